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
//! Before that, under pressure (from [`PRESSURE_ON`] of the budget until the store is back under
//! [`PRESSURE_OFF`] of it), counters get cheaper: a limit kept as an exact log of more than
//! [`Precision::AUTO_EXACT_UP_TO`](crate::store::Precision::AUTO_EXACT_UP_TO) hits is decided in
//! the buckets slidegate would choose for it (its log carried over, which keeps the guarantee; a
//! log of 1,000 hits is 8 KB, its 60 buckets at most 1 KB), and back in its log once the pressure
//! is off. Keys over 128 bytes are always kept compact (see the store's module docs).
//!
//! At the budget, a request that would create a counter is decided **over limit** on that counter
//! (denied, as any request over a limit: never allowed, never an error that a proxy's failure
//! policy turns into a pass) and counted in `slidegate_memory_store_refused_total`. Counters that
//! exist keep deciding as before, so a client over its limit stays over and one under it is still
//! served while the flood lasts; the flood's own counters leave with their windows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::borrow::Cow;

use prometheus::{IntCounter, IntGauge};

use super::{MAX_KEY_BYTES, Series, Shard, Tally};
use crate::metrics::Metrics;
use crate::store::{Counter, CounterKey, Precision};
use crate::throttle::Throttle;

/// The default budget where no container limit says otherwise: 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// The share of a container's memory limit (cgroup v2 `memory.max`) the default budget takes.
pub const CGROUP_SHARE: f64 = 0.5;

/// The share of the budget held from which counters get cheaper (see the module docs).
pub const PRESSURE_ON: f64 = 0.5;

/// The share of the budget under which they go back to their own forms: below [`PRESSURE_ON`],
/// so that a store near the threshold does not carry counters back and forth.
pub const PRESSURE_OFF: f64 = 0.4;

