//! The exact local deny cache of the Redis store.
//!
//! Hits leave a sliding log only by time. So when Redis says that a counter cannot take even one
//! more hit for the next `d`, nothing any replica does can make room before `d` has passed: every
//! request on that counter is denied until then, and asking Redis again is wasted work. The store
//! remembers `t0 + d` per counter, where `t0` is the local [`Instant`] taken *before* the request
//! was sent (Redis decided after `t0`, so the remembered instant is never later than the truth),
//! and denies such requests locally until then. When that instant passes, the first request to
//! notice asks Redis and the others wait for its answer (single flight), so a flood on an exhausted
//! key costs about one Redis call per reset instead of one per request (or one per request in
//! flight at the moment of the reset).
//!
//! Only enforced counters are cached (a shadow counter never denies). The entry is keyed by counter
//! key *and* limit, so a reload that raises a limit does not keep the old answer. It is exact only
//! while nothing but time removes hits. That holds for standalone Redis. In a cluster, a request
//! whose counters span several slots may have its hits taken back early (the compensation of a
//! cross-slot deny); the script keeps those hits in a provisional log too, and reports a counter
//! that they help fill as uncertain ([`Reported::provisional`]), which is never cached.
//!
//! [`Reported::provisional`]: super::script::Reported::provisional
//!
//! Bounded: [`SHARDS`] maps of at most `capacity / SHARDS` entries; a full shard first drops
//! expired entries and otherwise skips caching (the request then simply goes to Redis).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use foldhash::fast::FixedState;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::store::CounterKey;

const SHARDS: usize = 16;

/// Room (hits) up to which a refreshed counter stays single-flight (see [`DenyCache::settle`]).
pub const HANDOVER_ROOM: u64 = 8;

/// What the cache holds for one counter.
enum Slot {
    /// One hit cannot fit before this instant.
    DeniedUntil(Instant),
    /// The deny expired and one request is asking Redis again; the others wait for its answer
    /// instead of all asking at once (single flight). The sender lives in that request's
    /// [`Refresh`]: when it is dropped (answer stored, error, or the request cancelled), the
    /// receivers wake.
    Refreshing(watch::Receiver<()>),
}

/// (counter key, limit) → slot. Hashed with foldhash under a seed drawn from `rand` per map (and
/// per cache for the shard): every request looks each of its counters up, and SipHash, twice per
/// lookup, cost some 500 instructions a request. A client chooses the keys but not the seeds;
/// foldhash does not claim to resist one who can time the lookups, so what bounds the harm is the
/// shard: at most `capacity / SHARDS` entries, and only of counters the client got denied.
type Entries = HashMap<(CounterKey, u64), Slot, FixedState>;

/// What a request should do about one counter.
pub enum Lookup {
    /// Nothing known: ask Redis.
    Miss,
    /// Full for this long: deny locally.
    Denied(Duration),
    /// Another request is refreshing this counter: wait until it is done, then look again.
    Wait(watch::Receiver<()>),
    /// The deny just expired and this request refreshes it: ask Redis, store the answer with
    /// [`DenyCache::insert`] or [`DenyCache::settle`], then drop the [`Refresh`].
    Lead(Refresh),
}

/// Held by the one request that refreshes an expired deny; dropping it wakes the waiters.
pub struct Refresh {
    done: watch::Sender<()>,
}

impl Refresh {
    /// Requests waiting for this refresh (each holds a receiver; the slot holds one more).
    pub fn waiters(&self) -> usize {
        self.done.receiver_count().saturating_sub(1)
    }
}

/// Counter key and limit → instant before which one hit cannot fit.
pub struct DenyCache {
    shards: Box<[Mutex<Entries>]>,
    per_shard: usize,
    hasher: FixedState,
    /// Bumped by every [`DenyCache::clear`]: an answer read from Redis before a clear is not
    /// remembered after it ([`DenyCache::insert_read_in`]).
    epoch: AtomicU64,
}

