//! Prometheus metrics, in a registry of our own (served at `GET /metrics`).
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `slidegate_decisions_total` | counter | `domain`, `rule`, `decision` | descriptor decisions: `allowed`, `denied`, or `shadow_denied` (over limit, passed by shadow mode) |
//! | `slidegate_hits_total` | counter | `domain`, `rule`, `decision` | hits (the `hits_addend` of each decision) by decision |
//! | `slidegate_near_limit_total` | counter | `domain`, `rule` | allowed decisions that left 80 % or more of the limit used |
//! | `slidegate_unknown_domain_total` | counter | `domain` (the first 16 distinct, cut to a bounded length; the rest `overflow`) | requests for a domain with no rules (answered OK) |
//! | `slidegate_no_rule_total` | counter | `domain` | descriptors of a known domain that matched no rule (answered OK) |
//! | `slidegate_request_duration_seconds` | histogram | `transport` (`grpc`, `json`, `check`), `code` (`OK`, `OVER_LIMIT`, `INVALID_ARGUMENT`: malformed or over the request limits, HTTP 400; `UNAVAILABLE`: the store failed under `--failure-mode error`, HTTP 503) | time to answer one request, by how it was answered |
//! | `slidegate_store_duration_seconds` | histogram | | time of one store decision (one round trip) |
//! | `slidegate_store_errors_total` | counter | `kind` (`timeout`, `connection`, `oom`, `backend`, `incompatible`) | failed store decisions (`oom`: Redis at `maxmemory` refused the write; `incompatible`: Redis answered but cannot run the script) |
//! | `slidegate_store_failovers_total` | counter | | Redis Sentinel failovers followed: the sentinels named a new primary and the store moved to it |
//! | `slidegate_redis_call_duration_seconds` | histogram | | time of one script call to Redis that got an answer (a call may decide several requests) |
//! | `slidegate_redis_calls_total` | counter | `result` (`ok`, `expired`, `timeout`, `connection`, `oom`, `backend`, `incompatible`) | script calls to Redis by how they ended for their callers |
//! | `slidegate_redis_deadline_expired_total` | counter | | script calls that reached Redis after their callers' deadline and recorded nothing, answered in time or late |
//! | `slidegate_redis_late_recorded_total` | counter | | script calls answered after their callers gave up that had run before the deadline: the hits of the requests they admitted count although the callers got the failure mode |
//! | `slidegate_redis_incompatible_total` | counter | | script calls and health checks that Redis answered but could not run the script for (a server before 6.0, `EVALSHA` renamed or forbidden by an ACL, a Lua error): permanent until the server changes, and health is `NOT_SERVING` meanwhile |
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
//! | `slidegate_tls_handshake_failures_total` | counter | `listener` (`grpc`, `http`, `admin`), `reason` | TLS handshakes that failed, the connection closed without an answer (the reasons: docs/metrics.md) |
//! | `slidegate_tls_reloads_total` | counter | `result` (`success`, `failure`) | replacements of the TLS certificate, key or client CAs after their files changed |
//! | `slidegate_tls_certificate_expiry_timestamp_seconds` | gauge | | when the certificate now served expires, Unix time (0 without TLS) |
//! | `slidegate_trace_spans_total` | counter | `outcome` (`exported`, `dropped`, `failed`) | decision spans handed to the collector, dropped because the export queue was full, or lost with a failed export (with `--otlp-endpoint`; see [`crate::telemetry`]) |
//! | `slidegate_escaped_entries_total` | counter | `transport` (`grpc`, `check`) | descriptor entries whose key or value was not UTF-8 (or held a NUL), counted under an escape of their bytes |
//! | `slidegate_counters_cleared_total` | counter | | counters that held hits and were cleared through `DELETE /counters` |
//! | `slidegate_decision_log_dropped_total` | counter | | decision lines (`--log-decisions`) not written because more than 100 came in one second |
//! | `slidegate_memory_store_bytes` | gauge | | bytes the memory store holds: keys, logs, buckets and map slots (allocator overhead not included) |
//! | `slidegate_memory_store_max_bytes` | gauge | | the memory store's budget (`--memory-max-bytes`): at it, a request that would create a counter is decided over limit |
//! | `slidegate_memory_store_refused_total` | counter | | requests decided over limit because the memory store was at its budget |
//! | `slidegate_serving` | gauge | | 1 while this process is SERVING (gRPC health and `/healthcheck`), else 0 |
//! | `slidegate_rlqs_streams` | gauge | | open RLQS streams (`StreamRateLimitQuotas`, one per Envoy) |
//! | `slidegate_rlqs_assignments_total` | counter | `action` (`token_bucket`, `allow_all`, `deny_all`, `abandon`) | RLQS bucket answers: a token bucket, `ALLOW_ALL` (no limit), `DENY_ALL` (no room in the ledger yet), or abandoned after a minute without requests |
//! | `slidegate_rlqs_streams_refused_total` | counter | | RLQS streams refused `RESOURCE_EXHAUSTED`: their peer held the most streams one peer may open (64) |
//! | `slidegate_rlqs_buckets_refused_total` | counter | `reason` (`too_many`, `too_many_from_peer`, `too_large`, `too_complex`) | RLQS buckets not assigned: over the buckets per stream or in all, or a bucket id over the request limits; or denied because its peer made the most ledgers one peer may (`too_many_from_peer`) or the search for its rule ran out (`too_complex`) |
//! | `slidegate_rlqs_ambiguous_buckets_total` | counter | | RLQS bucket ids whose entries reach a limit in more than one order (the first in key order is taken) |
//! | `slidegate_rlqs_bucket_assigned_ratio` | histogram | | at each RLQS token-bucket answer, how much of its bucket's limit the Envoys hold together (current grants' weights over N) |
//! | `slidegate_rlqs_share_ratio` | histogram | | at each RLQS token-bucket answer, that Envoy's share of its bucket's limit: the spread of shares by demand |
//! | `slidegate_store_up` | gauge | `store` (`memory`, `redis`, `redis-cluster`, `redis-sentinel`) | 1 while the store answers its health probe, else 0 |
//! | `slidegate_build_info` | gauge | `version` | always 1 |
//!
//! Label cardinality is bounded by the configuration, never by clients: `domain` is a configured
//! domain and `rule` is the rule's `name` or path (runtime values only for `detailed_metric` /
//! `value_to_metric` rules; for a request-supplied limit override, `override:` and the entry keys,
//! e.g. `override:remote_address.path`, never the values). As a last
//! guard, at most [`MAX_RULE_LABELS`] distinct (domain, rule) pairs get their own series; later
//! ones share `rule="overflow"`, and `slidegate_rule_label_overflow_total` counts what was folded.
//! A `rule` label is at most [`MAX_LABEL_BYTES`] long ([`bounded_label`]), so `/metrics` stays
//! bounded in size whatever values clients send.
//!
//! A reload drops the series of what it removed (`limiter::DecisionMetrics::set_rules`): the pairs of rules no
//! longer configured, every pair and `slidegate_no_rule_total` series of a removed domain, and
//! pairs not named by a rule (runtime values, overrides, overflow) that saw no decision since
//! the previous reload. So renaming rules again and again never fills the cap.
//!
//! This module is the registry, the rendering and the label caps only, and knows nothing of the
//! crate: each layer defines and registers its own families into the one [`Metrics`] (the
//! decisions in `limiter`, the rule reloads in `config`, Redis in `store::redis`, connections and
//! TLS in `server`, requests by transport in `service`, spans in `telemetry`).
//!
//! The hot path does not hash label values into the prometheus vectors on every call: the counters
//! of each (domain, rule) pair are resolved once and kept in a two-level map looked up by `&str`.

