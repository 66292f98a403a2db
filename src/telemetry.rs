//! OpenTelemetry traces: one span per decision, exported over OTLP (gRPC or HTTP/protobuf).
//!
//! Off unless `--otlp-endpoint` is given. Off, there is no exporter, no queue, no task, and the
//! transports do not look at a single header: they ask for [`Traces`], get `None`, and call the
//! limiter with the observer `()` (docs/benchmarks.md, *Traces off*, measures the difference).
//!
//! On, each `ShouldRateLimit` call, `POST /json` and `/check` request:
//!
//! 1. reads the caller's context from the request's headers (gRPC metadata are HTTP/2 headers):
//!    W3C `traceparent`/`tracestate`, else B3 (`b3`, or `x-b3-traceid`, `x-b3-spanid`,
//!    `x-b3-sampled`, ...), as Envoy sends them with tracing on;
//! 2. lets the sampler decide: parent-based (a caller's sampled flag is followed), the ratio for
//!    a request without a caller's context. An unsampled request gets no span at all;
//! 3. becomes a server span, child of the caller's span, whose attributes are filled in while
//!    the limiter decides (see [`DecisionSpan`] for the list) and ended when the answer is known;
//! 4. is queued ([`QUEUE_SPANS`] at most; a full queue drops the span) for one export task on
//!    the main thread's runtime, which sends batches of up to [`BATCH_SPANS`] spans, at the
//!    latest [`BATCH_DELAY`] after the first one queued. A request never waits for the collector:
//!    a slow or dead one only costs spans, counted in `slidegate_trace_spans_total{outcome}`.
//!
//! Why the OpenTelemetry API directly and not `tracing` with `tracing-opentelemetry`: the span
//! is built once per decision with attributes that the limiter already has in hand, and it must
//! not exist at all when traces are off or the request is not sampled. Through `tracing`, every
//! request would enter a span in the subscriber (a registry lookup and a layer call each, on or
//! off), and the attributes would go through `tracing`'s field recording and back. Here the
//! code path when off is one `Option` test.
//!
//! This module knows spans, not decisions: it imports nothing from the limiter or the store.
//! What a decision shows reaches it as names and numbers, from `service::decision`, which is
//! where the limiter's observer for a span lives beside the answer's dynamic metadata.
//!
//! Why a queue of our own ([`ExportQueue`]) and not the SDK's batch processor: the SDK's drops
//! are only logged, never counted where an operator can alert on them, and its processor runs
//! exports on a thread of its own, where the gRPC exporter finds no Tokio runtime.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter as _, SpanProcessor,
};
use prometheus::IntCounter;
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

/// Finished spans waiting for export; past this, spans are dropped (and counted).
pub const QUEUE_SPANS: usize = 8192;

/// Spans sent in one export request at most.
pub const BATCH_SPANS: usize = 512;

/// The longest a span waits for a batch to fill before it is sent.
pub const BATCH_DELAY: Duration = Duration::from_millis(500);

/// How often a batch being filled takes in the queued spans (see [`fill`]).
const FILL_TICK: Duration = Duration::from_millis(10);

/// The time one export may take before it counts as failed.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// At most this many rules and descriptor decisions are listed in a span's attributes, each at
/// most [`MAX_LABEL_BYTES`] long: a rule label can hold request values (`detailed_metric`).
const MAX_LISTED: usize = 16;
const MAX_LABEL_BYTES: usize = 128;

/// How spans reach the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`opentelemetry.proto.collector.trace.v1.TraceService/Export`), port 4317.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`POST /v1/traces`), port 4318.
    Http,
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "grpc" => Ok(Protocol::Grpc),
            "http" | "http/protobuf" => Ok(Protocol::Http),
            other => Err(format!("expected grpc or http, got {other:?}")),
        }
    }
}

/// What `--otlp-*` and `--trace-sampling-ratio` configure.
#[derive(Clone, Debug)]
pub struct TraceSettings {
    /// The collector: `http://host:4317` for gRPC, `http://host:4318` for HTTP (a URL without a
    /// path gets OTLP's `/v1/traces`).
    pub endpoint: String,
    pub protocol: Protocol,
    /// The share of requests without a caller's sampled flag that get a span, 0.0 to 1.0.
    pub sampling_ratio: f64,
    /// The resource's `service.name`, `service.namespace` and `service.instance.id`.
    pub service_name: String,
    pub service_namespace: Option<String>,
    pub service_instance_id: Option<String>,
}