impl DenyCache {
    /// A cache of at most about `capacity` counters (at least one per shard).
    pub fn new(capacity: usize) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_hasher(seeded())))
                .collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            hasher: seeded(),
            epoch: AtomicU64::new(0),
        }
    }

    /// What to do about a counter at `now`. Only counters that were denied before are in the
    /// cache, so a counter that is not full costs one map lookup and nothing else.
    pub fn lookup(&self, key: &CounterKey, limit: u64, now: Instant) -> Lookup {
        let id = (key.clone(), limit);
        let mut shard = self.shard(&id).lock();
        let Some(slot) = shard.get_mut(&id) else {
            return Lookup::Miss;
        };
        match slot {
            Slot::DeniedUntil(until) if *until > now => Lookup::Denied(*until - now),
            // A refresh in flight, its leader still alive: wait for it.
            Slot::Refreshing(done) if done.has_changed().is_ok() => Lookup::Wait(done.clone()),
            // Expired, or the leader went away without an answer: this request leads.
            _ => {
                let (tx, rx) = watch::channel(());
                *slot = Slot::Refreshing(rx);
                Lookup::Lead(Refresh { done: tx })
            }
        }
    }

    /// The time left until one hit fits, if the counter is known to be full at `now`.
    pub fn denied_for(&self, key: &CounterKey, limit: u64, now: Instant) -> Option<Duration> {
        match self.lookup(key, limit, now) {
            Lookup::Denied(wait) => Some(wait),
            _ => None,
        }
    }

    /// Remembers that one hit cannot fit before `until` (replacing a refresh in flight).
    pub fn insert(&self, key: &CounterKey, limit: u64, until: Instant, now: Instant) {
        self.insert_read_in(self.epoch(), key, limit, until, now);
    }

    /// [`DenyCache::insert`] of an answer asked in `epoch` (read before the request was sent):
    /// nothing when the cache was cleared since, because the counter may have been reset after
    /// Redis answered. Compared under the shard's lock, which [`DenyCache::clear`] takes after
    /// bumping the epoch: an insert either sees the new epoch or is cleared.
    pub fn insert_read_in(
        &self,
        epoch: u64,
        key: &CounterKey,
        limit: u64,
        until: Instant,
        now: Instant,
    ) {
        if until <= now {
            return;
        }
        let id = (key.clone(), limit);
        let mut shard = self.shard(&id).lock();
        if self.epoch() != epoch {
            return;
        }
        if shard.len() >= self.per_shard && !shard.contains_key(&id) {
            // Drop expired denies and handed-over refreshes that nobody leads.
            shard.retain(|_, slot| match slot {
                Slot::DeniedUntil(until) => *until > now,
                Slot::Refreshing(done) => done.has_changed().is_ok(),
            });
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(id, Slot::DeniedUntil(until));
    }

    /// A refreshed counter turned out to have room for `remaining` more hits. If that is little
    /// (less than the requests waiting, or at most `HANDOVER_ROOM`), letting everyone go to
    /// Redis at once would mostly bring back denies: keep the slot, so that when `refresh` is
    /// dropped the next request leads the next refresh and the others wait again. With more
    /// room, forget the counter.
    pub fn settle(&self, key: &CounterKey, limit: u64, remaining: u64, refresh: &Refresh) {
        if remaining < (refresh.waiters() as u64).max(HANDOVER_ROOM + 1) {
            return;
        }
        let id = (key.clone(), limit);
        let mut shard = self.shard(&id).lock();
        if matches!(shard.get(&id), Some(Slot::Refreshing(_))) {
            shard.remove(&id);
        }
    }

    /// Forgets what is known of a counter (its hits were taken back, so it may have room now).
    pub fn forget(&self, key: &CounterKey, limit: u64) {
        let id = (key.clone(), limit);
        let mut shard = self.shard(&id).lock();
        if matches!(shard.get(&id), Some(Slot::DeniedUntil(_))) {
            shard.remove(&id);
        }
    }

    /// The clears so far; read before asking Redis, for [`DenyCache::insert_read_in`].
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Forgets everything (counters were reset, here or through another replica), and refuses
    /// what requests in flight read before now.
    pub fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        for shard in self.shards.iter() {
            shard.lock().clear();
        }
    }

    /// Entries held (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, id: &(CounterKey, u64)) -> &Mutex<Entries> {
        &self.shards[(self.hasher.hash_one(id) % SHARDS as u64) as usize]
    }
}

