//! Prometheus metrics, in a registry of our own (served at `GET /metrics`).
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `slidegate_decisions_total` | counter | `domain`, `rule`, `decision` | descriptor decisions: `allowed`, `denied`, or `shadow_denied` (over limit, passed by shadow mode) |
//! | `slidegate_hits_total` | counter | `domain`, `rule`, `decision` | hits (the `hits_addend` of each decision) by decision |
//! | `slidegate_near_limit_total` | counter | `domain`, `rule` | allowed decisions that left 80 % or more of the limit used |
//! | `slidegate_unknown_domain_total` | counter | | requests for a domain with no rules (answered OK) |
//! | `slidegate_no_rule_total` | counter | `domain` | descriptors of a known domain that matched no rule (answered OK) |
//! | `slidegate_request_duration_seconds` | histogram | `transport` (`grpc`, `json`, `check`) | time to answer one request |
//! | `slidegate_store_duration_seconds` | histogram | | time of one store decision (one round trip) |
//! | `slidegate_store_errors_total` | counter | `kind` (`timeout`, `connection`, `oom`, `backend`) | failed store decisions (`oom`: Redis at `maxmemory` refused the write) |
//! | `slidegate_store_failovers_total` | counter | | Redis Sentinel failovers followed: the sentinels named a new primary and the store moved to it |
//! | `slidegate_redis_call_duration_seconds` | histogram | | time of one script call to Redis that got an answer (a call may decide several requests) |
//! | `slidegate_redis_calls_total` | counter | `result` (`ok`, `expired`, `timeout`, `connection`, `oom`, `backend`) | script calls to Redis by how they ended for their callers |
//! | `slidegate_redis_deadline_expired_total` | counter | | script calls that reached Redis after their callers' deadline and recorded nothing, answered in time or late |
//! | `slidegate_redis_late_recorded_total` | counter | | script calls answered after their callers gave up that had run before the deadline: the hits of the requests they admitted count although the callers got the failure mode |
//! | `slidegate_redis_node_up` | gauge | `node` (`host:port`; in a cluster each node, and `cluster` for the cluster as calls see it; through Sentinel the primary in use) | 1 while the last call or health check on the node got an answer, 0 after one failed to connect or timed out (a cluster node: its connection connected or got a reply, or failed to connect, dropped or timed out) |
//! | `slidegate_store_redirections_total` | counter | `kind` (`moved`, `ask`, `tryagain`) | Redis Cluster replies that sent a script call to another node or asked for it again (slot migrations); the client retried them |
//! | `slidegate_failure_mode_total` | counter | `mode` (`error`, `allow`, `deny`) | requests answered by the failure mode |
//! | `slidegate_config_reloads_total` | counter | `result` (`success`, `failure`) | rule reload attempts |
//! | `slidegate_rules_loaded` | gauge | | rules in the live rule set |
//! | `slidegate_config_loaded_timestamp_seconds` | gauge | | when the live rules were loaded (Unix time) |
//! | `slidegate_config_stale` | gauge | | 1 when the rule files on disk are not the ones served (the last reload failed) |
//! | `slidegate_config_checksum_info` | gauge | `served`, `on_disk` | always 1; the SHA-256 of the served and of the on-disk rule files (`on_disk` empty when unreadable) |
//! | `slidegate_rule_label_overflow_total` | counter | | decisions counted under `rule="overflow"` because [`MAX_RULE_LABELS`] pairs had their own series |
//! | `slidegate_connections_refused_total` | counter | `listener` (`grpc`, `http`), `reason` (`max_connections`, `max_connections_per_peer`) | connections closed at once because a connection cap was reached |
//! | `slidegate_trace_spans_total` | counter | `outcome` (`exported`, `dropped`, `failed`) | decision spans handed to the collector, dropped because the export queue was full, or lost with a failed export (with `--otlp-endpoint`; see [`crate::telemetry`]) |
//! | `slidegate_build_info` | gauge | `version` | always 1 |
//!
//! Label cardinality is bounded by the configuration, never by clients: `domain` is a configured
//! domain and `rule` is the rule's `name` or path (runtime values only for `detailed_metric` /
//! `value_to_metric` rules; for a request-supplied limit override, `override:` and the entry keys,
//! e.g. `override:remote_address.path`, never the values). As a last
//! guard, at most [`MAX_RULE_LABELS`] distinct (domain, rule) pairs get their own series; later
//! ones share `rule="overflow"`, and `slidegate_rule_label_overflow_total` counts what was folded.
//!
//! A reload drops the series of what it removed ([`Metrics::set_rules`]): the pairs of rules no
//! longer configured, every pair and `slidegate_no_rule_total` series of a removed domain, and
//! pairs not named by a rule (runtime values, overrides, overflow) that saw no decision since
//! the previous reload. So renaming rules again and again never fills the cap.
//!
//! The hot path does not hash label values into the prometheus vectors on every call: the counters
//! of each (domain, rule) pair are resolved once and kept in a two-level map looked up by `&str`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use parking_lot::RwLock;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::config::RuleSet;
use crate::config::reload::ConfigStatus;

