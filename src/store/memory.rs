//! The embedded in-memory store: an exact sliding log or buckets per counter, sharded.
//!
//! A counter's state is a [`Series`]: the exact log below, or [`buckets`] (the window in buckets
//! of fixed width, bounded memory) when its [`Precision`] asks for them. The store decides through
//! the trait and never looks inside either.
//!
//! Each counter keeps the times of the hits in its window, oldest first, as a ring of packed
//! *runs*: one `u64` holds a timestamp (microseconds since the store was created, upper 52 bits,
//! good for 142 years) and a hit count (lower 12 bits, 1 to 4096). A request of `h` hits is one run,
//! and requests landing in the same microsecond share one, so the log stays compact whatever `hits`
//! clients send. Measured by [`MemoryStore::stats`] (the `bytes_per_tracked_hit` test): one
//! saturated counter of 1000 single hits takes 8 420 bytes, 8.4 bytes per tracked hit (its ring of
//! 1024 runs is 8.2 of them); 10 000 counters of 100 hits each take 11.6 bytes per tracked hit all
//! in (a ring of 128 runs, 10.2 bytes per hit, plus about 130 bytes per counter for its map slot
//! and key). Allocator overhead comes on top.
//!
//! Counters live in [`SHARDS`] independently locked hash maps, picked by key hash, so requests on
//! different counters rarely wait for each other. A request's counters may span several shards: the
//! store locks every shard involved, in ascending index order and each once, before looking at any
//! counter. That makes the all-or-nothing decision atomic with respect to every concurrent request,
//! and the fixed order means two requests can never wait for each other in a cycle.
//!
//! Memory stays bounded by what the windows hold: a counter drops expired runs whenever it is
//! touched, a counter left empty is removed at once, and idle counters are swept a shard at a time
//! as decisions go by (no runtime or timer needed), by [`MemoryStore::sweep`], or by the optional
//! task from [`MemoryStore::spawn_sweeper`]. The next shard is swept after [`SWEEP_EVERY`]
//! decisions, or after as many decisions as the last swept shard held counters if that is more:
//! sweeping then costs at most about one counter visit per decision however many counters there
//! are, and every counter is still looked at again within `SHARDS * SWEEP_EVERY` decisions or
//! about as many decisions as there are counters. (With a million counters a shard holds about
//! 15,600: sweeping one every 1024 decisions visited 15 counters per decision and stalled the
//! deciding worker for 0.2 to 0.7 ms some 50 times a second.)
//!
//! The clock is injected. If it steps backwards, a counter keeps to its newest hit's time until the
//! clock catches up, so a log never goes out of order and nothing is admitted twice.
//!
//! A counter's key does not name its representation: a decision that finds a counter in another
//! one than its rule asks for (after a reload) carries its hits over ([`carry`]).
//!
//! A key longer than [`MAX_KEY_BYTES`] (a client's long values: the limiter keeps values up to
//! `--max-value-bytes`, 4 KiB by default, verbatim) is kept under its compact stand-in
//! ([`CounterKey::compact`]), so such a counter costs about 150 bytes of key instead of its
//! values' length: the memory budget then holds some 20 times more of a flood's counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard};

use super::{
    Clock, Counter, CounterKey, CounterResult, Decided, Decision, HitKind, MAX_HELD, Precision,
    Store, StoreError, decided_forms,
};
use crate::Scratch;
use buckets::Buckets;
pub use budget::{MemoryBudget, default_max_bytes};
use budget::{SLOT, compact_keys, counter_bytes, shard_bytes};
use log::Log;
use shard::{KeyHasher, Shard};

mod buckets;
pub mod budget;
mod carry;
mod log;
mod shard;

/// Number of independently locked maps. A power of two well above the core count keeps contention
/// negligible; each shard costs one small map.
pub const SHARDS: usize = 64;

