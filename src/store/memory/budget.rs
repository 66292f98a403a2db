//! The memory store's budget: the bytes it holds, accounted as they change, and what happens at
//! the limit.
//!
//! Every distinct descriptor value is a counter for its whole window, so a client that varies a
//! value (a user id, a path, random text) adds a counter per request. Without a bound, a flood of
//! distinct values grows the process until it is killed, and every limit it held is lost with it.
//!
//! What is counted: each counter's key (its bytes and the `Arc`'s two counts), its ring of runs or
//! buckets (capacity, not length: what is allocated), and each shard's map slots (capacity times a
//! slot). A decision adjusts the figure by what changed in the counters it touched and in the maps
//! of the shards it locked; a sweep counts its shard before and after, and adjusts by the
//! difference (a unit test checks the figure against a count of the structures).
//! Allocator overhead is not counted: RSS runs above the figure (docs/operations.md says by how
//! much).
//!
//! At the budget, a request that would create a counter is decided **over limit** on that counter
//! (denied, as any request over a limit: never allowed, never an error that a proxy's failure
//! policy turns into a pass) and counted in `slidegate_memory_store_refused_total`. Counters that
//! exist keep deciding as before, so a client over its limit stays over and one under it is still
//! served while the flood lasts; the flood's own counters leave with their windows.

use prometheus::{IntCounter, IntGauge};

use crate::metrics::Metrics;

/// The default budget where no container limit says otherwise: 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// The share of a container's memory limit (cgroup v2 `memory.max`) the default budget takes.
pub const CGROUP_SHARE: f64 = 0.5;

/// The budget and the figures `/metrics` shows.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    /// Most bytes the store holds before it refuses new counters.
    pub max_bytes: u64,
    /// Bytes held now (`slidegate_memory_store_bytes`): the accounting itself.
    pub(super) held: IntGauge,
    /// Requests decided over limit because the budget was reached.
    pub(super) refused: IntCounter,
}

impl MemoryBudget {
    /// A budget of `max_bytes`, its figures registered in `metrics`.
    pub fn new(max_bytes: u64, metrics: &Metrics) -> prometheus::Result<MemoryBudget> {
        let held = metrics.gauge(
            "slidegate_memory_store_bytes",
            "Bytes the memory store holds: keys, logs, buckets and map slots (allocator overhead \
             not included).",
        )?;
        let max = metrics.gauge(
            "slidegate_memory_store_max_bytes",
            "The memory store's budget (--memory-max-bytes): at it, a request that would create \
             a counter is decided over limit.",
        )?;
        max.set(i64::try_from(max_bytes).unwrap_or(i64::MAX));
        let refused = metrics.counter(
            "slidegate_memory_store_refused_total",
            "Requests decided over limit because the memory store was at its budget.",
        )?;
        Ok(MemoryBudget {
            max_bytes,
            held,
            refused,
        })
    }

    /// A budget that is never reached, its figures in no registry (tests, benchmarks).
    pub fn unlimited() -> MemoryBudget {
        MemoryBudget {
            max_bytes: u64::MAX,
            held: IntGauge::new("unregistered_bytes", "-").unwrap_or_else(|_| unreachable()),
            refused: IntCounter::new("unregistered_refused", "-").unwrap_or_else(|_| unreachable()),
        }
    }

    /// Adds `delta` bytes (negative: freed).
    pub(super) fn adjust(&self, delta: i64) {
        if delta != 0 {
            self.held.add(delta);
        }
    }

    /// Whether a new counter may be created now.
    pub(super) fn has_room(&self) -> bool {
        u64::try_from(self.held.get()).unwrap_or(0) < self.max_bytes
    }

    /// The bytes held now.
    pub fn held_bytes(&self) -> u64 {
        u64::try_from(self.held.get()).unwrap_or(0)
    }
}

/// Metric names and help texts that are constants are always valid.
fn unreachable() -> ! {
    unreachable!("a constant metric description is valid")
}

/// The default budget: [`CGROUP_SHARE`] of the container's memory limit where cgroup v2 states
/// one (`/sys/fs/cgroup/memory.max`), else [`DEFAULT_MAX_BYTES`].
pub fn default_max_bytes() -> u64 {
    budget_for(
        std::fs::read_to_string("/sys/fs/cgroup/memory.max")
            .ok()
            .as_deref(),
    )
}

