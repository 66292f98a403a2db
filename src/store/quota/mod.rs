//! Quota ledgers: what the Rate Limit Quota Service has assigned of each bucket's limits, kept
//! where counters are kept so that the service only asks and answers.
//!
//! [`ledger`] holds the arithmetic of one bucket (the shares and the bound they keep);
//! [`QuotaLedgers`] is the table of every bucket's ledger, and what bounds it: a client shapes
//! bucket ids, so neither all of them together nor one peer's may grow it without a bound.
//!
//! The ledgers live in this process. With several replicas, each holds the bound for the Envoys
//! connected to it; this table is the one place a shared (Redis) ledger would take over.

pub mod ledger;

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;

pub use ledger::{Assignment, Grant, Ledger, LedgerView, Quota, TTL, TokenBucket, Usage};

/// The key of a bucket's ledger: a digest of its domain and counter entries, 32 bytes whatever
/// the size of the id.
pub type LedgerKey = [u8; 32];

/// The key of these parts (SHA-256 of each part after its length: a key or value may hold any
/// byte, a NUL too, and no two lists of parts are written the same, so no id reaches another's
/// ledger).
pub fn ledger_key<'a>(parts: impl IntoIterator<Item = &'a str>) -> LedgerKey {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(&(part.len() as u64).to_le_bytes());
        context.update(part.as_bytes());
    }
    let mut out = [0; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

/// Why a bucket without a ledger gets none (and is denied until one can be made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// The table holds its most ledgers.
    All,
    /// The peer asking has made its most ledgers that are still kept.
    Peer,
}

/// The ledgers of every bucket, by [`LedgerKey`]; `P` names a peer (who made a ledger).
pub struct QuotaLedgers<P> {
    max_ledgers: usize,
    max_per_peer: usize,
    table: Mutex<Table<P>>,
}

struct Table<P> {
    ledgers: HashMap<LedgerKey, (Ledger, P)>,
    /// How many of the ledgers each peer made.
    made_by: HashMap<P, usize>,
    /// Assignments since the last sweep of idle ledgers.
    since_sweep: usize,
    /// When the last sweep was (when full, one happens at most once a second).
    last_sweep: Duration,
}

/// Assignments between two sweeps of idle ledgers, when the table is not full.
const SWEEP_EVERY: usize = 1024;

impl<P: Copy + Eq + Hash> QuotaLedgers<P> {
    /// A table of at most `max_ledgers`, of which one peer makes at most `max_per_peer`.
    pub fn new(max_ledgers: usize, max_per_peer: usize) -> QuotaLedgers<P> {
        QuotaLedgers {
            max_ledgers,
            max_per_peer,
            table: Mutex::new(Table {
                ledgers: HashMap::new(),
                made_by: HashMap::new(),
                since_sweep: 0,
                last_sweep: Duration::ZERO,
            }),
        }
    }

    /// What `holder` (one bucket of one stream, of `peer`), reporting `usage`, gets of the bucket
    /// `key` at `now` under `quotas` ([`Ledger::assign`], `fresh` too), and how much of the
    /// bucket's limits is handed out then (the largest [`Ledger::assigned_ratio`]); a bucket
    /// without a ledger gets one if the table and the peer have room. `now` is read once the
    /// table is locked, so that no wait for the lock shortens a grant's life.
    pub fn assign(
        &self,
        key: LedgerKey,
        (holder, peer): (u64, P),
        now: impl FnOnce() -> Duration,
        usage: Usage,
        quotas: &[Quota],
        fresh: bool,
    ) -> Result<(Assignment, f64), Full> {
        let mut table = self.table.lock();
        let now = now();
        table.since_sweep += 1;
        let full = table.ledgers.len() >= self.max_ledgers;
        let peer_full = || table.made_by.get(&peer).copied().unwrap_or(0) >= self.max_per_peer;
        let short = full || peer_full();
        if table.since_sweep >= SWEEP_EVERY
            || (short && now >= table.last_sweep + Duration::from_secs(1))
        {
            table.sweep(now);
        }
        if !table.ledgers.contains_key(&key) {
            if table.ledgers.len() >= self.max_ledgers {
                return Err(Full::All);
            }
            let made = table.made_by.entry(peer).or_default();
            if *made >= self.max_per_peer {
                return Err(Full::Peer);
            }
            *made += 1;
            table.ledgers.insert(key, (Ledger::default(), peer));
        }
        let (ledger, _) = table.ledgers.get_mut(&key).ok_or(Full::All)?;
        let assignment = ledger.assign(holder, now, usage, quotas, fresh);
        let assigned = (quotas.iter())
            .map(|q| ledger.assigned_ratio(q))
            .fold(0.0, f64::max);
        Ok((assignment, assigned))
    }