/// Distinct (domain, rule) label pairs with their own series; beyond it, `rule="overflow"`.
pub const MAX_RULE_LABELS: usize = 10_000;

/// The label value used once [`MAX_RULE_LABELS`] is reached.
pub const OVERFLOW_RULE: &str = "overflow";

/// Latency buckets from 50 µs to 2.5 s: a memory-store decision takes microseconds, a Redis one
/// a fraction of a millisecond, and Envoy's default filter timeout is 20 ms.
const BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

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
}

impl CallResult {
    const ALL: [CallResult; 6] = [
        CallResult::Ok,
        CallResult::Expired,
        CallResult::Timeout,
        CallResult::Connection,
        CallResult::Oom,
        CallResult::Backend,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallResult::Ok => "ok",
            CallResult::Expired => "expired",
            CallResult::Timeout => "timeout",
            CallResult::Connection => "connection",
            CallResult::Oom => "oom",
            CallResult::Backend => "backend",
        }
    }
}

/// What became of a finished decision span ([`crate::telemetry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanOutcome {
    /// Accepted by the collector.
    Exported,
    /// Not queued: the export queue was full.
    Dropped,
    /// Lost with an export that failed or timed out.
    Failed,
}

impl SpanOutcome {
    const ALL: [SpanOutcome; 3] = [
        SpanOutcome::Exported,
        SpanOutcome::Dropped,
        SpanOutcome::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SpanOutcome::Exported => "exported",
            SpanOutcome::Dropped => "dropped",
            SpanOutcome::Failed => "failed",
        }
    }
}

/// The Redis store's own metrics, handed to it at connect: what each script call to Redis did,
/// below the per-decision view of `slidegate_store_*`. Cheap to clone (handles to the series).
#[derive(Clone, Debug)]
pub struct RedisMetrics {
    call_duration: Histogram,
    calls: [IntCounter; 6],
    deadline_expired: IntCounter,
    late_recorded: IntCounter,
    node_up: IntGaugeVec,
}

impl Default for RedisMetrics {
    /// Metrics registered nowhere (a store built without a [`Metrics`], as in tests and benches).
    fn default() -> Self {
        RedisMetrics::new(&Registry::new()).expect("metric definitions are valid")
    }
}