/// Longest key kept as it is; longer ones are kept under [`CounterKey::compact`] (which is 114
/// bytes long), so the stand-in is never longer than the key.
pub const MAX_KEY_BYTES: usize = 128;

/// The fewest decisions between two incremental shard sweeps (more when shards are larger; see
/// the module docs).
pub const SWEEP_EVERY: u64 = 1024;

/// What the store needs of one counter's state, whatever its representation. Times are
/// microseconds on the store's clock; `now` never goes backwards for one counter.
trait Series {
    /// Forgets the hits that no longer count at `now`.
    fn trim(&mut self, now: u64);
    /// The hits that count (after a [`Series::trim`]).
    fn hits(&self) -> u64;
    /// The time of the newest hit (or of its bucket's start).
    fn newest(&self) -> Option<u64>;
    /// Adds `hits` at `at`, never before [`Series::newest`], up to [`MAX_HELD`] hits in all;
    /// returns the hits it added.
    fn record(&mut self, at: u64, hits: u64) -> u64;
    /// Removes up to `hits` of the newest hits (returned hits); returns how many it removed.
    fn take_back(&mut self, hits: u64) -> u64;
    /// The instant at which the oldest `k` hits have all stopped counting, if there are that many.
    fn when_dropped(&self, k: u64) -> Option<u64>;
    /// The instant at which the oldest hit stops counting.
    fn oldest_leaves_at(&self) -> Option<u64>;
    fn is_empty(&self) -> bool;
    /// Entries held (runs of the log, buckets), for [`MemoryStats`].
    fn entries(&self) -> usize;
    /// Bytes on the heap (not the map slot).
    fn heap_bytes(&self) -> usize;
    /// Gives memory back after a burst.
    fn shrink(&mut self);
}

/// One counter's state in a shard: an enum rather than a boxed trait object, so a counter costs no
/// allocation beyond its entries.
#[derive(Debug)]
enum Tally {
    Log(Log),
    Buckets(Buckets),
}

impl Tally {
    /// The empty state `counter`'s precision asks for.
    fn new(counter: &Counter) -> Tally {
        Tally::of(counter.precision, counter.window)
    }

    /// An empty counter of `window` kept as `precision`.
    fn of(precision: Precision, window: Duration) -> Tally {
        let window = micros(window);
        match precision {
            Precision::Buckets(width) if !width.is_zero() => {
                Tally::Buckets(Buckets::new(window, micros(width)))
            }
            _ => Tally::Log(Log::new(window)),
        }
    }

    fn series(&self) -> &dyn Series {
        match self {
            Tally::Log(log) => log,
            Tally::Buckets(buckets) => buckets,
        }
    }

    fn series_mut(&mut self) -> &mut dyn Series {
        match self {
            Tally::Log(log) => log,
            Tally::Buckets(buckets) => buckets,
        }
    }
}

/// The default store: exact, process-local, no dependencies. See the module docs.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    /// The clock's reading at creation, so runs store small relative times.
    epoch: u64,
    hasher: KeyHasher,
    shards: Box<[Mutex<Shard>]>,
    decisions: AtomicU64,
    /// The decision count at which the next incremental sweep is due.
    next_sweep: AtomicU64,
    /// The shard that sweep takes; locked only by the decision that runs it.
    sweep_cursor: Mutex<usize>,
    /// The bytes held and the most allowed ([`budget`]).
    budget: MemoryBudget,
}

/// A snapshot of what a [`MemoryStore`] holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Counters with at least one run (or not yet swept).
    pub counters: usize,
    /// Hits in all logs and buckets (including expired ones not yet dropped).
    pub hits: u64,
    /// Packed runs in all logs, and buckets holding hits.
    pub runs: usize,
    /// Estimated heap bytes: map slots, keys, rings of runs and of buckets. Excludes allocator
    /// overhead.
    pub heap_bytes: usize,
}

