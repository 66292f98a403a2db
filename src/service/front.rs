//! What every transport shares: the limiter, the traces and the metrics, built once at start.
//!
//! The transports take them from here rather than from the limiter, which decides and knows
//! nothing of how a decision is traced or which transport asked.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, IntCounter};

use super::Caller;
use super::decision::log::DecisionLog;
use crate::limiter::{Code, LimitError, RateLimiter, Request, Response};
use crate::metrics::Metrics;
use crate::telemetry::Traces;

/// The transport a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Grpc,
    Json,
    Check,
}

impl Transport {
    const ALL: [Transport; 3] = [Transport::Grpc, Transport::Json, Transport::Check];

    fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Json => "json",
            Transport::Check => "check",
        }
    }
}

/// How a request was answered, whatever the transport: the `code` of
/// `slidegate_request_duration_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    OverLimit,
    /// Refused as malformed or over the request limits (gRPC INVALID_ARGUMENT, HTTP 400).
    InvalidArgument,
    /// The store failed and the failure mode answered with an error (UNAVAILABLE, HTTP 503).
    Unavailable,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Ok,
        Outcome::OverLimit,
        Outcome::InvalidArgument,
        Outcome::Unavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::OverLimit => "OVER_LIMIT",
            Outcome::InvalidArgument => "INVALID_ARGUMENT",
            Outcome::Unavailable => "UNAVAILABLE",
        }
    }

    /// The outcome of a decision.
    pub fn of(decided: Result<&Response, &LimitError>) -> Outcome {
        match decided {
            Ok(response) if response.overall == Code::OverLimit => Outcome::OverLimit,
            Ok(_) => Outcome::Ok,
            Err(LimitError::InvalidArgument(_)) => Outcome::InvalidArgument,
            Err(LimitError::Unavailable(_)) => Outcome::Unavailable,
        }
    }
}

/// The limiter, the traces and the metrics of the gRPC service, the HTTP routes and the h2
/// server.
pub struct Front {
    limiter: Arc<RateLimiter>,
    traces: Option<Traces>,
    metrics: Arc<Metrics>,
    /// `slidegate_request_duration_seconds` of each [`Transport`] and [`Outcome`].
    request_duration: [[Histogram; 4]; 3],
    /// `slidegate_escaped_entries_total` of each [`Transport`].
    escaped_entries: [IntCounter; 3],
    /// `--log-decisions`.
    log: DecisionLog,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("limiter", &self.limiter)
            .field("traces", &self.traces.is_some())
            .finish_non_exhaustive()
    }
}

impl Front {
    /// The front of the process, registering the requests' metric family into `metrics`; with
    /// `traces`, sampled requests get a span.
    pub fn new(
        limiter: Arc<RateLimiter>,
        traces: Option<Traces>,
        metrics: Arc<Metrics>,
        log: DecisionLog,
    ) -> Self {
        // A constant definition: registering it can only fail on a programming error (a
        // duplicate or malformed name), which the unit tests catch.
        let request_duration = metrics
            .latency_vec(
                "slidegate_request_duration_seconds",
                "Time to answer one rate-limit request, by transport (grpc, json, check) and code \
                 (OK, OVER_LIMIT, INVALID_ARGUMENT, UNAVAILABLE).",
                &["transport", "code"],
            )
            .expect("metric definitions are valid");
        let escaped_entries = metrics
            .counter_vec(
                "slidegate_escaped_entries_total",
                "Descriptor entries whose key or value was not UTF-8 (or held a NUL), counted \
                 under an escape of their bytes, by transport (grpc, check).",
                &["transport"],
            )
            .expect("metric definitions are valid");
        Front {
            limiter,
            traces,
            request_duration: Transport::ALL.map(|t| {
                Outcome::ALL.map(|o| request_duration.with_label_values(&[t.as_str(), o.as_str()]))
            }),
            escaped_entries: Transport::ALL
                .map(|t| escaped_entries.with_label_values(&[t.as_str()])),
            metrics,
            log,
        }
    }

    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    /// The traces, when on.
    pub fn traces(&self) -> Option<&Traces> {
        self.traces.as_ref()
    }

    /// Every metric of the process, for `GET /metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Time to answer one request, and how it was answered.
    pub fn observe_request(&self, transport: Transport, outcome: Outcome, elapsed: Duration) {
        self.request_duration[transport.index()][outcome as usize].observe(elapsed.as_secs_f64());
    }

    /// A decision, for the decision log (`--log-decisions`).
    #[inline]
    pub fn decided(
        &self,
        transport: Transport,
        caller: Option<&Caller>,
        request: &Request<'_>,
        response: &Response,
    ) {
        self.log
            .decided(transport.as_str(), caller, request, response);
    }

    /// Entries of one request that were escaped (see [`crate::limiter::entry_text`]).
    pub fn observe_escaped(&self, transport: Transport, entries: usize) {
        if entries > 0 {
            self.escaped_entries[transport.index()].inc_by(entries as u64);
        }
    }
}
