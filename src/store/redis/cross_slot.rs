//! A request whose counters span cluster slots: one script call per slot, concurrently, and if
//! any slot denies, the hits the other slots recorded are taken back (see the parent module's
//! *Cluster*).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::RedisError;
use ::redis::cluster_routing::Slot;
use futures::future::join_all;

use super::RedisStore;
use super::batch::Lane;
use super::cluster::ClusterConnection;
use super::script::{self, Reply, Reported};
use crate::store::{Counter, HitKind, StoreError};

impl RedisStore {
    /// Asks the cluster: one part per slot, each in its slot's next script call, concurrently; if
    /// any slot denies, the hits the others recorded are taken back (see the module docs).
    pub(super) async fn ask_cluster(
        &self,
        lane: &Arc<Lane<ClusterConnection>>,
        counters: &[Counter],
        deadline: Instant,
    ) -> Result<Reply, StoreError> {
        let keys: Vec<String> = counters.iter().map(|c| self.redis_key(&c.key)).collect();
        let id = self.ids.next();
        let groups = group_by_slot(&keys);
        let cross_slot = groups.len() > 1;
        // Each slot's counters, in the order the script answers for them.
        let calls = groups.iter().map(|(slot, group)| {
            let counters = group.iter().map(|&i| counters[i].clone()).collect();
            self.ask(
                lane,
                id.clone(),
                cross_slot,
                Some(*slot),
                counters,
                deadline,
            )
        });
        let answers = join_all(calls).await;

        let mut results: Vec<Option<Reported>> = vec![None; counters.len()];
        let mut allowed = true;
        let mut failure = None;
        // Counters whose hits were recorded by an allowing group (with the bucket, for bucket
        // counters): what to take back on a deny.
        let mut recorded: Vec<(usize, Option<u64>)> = Vec::new();
        for ((_, group), answer) in groups.iter().zip(answers) {
            match answer {
                Ok(reply) => {
                    allowed &= reply.allowed;
                    for (&i, r) in group.iter().zip(reply.counters) {
                        // Charged and returned hits are never taken back.
                        let admitted = counters[i].kind == HitKind::Admitted;
                        if reply.allowed && !r.result.over_limit && counters[i].hits > 0 && admitted
                        {
                            recorded.push((i, r.bucket));
                        }
                        results[i] = Some(r);
                    }
                }
                Err(e) => {
                    allowed = false;
                    failure.get_or_insert(e);
                }
            }
        }
        if !allowed && !recorded.is_empty() {
            self.take_back(&lane.conn, &keys, counters, &recorded, &id)
                .await;
            // Each counter of an admitting slot reported its key's hits up to it, this request's
            // included: take back all of them that were recorded on that key before it or by it.
            for (i, result) in results.iter_mut().enumerate() {
                let taken: u64 = recorded
                    .iter()
                    .filter(|&&(j, _)| j <= i && keys[j] == keys[i])
                    .map(|&(j, _)| counters[j].hits)
                    .sum();
                if let (Some(Reported { result: r, .. }), true) = (result.as_mut(), taken > 0) {
                    r.count = r.count.saturating_sub(taken);
                    r.remaining = counters[i].limit.saturating_sub(r.count);
                    if r.count == 0 {
                        r.reset_after = Duration::ZERO;
                    }
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let counters = results
            .into_iter()
            .map(|r| r.ok_or_else(|| StoreError::Backend("missing counter result".into())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Reply { allowed, counters })
    }

    /// The compensation of a denied cross-slot request: removes the members it recorded. Runs as
    /// its own task so that it completes even if the caller gives up (timeout) meanwhile. A failure
    /// is logged and leaves the hits to expire (over-counting, never over-admitting).
    async fn take_back(
        &self,
        conn: &ClusterConnection,
        keys: &[String],
        counters: &[Counter],
        recorded: &[(usize, Option<u64>)],
        id: &str,
    ) {
        // Hits are numbered per key across the request (a counter may be named twice; a bucket
        // counter named twice took both in one bucket).
        let mut per_key: Vec<(String, u64, Option<u64>, usize)> = Vec::new();
        for &(i, bucket) in recorded {
            match per_key.iter_mut().find(|(k, ..)| *k == keys[i]) {
                Some((_, hits, ..)) => *hits += counters[i].hits,
                None => per_key.push((keys[i].clone(), counters[i].hits, bucket, i)),
            }
        }
        // From the counter, then from its provisional log, where a cross-slot part's hits also go.
        // In this order: a counter whose log lost them first would look full for good to a call
        // in between, which a deny cache would then keep. If the first fails, the hits stay in
        // both (never cached as full) until they leave the window. A bucket counter's come off
        // the bucket the script reported, from both hashes in one script.
        let removals: Vec<Vec<::redis::Cmd>> = per_key
            .into_iter()
            .map(|(key, hits, bucket, i)| {
                let log = format!("{key}{}", script::PROVISIONAL_SUFFIX);
                if let Some(bucket) = bucket {
                    let cmd = script::take_back_buckets(&key, &log, bucket, hits, &counters[i]);
                    return vec![cmd];
                }
                let members = script::members(id, hits);
                let zrem = |key: &str| ::redis::cmd("ZREM").arg(key).arg(&members).clone();
                vec![zrem(&key), zrem(&log)]
            })
            .collect();
        let conn = conn.clone();
        let redactor = self.shared.redactor.clone();
        // A deadline, so that a node that does not answer holds no task: the hits then expire
        // with their window. One that answers late takes back no more than is still there.
        let deadline = self.shared.timeout;
        let task = tokio::spawn(async move {
            let calls = removals.into_iter().map(|cmds| {
                let mut conn = conn.clone();
                async move {
                    for cmd in cmds {
                        cmd.query_async::<i64>(&mut conn).await?;
                    }
                    Ok::<_, RedisError>(())
                }
            });
            let Ok(results) = tokio::time::timeout(deadline, join_all(calls)).await else {
                tracing::warn!(
                    ?deadline,
                    "the take-back of a denied cross-slot request timed out; its hits expire with their window"
                );
                return;
            };
            for result in results {
                if let Err(e) = result {
                    tracing::warn!(
                        error = %redactor.clean(&e.to_string()),
                        "could not take back the hits of a denied cross-slot request; they expire with their window"
                    );
                }
            }
        });
        let _ = task.await;
    }
}

/// Indices of `keys` grouped by cluster slot, in first-seen order.
pub(super) fn group_by_slot(keys: &[String]) -> Vec<(Slot, Vec<usize>)> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups
}