/// What pass one found for one counter.
struct Eval {
    over: bool,
    /// Over limit because the store is at its budget and the counter does not exist yet.
    refused: bool,
    /// Hits in the window before this request (plus earlier same-key counters of the request).
    count: u64,
    /// Hits in the window before this request: what a denied request reports, since it records
    /// none of the hits its earlier same-key counters would have added.
    held: u64,
    /// The counter's "now": the clock, or the newest run if the clock stepped back.
    now: u64,
    /// For an over-limit counter: microseconds until the request's hits fit.
    reset: u64,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore::with_budget(clock, MemoryBudget::unlimited())
    }

    /// An empty store reading time from `clock`, holding at most what `budget` allows.
    pub fn with_budget(clock: Arc<dyn Clock>, budget: MemoryBudget) -> MemoryStore {
        let epoch = micros(clock.now());
        MemoryStore {
            clock,
            epoch,
            hasher: KeyHasher::default(),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            decisions: AtomicU64::new(0),
            next_sweep: AtomicU64::new(SWEEP_EVERY),
            sweep_cursor: Mutex::new(0),
            budget,
        }
    }

    /// Decides one request now. The async [`Store::decide`] only wraps this; it never blocks on
    /// anything but the shard locks, which are held for microseconds.
    pub fn decide_now(&self, counters: &[Counter]) -> Decision {
        let lighter = self.budget.lighter_forms(counters);
        let counters = &*compact_keys(decided_forms(&lighter));
        let now = micros(self.clock.now()).saturating_sub(self.epoch);
        // Each key hashed once, for its shard and every lookup in it (see `shard`).
        let hashes: Scratch<u64> = counters.iter().map(|c| self.hasher.hash(&c.key)).collect();
        let shard_of: Scratch<usize> = hashes.iter().map(|&h| KeyHasher::shard(h)).collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        // Ascending order, each shard once: see the module docs on deadlock freedom.
        let mut guards: Scratch<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| self.shards[i].lock()).collect();
        let guard_of: Scratch<usize> = shard_of
            .iter()
            .map(|s| order.partition_point(|o| o < s))
            .collect();

        // What the touched counters and the locked maps held before, for the budget (a counter
        // named twice is measured at its first naming and its last).
        let slots_before: usize = guards.iter().map(|map| map.capacity()).sum();
        let mut bytes_before = 0usize;
        let mut refused = false;
        let mut evals: Scratch<Eval> = Scratch::with_capacity(counters.len());
        for (i, counter) in counters.iter().enumerate() {
            let map = &mut guards[guard_of[i]];
            // Keys in other shards differ: most comparisons stop at the shard index.
            let same_key =
                |(c, &shard): (&Counter, &usize)| shard == shard_of[i] && c.key == counter.key;
            let first = !counters[..i].iter().zip(&shard_of[..i]).any(same_key);
            let pending: u64 = counters[..i]
                .iter()
                .zip(&evals)
                .filter(|(c, e)| c.key == counter.key && records(c, e.over, true))
                .fold(0u64, |sum, (c, _)| sum.saturating_add(c.hits));
            // A key named again keeps the form its first naming left it in (buckets kept for a
            // large total may fall under the carry's bound once trimmed): one form per request.
            let series = map.get_mut(hashes[i], &counter.key).map(|tally| {
                if !first {
                    return tally.series_mut();
                }
                bytes_before += counter_bytes(&counter.key, tally.series());
                tally.conform(counter, now).series_mut()
            });
            // At the budget, a counter that would be created is over limit (see `budget`).
            let creates = series.is_none() && counter.hits > 0 && counter.kind != HitKind::Returned;
            let mut eval = evaluate(series, counter, now, pending);
            if creates && !self.budget.has_room() {
                (eval.over, eval.refused, eval.reset) = (true, true, micros(counter.window));
                refused = true;
            }
            evals.push(eval);
        }
        if refused {
            self.budget.refuse();
        }
        let allowed = !counters
            .iter()
            .zip(&evals)
            .any(|(c, e)| e.over && !c.shadow);
        if !allowed {
            for eval in evals.iter_mut() {
                eval.count = eval.held;
            }
        }

        let mut bytes_after = 0usize;
        let results = counters
            .iter()
            .zip(&evals)
            .enumerate()
            .map(|(i, (counter, eval))| {
                let record =
                    counter.hits > 0 && !eval.refused && records(counter, eval.over, allowed);
                let map = &mut guards[guard_of[i]];
                let (result, bytes) = settle(map, &self.hasher, hashes[i], counter, eval, record);
                let later = counters[i + 1..].iter().zip(&shard_of[i + 1..]);
                if !later
                    .into_iter()
                    .any(|(c, &shard)| shard == shard_of[i] && c.key == counter.key)
                {
                    bytes_after += bytes;
                }
                result
            })
            .collect();
        let slots_after: usize = guards.iter().map(|map| map.capacity()).sum();
        drop(guards);
        self.budget.adjust(
            signed(bytes_after + slots_after * SLOT) - signed(bytes_before + slots_before * SLOT),
        );

        let n = self.decisions.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.next_sweep.load(Ordering::Relaxed) {
            self.sweep_next(n);
        }
        Decision {
            allowed,
            counters: results,
        }
    }

    /// Forgets the counters under `keys` ([`Store::clear`]): whether each held one.
    pub fn clear_now(&self, keys: &[CounterKey]) -> Vec<bool> {
        keys.iter()
            .map(|key| {
                // Stored under its compact stand-in when long (see the module docs).
                let key = &key.compact(MAX_KEY_BYTES);
                let hash = self.hasher.hash(key);
                let mut map = self.shards[KeyHasher::shard(hash)].lock();
                let removed = map.remove(hash, key);
                if let Some(tally) = &removed {
                    self.budget
                        .adjust(-signed(counter_bytes(key, tally.series())));
                }
                removed.is_some()
            })
            .collect()
    }

    /// Drops expired runs and empty counters in every shard, and returns spare memory. Locks one
    /// shard at a time.
    pub fn sweep(&self) {
        for shard in 0..SHARDS {
            self.sweep_shard(shard);
        }
    }

    /// Sweeps every `every` on the current tokio runtime until the store is dropped. Optional:
    /// decisions sweep incrementally anyway; this also frees memory when traffic stops.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let store: Weak<MemoryStore> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match store.upgrade() {
                    Some(store) => store.sweep(),
                    None => return,
                }
            }
        })
    }

    /// Counts what the store holds (locks each shard in turn).
    pub fn stats(&self) -> MemoryStats {
        let mut stats = MemoryStats::default();
        for shard in self.shards.iter() {
            let map = shard.lock();
            stats.counters += map.len();
            stats.heap_bytes += shard_bytes(&map);
            for (_, tally) in map.iter() {
                let log = tally.series();
                stats.hits += log.hits();
                stats.runs += log.entries();
            }
        }
        stats
    }

    /// The bytes held as the budget accounts them (equal to [`MemoryStats::heap_bytes`]).
    pub fn held_bytes(&self) -> u64 {
        self.budget.held_bytes()
    }

    /// The representation the counter under `key` is held in, if it is held (for tests).
    #[cfg(test)]
    fn form_of(&self, key: &CounterKey) -> Option<Precision> {
        let hash = self.hasher.hash(key);
        let map = self.shards[KeyHasher::shard(hash)].lock();
        map.get(hash, key).map(|tally| match tally {
            Tally::Log(_) => Precision::Exact,
            Tally::Buckets(b) => Precision::Buckets(Duration::from_micros(b.width())),
        })
    }

    /// The incremental sweep of decision `n`: sweeps the next shard in turn, and schedules the
    /// one after it (see the module docs). A decision that finds another one sweeping leaves it.
    fn sweep_next(&self, n: u64) {
        let Some(mut cursor) = self.sweep_cursor.try_lock() else {
            return;
        };
        if n < self.next_sweep.load(Ordering::Relaxed) {
            return; // Swept while this decision waited for the cursor.
        }
        let shard = *cursor;
        *cursor = (shard + 1) % SHARDS;
        let left = self.sweep_shard(shard) as u64;
        self.next_sweep
            .store(n + SWEEP_EVERY.max(left), Ordering::Relaxed);
    }

    /// Sweeps one shard and returns how many counters it still holds.
    fn sweep_shard(&self, shard: usize) -> usize {
        let now = micros(self.clock.now()).saturating_sub(self.epoch);
        let mut map = self.shards[shard].lock();
        // Counted before and after: what the sweep frees.
        let before = shard_bytes(&map);
        map.retain(|tally| {
            let log = tally.series_mut();
            log.trim(now);
            log.shrink();
            !log.is_empty()
        });
        map.shrink(&self.hasher);
        self.budget
            .adjust(signed(shard_bytes(&map)) - signed(before));
        map.len()
    }
}

