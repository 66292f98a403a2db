//! The listeners' metric families: connections refused at accept, and the TLS handshakes,
//! reloads and certificate expiry.

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use crate::metrics::Metrics;

/// Every `reason` of `slidegate_tls_handshake_failures_total` (the `tls` module's handshake
/// failures): each series exists from start, at zero, so an alert on its rate has something to
/// read.
pub const HANDSHAKE_FAILURES: [&str; 12] = [
    "handshake_timeout",
    "aborted",
    "no_client_certificate",
    "san_not_allowed",
    "unknown_issuer",
    "client_certificate_not_valid_now",
    "bad_client_certificate",
    "no_application_protocol",
    "alert_received",
    "not_tls",
    "incompatible",
    "other",
];

/// The server's metric families, registered once into the process's [`Metrics`].
#[derive(Clone, Debug)]
pub struct ServerMetrics {
    connections_refused: IntCounterVec,
    tls_handshake_failures: IntCounterVec,
    tls_reloads: IntCounterVec,
    tls_expiry: IntGauge,
    http_buffer_refused: IntCounter,
}

impl Default for ServerMetrics {
    /// Registered in a registry of their own (a server in tests).
    fn default() -> Self {
        Self::new(&Metrics::new())
    }
}

impl ServerMetrics {
    /// Creates and registers the families into `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        // Constant definitions: registering them can only fail on a programming error (a
        // duplicate or malformed name), which the unit tests catch.
        Self::try_new(metrics).expect("metric definitions are valid")
    }

    fn try_new(metrics: &Metrics) -> prometheus::Result<Self> {
        let connections_refused = metrics.counter_vec(
            "slidegate_connections_refused_total",
            "Connections closed at accept because a connection cap was reached, by listener and reason.",
            &["listener", "reason"],
        )?;
        let tls_handshake_failures = metrics.counter_vec(
            "slidegate_tls_handshake_failures_total",
            "TLS handshakes that failed, the connection closed without an answer, by listener and reason.",
            &["listener", "reason"],
        )?;
        let tls_reloads = metrics.counter_vec(
            "slidegate_tls_reloads_total",
            "Replacements of the TLS certificate, key or client CAs by result (success, failure).",
            &["result"],
        )?;
        let tls_expiry = metrics.gauge(
            "slidegate_tls_certificate_expiry_timestamp_seconds",
            "When the certificate the listeners serve expires, Unix time (with TLS on).",
        )?;
        let http_buffer_refused = metrics.counter(
            "slidegate_http_buffer_refused_total",
            "HTTP requests answered 503 because the HTTP port's buffer budget \
             (--http-max-buffered-bytes) had no room for them.",
        )?;
        for result in ["success", "failure"] {
            tls_reloads.with_label_values(&[result]);
        }
        // Every series at zero from start: alerts on `rate()` need a series before the first event.
        for listener in ["grpc", "http", "admin"] {
            for reason in ["max_connections", "max_connections_per_peer"] {
                connections_refused.with_label_values(&[listener, reason]);
            }
            for reason in HANDSHAKE_FAILURES {
                tls_handshake_failures.with_label_values(&[listener, reason]);
            }
        }
        Ok(ServerMetrics {
            connections_refused,
            tls_handshake_failures,
            tls_reloads,
            tls_expiry,
            http_buffer_refused,
        })
    }

    /// The counter of HTTP requests refused for want of buffer room.
    pub fn http_buffer_refused(&self) -> IntCounter {
        self.http_buffer_refused.clone()
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
}