/// foldhash's state under a seed from `rand` (its own `RandomState` derives one from addresses
/// and the time).
fn seeded() -> FixedState {
    FixedState::with_seed(rand::random())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> CounterKey {
        CounterKey::new("d", [("k", name)], Duration::from_secs(1))
    }

    #[test]
    fn a_clear_forgets_everything_and_refuses_answers_read_before_it() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(60);
        cache.insert(&key("a"), 5, later, t0);
        let read_before = cache.epoch();
        cache.clear();
        assert!(cache.is_empty());
        cache.insert_read_in(read_before, &key("b"), 5, later, t0);
        assert_eq!(cache.denied_for(&key("b"), 5, t0), None);
        cache.insert_read_in(cache.epoch(), &key("b"), 5, later, t0);
        assert!(cache.denied_for(&key("b"), 5, t0).is_some());
    }

    #[test]
    fn denies_until_the_instant_then_forgets() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        cache.insert(&key("a"), 5, t0 + Duration::from_millis(300), t0);
        assert_eq!(
            cache.denied_for(&key("a"), 5, t0 + Duration::from_millis(100)),
            Some(Duration::from_millis(200))
        );
        assert_eq!(cache.denied_for(&key("a"), 6, t0), None, "other limit");
        assert_eq!(cache.denied_for(&key("b"), 5, t0), None);
        assert_eq!(
            cache.denied_for(&key("a"), 5, t0 + Duration::from_millis(300)),
            None
        );
        assert_eq!(cache.len(), 1, "that look made it the refresher");
        let Lookup::Lead(refresh) = cache.lookup(&key("a"), 5, t0) else {
            panic!("its refresh was dropped: the next look leads");
        };
        // An answer with little room keeps it single-flight; with ample room it is forgotten.
        cache.settle(&key("a"), 5, HANDOVER_ROOM, &refresh);
        assert_eq!(cache.len(), 1);
        cache.settle(&key("a"), 5, HANDOVER_ROOM + 1, &refresh);
        assert_eq!(cache.len(), 0);
    }

    #[tokio::test]
    async fn one_request_refreshes_an_expired_deny_while_the_others_wait() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(10);
        cache.insert(&key("a"), 5, t1, t0);
        let Lookup::Lead(refresh) = cache.lookup(&key("a"), 5, t1) else {
            panic!("the first look after expiry leads");
        };
        let Lookup::Wait(mut waiter) = cache.lookup(&key("a"), 5, t1) else {
            panic!("the second look waits");
        };
        // The leader learns the counter is still full and stores that before letting go.
        cache.insert(&key("a"), 5, t1 + Duration::from_millis(50), t1);
        drop(refresh);
        assert!(waiter.changed().await.is_err(), "the waiter wakes");
        assert!(matches!(cache.lookup(&key("a"), 5, t1), Lookup::Denied(_)));
    }

    #[test]
    fn a_leader_that_gives_up_hands_over() {
        let cache = DenyCache::new(100);
        let t0 = Instant::now();
        cache.insert(&key("a"), 5, t0 + Duration::from_millis(1), t0);
        let later = t0 + Duration::from_millis(2);
        let Lookup::Lead(refresh) = cache.lookup(&key("a"), 5, later) else {
            panic!("leads");
        };
        drop(refresh); // e.g. the Redis call failed or timed out
        assert!(matches!(cache.lookup(&key("a"), 5, later), Lookup::Lead(_)));
    }

    #[test]
    fn stays_bounded() {
        let cache = DenyCache::new(32);
        let t0 = Instant::now();
        for i in 0..1000 {
            cache.insert(&key(&i.to_string()), 1, t0 + Duration::from_secs(1), t0);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
        // Expired entries make room.
        let later = t0 + Duration::from_secs(2);
        for i in 0..1000 {
            cache.insert(
                &key(&format!("n{i}")),
                1,
                later + Duration::from_secs(1),
                later,
            );
        }
        assert!(cache.len() <= 32);
        assert!(cache.len() >= 16, "{}", cache.len());
    }
}