/// Whether `counter` records its hits: admitted ones if the request is `allowed` and the counter
/// not `over`, charged ones always (returned ones take hits back instead).
fn records(counter: &Counter, over: bool, allowed: bool) -> bool {
    match counter.kind {
        HitKind::Admitted => allowed && !over,
        HitKind::Charged => true,
        HitKind::Returned => false,
    }
}

/// Pass one for one counter: trim, count, decide, and for a deny find when the hits would fit.
fn evaluate(mut log: Option<&mut dyn Series>, counter: &Counter, now: u64, pending: u64) -> Eval {
    let window = micros(counter.window);
    let mut now = now;
    if let Some(log) = log.as_deref_mut() {
        now = now.max(log.newest().unwrap_or(0));
        log.trim(now);
    }
    let stored = log.as_deref().map_or(0, |l| l.hits());
    let count = stored.saturating_add(pending);
    let over = counter.kind != HitKind::Returned
        && (counter.hits > counter.limit || count.saturating_add(counter.hits) > counter.limit);
    let mut reset = 0;
    if over {
        // Entries leave only by time: the request fits once its excess of oldest hits is gone.
        // `hits > limit` never fits, and an excess the log cannot cover (same-key counters of this
        // request) is reported as the whole window.
        reset = window;
        if counter.hits <= counter.limit {
            let excess = count.saturating_add(counter.hits) - counter.limit;
            if let Some(at) = log.as_deref().and_then(|l| l.when_dropped(excess)) {
                reset = at.saturating_sub(now);
            }
        }
    }
    Eval {
        over,
        refused: false,
        count,
        held: stored,
        now,
        reset,
    }
}