/// Traces cannot start with these settings.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("--trace-sampling-ratio must be between 0.0 and 1.0, got {0}")]
    Ratio(f64),
    #[error("invalid --otlp-endpoint {endpoint:?}: {problem}")]
    Endpoint { endpoint: String, problem: String },
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The tracer, the propagators and the export task's handles: what a traced request needs.
pub struct Traces {
    tracer: SdkTracer,
    /// Kept so that the tracer's processor (and so the export queue) lives as long as `Traces`.
    _provider: SdkTracerProvider,
    propagator: TextMapCompositePropagator,
    flushes: mpsc::Sender<oneshot::Sender<()>>,
    shadow_mode: bool,
    store: &'static str,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").finish_non_exhaustive()
    }
}

impl Traces {
    /// Builds the exporter and starts the export task on the current Tokio runtime. `store` and
    /// `shadow_mode` are the limiter's, for every span.
    pub fn start(
        settings: &TraceSettings,
        metrics: Arc<TraceMetrics>,
        store: &'static str,
        shadow_mode: bool,
    ) -> Result<Traces, TraceError> {
        let ratio = settings.sampling_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(TraceError::Ratio(ratio));
        }
        let resource = resource(settings);
        let mut exporter = exporter(settings)?;
        exporter.set_resource(&resource);
        let (spans, queued) = mpsc::channel(QUEUE_SPANS);
        let (flushes, flush_requests) = mpsc::channel(1);
        tokio::spawn(export_loop(
            exporter,
            queued,
            flush_requests,
            Arc::clone(&metrics),
        ));
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .with_resource(resource)
            .with_span_processor(ExportQueue { spans, metrics })
            .build();
        let tracer = provider.tracer("slidegate");
        // W3C first: a request carrying both is read as `traceparent` says. The B3 propagator is
        // the Zipkin crate's, which is deprecated as an exporter (Zipkin takes OTLP now); its
        // propagator is still the OpenTelemetry project's only Rust implementation of B3.
        #[allow(deprecated)]
        let b3 = opentelemetry_zipkin::Propagator::new();
        let propagator = TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(b3),
        ]);
        Ok(Traces {
            tracer,
            _provider: provider,
            propagator,
            flushes,
            shadow_mode,
            store,
        })
    }

    /// A span for the decision of a request with these headers, or `None` when it is not
    /// sampled. `name` and `transport` follow OpenTelemetry's conventions for gRPC and HTTP
    /// server spans ([`Transport`]).
    pub fn begin(&self, headers: &HeaderMap, transport: Transport) -> Option<DecisionSpan> {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        self.begin_with(&parent, transport)
    }

    fn begin_with(&self, parent: &Context, transport: Transport) -> Option<DecisionSpan> {
        let span = self
            .tracer
            .span_builder(transport.span_name())
            .with_kind(SpanKind::Server)
            .with_attributes(transport.attributes())
            .start_with_context(&self.tracer, parent);
        if !span.is_recording() {
            return None;
        }
        Some(DecisionSpan(Box::new(Recording {
            span,
            transport,
            attributes: Vec::with_capacity(10),
            rules: Vec::new(),
            shadow_mode: self.shadow_mode,
            store: self.store,
        })))
    }

    /// Exports what is queued, waiting at most `timeout` (at shutdown, after the drain).
    pub async fn flush(&self, timeout: Duration) {
        let (done, flushed) = oneshot::channel();
        if self.flushes.send(done).await.is_ok() {
            let _ = tokio::time::timeout(timeout, flushed).await;
        }
    }
}

/// What kind of request a span stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `ShouldRateLimit` over gRPC.
    Grpc,
    /// `POST /json`.
    Json,
    /// `/check` with the request's method.
    Check(&'static str),
}

impl Transport {
    fn span_name(self) -> &'static str {
        match self {
            Transport::Grpc => "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            Transport::Json => "POST /json",
            Transport::Check("GET") => "GET /check",
            Transport::Check("POST") => "POST /check",
            Transport::Check("HEAD") => "HEAD /check",
            Transport::Check(_) => "/check",
        }
    }

    fn attributes(self) -> Vec<KeyValue> {
        match self {
            Transport::Grpc => vec![
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
            ],
            Transport::Json => vec![
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.route", "/json"),
            ],
            Transport::Check(method) => vec![
                KeyValue::new("http.request.method", method),
                KeyValue::new("http.route", "/check"),
            ],
        }
    }
}

