//! Deadlines in Redis's clock: a script call that reaches Redis after its caller gave up decides
//! nothing and records nothing.
//!
//! A call that times out at `--redis-timeout` is not taken back from the socket: a stalled Redis
//! (frozen, swapping, busy with a slow command) runs it when it resumes. Without a deadline its
//! hits would count although the caller was answered by the failure mode. So every call carries
//! the moment its earliest caller gives up, translated into the server's clock, and the script
//! compares it with `TIME` before it reads or writes anything (`ARGV[3]` in
//! `sliding_window/1_clock.lua`).
//!
//! # The estimate
//! Every reply carries the server's `TIME` at the moment the script ran (`T`, microseconds). That
//! moment lies between the call's send (`S`) and the arrival of its reply (`R`) on our monotonic
//! clock, so the offset `θ = redis − local` lies in `[T − R, T − S]`. The store keeps the largest
//! lower bound `T − R` seen, which is never later than the truth: a deadline translated with it is
//! at most the caller's real deadline, early by at most the one-way latency of the best reply
//! seen (tens of microseconds on a LAN, against a timeout of milliseconds). Consequences:
//! - **One-way latency** is the only error, and it errs early: a call that starts on Redis within
//!   that latency before its caller's deadline may be refused although the caller still waits; the
//!   caller is then answered by the failure mode, as it would be a moment later.
//! - **Before the first reply** there is no estimate: those calls go without a deadline (`0`).
//! - **Clock jumps.** Our side uses a monotonic clock and never jumps. A server clock that jumps
//!   forward raises the next lower bound, which replaces the estimate. One that jumps back (or
//!   runs slow) is caught when the estimate exceeds a reply's upper bound `T − S`: the estimate is
//!   then provably stale and is replaced by that reply's lower bound. Until that reply, deadlines
//!   are late by the jump (less protection, no false refusals); a forward jump can refuse the calls
//!   already sent with the old estimate, once.
//! - **Several lanes and threads** share one estimate per server: updates are atomic
//!   (`fetch_max`, or a compare-and-swap when a stale estimate is replaced).
//! - **Cluster nodes** have their own clocks, so a cluster keeps one estimate per hash slot (a
//!   reply's `T` comes from the node that ran the script). After a slot moves, its first calls
//!   use the old node's offset: late or early by the two nodes' clock difference (milliseconds
//!   under NTP), corrected by the first reply.
//!
//! # What it guarantees
//! A script call that starts on Redis after its earliest caller's deadline records nothing and
//! answers "expired". A call that starts before the deadline but whose reply arrives after it
//! (the stall happened while the script ran or on the way back) still records its hits: the store
//! counts those in `slidegate_redis_late_recorded_total`, and the expired ones in
//! `slidegate_redis_deadline_expired_total`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use ::redis::cluster_routing::Slot;

/// Redis Cluster's number of hash slots.
const SLOTS: u16 = 16384;

/// No estimate yet.
const UNKNOWN: i64 = i64::MIN;

/// The offset of each server's clock from ours, as far as replies tell (see the module docs).
#[derive(Debug)]
pub struct ServerClocks {
    /// Our clock's zero: local times are microseconds since it.
    epoch: Instant,
    /// Standalone: the server's offset (µs), or [`UNKNOWN`].
    single: AtomicI64,
    /// Cluster: one offset per slot (empty on standalone). Built once, read without locks.
    per_slot: HashMap<Slot, AtomicI64>,
}

impl ServerClocks {
    /// Estimates for one server (`cluster` false) or for every slot of a cluster.
    pub fn new(cluster: bool) -> ServerClocks {
        let per_slot = if cluster {
            (0..SLOTS)
                .filter_map(Slot::new)
                .map(|slot| (slot, AtomicI64::new(UNKNOWN)))
                .collect()
        } else {
            HashMap::new()
        };
        ServerClocks {
            epoch: Instant::now(),
            single: AtomicI64::new(UNKNOWN),
            per_slot,
        }
    }

    fn offset(&self, slot: Option<Slot>) -> &AtomicI64 {
        slot.and_then(|s| self.per_slot.get(&s))
            .unwrap_or(&self.single)
    }