    /// What the ledger of bucket `key` shows at `now`, if it has one.
    pub fn view(&self, key: &LedgerKey, now: Duration) -> Option<LedgerView> {
        let table = self.table.lock();
        table.ledgers.get(key).map(|(ledger, _)| ledger.view(now))
    }

    /// How many ledgers are kept.
    pub fn len(&self) -> usize {
        self.table.lock().ledgers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<P: Copy + Eq + Hash> Table<P> {
    /// Drops the ledgers that hold and hear nothing any more.
    fn sweep(&mut self, now: Duration) {
        self.since_sweep = 0;
        self.last_sweep = now;
        let made_by = &mut self.made_by;
        self.ledgers.retain(|_, (ledger, peer)| {
            let idle = ledger.is_idle(now);
            if idle && let Some(made) = made_by.get_mut(peer) {
                *made -= 1;
            }
            !idle
        });
        made_by.retain(|_, made| *made > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn per_minute(n: u64) -> [Quota; 1] {
        [Quota { n, window: 60 * S }]
    }

    /// One peer makes at most its share of ledgers, so it cannot fill the table for the others;
    /// a ledger that is known takes no room; ledgers that hold nothing any more give their room
    /// back to the peer that made them.
    #[test]
    fn one_peer_cannot_fill_the_table() {
        let ledgers = QuotaLedgers::<u8>::new(5, 2);
        let quotas = per_minute(10);
        let assign = |bucket: u32, holder: u64, peer: u8, now: Duration| {
            let key = ledger_key([bucket.to_string().as_str()]);
            let now = || now;
            (ledgers.assign(key, (holder, peer), now, Usage::default(), &quotas, false)).map(|_| ())
        };
        assert_eq!(assign(1, 1, b'a', S), Ok(()));
        assert_eq!(assign(2, 2, b'a', S), Ok(()));
        assert_eq!(assign(3, 3, b'a', S), Err(Full::Peer));
        assert_eq!(
            assign(1, 4, b'a', S),
            Ok(()),
            "a known bucket is no new ledger"
        );
        for (bucket, peer) in [(3, b'b'), (4, b'b'), (5, b'c')] {
            assert_eq!(assign(bucket, 10 + u64::from(bucket), peer, S), Ok(()));
        }
        assert_eq!(assign(6, 20, b'd', S), Err(Full::All));
        assert_eq!(ledgers.len(), 5);
        // Grants end a TTL (and the answer's delivery) after they were sent, and count a window
        // longer: after that every ledger is idle and is swept when the table is full.
        let later = S + TTL + 4 * S + 60 * S;
        assert_eq!(assign(6, 21, b'a', later), Ok(()));
        assert_eq!(ledgers.len(), 1);
        assert_eq!(assign(7, 22, b'a', later), Ok(()));
        assert_eq!(assign(8, 23, b'a', later), Err(Full::Peer));
    }

    /// A bucket id cannot be shaped to reach another bucket's ledger: parts are told apart by
    /// their lengths, whatever bytes they hold.
    #[test]
    fn keys_tell_every_list_of_parts_apart() {
        assert_ne!(ledger_key(["a\0b", "c"]), ledger_key(["a", "b\0c"]));
        assert_ne!(ledger_key(["ab", ""]), ledger_key(["a", "b"]));
        assert_ne!(ledger_key(["d", "k", "v"]), ledger_key(["d", "k"]));
        assert_eq!(ledger_key(["d", "k", "v"]), ledger_key(["d", "k", "v"]));
    }
}
