//! What a bucket id gets from the Rate Limit Quota Service now, for `POST /explain`: the rule it
//! reaches, and each Envoy's share of it from the bucket's ledger, assigning nothing.

use std::time::Duration;

use super::{Free, QuotaService, Reach, as_read, sorted};

/// A bucket id explained.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketExplained {
    /// `no_rule`, `unlimited`, `shadow` (all `ALLOW_ALL`), `too_complex` (`DENY_ALL`) or `limited`.
    pub outcome: &'static str,
    /// The rule reached, by name (or path).
    pub rule: Option<String>,
    /// Its limits: N per window.
    pub limits: Vec<(u64, Duration)>,
    /// Each Envoy holding a share now (none before the first report).
    pub envoys: Vec<EnvoyShare>,
}

/// One Envoy's (stream's) share of a bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvoyShare {
    /// Its number in the ledger (a bucket of one stream; a new one after a reconnect).
    pub holder: u64,
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval: Duration,
    /// The most it admits per window of each limit (its weight), in the limits' order.
    pub admits: Vec<u64>,
    /// How long until the grant ends unless renewed.
    pub ends_in: Duration,
    /// Requests per second it last reported, if a report said.
    pub demand: Option<f64>,
}

impl QuotaService {
    /// What the bucket id `entries` of `domain` gets now, and why; `None` for a bucket id over
    /// the request limits, which a report would not have assigned either.
    pub fn explain(&self, domain: &str, entries: &[(String, String)]) -> Option<BucketExplained> {
        let shared = &self.shared;
        // The values read as a report's are: the same ledger and rule.
        let texts = as_read(entries.iter().map(|(k, v)| (k.as_str(), v.as_bytes())));
        let entries = sorted(&texts);
        if shared.too_large(domain, &entries) {
            return None;
        }
        let free = |outcome, rule| BucketExplained {
            outcome,
            rule,
            limits: Vec::new(),
            envoys: Vec::new(),
        };
        Some(match shared.reach(domain, &entries, false) {
            Reach::Free(Free::NoRule) => free("no_rule", None),
            Reach::Free(Free::Unlimited(rule)) => free("unlimited", Some(rule)),
            Reach::Free(Free::Shadow(rule)) => free("shadow", Some(rule)),
            Reach::TooComplex => free("too_complex", None),
            Reach::Limited { rule, quotas, key } => {
                let view = shared.ledgers.view(&key, shared.epoch.elapsed());
                let view = view.unwrap_or_default();
                let envoys = (view.grants.iter())
                    .map(|(holder, bucket, ends_in)| EnvoyShare {
                        holder: *holder,
                        max_tokens: bucket.max_tokens,
                        tokens_per_fill: bucket.tokens_per_fill,
                        fill_interval: Duration::from_secs(u64::from(bucket.fill_interval_secs)),
                        admits: quotas.iter().map(|q| bucket.weight(q.window)).collect(),
                        ends_in: *ends_in,
                        demand: (view.demands.iter())
                            .find(|(h, _)| h == holder)
                            .and_then(|(_, d)| *d),
                    })
                    .collect();
                BucketExplained {
                    outcome: "limited",
                    rule: Some(rule),
                    limits: quotas.iter().map(|q| (q.n, q.window)).collect(),
                    envoys,
                }
            }
        })
    }
}
