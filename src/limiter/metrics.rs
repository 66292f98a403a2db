//! The decisions' metric families: per (domain, rule) pair, the unknown domains and unmatched
//! descriptors, and the store calls as the limiter sees them (their time, failures and the failure
//! mode's answers). The label cap and the dropping of removed rules' series are described in
//! [`crate::metrics`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use prometheus::{Histogram, IntCounter, IntCounterVec};

use super::envoy_stats::EnvoyStats;
use crate::config::RuleSet;
use crate::metrics::{MAX_RULE_LABELS, Metrics, OVERFLOW_RULE, bounded_label};
use crate::store::StoreError;

/// The outcome of one descriptor, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionLabel {
    Allowed,
    Denied,
    /// Over limit, but let through by a rule's or the global shadow mode.
    ShadowDenied,
}

impl DecisionLabel {
    const ALL: [DecisionLabel; 3] = [
        DecisionLabel::Allowed,
        DecisionLabel::Denied,
        DecisionLabel::ShadowDenied,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionLabel::Allowed => "allowed",
            DecisionLabel::Denied => "denied",
            DecisionLabel::ShadowDenied => "shadow_denied",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The counters of one (domain, rule) pair, resolved once.
#[derive(Debug)]
pub struct RuleCounters {
    decisions: [IntCounter; 3],
    hits: [IntCounter; 3],
    near_limit: IntCounter,
    /// A decision was recorded since the last reload (see [`DecisionMetrics::set_rules`]).
    used: AtomicBool,
}

impl RuleCounters {
    /// Counts one descriptor decision with its hits; `near_limit` when the allowed decision left
    /// 80 % or more of the limit used.
    pub fn record(&self, decision: DecisionLabel, hits: u64, near_limit: bool) {
        // Read first: a flag that is already set is not written again by every core.
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
        self.decisions[decision.index()].inc();
        // Saturating: hits come from clients (up to `MAX_HITS` each), and a counter that
        // wrapped would read as a reset.
        let total = &self.hits[decision.index()];
        total.inc_by(hits.min(u64::MAX - total.get()));
        if near_limit {
            self.near_limit.inc();
        }
    }
}

/// The limiter's metric families, registered once into the process's [`Metrics`].
pub struct DecisionMetrics {
    decisions: IntCounterVec,
    hits: IntCounterVec,
    near_limit: IntCounterVec,
    unknown_domain: IntCounterVec,
    /// The unknown domains with a series of their own, at most [`MAX_UNKNOWN_DOMAINS`].
    unknown_domains: RwLock<HashMap<String, IntCounter>>,
    no_rule: IntCounterVec,
    store_duration: Histogram,
    store_errors: IntCounterVec,
    failure_mode: IntCounterVec,
    rule_label_overflow: IntCounter,
    rule_cache: RwLock<RuleCache>,
    /// envoyproxy/ratelimit's per-rule stats, when its Prometheus listener is on.
    envoy: Option<Arc<EnvoyStats>>,
}

/// Unknown domains counted under their own name; the rest share `domain="overflow"`.
pub const MAX_UNKNOWN_DOMAINS: usize = 16;

impl std::fmt::Debug for DecisionMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionMetrics").finish_non_exhaustive()
    }
}

impl Default for DecisionMetrics {
    /// Registered in a registry of their own (a limiter in tests and benches).
    fn default() -> Self {
        Self::new(&Metrics::new())
    }
}

impl DecisionMetrics {
    /// Counts envoyproxy/ratelimit's per-rule stats too (see [`EnvoyStats`]), hits past
    /// `near_ratio` of a limit as near it.
    pub fn with_envoy_stats(mut self, near_ratio: f32) -> Self {
        self.envoy = Some(Arc::new(EnvoyStats::new(near_ratio)));
        self
    }

    /// envoyproxy/ratelimit's per-rule stats, if they are counted.
    pub fn envoy_stats(&self) -> Option<&Arc<EnvoyStats>> {
        self.envoy.as_ref()
    }

