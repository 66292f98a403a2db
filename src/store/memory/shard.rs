//! One shard's counters: a hash table looked up by a hash the store computes once per counter.
//!
//! Keys carry what clients send, so they are hashed with SipHash under a per-process random key
//! (a hash a client could predict would let it pile its keys into one bucket). That is the
//! dearest hash there is, and a `std` map computes it again on every lookup: picking the shard,
//! evaluating and settling a counter took three runs over a key of some 40 bytes, about 700
//! instructions of a call. Here the store hashes a key once ([`KeyHasher::hash`]), picks the shard
//! from that hash's middle bits and hands the same hash to every lookup; the table rehashes keys
//! only when it grows or shrinks.

use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use super::{SHARDS, Tally};
use crate::store::CounterKey;

/// Hashes counter keys, and maps a hash to its shard.
#[derive(Debug, Default)]
pub(super) struct KeyHasher(RandomState);

impl KeyHasher {
    pub(super) fn hash(&self, key: &CounterKey) -> u64 {
        self.0.hash_one(key)
    }

    /// The shard of a key hashed to `hash`. Bits 32 and up: the table takes its bucket from the
    /// low bits and its tag from the top seven, which would all be alike within a shard if the
    /// shard took them too.
    pub(super) fn shard(hash: u64) -> usize {
        (hash >> 32) as usize % SHARDS
    }
}

/// A shard's map from counter key to its state.
#[derive(Debug, Default)]
pub(super) struct Shard {
    table: HashTable<(CounterKey, Tally)>,
}

impl Shard {
    #[cfg(test)]
    pub(super) fn get(&self, hash: u64, key: &CounterKey) -> Option<&Tally> {
        self.table
            .find(hash, |(k, _)| k == key)
            .map(|(_, tally)| tally)
    }

    pub(super) fn get_mut(&mut self, hash: u64, key: &CounterKey) -> Option<&mut Tally> {
        self.table
            .find_mut(hash, |(k, _)| k == key)
            .map(|(_, tally)| tally)
    }

    /// The counter under `key`, created by `make` if there is none. Looks before it reserves: a
    /// full table grows only for a new counter, never for a hit on one it holds (an `entry`
    /// reserves first), so an existing counter's hit never allocates past the memory budget.
    pub(super) fn get_or_insert_with(
        &mut self,
        hasher: &KeyHasher,
        hash: u64,
        key: &CounterKey,
        make: impl FnOnce() -> Tally,
    ) -> &mut Tally {
        let found = match self.table.find_entry(hash, |(k, _)| k == key) {
            Ok(found) => found,
            Err(absent) => {
                absent
                    .into_table()
                    .insert_unique(hash, (key.clone(), make()), |(k, _)| hasher.hash(k))
            }
        };
        &mut found.into_mut().1
    }

    pub(super) fn remove(&mut self, hash: u64, key: &CounterKey) -> Option<Tally> {
        let found = self.table.find_entry(hash, |(k, _)| k == key).ok()?;
        Some(found.remove().0.1)
    }

    /// Keeps the counters for which `keep` says so.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&mut Tally) -> bool) {
        self.table.retain(|(_, tally)| keep(tally));
    }

    /// Gives back slots when at most a quarter are used.
    pub(super) fn shrink(&mut self, hasher: &KeyHasher) {
        if self.table.capacity() > 4 * self.table.len() + 16 {
            self.table.shrink_to_fit(|(k, _)| hasher.hash(k));
        }
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&CounterKey, &Tally)> {
        self.table.iter().map(|(key, tally)| (key, tally))
    }
}
