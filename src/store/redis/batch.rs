//! Batching: the requests a worker has in hand at once share one script call on its lane,
//! within a budget of hits per call.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ::redis::cluster_routing::Slot;
use futures::future::join_all;
use tokio::sync::oneshot;

use super::script::{self, CallPart, Reply};
use super::{CallResult, Shared};
use crate::store::work::work;
use crate::store::{Counter, StoreError};

/// How long a batch task keeps waiting, after its callers timed out, for the late reply that says
/// whether the call expired or recorded its hits (`slidegate_redis_*` metrics); the reply is
/// dropped unread after that.
pub(super) const LATE_REPLY_WAIT: Duration = Duration::from_secs(10);

/// Most calls waiting for their late reply at once, per store: each holds about 2.5 KB (its
/// task and the client's future), so a frozen Redis that thousands of calls time out against
/// costs at most about 1.3 MB. Calls beyond it are not waited for (nor counted as expired or
/// late).
pub(super) const MAX_LATE_WAITERS: usize = 512;

/// A connection (standalone, or a cluster's) and the requests waiting for its next script call.
///
/// Requests that a worker starts in one go (the calls that one read of a connection brought, or
/// of several) are decided in one script call: about half of what Redis spends on a one-counter
/// request is the call itself (docs/benchmarks.md), and the call is shared. The first request into an
/// empty queue spawns the task that sends it; that task runs once the worker has started every
/// call at hand, so it takes them all, and no request ever waits for a timer. In a cluster a call
/// holds the requests (or cross-slot parts of requests) of one slot.
pub(super) struct Lane<C> {
    pub(super) conn: C,
    /// Cluster: calls pass each counter's provisional log and hold one slot's parts.
    pub(super) cluster: bool,
    pub(super) queue: parking_lot::Mutex<Vec<Queued>>,
}

impl<C> Lane<C> {
    pub(super) fn new(conn: C, cluster: bool) -> Arc<Lane<C>> {
        Arc::new(Lane {
            conn,
            cluster,
            queue: parking_lot::Mutex::new(Vec::new()),
        })
    }
}

/// What a [`Lane`] sends its script calls on.
pub(super) trait LaneConn:
    ::redis::aio::ConnectionLike + Clone + Send + Sync + 'static
{
}

impl<C: ::redis::aio::ConnectionLike + Clone + Send + Sync + 'static> LaneConn for C {}

/// A request, or one slot's part of a cross-slot request, in a [`Lane`]'s queue.
pub(super) struct Queued {
    pub(super) id: String,
    /// One slot's part of a cross-slot request (its hits also go to the provisional logs).
    pub(super) provisional: bool,
    /// The counters' cluster slot (`None` on standalone).
    pub(super) slot: Option<Slot>,
    pub(super) counters: Vec<Counter>,
    /// When the caller gives up.
    pub(super) deadline: Instant,
    pub(super) answer: oneshot::Sender<Result<Reply, StoreError>>,
}

/// Most requests decided in one script call: Redis runs nothing else while a script runs, so a
/// call is kept to a few hundred microseconds.
pub(super) const MAX_BATCH: usize = 16;

/// Sends what a [`Lane`] has queued, up to [`MAX_BATCH`] requests of one slot per script call
/// (the calls go out together on the lane's pipelined connection), and hands each request its
/// answer. A request whose caller has gone (timed out, cancelled) before the call is built is
/// left out.
pub(super) async fn send_queued<C: LaneConn>(lane: Arc<Lane<C>>, shared: Arc<Shared>) {
    let mut queued = std::mem::take(&mut *lane.queue.lock());
    queued.retain(|q| !q.answer.is_closed());
    let calls = batches(queued, shared.max_call_hits)
        .into_iter()
        .map(|batch| send_batch(&lane, &shared, batch));
    join_all(calls).await;
}

/// `queued` in script calls: at most [`MAX_BATCH`] each and at most `max_hits` hits each (but a
/// request alone always), one slot each, in queue order per slot.
pub(super) fn batches(queued: Vec<Queued>, max_hits: u64) -> Vec<Vec<Queued>> {
    let fits = |batch: &Vec<Queued>, hits: u64, cost: u64| {
        batch.len() < MAX_BATCH && hits.saturating_add(cost) <= max_hits
    };
    if queued.iter().all(|q| q.slot.is_none()) {
        // Standalone: any requests may share a call, so filling calls in order is all there is
        // (a slot map here cost about 370 instructions per call).
        let mut batches: Vec<Vec<Queued>> = Vec::new();
        let mut hits = 0;
        for q in queued {
            let cost = call_cost(&q);
            match batches.last_mut() {
                Some(batch) if fits(batch, hits, cost) => {
                    batch.push(q);
                    hits += cost;
                }
                _ => {
                    batches.push(vec![q]);
                    hits = cost;
                }
            }
        }
        return batches;
    }
    let mut batches: Vec<Vec<Queued>> = Vec::new();
    // The batch still taking requests of each slot, and its hits.
    let mut open: HashMap<Option<Slot>, (usize, u64)> = HashMap::new();
    for q in queued {
        let cost = call_cost(&q);
        match open.get_mut(&q.slot) {
            Some((b, hits)) if fits(&batches[*b], *hits, cost) => {
                *hits += cost;
                batches[*b].push(q);
            }
            _ => {
                open.insert(q.slot, (batches.len(), cost));
                batches.push(vec![q]);
            }
        }
    }
    batches
}