/// The span of one sampled decision. Its attributes:
///
/// | attribute | value |
/// |---|---|
/// | `rpc.system`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code` | gRPC calls (OpenTelemetry's RPC conventions) |
/// | `http.request.method`, `http.route`, `http.response.status_code` | `/json` and `/check` (HTTP conventions) |
/// | `slidegate.domain` | the request's domain |
/// | `slidegate.rules` | the matched rules' labels (`name`, else the descriptor path), at most 16 |
/// | `slidegate.decision` | `OK` or `OVER_LIMIT` |
/// | `slidegate.descriptor_decisions` | each descriptor's code, in order, at most 16 |
/// | `slidegate.shadow_mode` | whether the global shadow mode is on |
/// | `slidegate.store` | `memory`, `redis`, `redis-sentinel` or `redis-cluster` |
/// | `slidegate.store.duration` | seconds in the store call (for Redis, the round trip); absent without one |
/// | `slidegate.failure_mode`, `error.type` | when the store failed: the mode that answered, and `timeout`, `connection`, `oom` or `backend` |
///
/// An answer of gRPC `UNAVAILABLE` or HTTP 5xx sets the span's status to error.
///
/// One pointer wide: requests that are not traced carry an `Option<DecisionSpan>` through their
/// futures, which would otherwise grow (and be copied) by the SDK span's size.
pub struct DecisionSpan(Box<Recording>);

/// What a [`DecisionSpan`] holds.
struct Recording {
    span: Span,
    transport: Transport,
    attributes: Vec<KeyValue>,
    rules: Vec<StringValue>,
    shadow_mode: bool,
    store: &'static str,
}

impl DecisionSpan {
    /// The request's domain, before anything is decided.
    pub fn record_domain(&mut self, domain: &str) {
        self.0
            .attributes
            .push(KeyValue::new("slidegate.domain", bounded(domain)));
    }

    /// A matched rule's label; the first [`MAX_LISTED`] are kept.
    pub fn record_rule(&mut self, label: &str) {
        if self.0.rules.len() < MAX_LISTED {
            self.0.rules.push(bounded(label).into());
        }
    }

    /// The store call took `elapsed`.
    pub fn record_store_call(&mut self, elapsed: Duration) {
        self.0.attributes.push(KeyValue::new(
            "slidegate.store.duration",
            elapsed.as_secs_f64(),
        ));
    }

    /// The store call failed with an error of `kind`, and the failure mode `mode` answered.
    pub fn record_store_failure(&mut self, kind: &'static str, mode: &'static str) {
        self.0
            .attributes
            .push(KeyValue::new("slidegate.failure_mode", mode));
        self.0.attributes.push(KeyValue::new("error.type", kind));
    }

