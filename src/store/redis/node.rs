//! What the store knows about the health of its Redis node: up or down as calls see it (the
//! `slidegate_redis_node_up` gauge), whether its eviction policy can lose counters, and whether
//! it is out of memory.
//!
//! Up and down follow the calls and health checks: a call or `PING` that gets an answer (any
//! answer, an error reply too) marks the node up, one that fails to connect or times out marks it
//! down. redis-rs does not expose its connections' state, so this is what it can observe. In a
//! cluster the connection hides which node served a call, so the store keeps one state for the
//! cluster as a whole (`node="cluster"`); each node connection keeps its own node's series (see
//! the `cluster` module).
//!
//! Each time the node comes up (the first answer after start, and after every outage: a
//! reconnect), the store reads `CONFIG GET maxmemory-policy` and warns when the policy can evict
//! counters. Every policy but `noeviction` can: counters are ordinary keys with a TTL, so
//! `allkeys-*` and `volatile-*` both choose among them, and an evicted counter forgets its hits
//! and admits up to its limit again. A server that refuses `CONFIG` (managed Redis, ACLs) is noted
//! at debug level and left alone. In a cluster the command goes to one node at random.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::IntGauge;

use super::redact::Redactor;

/// Whether a node answered last time.
const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// At most one "out of memory" warning per this long; the others are counted in it.
const OOM_LOG_EVERY: Duration = Duration::from_secs(10);

/// The eviction policies that never evict a counter.
pub const SAFE_POLICIES: &[&str] = &["noeviction"];

/// One node's (or a cluster's) state as calls see it.
#[derive(Debug)]
pub struct NodeHealth {
    /// The node's redacted address (for logs) and its gauge; another node's after a Sentinel
    /// failover ([`NodeHealth::moved_to`]). Locked only when the state changes.
    node: Mutex<(String, IntGauge)>,
    state: AtomicU8,
    /// When the process started: the clock of `last_oom_log`.
    epoch: Instant,
    /// Milliseconds since `epoch` of the last OOM warning (0: never), and the ones not logged.
    last_oom_log: AtomicU64,
    oom_unlogged: AtomicU64,
}

impl NodeHealth {
    pub fn new(name: String, gauge: IntGauge) -> NodeHealth {
        NodeHealth {
            node: Mutex::new((name, gauge)),
            state: AtomicU8::new(UNKNOWN),
            epoch: Instant::now(),
            last_oom_log: AtomicU64::new(0),
            oom_unlogged: AtomicU64::new(0),
        }
    }

    /// The node answered. Returns true when it was not known to be up (start or reconnect): the
    /// caller then checks its eviction policy.
    pub fn answered(&self) -> bool {
        if self.state.load(Ordering::Relaxed) == UP {
            return false;
        }
        self.node.lock().1.set(1);
        self.state.swap(UP, Ordering::Relaxed) != UP
    }

    /// A call failed to connect or timed out.
    pub fn unreachable(&self) {
        if self.state.swap(DOWN, Ordering::Relaxed) != DOWN {
            self.node.lock().1.set(0);
        }
    }

    /// Calls go to another node from now on (the primary the sentinels named after a failover):
    /// the old node's series goes to 0, and the new node's first answer sets its own series and
    /// has its eviction policy checked, as after a reconnect.
    pub fn moved_to(&self, name: String, gauge: IntGauge) {
        let mut node = self.node.lock();
        node.1.set(0);
        *node = (name, gauge);
        self.state.store(UNKNOWN, Ordering::Relaxed);
    }

    fn name(&self) -> String {
        self.node.lock().0.clone()
    }

    /// Redis refused a call for lack of memory: one warning per [`OOM_LOG_EVERY`], saying how many
    /// refusals it stands for.
    pub fn out_of_memory(&self, error: &str) {
        let now = u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let last = self.last_oom_log.load(Ordering::Relaxed);
        let every = u64::try_from(OOM_LOG_EVERY.as_millis()).unwrap_or(u64::MAX);
        let due = last == 0 || now.saturating_sub(last) >= every;
        if !due
            || self
                .last_oom_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.oom_unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let refused = self.oom_unlogged.swap(0, Ordering::Relaxed) + 1;
        tracing::warn!(
            node = %self.name(),
            refused,
            error,
            "Redis is out of memory (maxmemory reached, noeviction): it refuses to record hits, so \
             calls fail by the failure mode until memory is freed or maxmemory raised"
        );
    }

    /// Reads the node's `maxmemory-policy` and warns if it can evict counters (see the module
    /// docs); runs as a task of its own.
    pub fn check_policy<C>(&self, conn: C, redactor: Redactor, timeout: Duration)
    where
        C: ::redis::aio::ConnectionLike + Send + 'static,
    {
        let name = self.name();
        tokio::spawn(async move {
            let mut conn = conn;
            let mut cmd = ::redis::cmd("CONFIG");
            cmd.arg("GET").arg("maxmemory-policy");
            let query = cmd.query_async::<Vec<String>>(&mut conn);
            let reply = match tokio::time::timeout(timeout, query).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) => {
                    tracing::debug!(
                        node = %name,
                        error = %redactor.clean(&e.to_string()),
                        "cannot read Redis's maxmemory-policy (CONFIG refused); not checked"
                    );
                    return;
                }
                Err(_) => return,
            };
            if let Some(policy) = reply.get(1)
                && !SAFE_POLICIES.contains(&policy.as_str())
            {
                tracing::warn!(
                    node = %name,
                    policy = %policy,
                    "Redis's maxmemory-policy {policy} can evict rate-limit counters: an evicted \
                     counter forgets its hits and admits up to its limit again; use noeviction \
                     (at maxmemory, calls then fail by the failure mode instead)"
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_and_down_follow_answers() {
        let gauge = IntGauge::new("g", "g").expect("gauge");
        let node = NodeHealth::new("127.0.0.1:6379".into(), gauge.clone());
        assert!(node.answered(), "the first answer is news");
        assert!(!node.answered());
        assert_eq!(gauge.get(), 1);
        node.unreachable();
        assert_eq!(gauge.get(), 0);
        assert!(node.answered(), "back after an outage: check again");
        assert_eq!(gauge.get(), 1);
    }

    #[test]
    fn a_failover_moves_the_series_to_the_new_primary() {
        let old = IntGauge::new("old", "g").expect("gauge");
        let new = IntGauge::new("new", "g").expect("gauge");
        let node = NodeHealth::new("127.0.0.1:6379".into(), old.clone());
        assert!(node.answered());
        node.moved_to("127.0.0.1:6380".into(), new.clone());
        assert_eq!((old.get(), new.get()), (0, 0));
        assert!(node.answered(), "the new primary's first answer is news");
        assert_eq!((old.get(), new.get()), (0, 1));
        assert_eq!(node.name(), "127.0.0.1:6380");
    }

    #[test]
    fn oom_warnings_are_rate_limited() {
        let node = NodeHealth::new("n".into(), IntGauge::new("g", "g").expect("gauge"));
        node.out_of_memory("OOM");
        for _ in 0..5 {
            node.out_of_memory("OOM");
        }
        assert_eq!(node.oom_unlogged.load(Ordering::Relaxed), 5);
    }
}
