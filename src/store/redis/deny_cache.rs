//! The exact local deny cache of the Redis store.
//!
//! Hits leave a sliding log only by time. So when Redis says that a counter cannot take even one
//! more hit for the next `d`, nothing any replica does can make room before `d` has passed: every
//! request on that counter is denied until then, and asking Redis again is wasted work. The store
//! remembers `t0 + d` per counter, where `t0` is the local [`Instant`] taken *before* the request
//! was sent (Redis decided after `t0`, so the remembered instant is never later than the truth),
//! and denies such requests locally until then: under a flood on an exhausted key, about one Redis
//! call per reset instead of one per request.
//!
//! Only enforced counters are cached (a shadow counter never denies). The entry is keyed by counter
//! key *and* limit, so a reload that raises a limit does not keep the old answer. It is exact only
//! while nothing but time removes hits: that holds for standalone Redis, not for a cluster, whose
//! cross-slot compensation takes hits back early, so the cluster store runs without this cache.
//!
//! Bounded: [`SHARDS`] maps of at most `capacity / SHARDS` entries; a full shard first drops
//! expired entries and otherwise skips caching (the request then simply goes to Redis).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::store::CounterKey;

const SHARDS: usize = 16;

/// (counter key, limit) → instant before which one hit cannot fit.
type Entries = HashMap<(CounterKey, u64), Instant>;

/// Counter key and limit → instant before which one hit cannot fit.
pub struct DenyCache {
    shards: Box<[Mutex<Entries>]>,
    per_shard: usize,
    hasher: RandomState,
}

impl DenyCache {
    /// A cache of at most about `capacity` counters (at least one per shard).
    pub fn new(capacity: usize) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            hasher: RandomState::new(),
        }
    }

    /// The time left until one hit fits, if the counter is known to be full at `now`.
    pub fn denied_for(&self, key: &CounterKey, limit: u64, now: Instant) -> Option<Duration> {
        let id = (key.clone(), limit);
        let mut shard = self.shard(&id).lock();
        let until = *shard.get(&id)?;
        if until > now {
            Some(until - now)
        } else {
            shard.remove(&id);
            None
        }
    }

    /// Remembers that one hit cannot fit before `until`.
    pub fn insert(&self, key: &CounterKey, limit: u64, until: Instant, now: Instant) {
        if until <= now {
            return;
        }
        let id = (key.clone(), limit);
        let mut shard = self.shard(&id).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&id) {
            shard.retain(|_, until| *until > now);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(id, until);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> CounterKey {
        CounterKey::new("d", [("k", name)], Duration::from_secs(1))
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
        assert_eq!(cache.len(), 0);
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