    fn local(&self, at: Instant) -> i64 {
        let micros = at.saturating_duration_since(self.epoch).as_micros();
        i64::try_from(micros).unwrap_or(i64::MAX)
    }

    /// `deadline` in the clock of the server holding `slot` (microseconds of its `TIME`), never
    /// later than the truth; 0 (no deadline) while nothing is known about that server.
    pub fn deadline(&self, slot: Option<Slot>, deadline: Instant) -> u64 {
        let offset = self.offset(slot).load(Ordering::Relaxed);
        if offset == UNKNOWN {
            return 0;
        }
        let at = self.local(deadline).saturating_add(offset);
        u64::try_from(at).unwrap_or(0).max(1)
    }

    /// A reply sent at `sent` and received at `received` reported the server's `TIME` `now`
    /// (microseconds).
    pub fn observe(&self, slot: Option<Slot>, sent: Instant, received: Instant, now: u64) {
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let lower = now.saturating_sub(self.local(received));
        let upper = now.saturating_sub(self.local(sent));
        let offset = self.offset(slot);
        let current = offset.fetch_max(lower, Ordering::Relaxed);
        if current > upper {
            // The server's clock went back (or runs slow): the estimate is provably too late.
            let _ = offset.compare_exchange(current, lower, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SECOND: u64 = 1_000_000;

    #[test]
    fn no_deadline_before_the_first_reply() {
        let clocks = ServerClocks::new(false);
        assert_eq!(clocks.deadline(None, Instant::now()), 0);
    }

    #[test]
    fn the_deadline_is_never_later_than_the_truth() {
        let clocks = ServerClocks::new(false);
        // The server's clock is our epoch + 1000 s; a reply took 2 ms, the script ran 0.5 ms in.
        let sent = clocks.epoch + Duration::from_millis(10);
        let ran = sent + Duration::from_micros(500);
        let received = sent + Duration::from_millis(2);
        let truth = |at: Instant| 1000 * SECOND + clocks.local(at) as u64;
        clocks.observe(None, sent, received, truth(ran));
        let deadline = received + Duration::from_millis(50);
        let estimated = clocks.deadline(None, deadline);
        assert!(estimated <= truth(deadline));
        assert_eq!(
            truth(deadline) - estimated,
            1500,
            "early by the reply's way back"
        );
        // A faster reply tightens it.
        let sent = received;
        clocks.observe(
            None,
            sent,
            sent + Duration::from_micros(100),
            truth(sent + Duration::from_micros(60)),
        );
        assert_eq!(truth(deadline) - clocks.deadline(None, deadline), 40);
        // A slow reply does not loosen it.
        clocks.observe(
            None,
            sent,
            sent + Duration::from_millis(30),
            truth(sent + Duration::from_millis(1)),
        );
        assert_eq!(truth(deadline) - clocks.deadline(None, deadline), 40);
    }

    #[test]
    fn clock_jumps_are_followed() {
        let clocks = ServerClocks::new(false);
        let at = |ms: u64| clocks.epoch + Duration::from_millis(ms);
        let base = 1000 * SECOND;
        let reply = |sent: u64, server: u64| {
            clocks.observe(None, at(sent), at(sent + 1), server + sent * 1000 + 500);
        };
        reply(10, base);
        let before = clocks.deadline(None, at(100));
        // Forward by 2 s: the next reply raises the estimate.
        reply(20, base + 2 * SECOND);
        assert_eq!(clocks.deadline(None, at(100)), before + 2 * SECOND);
        // Back by 5 s: the estimate exceeds the reply's upper bound and is replaced.
        reply(30, base - 3 * SECOND);
        assert_eq!(clocks.deadline(None, at(100)), before - 3 * SECOND);
    }

    #[test]
    fn cluster_slots_keep_their_own_clock() {
        let clocks = ServerClocks::new(true);
        let (a, b) = (Slot::new(1), Slot::new(16000));
        let sent = Instant::now();
        let received = sent + Duration::from_millis(1);
        clocks.observe(a, sent, received, 1000 * SECOND);
        assert_ne!(clocks.deadline(a, received), 0);
        assert_eq!(clocks.deadline(b, received), 0);
    }
}