use std::borrow::Cow;
use std::fmt::Write as _;

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Distinct (domain, rule) label pairs with their own series; beyond it, `rule="overflow"`.
pub const MAX_RULE_LABELS: usize = 10_000;

/// Longest `rule` label value kept whole. A rule label can hold request values
/// (`detailed_metric`, `value_to_metric`); a longer one is cut and ends in a digest of the whole
/// ([`bounded_label`]), so a client's megabyte header costs a label of this size.
pub const MAX_LABEL_BYTES: usize = 128;

/// Hex digits of the SHA-256 digest a cut label ends in: distinct long values keep distinct
/// series (up to 64 bits of digest), and the readable start tells what they were.
const LABEL_DIGEST_HEX: usize = 16;

/// The label value for `value`: itself when at most [`MAX_LABEL_BYTES`] long, else its start cut
/// at a character boundary, `~`, and the first [`LABEL_DIGEST_HEX`] hex digits of the SHA-256
/// of the whole value ([`MAX_LABEL_BYTES`] in all).
pub fn bounded_label(value: &str) -> Cow<'_, str> {
    bounded_to(value, MAX_LABEL_BYTES)
}

/// `value` if it is at most `max` bytes (more than [`LABEL_DIGEST_HEX`] + 1), else its first
/// bytes, `~` and a digest of the whole, `max` bytes in all: distinct values stay distinct.
pub fn bounded_to(value: &str, max: usize) -> Cow<'_, str> {
    if value.len() <= max {
        return Cow::Borrowed(value);
    }
    let mut end = max - 1 - LABEL_DIGEST_HEX;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let mut label = String::with_capacity(max);
    label.push_str(&value[..end]);
    label.push('~');
    for byte in &digest.as_ref()[..LABEL_DIGEST_HEX / 2] {
        // Writing to a String cannot fail.
        let _ = write!(label, "{byte:02x}");
    }
    Cow::Owned(label)
}