impl RedisMetrics {
    fn new(registry: &Registry) -> prometheus::Result<RedisMetrics> {
        let call_duration = Histogram::with_opts(
            HistogramOpts::new(
                "slidegate_redis_call_duration_seconds",
                "Time of one script call to Redis that got an answer (it may decide several requests).",
            )
            .buckets(BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(call_duration.clone()))?;
        let calls = IntCounterVec::new(
            Opts::new(
                "slidegate_redis_calls_total",
                "Script calls to Redis by result (ok, expired, timeout, connection, oom, backend).",
            ),
            &["result"],
        )?;
        registry.register(Box::new(calls.clone()))?;
        let deadline_expired = IntCounter::new(
            "slidegate_redis_deadline_expired_total",
            "Script calls that reached Redis after their callers' deadline and recorded nothing.",
        )?;
        registry.register(Box::new(deadline_expired.clone()))?;
        let late_recorded = IntCounter::new(
            "slidegate_redis_late_recorded_total",
            "Script calls answered after their callers gave up that ran before the deadline and \
             recorded their hits.",
        )?;
        registry.register(Box::new(late_recorded.clone()))?;
        let node_up = IntGaugeVec::new(
            Opts::new(
                "slidegate_redis_node_up",
                "1 while the last call or health check on the Redis node got an answer, 0 after \
                 one failed to connect or timed out.",
            ),
            &["node"],
        )?;
        registry.register(Box::new(node_up.clone()))?;
        Ok(RedisMetrics {
            call_duration,
            calls: CallResult::ALL.map(|r| calls.with_label_values(&[r.as_str()])),
            deadline_expired,
            late_recorded,
            node_up,
        })
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
}

/// The outcome of one descriptor, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionLabel {
    Allowed,
    Denied,
    /// Over limit, but let through by a rule's or the global shadow mode.
    ShadowDenied,
}

impl DecisionLabel {
    const ALL: [DecisionLabel; 3] = [
        DecisionLabel::Allowed,
        DecisionLabel::Denied,
        DecisionLabel::ShadowDenied,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionLabel::Allowed => "allowed",
            DecisionLabel::Denied => "denied",
            DecisionLabel::ShadowDenied => "shadow_denied",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The transport a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Grpc,
    Json,
    Check,
}

impl Transport {
    const ALL: [Transport; 3] = [Transport::Grpc, Transport::Json, Transport::Check];

    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Json => "json",
            Transport::Check => "check",
        }
    }
}

/// The counters of one (domain, rule) pair, resolved once.
#[derive(Debug)]
pub struct RuleCounters {
    decisions: [IntCounter; 3],
    hits: [IntCounter; 3],
    near_limit: IntCounter,
    /// A decision was recorded since the last reload (see [`Metrics::set_rules`]).
    used: AtomicBool,
}

impl RuleCounters {
    /// Counts one descriptor decision with its hits; `near_limit` when the allowed decision left
    /// 80 % or more of the limit used.
    pub fn record(&self, decision: DecisionLabel, hits: u64, near_limit: bool) {
        // Read first: a flag that is already set is not written again by every core.
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
        self.decisions[decision.index()].inc();
        self.hits[decision.index()].inc_by(hits);
        if near_limit {
            self.near_limit.inc();
        }
    }
}

/// All metrics of the process.
pub struct Metrics {
    registry: Registry,
    decisions: IntCounterVec,
    hits: IntCounterVec,
    near_limit: IntCounterVec,
    unknown_domain: IntCounter,
    no_rule: IntCounterVec,
    request_duration: [Histogram; 3],
    store_duration: Histogram,
    store_errors: IntCounterVec,
    store_failovers: IntCounter,
    failure_mode: IntCounterVec,
    config_reloads: IntCounterVec,
    rules_loaded: IntGauge,
    config_loaded: IntGauge,
    config_stale: IntGauge,
    config_checksum: IntGaugeVec,
    rule_label_overflow: IntCounter,
    connections_refused: IntCounterVec,
    tls_handshake_failures: IntCounterVec,
    tls_reloads: IntCounterVec,
    tls_expiry: IntGauge,
    redis: RedisMetrics,
    trace_spans: [IntCounter; 3],
    rule_cache: RwLock<RuleCache>,
}

#[derive(Default)]
struct RuleCache {
    by_domain: HashMap<String, HashMap<String, Arc<RuleCounters>>>,
    len: usize,
    /// The configured domains and the (domain, rule) pairs that the live rules name.
    domains: HashSet<String>,
    configured: HashSet<(String, String)>,
}