    /// Creates and registers the families into `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        // The definitions below are constants: registering them can only fail on a programming
        // error (a duplicate or malformed name), which the unit tests catch.
        Self::try_new(metrics).expect("metric definitions are valid")
    }

    fn try_new(metrics: &Metrics) -> prometheus::Result<Self> {
        let decisions = metrics.counter_vec(
            "slidegate_decisions_total",
            "Descriptor decisions by domain, rule and decision (allowed, denied, shadow_denied).",
            &["domain", "rule", "decision"],
        )?;
        let hits = metrics.counter_vec(
            "slidegate_hits_total",
            "Hits of descriptor decisions by domain, rule and decision.",
            &["domain", "rule", "decision"],
        )?;
        let near_limit = metrics.counter_vec(
            "slidegate_near_limit_total",
            "Allowed descriptor decisions that left 80% or more of the limit used.",
            &["domain", "rule"],
        )?;
        let no_rule = metrics.counter_vec(
            "slidegate_no_rule_total",
            "Descriptors of a configured domain that matched no rule.",
            &["domain"],
        )?;
        let store_errors = metrics.counter_vec(
            "slidegate_store_errors_total",
            "Failed store decisions by kind (timeout, connection, oom, backend, incompatible, auth).",
            &["kind"],
        )?;
        let failure_mode = metrics.counter_vec(
            "slidegate_failure_mode_total",
            "Requests answered by the failure mode after a store error.",
            &["mode"],
        )?;
        let unknown_domain = metrics.counter_vec(
            "slidegate_unknown_domain_total",
            "Requests for a domain that has no rules, by domain (the first 16 named; the rest \
             counted under domain=\"overflow\").",
            &["domain"],
        )?;
        unknown_domain.with_label_values(&[OVERFLOW_RULE]);
        let store_duration = metrics.latency(
            "slidegate_store_duration_seconds",
            "Time of one store decision (one round trip for Redis).",
        )?;
        let rule_label_overflow = metrics.counter(
            "slidegate_rule_label_overflow_total",
            "Decisions counted under rule=\"overflow\" because the cap of distinct (domain, rule) \
             pairs was reached.",
        )?;
        for kind in StoreError::KINDS {
            store_errors.with_label_values(&[kind]);
        }
        for mode in ["error", "allow", "deny"] {
            failure_mode.with_label_values(&[mode]);
        }
        Ok(DecisionMetrics {
            decisions,
            hits,
            near_limit,
            unknown_domain,
            unknown_domains: RwLock::new(HashMap::new()),
            no_rule,
            store_duration,
            store_errors,
            failure_mode,
            rule_label_overflow,
            rule_cache: RwLock::new(RuleCache::default()),
            envoy: None,
        })
    }

    /// The counters for a (domain, rule) pair; `rule="overflow"` once [`MAX_RULE_LABELS`] pairs exist.
    /// A long `rule` is cut to a bounded label first ([`bounded_label`]).
    pub fn rule(&self, domain: &str, rule: &str) -> Arc<RuleCounters> {
        let rule = &*bounded_label(rule);
        {
            let cache = self.rule_cache.read();
            if let Some(found) = cache.get(domain, rule) {
                return found;
            }
            if cache.len >= MAX_RULE_LABELS
                && let Some(found) = cache.get(domain, OVERFLOW_RULE)
            {
                self.rule_label_overflow.inc();
                return found;
            }
        }
        let mut cache = self.rule_cache.write();
        if let Some(found) = cache.get(domain, rule) {
            return found;
        }
        let label = if cache.len >= MAX_RULE_LABELS {
            self.rule_label_overflow.inc();
            OVERFLOW_RULE
        } else {
            rule
        };
        if let Some(found) = cache.get(domain, label) {
            return found;
        }
        let counters = Arc::new(RuleCounters {
            decisions: DecisionLabel::ALL.map(|d| {
                self.decisions
                    .with_label_values(&[domain, label, d.as_str()])
            }),
            hits: DecisionLabel::ALL
                .map(|d| self.hits.with_label_values(&[domain, label, d.as_str()])),
            near_limit: self.near_limit.with_label_values(&[domain, label]),
            used: AtomicBool::new(false),
        });
        cache.len += 1;
        cache
            .by_domain
            .entry(domain.to_string())
            .or_default()
            .insert(label.to_string(), Arc::clone(&counters));
        counters
    }

    /// The live rules changed (at start and after each successful reload): drops the series of
    /// what the change removed (see [`crate::metrics`]). Prometheus marks a dropped series stale at its next scrape.
    pub fn set_rules(&self, rules: &RuleSet) {
        let domains: HashSet<String> = rules.domain_names().into_iter().map(String::from).collect();
        let configured: HashSet<(String, String)> = rules
            .rules()
            .into_iter()
            .map(|r| (r.domain.clone(), bounded_label(r.stats_name()).into_owned()))
            .collect();
        let mut cache = self.rule_cache.write();
        let RuleCache {
            by_domain,
            len,
            domains: old_domains,
            configured: old_configured,
        } = &mut *cache;
        let mut removed = Vec::new();
        for (domain, labels) in by_domain.iter_mut() {
            labels.retain(|label, counters| {
                let key = (domain.clone(), label.clone());
                let keep = domains.contains(domain)
                    && (configured.contains(&key)
                        || (!old_configured.contains(&key)
                            && counters.used.swap(false, Ordering::Relaxed)));
                if !keep {
                    removed.push(key);
                }
                keep
            });
        }
        by_domain.retain(|_, labels| !labels.is_empty());
        *len -= removed.len();
        for (domain, label) in &removed {
            for decision in DecisionLabel::ALL {
                let values = [domain.as_str(), label.as_str(), decision.as_str()];
                let _ = self.decisions.remove_label_values(&values);
                let _ = self.hits.remove_label_values(&values);
            }
            let _ = self.near_limit.remove_label_values(&[domain, label]);
        }
        for domain in old_domains.difference(&domains) {
            let _ = self.no_rule.remove_label_values(&[domain]);
        }
        *old_domains = domains;
        *old_configured = configured;
    }

    /// A request for an unconfigured domain. Clients choose domains, so only the first
    /// [`MAX_UNKNOWN_DOMAINS`] get a series (each name cut to a bounded label); the rest are
    /// counted under `domain="overflow"`.
    pub fn unknown_domain(&self, domain: &str) {
        let domain = bounded_label(domain);
        if let Some(counter) = self.unknown_domains.read().get(domain.as_ref()) {
            counter.inc();
            return;
        }
        let mut named = self.unknown_domains.write();
        if named.len() >= MAX_UNKNOWN_DOMAINS {
            self.unknown_domain
                .with_label_values(&[OVERFLOW_RULE])
                .inc();
            return;
        }
        named
            .entry(domain.into_owned())
            .or_insert_with_key(|d| self.unknown_domain.with_label_values(&[d.as_str()]))
            .inc();
    }

    /// A descriptor of a configured domain that matched no rule.
    pub fn no_rule(&self, domain: &str) {
        self.no_rule.with_label_values(&[domain]).inc();
    }

    /// Time of one store decision.
    pub fn observe_store(&self, elapsed: Duration) {
        self.store_duration.observe(elapsed.as_secs_f64());
    }

    /// A failed store decision.
    pub fn store_error(&self, kind: &str) {
        self.store_errors.with_label_values(&[kind]).inc();
    }

    /// A request answered by the failure mode.
    pub fn failure_mode(&self, mode: &str) {
        self.failure_mode.with_label_values(&[mode]).inc();
    }
}

