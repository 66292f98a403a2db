//! The Redis store's metric families: what each script call to Redis did, below the per-decision
//! view of `slidegate_store_*`, the nodes' health, Sentinel failovers and Cluster redirections.

use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use crate::metrics::Metrics;

/// How a script call to Redis ended for its callers (`slidegate_redis_calls_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallResult {
    Ok,
    /// The call reached Redis after its deadline and decided nothing.
    Expired,
    Timeout,
    Connection,
    /// Redis at `maxmemory` (`noeviction`) refused the write.
    Oom,
    Backend,
    /// Redis answered but cannot run the script (see `StoreError::Incompatible`).
    Incompatible,
    /// Redis refused the credentials (see `StoreError::Auth`).
    Auth,
    /// Nothing listened at the address (see `StoreError::Refused`).
    Refused,
    /// The host name did not resolve (see `StoreError::Dns`).
    Dns,
}

impl CallResult {
    const ALL: [CallResult; 10] = [
        CallResult::Ok,
        CallResult::Expired,
        CallResult::Timeout,
        CallResult::Connection,
        CallResult::Oom,
        CallResult::Backend,
        CallResult::Incompatible,
        CallResult::Auth,
        CallResult::Refused,
        CallResult::Dns,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallResult::Ok => "ok",
            CallResult::Expired => "expired",
            CallResult::Timeout => "timeout",
            CallResult::Connection => "connection",
            CallResult::Oom => "oom",
            CallResult::Backend => "backend",
            CallResult::Incompatible => "incompatible",
            CallResult::Auth => "auth",
            CallResult::Refused => "refused",
            CallResult::Dns => "dns",
        }
    }
}

/// The Redis store's own metrics, handed to it at connect: what each script call to Redis did,
/// below the per-decision view of `slidegate_store_*`. Cheap to clone (handles to the series).
#[derive(Clone, Debug)]
pub struct RedisMetrics {
    call_duration: Histogram,
    calls: [IntCounter; 10],
    deadline_expired: IntCounter,
    late_recorded: IntCounter,
    incompatible: IntCounter,
    node_up: IntGaugeVec,
    failovers: IntCounter,
}

impl Default for RedisMetrics {
    /// Registered in a registry of their own (a store built without the process's [`Metrics`],
    /// as in tests and benches).
    fn default() -> Self {
        RedisMetrics::new(&Metrics::new())
    }
}

impl RedisMetrics {
    /// Creates and registers the families into `metrics`: always, whatever the store, so that
    /// every scrape shows the same series.
    pub fn new(metrics: &Metrics) -> Self {
        // Constant definitions: registering them can only fail on a programming error (a
        // duplicate or malformed name), which the unit tests catch.
        Self::try_new(metrics).expect("metric definitions are valid")
    }

    fn try_new(metrics: &Metrics) -> prometheus::Result<RedisMetrics> {
        let call_duration = metrics.latency(
            "slidegate_redis_call_duration_seconds",
            "Time of one script call to Redis that got an answer (it may decide several requests).",
        )?;
        let calls = metrics.counter_vec(
            "slidegate_redis_calls_total",
            "Script calls to Redis by result (ok, expired, timeout, connection, refused, dns, auth, \
             oom, backend, incompatible).",
            &["result"],
        )?;
        let deadline_expired = metrics.counter(
            "slidegate_redis_deadline_expired_total",
            "Script calls that reached Redis after their callers' deadline and recorded nothing.",
        )?;
        let late_recorded = metrics.counter(
            "slidegate_redis_late_recorded_total",
            "Script calls answered after their callers gave up that ran before the deadline and \
             recorded their hits.",
        )?;
        let incompatible = metrics.counter(
            "slidegate_redis_incompatible_total",
            "Script calls and health probes that Redis answered but could not run the script for \
             (a server before 6.0, EVALSHA renamed or forbidden, a Lua error): permanent until the \
             server changes.",
        )?;
        let node_up = metrics.gauge_vec(
            "slidegate_redis_node_up",
            "1 while the last call or health check on the Redis node got an answer, 0 after \
             one failed to connect or timed out.",
            &["node"],
        )?;
        let failovers = metrics.counter(
            "slidegate_store_failovers_total",
            "Redis Sentinel failovers followed: the sentinels named a new primary and the store moved to it.",
        )?;
        metrics.register(Box::new(StoreRedirections::new()?))?;
        Ok(RedisMetrics {
            call_duration,
            calls: CallResult::ALL.map(|r| calls.with_label_values(&[r.as_str()])),
            deadline_expired,
            late_recorded,
            incompatible,
            node_up,
            failovers,
        })
    }