    /// Ends the span with the answer: the decision (`OK` or `OVER_LIMIT`, and each
    /// descriptor's), or the error when there was none (also when the request did not decode),
    /// and the status the transport answered (gRPC code or HTTP status).
    pub fn end<I>(mut self, result: Result<(&'static str, I), &dyn Display>, status: u16)
    where
        I: IntoIterator<Item = &'static str>,
    {
        let mut attributes = std::mem::take(&mut self.0.attributes);
        attributes.push(KeyValue::new("slidegate.shadow_mode", self.0.shadow_mode));
        attributes.push(KeyValue::new("slidegate.store", self.0.store));
        if !self.0.rules.is_empty() {
            let rules = std::mem::take(&mut self.0.rules);
            attributes.push(KeyValue::new(
                "slidegate.rules",
                Value::Array(Array::String(rules)),
            ));
        }
        let error = match result {
            Ok((overall, descriptors)) => {
                attributes.push(KeyValue::new("slidegate.decision", overall));
                let codes = descriptors
                    .into_iter()
                    .take(MAX_LISTED)
                    .map(StringValue::from)
                    .collect();
                attributes.push(KeyValue::new(
                    "slidegate.descriptor_decisions",
                    Value::Array(Array::String(codes)),
                ));
                None
            }
            Err(error) => Some(error),
        };
        let failed = match self.0.transport {
            Transport::Grpc => {
                attributes.push(KeyValue::new("rpc.grpc.status_code", i64::from(status)));
                // OpenTelemetry's server-side error codes; UNAVAILABLE is the one answered here.
                matches!(status, 2 | 4 | 12 | 13 | 14 | 15)
            }
            Transport::Json | Transport::Check(_) => {
                attributes.push(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                status >= 500
            }
        };
        self.0.span.set_attributes(attributes);
        if failed && let Some(error) = error {
            self.0.span.set_status(Status::error(error.to_string()));
        }
        self.0.span.end();
    }
}

/// `s` cut to [`MAX_LABEL_BYTES`] at a character boundary.
fn bounded(s: &str) -> String {
    if s.len() <= MAX_LABEL_BYTES {
        return s.to_owned();
    }
    let mut end = MAX_LABEL_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn resource(settings: &TraceSettings) -> Resource {
    let mut attributes = Vec::new();
    if let Some(namespace) = &settings.service_namespace {
        attributes.push(KeyValue::new("service.namespace", namespace.clone()));
    }
    if let Some(instance) = &settings.service_instance_id {
        attributes.push(KeyValue::new("service.instance.id", instance.clone()));
    }
    attributes.push(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attributes(attributes)
        .build()
}

fn exporter(settings: &TraceSettings) -> Result<opentelemetry_otlp::SpanExporter, TraceError> {
    let endpoint = &settings.endpoint;
    let invalid = |problem: &str| TraceError::Endpoint {
        endpoint: endpoint.clone(),
        problem: problem.to_owned(),
    };
    let uri: http::Uri = endpoint.parse().map_err(|_| invalid("not a URL"))?;
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match (settings.protocol, uri.scheme_str()) {
        (_, None) => return Err(invalid("expected http://HOST:PORT or https://HOST:PORT")),
        (Protocol::Grpc, Some("http" | "https")) => builder
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()?,
        (Protocol::Http, Some("http")) => {
            // OTLP/HTTP's path for traces, as OTEL_EXPORTER_OTLP_ENDPOINT adds it.
            let url = match uri.path() {
                "" | "/" => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
                _ => endpoint.clone(),
            };
            builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(url)
                .with_timeout(EXPORT_TIMEOUT)
                .build()?
        }
        (Protocol::Http, Some("https")) => {
            return Err(invalid(
                "OTLP over HTTP is plaintext here; use --otlp-protocol grpc for TLS, or a local collector",
            ));
        }
        (_, Some(_)) => return Err(invalid("expected an http:// or https:// URL")),
    };
    Ok(exporter)
}

/// The tracer's span processor: hands a finished span to the export task, or drops it when the
/// queue is full. Never waits.
#[derive(Debug)]
struct ExportQueue {
    spans: mpsc::Sender<SpanData>,
    metrics: Arc<TraceMetrics>,
}

impl SpanProcessor for ExportQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            self.metrics.trace_spans(SpanOutcome::Dropped, 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Sends the queued spans in batches until the queue closes; on a flush request, sends all that
/// is queued at once and answers.
async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    mut queued: mpsc::Receiver<SpanData>,
    mut flush_requests: mpsc::Receiver<oneshot::Sender<()>>,
    metrics: Arc<TraceMetrics>,
) {
    let mut batch = Vec::with_capacity(BATCH_SPANS);
    loop {
        let flush = tokio::select! {
            received = queued.recv_many(&mut batch, BATCH_SPANS) => {
                if received == 0 {
                    return;
                }
                None
            }
            Some(done) = flush_requests.recv() => Some(done),
        };
        match flush {
            None => {
                fill(&mut queued, &mut batch).await;
                export(&exporter, &mut batch, &metrics).await;
            }
            Some(done) => {
                while let Ok(span) = queued.try_recv() {
                    batch.push(span);
                    if batch.len() == BATCH_SPANS {
                        export(&exporter, &mut batch, &metrics).await;
                    }
                }
                export(&exporter, &mut batch, &metrics).await;
                let _ = done.send(());
            }
        }
    }
}

/// Takes queued spans into `batch` every [`FILL_TICK`] until it is full or [`BATCH_DELAY`] has
/// passed. Waiting on the queue instead had the serving threads wake this task for nearly every
/// span: at tens of thousands of spans a second, about a third of what tracing a call cost.
async fn fill(queued: &mut mpsc::Receiver<SpanData>, batch: &mut Vec<SpanData>) {
    let deadline = tokio::time::Instant::now() + BATCH_DELAY;
    while batch.len() < BATCH_SPANS {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return;
        }
        tokio::time::sleep(FILL_TICK.min(deadline - now)).await;
        while batch.len() < BATCH_SPANS {
            match queued.try_recv() {
                Ok(span) => batch.push(span),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
    }
}

/// Sends `batch` (emptying it) and counts the outcome.
async fn export(
    exporter: &opentelemetry_otlp::SpanExporter,
    batch: &mut Vec<SpanData>,
    metrics: &TraceMetrics,
) {
    if batch.is_empty() {
        return;
    }
    let spans = batch.len();
    let sent = exporter.export(std::mem::replace(batch, Vec::with_capacity(BATCH_SPANS)));
    let outcome = match tokio::time::timeout(EXPORT_TIMEOUT, sent).await {
        Ok(Ok(())) => SpanOutcome::Exported,
        Ok(Err(error)) => {
            tracing::debug!(%error, spans, "trace export failed");
            SpanOutcome::Failed
        }
        Err(_) => {
            tracing::debug!(spans, "trace export timed out");
            SpanOutcome::Failed
        }
    };
    metrics.trace_spans(outcome, spans);
}

/// What became of a finished decision span .
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

/// `slidegate_trace_spans_total`, registered once into the process's [`Metrics`] (with traces
/// off too, so that every scrape shows the same series).
#[derive(Clone, Debug)]
pub struct TraceMetrics {
    spans: [IntCounter; 3],
}

impl Default for TraceMetrics {
    /// Registered in a registry of their own (traces in tests).
    fn default() -> Self {
        Self::new(&Metrics::new())
    }
}

impl TraceMetrics {
    /// Creates and registers the family into `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        // A constant definition: registering it can only fail on a programming error (a
        // duplicate or malformed name), which the unit tests catch.
        let spans = metrics
            .counter_vec(
                "slidegate_trace_spans_total",
                "Decision spans by outcome: exported to the collector, dropped (export queue full), \
                 failed (the export failed).",
                &["outcome"],
            )
            .expect("metric definitions are valid");
        TraceMetrics {
            spans: SpanOutcome::ALL.map(|o| spans.with_label_values(&[o.as_str()])),
        }
    }

    /// Decision spans that met `outcome` (see [`SpanOutcome`]).
    pub fn trace_spans(&self, outcome: SpanOutcome, spans: usize) {
        self.spans[outcome as usize].inc_by(u64::try_from(spans).unwrap_or(u64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(endpoint: &str, protocol: Protocol) -> TraceSettings {
        TraceSettings {
            endpoint: endpoint.to_owned(),
            protocol,
            sampling_ratio: 1.0,
            service_name: "slidegate".to_owned(),
            service_namespace: None,
            service_instance_id: None,
        }
    }

    #[tokio::test]
    async fn bad_settings_are_refused_with_the_reason() {
        let metrics = Arc::new(TraceMetrics::default());
        let start = |s: TraceSettings| Traces::start(&s, Arc::clone(&metrics), "memory", false);
        let mut ratio = settings("http://127.0.0.1:4317", Protocol::Grpc);
        ratio.sampling_ratio = 1.5;
        assert!(matches!(start(ratio), Err(TraceError::Ratio(_))));
        for (endpoint, protocol) in [
            ("127.0.0.1:4317", Protocol::Grpc),
            ("ftp://collector:4317", Protocol::Grpc),
            ("https://collector:4318", Protocol::Http),
            ("not a url", Protocol::Http),
        ] {
            let error = start(settings(endpoint, protocol)).expect_err(endpoint);
            assert!(error.to_string().contains(endpoint), "{endpoint}: {error}");
        }
        assert!(start(settings("http://127.0.0.1:4318", Protocol::Http)).is_ok());
        assert!(start(settings("http://127.0.0.1:4317", Protocol::Grpc)).is_ok());
    }

    #[test]
    fn protocols_parse_as_the_flag_and_envoyproxy_ratelimit_write_them() {
        assert_eq!("grpc".parse(), Ok(Protocol::Grpc));
        assert_eq!("http".parse(), Ok(Protocol::Http));
        assert_eq!("http/protobuf".parse(), Ok(Protocol::Http));
        assert!("udp".parse::<Protocol>().is_err());
    }

    #[test]
    fn long_labels_are_cut_at_a_character_boundary() {
        let label = "é".repeat(100);
        let cut = bounded(&label);
        assert!(cut.len() <= MAX_LABEL_BYTES && label.starts_with(&cut));
        assert_eq!(bounded("short"), "short");
    }
}