/// Pass two for one counter: records the hits if the request was admitted, finds when the oldest
/// hit leaves the window, and drops a log left empty. One map lookup: a counter that records is
/// looked up through `entry` (which creates it), any other through `get_mut`. Also returns the
/// bytes the counter holds afterwards ([`counter_bytes`], 0 when it is gone).
fn settle(
    map: &mut Shard,
    hasher: &KeyHasher,
    hash: u64,
    counter: &Counter,
    eval: &Eval,
    record: bool,
) -> (CounterResult, usize) {
    let mut log = if record {
        Some(map.get_or_insert_with(hasher, hash, &counter.key, || Tally::new(counter)))
    } else {
        map.get_mut(hash, &counter.key)
    }
    .map(Tally::series_mut);
    let mut count = eval.count;
    if let Some(log) = log.as_deref_mut().filter(|_| record) {
        // Past MAX_HELD the oldest hits made room: the counter holds at most that many.
        count = count
            .saturating_add(log.record(eval.now, counter.hits))
            .min(MAX_HELD);
    } else if let Some(log) = log
        .as_deref_mut()
        .filter(|_| counter.kind == HitKind::Returned)
    {
        count = count.saturating_sub(log.take_back(counter.hits));
    }
    let reset = if eval.over {
        eval.reset
    } else {
        let leaves = log.as_deref().and_then(|l| l.oldest_leaves_at());
        leaves.map_or(0, |at| at.saturating_sub(eval.now))
    };
    let bytes = match log {
        Some(l) if l.is_empty() => {
            map.remove(hash, &counter.key);
            0
        }
        Some(l) => counter_bytes(&counter.key, l),
        None => 0,
    };
    let result = CounterResult {
        over_limit: eval.over,
        count,
        remaining: counter.limit.saturating_sub(count),
        reset_after: Duration::from_micros(reset),
    };
    (result, bytes)
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Microseconds, saturating (a window of 584 000 years is as good as infinite).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[async_trait]
impl Store for MemoryStore {
    fn decide<'a>(&'a self, counters: &'a [Counter]) -> Decided<'a> {
        Decided::Now(Some(Ok(self.decide_now(counters))))
    }

    async fn clear(&self, keys: &[CounterKey]) -> Result<Vec<bool>, StoreError> {
        Ok(self.clear_now(keys))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &SHARDS)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ManualClock, Precision};

    const SEC: Duration = Duration::from_secs(1);

    fn new_store() -> (Arc<ManualClock>, MemoryStore) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        (clock, store)
    }

    fn counter(name: &str, limit: u64, window: Duration, hits: u64) -> Counter {
        Counter {
            key: CounterKey::new("test", [("k", name)], window),
            limit,
            window,
            hits,
            shadow: false,
            precision: Precision::Exact,
            kind: HitKind::Admitted,
        }
    }

    #[test]
    fn clock_stepping_back_never_readmits() {
        let (clock, store) = new_store();
        let c = counter("a", 2, 10 * SEC, 1);
        assert!(store.decide_now(std::slice::from_ref(&c)).allowed);
        assert!(store.decide_now(std::slice::from_ref(&c)).allowed);
        clock.set(clock.now() - 60 * SEC);
        let d = store.decide_now(std::slice::from_ref(&c));
        assert!(!d.allowed);
        assert_eq!(d.counters[0].reset_after, 10 * SEC);
    }

    #[test]
    fn same_counter_twice_in_one_request_is_one_log() {
        let (_clock, store) = new_store();
        let c = counter("dup", 3, SEC, 2);
        let d = store.decide_now(&[c.clone(), c.clone()]);
        assert!(!d.allowed, "2 + 2 hits do not fit a limit of 3");
        assert_eq!(store.stats().hits, 0);
        let one = counter("dup", 3, SEC, 1);
        let d = store.decide_now(&[one.clone(), one.clone()]);
        assert!(d.allowed);
        assert_eq!(store.stats().hits, 2);
    }

    #[test]
    fn sweep_drops_idle_counters_and_memory() {
        let (clock, store) = new_store();
        for i in 0..1000 {
            let c = counter(&i.to_string(), 10, SEC, 3);
            assert!(store.decide_now(&[c]).allowed);
        }
        assert_eq!(store.stats().counters, 1000);
        store.sweep();
        assert_eq!(store.stats().counters, 1000, "nothing expired yet");
        clock.advance(SEC);
        store.sweep();
        let stats = store.stats();
        assert_eq!((stats.counters, stats.hits), (0, 0));
        assert!(stats.heap_bytes < 64 * 1024, "{stats:?}");
    }

    #[test]
    fn decisions_sweep_incrementally_without_a_runtime() {
        let (clock, store) = new_store();
        for i in 0..100 {
            store.decide_now(&[counter(&format!("idle{i}"), 10, SEC, 1)]);
        }
        clock.advance(2 * SEC);
        let busy = counter("busy", u64::MAX, SEC, 1);
        for _ in 0..SHARDS as u64 * SWEEP_EVERY {
            store.decide_now(std::slice::from_ref(&busy));
        }
        assert_eq!(store.stats().counters, 1, "only the busy counter is left");
    }

    /// With shards larger than [`SWEEP_EVERY`] counters, incremental sweeps come once per shard's
    /// worth of decisions, not once per `SWEEP_EVERY`: about one counter visit per decision.
    #[test]
    fn sweeps_keep_pace_with_the_shards_not_with_the_decisions() {
        let (_clock, store) = new_store();
        let per_shard = 4 * SWEEP_EVERY as usize;
        for i in 0..SHARDS * per_shard {
            store.decide_now(&[counter(&i.to_string(), 10, 60 * SEC, 1)]);
        }
        let busy = counter("busy", u64::MAX, SEC, 1);
        let decide = |n: u64| {
            for _ in 0..n {
                store.decide_now(std::slice::from_ref(&busy));
            }
        };
        decide(per_shard as u64 * 2); // past the sweeps scheduled while filling
        let before = *store.sweep_cursor.lock();
        decide(per_shard as u64 * 10);
        let swept = (*store.sweep_cursor.lock() + SHARDS - before) % SHARDS;
        // Every 1024 decisions this would have been 40 sweeps.
        assert!((8..=12).contains(&swept), "{swept} shards swept");
    }

    /// A day quota of 10,000,000 in automatic buckets (24 minutes each) taking 200,000 single
    /// hits over a day holds 61 buckets at most, whatever the hits: under 2 KB, where the log
    /// would hold 200,000 runs (1.6 MB).
    #[test]
    fn bucket_counter_memory_is_bounded() {
        let (clock, store) = new_store();
        let day = 86_400 * SEC;
        let precision = Precision::automatic(10_000_000, day);
        assert_eq!(precision, Precision::Buckets(24 * 60 * SEC));
        let c = Counter {
            key: CounterKey::new("test", [("k", "tenant")], day),
            precision,
            ..counter("tenant", 10_000_000, day, 1)
        };
        let mut most = 0;
        for _ in 0..200_000 {
            assert!(store.decide_now(std::slice::from_ref(&c)).allowed);
            clock.advance(day / 200_000);
            most = most.max(store.stats().heap_bytes);
        }
        let stats = store.stats();
        assert_eq!((stats.counters, stats.hits), (1, 200_000));
        assert!(stats.runs <= 61, "{stats:?}");
        eprintln!("one bucket counter, 200 000 hits over a day: {stats:?}, at most {most} B");
        assert!(most < 2048, "{most} bytes");
    }

    /// The figure quoted in the module docs: bytes per tracked hit.
    #[test]
    fn bytes_per_tracked_hit() {
        let (clock, store) = new_store();
        let big = counter("big", 1000, 60 * SEC, 1);
        for _ in 0..1000 {
            assert!(store.decide_now(std::slice::from_ref(&big)).allowed);
            clock.advance(Duration::from_micros(7));
        }
        let stats = store.stats();
        assert_eq!((stats.counters, stats.hits, stats.runs), (1, 1000, 1000));
        let per_hit = stats.heap_bytes as f64 / 1000.0;
        eprintln!("one counter, 1000 single hits: {stats:?}, {per_hit:.2} B/hit");
        assert!(per_hit < 8.5 + 0.2, "{per_hit}");

        let (clock, store) = new_store();
        for i in 0..10_000 {
            let c = counter(&format!("user{i:05}"), 100, 60 * SEC, 1);
            for _ in 0..100 {
                assert!(store.decide_now(std::slice::from_ref(&c)).allowed);
                clock.advance(Duration::from_micros(1));
            }
        }
        let stats = store.stats();
        assert_eq!(stats.hits, 1_000_000);
        let per_hit = stats.heap_bytes as f64 / stats.hits as f64;
        eprintln!("10 000 counters x 100 hits: {stats:?}, {per_hit:.2} B/hit");
        assert!(per_hit < 13.0, "{per_hit}");
    }
}