    /// A script call or health probe that Redis could not run the script for.
    pub fn incompatible(&self) {
        self.incompatible.inc();
    }

    /// A script call that ended for its callers with `result`, after `elapsed` if it got an
    /// answer.
    pub fn call(&self, result: CallResult, elapsed: Option<Duration>) {
        self.calls[result as usize].inc();
        if let Some(elapsed) = elapsed {
            self.call_duration.observe(elapsed.as_secs_f64());
        }
    }

    /// A script call that reached Redis after its deadline (answered in time or late).
    pub fn deadline_expired(&self) {
        self.deadline_expired.inc();
    }

    /// A script call answered after its callers gave up that recorded its hits.
    pub fn late_recorded(&self) {
        self.late_recorded.inc();
    }

    /// The gauge of one node (a redacted address: never credentials).
    pub fn node(&self, node: &str) -> IntGauge {
        self.node_up.with_label_values(&[node])
    }

    /// Every node's gauge, for a cluster's node connections to pick theirs by address.
    pub fn nodes(&self) -> IntGaugeVec {
        self.node_up.clone()
    }

    /// The counter of failovers the Redis Sentinel store followed (it increments it itself).
    pub fn failovers(&self) -> IntCounter {
        self.failovers.clone()
    }
}

/// `slidegate_store_redirections_total`, read from the Redis Cluster client's process-wide counts
/// at every scrape (all 0 without a cluster; see `store::redis::redirections`).
struct StoreRedirections {
    counters: IntCounterVec,
    /// Scrapes in parallel must not both add the same difference.
    update: parking_lot::Mutex<()>,
}

impl StoreRedirections {
    fn new() -> prometheus::Result<Self> {
        let counters = IntCounterVec::new(
            Opts::new(
                "slidegate_store_redirections_total",
                "Redis Cluster replies that sent a call to another node (moved, ask) or asked for \
                 it again (tryagain: a slot migrating), by kind; the client retried them.",
            ),
            &["kind"],
        )?;
        Ok(StoreRedirections {
            counters,
            update: parking_lot::Mutex::new(()),
        })
    }
}

impl prometheus::core::Collector for StoreRedirections {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.counters.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let seen = super::redirections();
        let _update = self.update.lock();
        for (kind, total) in [
            ("moved", seen.moved),
            ("ask", seen.ask),
            ("tryagain", seen.try_again),
        ] {
            let counter = self.counters.with_label_values(&[kind]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        self.counters.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let registry = Metrics::new();
        let metrics = RedisMetrics::new(&registry);
        metrics.call(CallResult::Oom, Some(Duration::from_millis(1)));
        metrics.deadline_expired();
        metrics.node("127.0.0.1:6379").set(1);
        let text = registry.render();
        for name in [
            "slidegate_redis_call_duration_seconds_count 1",
            "slidegate_redis_calls_total{result=\"oom\"} 1",
            "slidegate_redis_calls_total{result=\"ok\"} 0",
            "slidegate_redis_deadline_expired_total 1",
            "slidegate_redis_late_recorded_total 0",
            "slidegate_redis_node_up{node=\"127.0.0.1:6379\"} 1",
            "slidegate_store_failovers_total 0",
            "slidegate_store_redirections_total{kind=\"tryagain\"}",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