/// The budget and the figures `/metrics` shows.
#[derive(Clone, Debug)]
pub struct MemoryBudget {
    /// Most bytes the store holds before it refuses new counters.
    pub max_bytes: u64,
    /// Bytes held now (`slidegate_memory_store_bytes`): the accounting itself.
    pub(super) held: IntGauge,
    /// Requests decided over limit because the budget was reached.
    pub(super) refused: IntCounter,
    /// Whether the store is under pressure now ([`PRESSURE_ON`], [`PRESSURE_OFF`]).
    pressure: Arc<AtomicBool>,
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
            pressure: Arc::default(),
        })
    }

    /// A budget that is never reached, its figures in no registry (tests, benchmarks).
    pub fn unlimited() -> MemoryBudget {
        MemoryBudget {
            max_bytes: u64::MAX,
            held: IntGauge::new("unregistered_bytes", "-").unwrap_or_else(|_| unreachable()),
            refused: IntCounter::new("unregistered_refused", "-").unwrap_or_else(|_| unreachable()),
            pressure: Arc::default(),
        }
    }

    /// Adds `delta` bytes (negative: freed).
    pub(super) fn adjust(&self, delta: i64) {
        if delta != 0 {
            self.held.add(delta);
        }
    }

    /// Whether counters should take their cheaper forms now (see the module docs): one load
    /// while the store is far from its budget.
    pub(super) fn under_pressure(&self) -> bool {
        let held = self.held_bytes() as f64;
        let max = self.max_bytes as f64;
        let was = self.pressure.load(Ordering::Relaxed);
        let is = if was {
            held >= max * PRESSURE_OFF
        } else {
            held >= max * PRESSURE_ON
        };
        if is != was {
            self.pressure.store(is, Ordering::Relaxed);
        }
        is
    }

    /// Under pressure (see the module docs), exact logs of limits over [`Precision::AUTO_EXACT_UP_TO`]
    /// asked for in the buckets slidegate would choose for them (where the window has such
    /// buckets). Borrowed otherwise.
    pub(super) fn lighter_forms<'a>(&self, counters: &'a [Counter]) -> Cow<'a, [Counter]> {
        let heavy =
            |c: &Counter| c.precision == Precision::Exact && c.limit > Precision::AUTO_EXACT_UP_TO;
        if !counters.iter().any(heavy) || !self.under_pressure() {
            return Cow::Borrowed(counters);
        }
        let mut counters = counters.to_vec();
        for counter in counters.iter_mut().filter(|c| heavy(c)) {
            counter.precision = Precision::automatic(counter.limit, counter.window);
        }
        Cow::Owned(counters)
    }

    /// A request decided over limit because the store is at its budget: counted, and logged at
    /// `warn` once per interval with how many it stands for (see [`Throttle`]).
    pub(super) fn refuse(&self) {
        static LOG: Throttle = Throttle::new();
        self.refused.inc();
        if let Some(left_out) = LOG.admit() {
            tracing::warn!(
                max_bytes = self.max_bytes,
                held_bytes = self.held_bytes(),
                refused_before = left_out,
                "memory store at its budget (--memory-max-bytes): requests that would create a \
                 counter are decided over limit"
            );
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

/// A map slot: a key and its tally, plus hashbrown's control byte.
pub(super) const SLOT: usize = std::mem::size_of::<(CounterKey, Tally)>() + 1;

/// Counters whose keys are longer than [`MAX_KEY_BYTES`](super::MAX_KEY_BYTES), under their compact stand-ins
/// ([`CounterKey::compact`]): a key as long as a client's values would otherwise cost its bytes
/// for the counter's whole window. Borrowed when every key is short (the usual request).
pub(super) fn compact_keys(counters: Cow<'_, [Counter]>) -> Cow<'_, [Counter]> {
    if counters
        .iter()
        .all(|c| c.key.as_str().len() <= MAX_KEY_BYTES)
    {
        return counters;
    }
    let mut counters = counters.into_owned();
    for counter in &mut counters {
        counter.key = counter.key.compact(MAX_KEY_BYTES);
    }
    Cow::Owned(counters)
}

/// The bytes a counter holds besides its map slot: its key (an `Arc<str>` allocates two counts
/// and the bytes) and its ring of runs or buckets, each as the allocator's chunk.
pub(super) fn counter_bytes(key: &CounterKey, series: &dyn Series) -> usize {
    chunk(key.as_str().len() + 16) + chunk(series.heap_bytes())
}

/// What an allocation of `bytes` takes from the heap: the binary's allocator (mimalloc) serves
/// it from a size class, multiples of 8 up to 64 bytes and then steps of an eighth of the next
/// power of two (a key of 114 bytes and its two counts, 130 bytes, take 160). Counting the class
/// keeps the figure near RSS for many small counters.
fn chunk(bytes: usize) -> usize {
    if bytes <= 64 {
        return bytes.next_multiple_of(8);
    }
    bytes.next_multiple_of(bytes.next_power_of_two() / 8)
}

/// The bytes a shard holds: its map's slots and every counter.
pub(super) fn shard_bytes(map: &Shard) -> usize {
    map.capacity() * SLOT
        + map
            .iter()
            .map(|(key, tally)| counter_bytes(key, tally.series()))
            .sum::<usize>()
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

    /// Under pressure a large exact log is kept in buckets, and its limit still holds; with the
    /// pressure off it is a log again, its hits carried back.
    #[test]
    fn under_pressure_large_logs_become_buckets() {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let mut budget = MemoryBudget::unlimited();
        budget.max_bytes = 64 * 1024;
        let store = MemoryStore::with_budget(clock.clone(), budget);
        let big = |hits| counter("big", 1000, hits, Precision::Exact);
        // 900 hits one millisecond apart: a log of 900 runs (about 8 KB).
        for _ in 0..900 {
            assert!(store.decide_now(&[big(1)]).allowed);
            clock.advance(Duration::from_millis(1));
        }
        let as_log = store.held_bytes();
        assert!(as_log > 7_000, "{as_log}");
        // Fill past half the budget with other counters.
        let mut i = 0;
        while store.held_bytes() < 40 * 1024 {
            let mut filler = counter(&format!("filler-{i}"), 10, 1, Precision::Exact);
            filler.window = Duration::from_secs(1);
            store.decide_now(&[filler]);
            i += 1;
        }
        let before = store.held_bytes();
        let d = store.decide_now(&[big(100)]);
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.counters[0].remaining, 0);
        assert!(
            store.held_bytes() + 5_000 < before,
            "{} then {}",
            before,
            store.held_bytes()
        );
        assert!(
            !store.decide_now(&[big(1)]).allowed,
            "the limit still holds"
        );
        let key = big(1).key;
        let buckets = Some(Precision::Buckets(Duration::from_secs(1)));
        assert_eq!(
            store.form_of(&key),
            buckets,
            "kept in the automatic buckets"
        );
        // The fillers leave with their 1 s window; the pressure is off and the counter a log again.
        clock.advance(Duration::from_secs(2));
        store.sweep();
        assert!(
            !store.decide_now(&[big(1)]).allowed,
            "its hits were carried back"
        );
        assert_eq!(store.form_of(&key), Some(Precision::Exact), "a log again");
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