type FastMap<V> = HashMap<String, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct RuleCache {
    /// By configured domain (a fast hasher: only the live rules' domains are inserted), then by
    /// rule label, which can carry what a client sent (`detailed_metric`, `value_to_metric`,
    /// overrides): SipHash there, against flooding, as well as the bound on labels.
    by_domain: FastMap<HashMap<String, Arc<RuleCounters>>>,
    len: usize,
    /// The configured domains and the (domain, rule) pairs that the live rules name.
    domains: HashSet<String>,
    configured: HashSet<(String, String)>,
}

impl RuleCache {
    fn get(&self, domain: &str, rule: &str) -> Option<Arc<RuleCounters>> {
        self.by_domain.get(domain)?.get(rule).map(Arc::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_sources;

    fn registered() -> (Metrics, DecisionMetrics) {
        let registry = Metrics::new();
        let metrics = DecisionMetrics::new(&registry);
        (registry, metrics)
    }

    #[test]
    fn rule_labels_are_capped() {
        let (registry, metrics) = registered();
        for i in 0..MAX_RULE_LABELS + 5 {
            metrics
                .rule("d", &format!("r{i}"))
                .record(DecisionLabel::Allowed, 1, false);
        }
        let text = registry.render();
        assert!(text.contains(
            "slidegate_decisions_total{decision=\"allowed\",domain=\"d\",rule=\"overflow\"} 5"
        ));
        assert!(
            text.contains("slidegate_rule_label_overflow_total 5"),
            "{text}"
        );
        // A pair seen before the cap keeps its own series.
        metrics
            .rule("d", "r0")
            .record(DecisionLabel::Allowed, 1, false);
        assert!(registry.render().contains(
            "slidegate_decisions_total{decision=\"allowed\",domain=\"d\",rule=\"r0\"} 2"
        ));
    }

    /// Rules of domain `d` named `{prefix}{i}`.
    fn named_rules(prefix: &str, count: usize) -> RuleSet {
        let mut text = String::from("domain: d\ndescriptors:\n");
        for i in 0..count {
            text.push_str(&format!(
                "  - key: k{i}\n    rate_limit: {{ name: {prefix}{i}, unit: second, requests_per_unit: 1 }}\n"
            ));
        }
        load_sources(&[("d.yaml".to_owned(), text)]).expect("rules load")
    }

    fn series(text: &str, rule: &str) -> bool {
        text.contains(&format!("domain=\"d\",rule=\"{rule}\"}}"))
    }

    #[test]
    fn renamed_rules_never_fill_the_cap() {
        let (registry, metrics) = registered();
        let count = MAX_RULE_LABELS / 4 + 1;
        for generation in 0..6 {
            let prefix = format!("g{generation}_");
            metrics.set_rules(&named_rules(&prefix, count));
            for i in 0..count {
                metrics
                    .rule("d", &format!("{prefix}{i}"))
                    .record(DecisionLabel::Allowed, 1, false);
            }
        }
        let text = registry.render();
        assert!(!series(&text, OVERFLOW_RULE), "live rules overflowed");
        assert!(text.contains("slidegate_rule_label_overflow_total 0"));
        assert!(series(&text, "g5_0") && !series(&text, "g4_0"));
        assert_eq!(metrics.rule_cache.read().len, count);
    }

    #[test]
    fn runtime_labels_stay_while_used_and_removed_domains_go() {
        let (registry, metrics) = registered();
        metrics.set_rules(&named_rules("r", 1));
        metrics
            .rule("d", "r0")
            .record(DecisionLabel::Allowed, 1, false);
        metrics
            .rule("d", "k0_alice")
            .record(DecisionLabel::Allowed, 1, false);
        metrics
            .rule("d", "k0_bob")
            .record(DecisionLabel::Allowed, 1, false);
        metrics.no_rule("d");
        // A reload right after: both runtime labels were used since the last one.
        metrics.set_rules(&named_rules("r", 1));
        assert!(series(&registry.render(), "k0_bob"));
        // Only alice is seen before the next reload: bob's series goes.
        metrics
            .rule("d", "k0_alice")
            .record(DecisionLabel::Allowed, 1, false);
        metrics.set_rules(&named_rules("r", 1));
        let text = registry.render();
        assert!(
            series(&text, "k0_alice") && !series(&text, "k0_bob"),
            "{text}"
        );
        assert!(series(&text, "r0"), "a configured rule stays, used or not");
        // A reload without domain `d` removes all of its series.
        let other = "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
        metrics.set_rules(
            &load_sources(&[("e.yaml".to_owned(), other.to_owned())]).expect("rules load"),
        );
        let text = registry.render();
        assert!(!text.contains("domain=\"d\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let (registry, metrics) = registered();
        metrics
            .rule("d", "a\"b\\c\nd")
            .record(DecisionLabel::Allowed, 1, true);
        let text = registry.render();
        assert!(text.contains(r#"rule="a\"b\\c\nd""#), "{text}");
    }
}
