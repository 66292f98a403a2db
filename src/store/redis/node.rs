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

/// At most one "cannot run the script" error per this long; the others are counted in it.
const INCOMPATIBLE_LOG_EVERY: Duration = Duration::from_secs(30);

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
    /// The OOM warnings' and the "cannot run the script" errors' rate limits.
    oom_log: LogEvery,
    incompatible_log: LogEvery,
}

/// A rate limit on one log message: at most one per `every`, saying how many it stands for.
#[derive(Debug)]
struct LogEvery {
    every: Duration,
    /// Milliseconds since the node's `epoch` of the last message (0: never), and the occurrences
    /// not logged since.
    last: AtomicU64,
    unlogged: AtomicU64,
}

impl LogEvery {
    fn new(every: Duration) -> LogEvery {
        LogEvery {
            every,
            last: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    /// One occurrence at `elapsed` since the epoch: `Some(n)` when it is to be logged, standing
    /// for `n` occurrences, `None` when it is only counted.
    fn occurred(&self, elapsed: Duration) -> Option<u64> {
        let now = u64::try_from(elapsed.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let last = self.last.load(Ordering::Relaxed);
        let every = u64::try_from(self.every.as_millis()).unwrap_or(u64::MAX);
        let due = last == 0 || now.saturating_sub(last) >= every;
        if !due
            || self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.unlogged.swap(0, Ordering::Relaxed) + 1)
    }
}

impl NodeHealth {
    pub fn new(name: String, gauge: IntGauge) -> NodeHealth {
        NodeHealth {
            node: Mutex::new((name, gauge)),
            state: AtomicU8::new(UNKNOWN),
            epoch: Instant::now(),
            oom_log: LogEvery::new(OOM_LOG_EVERY),
            incompatible_log: LogEvery::new(INCOMPATIBLE_LOG_EVERY),
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
        let Some(refused) = self.oom_log.occurred(self.epoch.elapsed()) else {
            return;
        };
        tracing::warn!(
            node = %self.name(),
            refused,
            error,
            "Redis is out of memory (maxmemory reached, noeviction): it refuses to record hits, so \
             calls fail by the failure mode until memory is freed or maxmemory raised"
        );
    }

    /// Redis answered but cannot run the script: one error per [`INCOMPATIBLE_LOG_EVERY`], from
    /// the first call or health probe on, saying how many failures it stands for. Unlike an
    /// outage this does not pass by itself, so it is an error, not a warning.
    pub fn incompatible(&self, error: &str) {
        let Some(failed) = self.incompatible_log.occurred(self.epoch.elapsed()) else {
            return;
        };
        tracing::error!(
            node = %self.name(),
            failed,
            error,
            "Redis answers but cannot run the rate-limit script: every call fails by the failure \
             mode and health is NOT_SERVING until the server is fixed (Redis 6.0 or later, \
             EVALSHA and SCRIPT allowed, not a cluster node named as a standalone server; see \
             docs/operations.md)"
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
            // A map in RESP3, pairs in RESP2: both read as one.
            let query = cmd.query_async::<std::collections::HashMap<String, String>>(&mut conn);
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
            if let Some(policy) = reply.get("maxmemory-policy")
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
        assert_eq!(node.oom_log.unlogged.load(Ordering::Relaxed), 5);
        node.incompatible("NOPERM");
        node.incompatible("NOPERM");
        assert_eq!(node.incompatible_log.unlogged.load(Ordering::Relaxed), 1);
    }
}