/// What a request adds to a script call's work, as in the limiter's budget ([`work`]).
pub(super) fn call_cost(q: &Queued) -> u64 {
    q.counters.iter().fold(0u64, |sum, c| {
        sum.saturating_add(work(c.precision, c.window, c.hits))
    })
}

/// One script call for `batch`, each request answered with its part of the reply (or the error).
///
/// The call carries its callers' earliest deadline in the server's clock (see the `deadline`
/// module): if it reaches Redis later, the script decides nothing. When the call outlives the
/// timeout its callers are answered at once, and the task waits on (up to [`LATE_REPLY_WAIT`])
/// for the late reply, to count whether the call expired or recorded hits.
pub(super) async fn send_batch<C: LaneConn>(lane: &Lane<C>, shared: &Shared, batch: Vec<Queued>) {
    let slot = batch.first().and_then(|q| q.slot);
    let deadline = batch.iter().map(|q| q.deadline).min();
    let (answers, requests): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|q| (q.answer, (q.id, q.provisional, q.counters)))
        .unzip();
    let parts: Vec<CallPart<'_>> = requests
        .iter()
        .map(|(id, provisional, counters)| CallPart {
            id,
            provisional: *provisional,
            counters,
        })
        .collect();
    let redis_deadline = deadline.map_or(0, |d| shared.clocks.deadline(slot, d));
    let cmd = script::command(
        shared.dialect.script(),
        &shared.prefix,
        lane.cluster,
        redis_deadline,
        &parts,
    );
    let mut conn = lane.conn.clone();
    let sent = Instant::now();
    let mut call = std::pin::pin!(async {
        match script::run(&mut conn, &shared.dialect, &cmd).await {
            // Refused while connecting: the call never reached Redis, and the manager connects
            // again as it fails. A script that may have run is never sent twice. Not on a
            // cluster lane, whose client retries on its own (and may have sent the call before a
            // reconnect was refused).
            Err(e) if !lane.cluster && never_sent(&e) => {
                script::run(&mut conn, &shared.dialect, &cmd).await
            }
            other => other,
        }
    });
    let Ok(reply) = tokio::time::timeout(shared.timeout, call.as_mut()).await else {
        // By the timeout every caller of the batch has given up (each one's own timeout started
        // before the call was sent): answer them now, or a frozen Redis would hold every request
        // it was sent.
        for answer in answers {
            let _ = answer.send(Err(StoreError::Timeout(shared.timeout)));
        }
        shared.metrics.call(CallResult::Timeout, None);
        shared.node.unreachable();
        // Only the reply's header matters now: free the requests while waiting (a frozen Redis
        // may hold thousands of calls).
        drop(parts);
        drop(requests);
        if shared.late_waiters.fetch_add(1, Ordering::Relaxed) < MAX_LATE_WAITERS
            && let Ok(Ok(reply)) = tokio::time::timeout(LATE_REPLY_WAIT, call).await
        {
            shared.late(slot, sent, &reply);
        }
        shared.late_waiters.fetch_sub(1, Ordering::Relaxed);
        return;
    };
    let received = Instant::now();
    let parsed = reply
        .map_err(|e| shared.error(e))
        .and_then(|reply| script::parse(&reply, &parts));
    let (result, outcome) = match parsed {
        Ok(script::Answer { now, replies }) => {
            shared.clocks.observe(slot, sent, received, now);
            match replies {
                Some(replies) => (Ok(replies), CallResult::Ok),
                None => {
                    shared.metrics.deadline_expired();
                    (
                        Err(StoreError::Timeout(shared.timeout)),
                        CallResult::Expired,
                    )
                }
            }
        }
        Err(e) => {
            let outcome = call_result(&e);
            (Err(e), outcome)
        }
    };
    shared.metrics.call(outcome, Some(received - sent));
    shared.note(&lane.conn, result.as_ref().map(|_| ()));
    match result {
        Ok(replies) => {
            for (answer, reply) in answers.into_iter().zip(replies) {
                let _ = answer.send(reply);
            }
        }
        Err(e) => {
            for answer in answers {
                let _ = answer.send(Err(e.clone()));
            }
        }
    }
}

/// Whether a failed call provably never reached Redis, so that sending it again cannot count
/// anything twice: the connection was refused (a restarted server was down when the connection
/// manager last tried to connect; the call waited for that attempt and was never written). A
/// broken pipe or a reset is not: the call may have been written, and run, before it broke.
pub(super) fn never_sent(e: &::redis::RedisError) -> bool {
    e.is_connection_refusal()
}

/// The `slidegate_redis_calls_total` result of a failed call.
pub(super) fn call_result(e: &StoreError) -> CallResult {
    match e {
        StoreError::Timeout(_) => CallResult::Timeout,
        StoreError::Connection(_) => CallResult::Connection,
        StoreError::OutOfMemory(_) => CallResult::Oom,
        StoreError::Backend(_) => CallResult::Backend,
        StoreError::Incompatible(_) => CallResult::Incompatible,
        StoreError::Auth(_) => CallResult::Auth,
        StoreError::Refused(_) => CallResult::Refused,
        StoreError::Dns(_) => CallResult::Dns,
    }
}
