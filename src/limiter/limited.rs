//! Who is being limited now (`GET /limited`): the counters that deny most, in a structure of
//! fixed size fed by denies only.
//!
//! Space-Saving (Metwally et al.): [`CAPACITY`] slots in [`SHARDS`] shards. A deny of a counter
//! already held adds one to its slot; a new counter takes a free slot, else the slot of a counter
//! not denied for [`RECENT`], else the slot with the fewest denies, starting from that count (so
//! its `denied` may overstate by at most what it inherited, reported as `overstated`). A counter
//! denied more than `total denies / CAPACITY` times is always held. A flood of distinct denied
//! keys therefore never grows it, and a slot is looked up by comparing at most
//! `CAPACITY / SHARDS` keys (an `Arc` clone of the counter's key is all a new slot copies besides
//! the rule's label). An allowed call never reaches it.
//!
//! A counter that has not been denied for [`RECENT`] is not listed, and its slot is the first to go:
//! `denied` counts the denies since `first`, over an unbroken run without a gap of `RECENT`.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;

use crate::store::CounterKey;

/// Slots in all: the most counters listed.
pub const CAPACITY: usize = 256;

const SHARDS: usize = 8;

/// A counter not denied for this long is no longer listed.
pub const RECENT: Duration = Duration::from_secs(60);

/// One counter being denied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitedKey {
    /// The deciding counter (its domain and entries: [`CounterKey::decode`]).
    pub key: CounterKey,
    /// The metrics `rule` label of the rule (or limit) that denied it.
    pub rule: Box<str>,
    /// Denies since `first` (at most `overstated` more than the truth).
    pub denied: u64,
    /// What the slot's previous counter had when this one took it over.
    pub overstated: u64,
    pub first: SystemTime,
    pub last: SystemTime,
}

/// The counters that deny most; see the module docs.
pub struct LimitedKeys {
    shards: Box<[Mutex<Vec<LimitedKey>>]>,
    hasher: RandomState,
}

impl Default for LimitedKeys {
    fn default() -> Self {
        LimitedKeys {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Vec::with_capacity(CAPACITY / SHARDS)))
                .collect(),
            hasher: RandomState::new(),
        }
    }
}

impl std::fmt::Debug for LimitedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitedKeys").finish_non_exhaustive()
    }
}

impl LimitedKeys {
    /// Counts one deny of `key` by `rule` at `now`.
    pub fn deny(&self, key: &CounterKey, rule: &str, now: SystemTime) {
        let shard = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        let mut slots = self.shards[shard].lock();
        if let Some(slot) = slots.iter_mut().find(|s| s.key == *key) {
            if is_stale(slot, now) {
                // A new run: the count of the old one is history.
                (slot.denied, slot.overstated, slot.first) = (0, 0, now);
            }
            slot.denied += 1;
            slot.last = now;
            if *slot.rule != *rule {
                slot.rule = rule.into();
            }
            return;
        }
        let fresh = LimitedKey {
            key: key.clone(),
            rule: rule.into(),
            denied: 1,
            overstated: 0,
            first: now,
            last: now,
        };
        if slots.len() < CAPACITY / SHARDS {
            slots.push(fresh);
            return;
        }
        // The slot to take: a stale one, else the one with the fewest denies.
        let victim = slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| (!is_stale(s, now), s.denied))
            .map(|(i, _)| i);
        if let Some(i) = victim {
            let inherited = if is_stale(&slots[i], now) {
                0
            } else {
                slots[i].denied
            };
            slots[i] = LimitedKey {
                denied: inherited + 1,
                overstated: inherited,
                ..fresh
            };
        }
    }

    /// The counters denied within [`RECENT`] of `now`, most denied first.
    pub fn top(&self, now: SystemTime) -> Vec<LimitedKey> {
        let mut listed: Vec<LimitedKey> = self
            .shards
            .iter()
            .flat_map(|shard| {
                let slots = shard.lock();
                slots
                    .iter()
                    .filter(|s| !is_stale(s, now))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        listed.sort_by(|a, b| b.denied.cmp(&a.denied).then(b.last.cmp(&a.last)));
        listed
    }

    /// Slots in use (at most [`CAPACITY`]).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn is_stale(slot: &LimitedKey, now: SystemTime) -> bool {
    now.duration_since(slot.last)
        .is_ok_and(|since| since >= RECENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> CounterKey {
        CounterKey::new(
            "d",
            [("user", i.to_string().as_str())],
            Duration::from_secs(60),
        )
    }

    #[test]
    fn the_heaviest_stay_listed_under_a_flood_of_distinct_keys() {
        let limited = LimitedKeys::default();
        let t0 = SystemTime::now();
        for round in 0..100 {
            limited.deny(&key(0), "per_user", t0);
            limited.deny(&key(1), "per_user", t0);
            for i in 0..50 {
                limited.deny(&key(1000 + round * 50 + i), "per_user", t0);
            }
        }
        assert_eq!(limited.len(), CAPACITY);
        let top = limited.top(t0);
        assert_eq!(top.len(), CAPACITY);
        let heavy: Vec<&CounterKey> = top.iter().take(2).map(|k| &k.key).collect();
        assert!(
            heavy.contains(&&key(0)) && heavy.contains(&&key(1)),
            "{top:?}"
        );
        assert!(top[0].denied >= 100);
        assert_eq!(top[0].rule.as_ref(), "per_user");
    }

    #[test]
    fn a_counter_not_denied_for_a_while_is_not_listed_and_starts_again() {
        let limited = LimitedKeys::default();
        let t0 = SystemTime::now();
        limited.deny(&key(0), "r", t0);
        limited.deny(&key(0), "r", t0);
        assert_eq!(limited.top(t0)[0].denied, 2);
        let later = t0 + RECENT;
        assert!(limited.top(later).is_empty());
        limited.deny(&key(0), "r", later);
        let again = limited.top(later);
        assert_eq!((again[0].denied, again[0].first), (1, later));
    }
}