impl RuleCache {
    fn get(&self, domain: &str, rule: &str) -> Option<Arc<RuleCounters>> {
        self.by_domain.get(domain)?.get(rule).map(Arc::clone)
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        // The definitions below are constants: registering them can only fail on a programming
        // error (a duplicate or malformed name), which the unit tests catch.
        Self::try_new().expect("metric definitions are valid")
    }

    fn try_new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let vec = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(vec.clone()))?;
            Ok::<_, prometheus::Error>(vec)
        };
        let decisions = counter_vec(
            "slidegate_decisions_total",
            "Descriptor decisions by domain, rule and decision (allowed, denied, shadow_denied).",
            &["domain", "rule", "decision"],
        )?;
        let hits = counter_vec(
            "slidegate_hits_total",
            "Hits of descriptor decisions by domain, rule and decision.",
            &["domain", "rule", "decision"],
        )?;
        let near_limit = counter_vec(
            "slidegate_near_limit_total",
            "Allowed descriptor decisions that left 80% or more of the limit used.",
            &["domain", "rule"],
        )?;
        let no_rule = counter_vec(
            "slidegate_no_rule_total",
            "Descriptors of a configured domain that matched no rule.",
            &["domain"],
        )?;
        let store_errors = counter_vec(
            "slidegate_store_errors_total",
            "Failed store decisions by kind (timeout, connection, oom, backend).",
            &["kind"],
        )?;
        let failure_mode = counter_vec(
            "slidegate_failure_mode_total",
            "Requests answered by the failure mode after a store error.",
            &["mode"],
        )?;
        let config_reloads = counter_vec(
            "slidegate_config_reloads_total",
            "Rule reload attempts by result (success, failure).",
            &["result"],
        )?;
        let connections_refused = counter_vec(
            "slidegate_connections_refused_total",
            "Connections closed at accept because a connection cap was reached, by listener and reason.",
            &["listener", "reason"],
        )?;
        let tls_handshake_failures = counter_vec(
            "slidegate_tls_handshake_failures_total",
            "TLS handshakes that failed, the connection closed without an answer, by listener and reason.",
            &["listener", "reason"],
        )?;
        let tls_reloads = counter_vec(
            "slidegate_tls_reloads_total",
            "Replacements of the TLS certificate, key or client CAs by result (success, failure).",
            &["result"],
        )?;
        let trace_spans_vec = counter_vec(
            "slidegate_trace_spans_total",
            "Decision spans by outcome: exported to the collector, dropped (export queue full), \
             failed (the export failed).",
            &["outcome"],
        )?;
        let trace_spans =
            SpanOutcome::ALL.map(|o| trace_spans_vec.with_label_values(&[o.as_str()]));
        let tls_expiry = IntGauge::new(
            "slidegate_tls_certificate_expiry_timestamp_seconds",
            "When the certificate the listeners serve expires, Unix time (with TLS on).",
        )?;
        registry.register(Box::new(tls_expiry.clone()))?;
        let store_failovers = IntCounter::new(
            "slidegate_store_failovers_total",
            "Redis Sentinel failovers followed: the sentinels named a new primary and the store moved to it.",
        )?;
        registry.register(Box::new(store_failovers.clone()))?;
        let unknown_domain = IntCounter::new(
            "slidegate_unknown_domain_total",
            "Requests for a domain that has no rules.",
        )?;
        registry.register(Box::new(unknown_domain.clone()))?;
        let request_duration_vec = HistogramVec::new(
            HistogramOpts::new(
                "slidegate_request_duration_seconds",
                "Time to answer one rate-limit request, by transport (grpc, json, check).",
            )
            .buckets(BUCKETS.to_vec()),
            &["transport"],
        )?;
        registry.register(Box::new(request_duration_vec.clone()))?;
        let request_duration =
            Transport::ALL.map(|t| request_duration_vec.with_label_values(&[t.as_str()]));
        let store_duration = Histogram::with_opts(
            HistogramOpts::new(
                "slidegate_store_duration_seconds",
                "Time of one store decision (one round trip for Redis).",
            )
            .buckets(BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(store_duration.clone()))?;
        let gauge = |name: &str, help: &str| {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok::<_, prometheus::Error>(gauge)
        };
        let rules_loaded = gauge("slidegate_rules_loaded", "Rules in the live rule set.")?;
        let config_loaded = gauge(
            "slidegate_config_loaded_timestamp_seconds",
            "When the live rules were loaded (at start or by the last successful reload), Unix time.",
        )?;
        let config_stale = gauge(
            "slidegate_config_stale",
            "1 when the rule files on disk are not the ones served (the last reload failed).",
        )?;
        let config_checksum = IntGaugeVec::new(
            Opts::new(
                "slidegate_config_checksum_info",
                "SHA-256 of the served rule files and of the rule files on disk (empty when \
                 unreadable); always 1.",
            ),
            &["served", "on_disk"],
        )?;
        registry.register(Box::new(config_checksum.clone()))?;
        let rule_label_overflow = IntCounter::new(
            "slidegate_rule_label_overflow_total",
            "Decisions counted under rule=\"overflow\" because the cap of distinct (domain, rule) \
             pairs was reached.",
        )?;
        registry.register(Box::new(rule_label_overflow.clone()))?;
        let build_info = IntGaugeVec::new(
            Opts::new("slidegate_build_info", "Build information; always 1."),
            &["version"],
        )?;
        registry.register(Box::new(build_info.clone()))?;
        registry.register(Box::new(StoreRedirections::new()?))?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        for kind in ["timeout", "connection", "oom", "backend"] {
            store_errors.with_label_values(&[kind]);
        }
        for mode in ["error", "allow", "deny"] {
            failure_mode.with_label_values(&[mode]);
        }
        for result in ["success", "failure"] {
            config_reloads.with_label_values(&[result]);
            tls_reloads.with_label_values(&[result]);
        }
        let redis = RedisMetrics::new(&registry)?;
        Ok(Metrics {
            registry,
            decisions,
            hits,
            near_limit,
            unknown_domain,
            no_rule,
            request_duration,
            store_duration,
            store_errors,
            store_failovers,
            failure_mode,
            config_reloads,
            rules_loaded,
            config_loaded,
            config_stale,
            config_checksum,
            rule_label_overflow,
            connections_refused,
            tls_handshake_failures,
            tls_reloads,
            tls_expiry,
            redis,
            trace_spans,
            rule_cache: RwLock::new(RuleCache::default()),
        })
    }

    /// The counters for a (domain, rule) pair; `rule="overflow"` once [`MAX_RULE_LABELS`] pairs exist.
    pub fn rule(&self, domain: &str, rule: &str) -> Arc<RuleCounters> {
        {
            let cache = self.rule_cache.read();
            if let Some(found) = cache.get(domain, rule) {
                return found;
            }
            if cache.len >= MAX_RULE_LABELS
                && let Some(found) = cache.get(domain, OVERFLOW_RULE)
            {
                self.rule_label_overflow.inc();
                return found;
            }
        }
        let mut cache = self.rule_cache.write();
        if let Some(found) = cache.get(domain, rule) {
            return found;
        }
        let label = if cache.len >= MAX_RULE_LABELS {
            self.rule_label_overflow.inc();
            OVERFLOW_RULE
        } else {
            rule
        };
        if let Some(found) = cache.get(domain, label) {
            return found;
        }
        let counters = Arc::new(RuleCounters {
            decisions: DecisionLabel::ALL.map(|d| {
                self.decisions
                    .with_label_values(&[domain, label, d.as_str()])
            }),
            hits: DecisionLabel::ALL
                .map(|d| self.hits.with_label_values(&[domain, label, d.as_str()])),
            near_limit: self.near_limit.with_label_values(&[domain, label]),
            used: AtomicBool::new(false),
        });
        cache.len += 1;
        cache
            .by_domain
            .entry(domain.to_string())
            .or_default()
            .insert(label.to_string(), Arc::clone(&counters));
        counters
    }

    /// The live rules changed (at start and after each successful reload): sets
    /// `slidegate_rules_loaded` and drops the series of what the change removed (see the module
    /// documentation). Prometheus marks a dropped series stale at its next scrape.
    pub fn set_rules(&self, rules: &RuleSet) {
        self.set_rules_loaded(rules.rule_count());
        let domains: HashSet<String> = rules.domain_names().into_iter().map(String::from).collect();
        let configured: HashSet<(String, String)> = rules
            .rules()
            .into_iter()
            .map(|r| (r.domain.clone(), r.stats_name().to_owned()))
            .collect();
        let mut cache = self.rule_cache.write();
        let RuleCache {
            by_domain,
            len,
            domains: old_domains,
            configured: old_configured,
        } = &mut *cache;
        let mut removed = Vec::new();
        for (domain, labels) in by_domain.iter_mut() {
            labels.retain(|label, counters| {
                let key = (domain.clone(), label.clone());
                let keep = domains.contains(domain)
                    && (configured.contains(&key)
                        || (!old_configured.contains(&key)
                            && counters.used.swap(false, Ordering::Relaxed)));
                if !keep {
                    removed.push(key);
                }
                keep
            });
        }
        by_domain.retain(|_, labels| !labels.is_empty());
        *len -= removed.len();
        for (domain, label) in &removed {
            for decision in DecisionLabel::ALL {
                let values = [domain.as_str(), label.as_str(), decision.as_str()];
                let _ = self.decisions.remove_label_values(&values);
                let _ = self.hits.remove_label_values(&values);
            }
            let _ = self.near_limit.remove_label_values(&[domain, label]);
        }
        for domain in old_domains.difference(&domains) {
            let _ = self.no_rule.remove_label_values(&[domain]);
        }
        *old_domains = domains;
        *old_configured = configured;
    }

    /// Whether the served rules are the files on disk, and since when.
    pub fn set_config_status(&self, status: &ConfigStatus) {
        let loaded = status
            .loaded_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.config_loaded.set(loaded);
        self.config_stale.set(i64::from(status.is_stale()));
        let on_disk = status.on_disk.map(|c| c.to_string()).unwrap_or_default();
        self.config_checksum.reset();
        self.config_checksum
            .with_label_values(&[status.served.to_string(), on_disk])
            .set(1);
    }

    /// A request for an unconfigured domain.
    pub fn unknown_domain(&self) {
        self.unknown_domain.inc();
    }

    /// A descriptor of a configured domain that matched no rule.
    pub fn no_rule(&self, domain: &str) {
        self.no_rule.with_label_values(&[domain]).inc();
    }

    /// Time to answer one request.
    pub fn observe_request(&self, transport: Transport, elapsed: Duration) {
        let index = Transport::ALL
            .iter()
            .position(|t| *t == transport)
            .unwrap_or(0);
        self.request_duration[index].observe(elapsed.as_secs_f64());
    }

    /// Time of one store decision.
    pub fn observe_store(&self, elapsed: Duration) {
        self.store_duration.observe(elapsed.as_secs_f64());
    }

    /// The Redis store's metrics (hand them to it in `RedisOptions`).
    pub fn redis(&self) -> RedisMetrics {
        self.redis.clone()
    }

    /// A failed store decision.
    pub fn store_error(&self, kind: &str) {
        self.store_errors.with_label_values(&[kind]).inc();
    }

    /// The counter of failovers the Redis Sentinel store followed (it increments it itself).
    pub fn store_failovers(&self) -> IntCounter {
        self.store_failovers.clone()
    }

    /// A request answered by the failure mode.
    pub fn failure_mode(&self, mode: &str) {
        self.failure_mode.with_label_values(&[mode]).inc();
    }

    /// A rule reload attempt (the new rules, if any, come through [`Metrics::set_rules`]).
    pub fn config_reload(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.config_reloads.with_label_values(&[result]).inc();
    }

    /// A connection refused at accept because of a connection cap.
    pub fn connection_refused(&self, listener: &str, reason: &str) {
        self.connections_refused
            .with_label_values(&[listener, reason])
            .inc();
    }

    /// A TLS handshake that failed (the client was refused, or gave up).
    pub fn tls_handshake_failure(&self, listener: &str, reason: &str) {
        self.tls_handshake_failures
            .with_label_values(&[listener, reason])
            .inc();
    }

    /// An attempt to replace the TLS material after its files changed.
    pub fn tls_reload(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.tls_reloads.with_label_values(&[result]).inc();
    }

    /// The expiry of the certificate now served, Unix time.
    pub fn set_tls_expiry(&self, expires: i64) {
        self.tls_expiry.set(expires);
    }

    /// Decision spans that met `outcome` (see [`SpanOutcome`]).
    pub fn trace_spans(&self, outcome: SpanOutcome, spans: usize) {
        self.trace_spans[outcome as usize].inc_by(u64::try_from(spans).unwrap_or(u64::MAX));
    }

    /// The number of live rules.
    fn set_rules_loaded(&self, rules: usize) {
        self.rules_loaded
            .set(i64::try_from(rules).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition format of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::with_capacity(8 * 1024);
        // Encoding into a Vec fails only for malformed metric families, which we never build.
        if let Err(error) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(%error, "cannot encode metrics");
        }
        String::from_utf8(out).unwrap_or_default()
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
        let seen = crate::store::redis::redirections();
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
    fn renders_every_family_with_help() {
        let metrics = Metrics::new();
        metrics
            .rule("api", "per_user")
            .record(DecisionLabel::Denied, 3, false);
        metrics.unknown_domain();
        metrics.no_rule("api");
        metrics.observe_request(Transport::Check, Duration::from_millis(1));
        metrics.observe_store(Duration::from_millis(1));
        metrics
            .redis()
            .call(CallResult::Oom, Some(Duration::from_millis(1)));
        metrics.redis().deadline_expired();
        metrics.redis().node("127.0.0.1:6379").set(1);
        metrics.config_reload(true);
        let served = crate::config::Checksum::of(&[]);
        metrics.set_config_status(&ConfigStatus {
            served,
            on_disk: None,
            loaded_at: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        });
        let text = metrics.render();
        for name in [
            "slidegate_decisions_total{decision=\"denied\",domain=\"api\",rule=\"per_user\"} 1",
            "slidegate_hits_total{decision=\"denied\",domain=\"api\",rule=\"per_user\"} 3",
            "slidegate_near_limit_total{domain=\"api\",rule=\"per_user\"} 0",
            "slidegate_unknown_domain_total 1",
            "slidegate_no_rule_total{domain=\"api\"} 1",
            "slidegate_request_duration_seconds_count{transport=\"check\"} 1",
            "slidegate_store_duration_seconds_count 1",
            "slidegate_store_errors_total{kind=\"timeout\"} 0",
            "slidegate_store_errors_total{kind=\"oom\"} 0",
            "slidegate_redis_call_duration_seconds_count 1",
            "slidegate_redis_calls_total{result=\"oom\"} 1",
            "slidegate_redis_calls_total{result=\"ok\"} 0",
            "slidegate_redis_deadline_expired_total 1",
            "slidegate_redis_late_recorded_total 0",
            "slidegate_redis_node_up{node=\"127.0.0.1:6379\"} 1",
            "slidegate_failure_mode_total{mode=\"deny\"} 0",
            "slidegate_store_redirections_total{kind=\"tryagain\"}",
            "slidegate_config_reloads_total{result=\"success\"} 1",
            "slidegate_rules_loaded 0",
            "slidegate_config_loaded_timestamp_seconds 1800000000",
            "slidegate_config_stale 1",
            &format!("slidegate_config_checksum_info{{on_disk=\"\",served=\"{served}\"}} 1"),
            "slidegate_rule_label_overflow_total 0",
            "slidegate_build_info{version=",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    #[test]
    fn rule_labels_are_capped() {
        let metrics = Metrics::new();
        for i in 0..MAX_RULE_LABELS + 5 {
            metrics
                .rule("d", &format!("r{i}"))
                .record(DecisionLabel::Allowed, 1, false);
        }
        let text = metrics.render();
        assert!(text.contains(
            "slidegate_decisions_total{decision=\"allowed\",domain=\"d\",rule=\"overflow\"} 5"
        ));
        assert!(
            text.contains("slidegate_rule_label_overflow_total 5"),
            "{text}"
        );
        // A pair seen before the cap keeps its own series.
        metrics
            .rule("d", "r0")
            .record(DecisionLabel::Allowed, 1, false);
        assert!(metrics.render().contains(
            "slidegate_decisions_total{decision=\"allowed\",domain=\"d\",rule=\"r0\"} 2"
        ));
    }

    /// Rules of domain `d` named `{prefix}{i}`.
    fn named_rules(prefix: &str, count: usize) -> RuleSet {
        let mut text = String::from("domain: d\ndescriptors:\n");
        for i in 0..count {
            text.push_str(&format!(
                "  - key: k{i}\n    rate_limit: {{ name: {prefix}{i}, unit: second, requests_per_unit: 1 }}\n"
            ));
        }
        crate::config::load_sources(&[("d.yaml".to_owned(), text)]).expect("rules load")
    }

    fn series(text: &str, rule: &str) -> bool {
        text.contains(&format!("domain=\"d\",rule=\"{rule}\"}}"))
    }

    #[test]
    fn renamed_rules_never_fill_the_cap() {
        let metrics = Metrics::new();
        let count = MAX_RULE_LABELS / 4 + 1;
        for generation in 0..6 {
            let prefix = format!("g{generation}_");
            metrics.set_rules(&named_rules(&prefix, count));
            for i in 0..count {
                metrics
                    .rule("d", &format!("{prefix}{i}"))
                    .record(DecisionLabel::Allowed, 1, false);
            }
        }
        let text = metrics.render();
        assert!(!series(&text, OVERFLOW_RULE), "live rules overflowed");
        assert!(text.contains("slidegate_rule_label_overflow_total 0"));
        assert!(series(&text, "g5_0") && !series(&text, "g4_0"));
        assert_eq!(metrics.rule_cache.read().len, count);
    }

    #[test]
    fn runtime_labels_stay_while_used_and_removed_domains_go() {
        let metrics = Metrics::new();
        metrics.set_rules(&named_rules("r", 1));
        metrics
            .rule("d", "r0")
            .record(DecisionLabel::Allowed, 1, false);
        metrics
            .rule("d", "k0_alice")
            .record(DecisionLabel::Allowed, 1, false);
        metrics
            .rule("d", "k0_bob")
            .record(DecisionLabel::Allowed, 1, false);
        metrics.no_rule("d");
        // A reload right after: both runtime labels were used since the last one.
        metrics.set_rules(&named_rules("r", 1));
        assert!(series(&metrics.render(), "k0_bob"));
        // Only alice is seen before the next reload: bob's series goes.
        metrics
            .rule("d", "k0_alice")
            .record(DecisionLabel::Allowed, 1, false);
        metrics.set_rules(&named_rules("r", 1));
        let text = metrics.render();
        assert!(
            series(&text, "k0_alice") && !series(&text, "k0_bob"),
            "{text}"
        );
        assert!(series(&text, "r0"), "a configured rule stays, used or not");
        // A reload without domain `d` removes all of its series.
        let other = "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
        metrics.set_rules(
            &crate::config::load_sources(&[("e.yaml".to_owned(), other.to_owned())])
                .expect("rules load"),
        );
        let text = metrics.render();
        assert!(!text.contains("domain=\"d\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new();
        metrics
            .rule("d", "a\"b\\c\nd")
            .record(DecisionLabel::Allowed, 1, true);
        let text = metrics.render();
        assert!(text.contains(r#"rule="a\"b\\c\nd""#), "{text}");
    }
}