/// The label value used once [`MAX_RULE_LABELS`] is reached.
pub const OVERFLOW_RULE: &str = "overflow";

/// Latency buckets from 50 µs to 2.5 s: a memory-store decision takes microseconds, a Redis one
/// a fraction of a millisecond, and Envoy's default filter timeout is 20 ms.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// The process's registry, which every layer registers its families into, and `slidegate_build_info`.
pub struct Metrics {
    registry: Registry,
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
    /// A registry holding `slidegate_build_info`.
    pub fn new() -> Self {
        let metrics = Metrics {
            registry: Registry::new(),
        };
        // A constant definition: it can only fail on a programming error, which the tests catch.
        let build_info = metrics
            .gauge_vec(
                "slidegate_build_info",
                "Build information; always 1.",
                &["version"],
            )
            .expect("metric definitions are valid");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // The standard `process_*` metrics (CPU, resident and virtual memory, open file
        // descriptors, start time) that dashboards and alerts for any service query. Registering
        // them can only fail on a duplicate, which a new registry cannot hold.
        #[cfg(target_os = "linux")]
        let _ = metrics.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        metrics
    }

    /// Registers a collector of a layer's own.
    pub fn register(&self, collector: Box<dyn Collector>) -> prometheus::Result<()> {
        self.registry.register(collector)
    }

    /// A registered counter.
    pub fn counter(&self, name: &str, help: &str) -> prometheus::Result<IntCounter> {
        let counter = IntCounter::new(name, help)?;
        self.register(Box::new(counter.clone()))?;
        Ok(counter)
    }

    /// A registered counter family.
    pub fn counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntCounterVec> {
        let vec = IntCounterVec::new(Opts::new(name, help), labels)?;
        self.register(Box::new(vec.clone()))?;
        Ok(vec)
    }

    /// A registered gauge.
    pub fn gauge(&self, name: &str, help: &str) -> prometheus::Result<IntGauge> {
        let gauge = IntGauge::new(name, help)?;
        self.register(Box::new(gauge.clone()))?;
        Ok(gauge)
    }

    /// A registered gauge family.
    pub fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntGaugeVec> {
        let vec = IntGaugeVec::new(Opts::new(name, help), labels)?;
        self.register(Box::new(vec.clone()))?;
        Ok(vec)
    }

    /// A registered histogram of ratios from 0 to 1 (tenths, and 0.05).
    pub fn ratio(&self, name: &str, help: &str) -> prometheus::Result<Histogram> {
        let buckets = vec![0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
        let histogram = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))?;
        self.register(Box::new(histogram.clone()))?;
        Ok(histogram)
    }

    /// A registered latency histogram ([`LATENCY_BUCKETS`]).
    pub fn latency(&self, name: &str, help: &str) -> prometheus::Result<Histogram> {
        let histogram =
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()))?;
        self.register(Box::new(histogram.clone()))?;
        Ok(histogram)
    }

    /// A registered latency histogram family ([`LATENCY_BUCKETS`]).
    pub fn latency_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<HistogramVec> {
        let vec = HistogramVec::new(
            HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
            labels,
        )?;
        self.register(Box::new(vec.clone()))?;
        Ok(vec)
    }

    /// Every metric family, as the registry holds it now.
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_build_info_and_what_layers_register() {
        let metrics = Metrics::new();
        let counter = metrics
            .counter("slidegate_test_total", "A test.")
            .expect("valid");
        counter.inc();
        let text = metrics.render();
        assert!(text.contains("slidegate_build_info{version="), "{text}");
        assert!(
            text.contains("# HELP slidegate_test_total A test."),
            "{text}"
        );
        assert!(text.contains("slidegate_test_total 1"), "{text}");
        assert!(metrics.counter("slidegate_test_total", "Again.").is_err());
    }

    #[test]
    fn long_labels_are_cut_with_a_digest() {
        assert!(matches!(bounded_label("short"), Cow::Borrowed("short")));
        let long = format!("user_{}", "\u{e9}".repeat(1 << 19));
        let other = format!("{long}x");
        let (cut, cut_other) = (bounded_label(&long), bounded_label(&other));
        assert!(cut.len() <= MAX_LABEL_BYTES, "{}", cut.len());
        assert!(cut.starts_with("user_\u{e9}"), "{cut}");
        assert_ne!(cut, cut_other, "distinct values keep distinct labels");
        assert_eq!(
            cut.split_once('~').map(|(_, d)| d.len()),
            Some(LABEL_DIGEST_HEX)
        );
    }
}
