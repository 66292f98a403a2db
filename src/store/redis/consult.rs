//! The deny-cache path: a request whose counters are known to be full is denied without a
//! round trip, and what Redis answers is remembered.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::script::{Reply, Reported};
use super::{Lookup, RedisStore, Refresh};
use crate::store::{Counter, CounterResult, Decision, HitKind};

/// What the deny cache says about a request.
pub(super) enum Consult {
    /// An enforced counter is known to be full.
    Deny(Decision),
    /// Another request is asking Redis about one of the counters: wait for it, then look again.
    Wait(tokio::sync::watch::Receiver<()>),
    /// Ask Redis; the refreshes this request leads are released once the answer is cached.
    Ask(Vec<(usize, Refresh)>),
}

/// How long one more hit cannot fit in a counter after this answer, if it cannot fit now.
///
/// Denied: what Redis computed (nothing was recorded). Admitted and now full: one hit fits when
/// the oldest hit leaves, which is the counter's `reset_after`. Either way the time was measured
/// by Redis after the request was sent, so `sent + wait` is never later than the truth.
pub(super) fn full_for(reported: &Reported, allowed: bool) -> Option<Duration> {
    if reported.provisional {
        return None;
    }
    let r = &reported.result;
    if allowed && !r.over_limit {
        (r.remaining == 0 && !r.reset_after.is_zero()).then_some(r.reset_after)
    } else {
        reported.one_hit_fits_in
    }
}

/// Whether `leads` (this request's refreshes so far) holds `counter`'s cache entry.
pub(super) fn leads_counter(
    leads: &[(usize, Refresh)],
    counters: &[Counter],
    counter: &Counter,
) -> bool {
    leads
        .iter()
        .any(|(j, _)| counters[*j].key == counter.key && counters[*j].limit == counter.limit)
}

/// The decision for a request denied from the cache (see [`RedisStore::consult_cache`]).
pub(super) fn local_deny(counters: &[Counter], waits: Vec<Option<Duration>>) -> Decision {
    let counters = counters
        .iter()
        .zip(waits)
        .map(|(c, wait)| match wait {
            Some(wait) => CounterResult {
                over_limit: true,
                count: c.limit,
                remaining: 0,
                reset_after: if c.hits > c.limit { c.window } else { wait },
            },
            None => CounterResult {
                over_limit: false,
                count: 0,
                remaining: c.limit,
                reset_after: Duration::ZERO,
            },
        })
        .collect();
    Decision {
        allowed: false,
        counters,
    }
}

impl RedisStore {
    /// Consults the deny cache until it denies the request or lets it ask Redis, waiting while
    /// another request refreshes one of its counters. Waiting, in all, lasts at most a quarter of
    /// our timeout, however long the leader takes: then stop waiting for other requests' answers
    /// and ask Redis, so that waiting never turns a request into a timeout.
    pub(super) async fn consult(
        &self,
        counters: &[Counter],
    ) -> ControlFlow<Decision, Vec<(usize, Refresh)>> {
        let stop_waiting = Instant::now() + self.shared.timeout / 4;
        while Instant::now() < stop_waiting {
            match self.consult_cache(counters, Instant::now()) {
                Consult::Deny(decision) => return ControlFlow::Break(decision),
                Consult::Wait(mut done) => {
                    let until = tokio::time::Instant::from_std(stop_waiting);
                    // Boxed: a rare wait, whose timer and channel future would otherwise size
                    // every request's future.
                    let _ = Box::pin(tokio::time::timeout_at(until, done.changed())).await;
                }
                Consult::Ask(leads) => return ControlFlow::Continue(leads),
            }
        }
        ControlFlow::Continue(Vec::new())
    }

    /// Stores what Redis said about the counters of a request sent at `sent`, when the cache's
    /// epoch was `epoch` (nothing if it was cleared since), then releases the refreshes this
    /// request led: the requests that waited for them find the answer cached.
    pub(super) fn remember(
        &self,
        counters: &[Counter],
        reply: &Reply,
        (sent, epoch): (Instant, u64),
        refreshes: Vec<(usize, Refresh)>,
    ) {
        if let Some(cache) = &self.deny_cache {
            for (c, r) in counters.iter().zip(&reply.counters) {
                if c.kind == HitKind::Returned {
                    // Hits were taken back: what the cache knew of this counter is stale.
                    cache.forget(&c.key, c.limit);
                    continue;
                }
                if let (false, Some(wait)) = (c.shadow, full_for(r, reply.allowed)) {
                    cache.insert_read_in(epoch, &c.key, c.limit, sent + wait, sent);
                }
            }
            for (i, refresh) in &refreshes {
                let (c, r) = (&counters[*i], &reply.counters[*i].result);
                if full_for(&reply.counters[*i], reply.allowed).is_none() {
                    cache.settle(&c.key, c.limit, r.remaining, refresh);
                }
            }
        }
        drop(refreshes);
    }

    /// Consults the deny cache for every enforced counter; see [`DenyCache`].
    ///
    /// A local deny is exact for the full counter: `count` = limit (one more hit does not fit, so
    /// the log holds the limit), `remaining` 0, `reset_after` the time until one hit fits (the
    /// whole window for `hits > limit`). Its exact `reset_after` for `1 < hits <= limit` would need
    /// the log, so such counters go to Redis, as do checks (`hits` 0), which fit a full counter.
    /// A counter the request names twice is looked up once: the request never waits for a
    /// refresh it leads itself. The request's other counters were not looked at:
    /// they are reported as not over limit with `count` 0, `remaining` = limit and `reset_after` 0
    /// (unknown, and untouched by this request). A request that charges or returns hits always
    /// goes to Redis: a local deny would record neither.
    pub(super) fn consult_cache(&self, counters: &[Counter], now: Instant) -> Consult {
        let Some(cache) = self.deny_cache.as_ref() else {
            return Consult::Ask(Vec::new());
        };
        if counters.iter().any(|c| c.kind != HitKind::Admitted) {
            return Consult::Ask(Vec::new());
        }
        let mut waits = Vec::with_capacity(counters.len());
        let mut denied = false;
        let mut pending = None;
        let mut leads = Vec::new();
        for (i, c) in counters.iter().enumerate() {
            let exact = !c.shadow && (c.hits == 1 || c.hits > c.limit);
            let mut wait = None;
            if exact {
                match cache.lookup(&c.key, c.limit, now) {
                    Lookup::Miss => {}
                    Lookup::Denied(d) => wait = Some(d),
                    Lookup::Wait(_) if leads_counter(&leads, counters, c) => {}
                    Lookup::Wait(done) => pending = pending.or(Some(done)),
                    Lookup::Lead(refresh) => leads.push((i, refresh)),
                }
            }
            denied |= wait.is_some();
            waits.push(wait);
        }
        if denied {
            return Consult::Deny(local_deny(counters, waits));
        }
        match pending {
            // Leads taken in this round are dropped here, so their counters are handed over.
            Some(done) => Consult::Wait(done),
            None => Consult::Ask(leads),
        }
    }
}
