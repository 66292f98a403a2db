//! envoyproxy/ratelimit's per-rule stats, counted as it counts them, for the Prometheus listener
//! that serves them under its names (`--prometheus-addr`, `USE_PROMETHEUS`).
//!
//! envoyproxy/ratelimit keeps five counters per rule, under the rule's key: the domain and, per
//! level of the rule tree, `key` or `key_value` with the configured value, joined with `.`
//! (`ratelimit.service.rate_limit.<domain>.<key>.<stat>`; a rule's `name` is not used;
//! `detailed_metric` and `value_to_metric` put the request's values in, as slidegate's own `rule`
//! label does). What each counts, for a descriptor of `hits` hits against a limit `N`, with
//! `before` the hits its window held and `after = before + hits`, `near = floor(0.8 N)`
//! (`base_limiter.go`):
//! - `total_hits`: every hit;
//! - over limit (`after > N`): `over_limit` the hits past `N` (all of them if `before >= N`), and
//!   `near_limit` the hits between `near` and `N`; a shadow rule's also in `shadow_mode`;
//! - within the limit: `within_limit` every hit, and `near_limit` the hits past `near`.
//!
//! Counted only when the listener is on: without it the limiter pays one branch. Keys come from
//! the configuration (a limit override's from the keys of its entries, not the values clients
//! choose), and at most [`MAX_RULE_LABELS`] of them are kept, as slidegate's own rule labels.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::metrics::MAX_RULE_LABELS;

/// The stat names, in the order of [`RuleStats::values`].
pub const STATS: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

/// Longest key kept as it is (Envoy Gateway's keys run to a few hundred bytes); a longer one,
/// which only request values can make (`detailed_metric`, `value_to_metric`), is shortened with
/// a digest.
pub const MAX_KEY_BYTES: usize = 1024;

/// The key under which rules past [`MAX_RULE_LABELS`] are counted together (per domain).
pub const OVERFLOW_KEY: &str = "overflow";

/// One rule's five counters.
#[derive(Debug, Default)]
pub struct RuleStats {
    counts: [AtomicU64; 5],
}

impl RuleStats {
    fn add(&self, stat: usize, n: u64) {
        if n > 0 {
            // Saturating: hits come from clients (up to `MAX_HITS` each).
            let _ = self.counts[stat].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(n))
            });
        }
    }

    /// Counts one descriptor decision (see the module docs); `near` is where near limit starts
    /// ([`EnvoyStats::near`]).
    pub fn record(&self, limit: u64, near: u64, before: u64, hits: u64, over: bool, shadow: bool) {
        let after = before.saturating_add(hits);
        self.add(0, hits);
        if over {
            if before >= limit {
                self.add(1, hits);
            } else {
                self.add(1, after - limit.min(after));
                self.add(2, limit.saturating_sub(near.max(before)));
            }
            if shadow {
                let past = if before >= limit {
                    hits
                } else {
                    after.saturating_sub(limit)
                };
                self.add(4, past);
            }
        } else {
            if after > near {
                self.add(2, if before >= near { hits } else { after - near });
            }
            self.add(3, hits);
        }
    }

    /// The five counts, in the order of [`STATS`].
    pub fn values(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }
}

/// envoyproxy/ratelimit's default `NEAR_LIMIT_RATIO`.
pub const DEFAULT_NEAR_LIMIT_RATIO: f32 = 0.8;

/// Every rule's stats, by domain and key; kept across reloads (a counter never goes back).
#[derive(Debug)]
pub struct EnvoyStats {
    /// The share of a limit past which hits are near it (`--near-limit-ratio`).
    near_ratio: f32,
    rules: RwLock<HashMap<String, HashMap<String, Arc<RuleStats>>>>,
}

impl Default for EnvoyStats {
    fn default() -> Self {
        EnvoyStats::new(DEFAULT_NEAR_LIMIT_RATIO)
    }
}

impl EnvoyStats {
    pub fn new(near_ratio: f32) -> EnvoyStats {
        EnvoyStats {
            near_ratio,
            rules: RwLock::default(),
        }
    }

    /// Where near limit starts for `limit`, as envoyproxy/ratelimit computes it: a float32
    /// product, rounded down.
    pub fn near(&self, limit: u64) -> u64 {
        (limit as f32 * self.near_ratio).floor() as u64
    }

    /// The stats of the rule `key` of `domain`, made on first use.
    pub fn rule(&self, domain: &str, key: &str) -> Arc<RuleStats> {
        if let Some(found) = self.rules.read().get(domain).and_then(|d| d.get(key)) {
            return Arc::clone(found);
        }
        let mut rules = self.rules.write();
        let full = rules.values().map(HashMap::len).sum::<usize>() >= MAX_RULE_LABELS;
        let keys = rules.entry(domain.to_string()).or_default();
        if let Some(found) = keys.get(key) {
            return Arc::clone(found);
        }
        let key = if full { OVERFLOW_KEY } else { key };
        Arc::clone(keys.entry(key.to_string()).or_default())
    }

    /// Every rule's `<domain>.<key>` and counts, sorted.
    pub fn snapshot(&self) -> Vec<(String, [u64; 5])> {
        let rules = self.rules.read();
        let mut all: Vec<(String, [u64; 5])> = rules
            .iter()
            .flat_map(|(domain, keys)| {
                keys.iter()
                    .map(move |(key, stats)| (format!("{domain}.{key}"), stats.values()))
            })
            .collect();
        all.sort_unstable();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures of envoyproxy/ratelimit's own examples: limit 10, near limit at 8.
    #[test]
    fn counts_as_envoyproxy_ratelimit() {
        let stats = RuleStats::default();
        for before in 0..12u64 {
            stats.record(10, 8, before.min(10), 1, before >= 10, false);
        }
        // 12 single hits: 1-8 within, 9-10 within and near, 11-12 over.
        assert_eq!(stats.values(), [12, 2, 2, 10, 0]);

        let batch = RuleStats::default();
        batch.record(10, 8, 7, 5, true, true); // 7 held, 5 more: over by 2, near 2.
        assert_eq!(batch.values(), [5, 2, 2, 0, 2]);
        batch.record(10, 8, 6, 3, false, false); // 6 held, 3 more: near 1, within 3.
        assert_eq!(batch.values(), [8, 2, 3, 3, 2]);
    }

    #[test]
    fn keys_are_capped_per_process() {
        let stats = EnvoyStats::default();
        for i in 0..MAX_RULE_LABELS + 5 {
            stats
                .rule("d", &format!("k{i}"))
                .record(1, 0, 0, 1, false, false);
        }
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.len(), MAX_RULE_LABELS + 1);
        let overflow = snapshot.iter().find(|(k, _)| k == "d.overflow");
        assert_eq!(overflow.map(|(_, v)| v[0]), Some(5));
    }
}