/// The default budget for the text of `memory.max` (`max` where the container has no limit).
fn budget_for(memory_max: Option<&str>) -> u64 {
    memory_max
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map_or(DEFAULT_MAX_BYTES, |limit| {
            (limit as f64 * CGROUP_SHARE) as u64
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::store::{Counter, CounterKey, HitKind, ManualClock, MemoryStore, Precision};

    fn counter(value: &str, limit: u64, hits: u64, precision: Precision) -> Counter {
        let window = Duration::from_secs(60);
        Counter {
            key: CounterKey::new("budget", [("k", value)], window),
            limit,
            window,
            hits,
            shadow: false,
            precision,
            kind: HitKind::Admitted,
        }
    }

    /// The figure kept as decisions change the store equals a count of the structures.
    #[test]
    fn the_accounting_matches_the_structures() {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let store = MemoryStore::new(clock.clone());
        let buckets = Precision::Buckets(Duration::from_secs(1));
        for i in 0..2000u64 {
            let value = format!("{i}-{}", "v".repeat((i % 7) as usize * 300));
            let precision = if i % 3 == 0 {
                buckets
            } else {
                Precision::Exact
            };
            let c = counter(&value, 50, 1 + i % 5, precision);
            store.decide_now(&[c.clone(), counter("shared", 1000, 1, Precision::Exact)]);
            if i % 5 == 0 {
                store.decide_now(&[c.clone(), c]);
            }
            clock.advance(Duration::from_millis(40));
            assert_eq!(
                store.held_bytes(),
                store.stats().heap_bytes as u64,
                "after {i}"
            );
        }
        store.sweep();
        assert_eq!(store.held_bytes(), store.stats().heap_bytes as u64);
        clock.advance(Duration::from_secs(120));
        store.sweep();
        assert_eq!(store.held_bytes(), store.stats().heap_bytes as u64);
    }

    #[test]
    fn the_default_is_half_the_container_limit() {
        assert_eq!(budget_for(Some("536870912\n")), 256 << 20);
        assert_eq!(budget_for(Some("max\n")), DEFAULT_MAX_BYTES);
        assert_eq!(budget_for(None), DEFAULT_MAX_BYTES);
    }

    /// A counter of a 4 KiB value is kept under its compact key: under 1 KiB with its map, not 4 KiB,
    /// and two long values that differ only in their last byte are still two counters.
    #[test]
    fn long_values_cost_a_compact_key() {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let store = MemoryStore::new(clock);
        let long = "x".repeat(4096);
        let a = counter(&format!("{long}a"), 1, 1, Precision::Exact);
        let b = counter(&format!("{long}b"), 1, 1, Precision::Exact);
        assert!(store.decide_now(std::slice::from_ref(&a)).allowed);
        let one = store.held_bytes();
        assert!(one < 1024, "{one} bytes for one counter and its map");
        assert!(store.decide_now(std::slice::from_ref(&b)).allowed);
        assert!(
            !store.decide_now(std::slice::from_ref(&a)).allowed,
            "a is full"
        );
        assert!(!store.decide_now(&[b]).allowed, "b is full");
        assert_eq!(store.stats().counters, 2);
    }

    /// At the budget a new counter is over limit and nothing is created; existing counters decide
    /// as before.
    #[test]
    fn at_the_budget_new_counters_are_over_limit() {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let mut budget = MemoryBudget::unlimited();
        budget.max_bytes = 64 * 1024;
        let store = MemoryStore::with_budget(clock, budget);
        let tenant = counter("tenant", 3, 1, Precision::Exact);
        for _ in 0..3 {
            assert!(store.decide_now(std::slice::from_ref(&tenant)).allowed);
        }
        let served = counter("served", 1000, 1, Precision::Exact);
        assert!(store.decide_now(std::slice::from_ref(&served)).allowed);
        let mut refused = 0;
        for i in 0..10_000 {
            let flood = counter(
                &format!("{i}{}", "x".repeat(4096)),
                1000,
                1,
                Precision::Exact,
            );
            let d = store.decide_now(&[flood]);
            refused += usize::from(!d.allowed);
        }
        assert!(refused > 9_000, "{refused} refused");
        assert!(
            store.held_bytes() < 64 * 1024 + 16 * 1024,
            "{}",
            store.held_bytes()
        );
        assert!(
            !store.decide_now(std::slice::from_ref(&tenant)).allowed,
            "still over"
        );
        assert!(
            store.decide_now(std::slice::from_ref(&served)).allowed,
            "still served"
        );
        // A check on a new counter creates nothing and is allowed.
        let check = counter("new", 10, 0, Precision::Exact);
        assert!(store.decide_now(&[check]).allowed);
    }
}
