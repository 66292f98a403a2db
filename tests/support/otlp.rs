//! A test OpenTelemetry collector: receives OTLP traces over gRPC (the `TraceService` of the
//! official protos, from the `opentelemetry-proto` crate) or over HTTP (`POST /v1/traces` with an
//! `ExportTraceServiceRequest` protobuf body) on a free port, and keeps every span.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// One received span with its resource's attributes.
#[derive(Clone, Debug)]
pub struct Received {
    pub span: Span,
    pub resource: Vec<KeyValue>,
}

impl Received {
    /// The span's attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&Value> {
        find(&self.span.attributes, key)
    }

    /// The span's string attribute `key`.
    pub fn text(&self, key: &str) -> Option<&str> {
        match self.attr(key)? {
            Value::StringValue(s) => Some(s),
            _ => None,
        }
    }

    /// The span's string-array attribute `key`.
    pub fn texts(&self, key: &str) -> Vec<String> {
        match self.attr(key) {
            Some(Value::ArrayValue(array)) => array
                .values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The resource's string attribute `key` (`service.name`, ...).
    pub fn resource_text(&self, key: &str) -> Option<&str> {
        match find(&self.resource, key)? {
            Value::StringValue(s) => Some(s),
            _ => None,
        }
    }

    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    pub fn parent_span_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }
}

fn find<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

type Spans = Arc<Mutex<Vec<Received>>>;

fn keep(spans: &Spans, request: ExportTraceServiceRequest) {
    let mut kept = spans.lock().expect("spans lock");
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| r.attributes)
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                kept.push(Received {
                    span,
                    resource: resource.clone(),
                });
            }
        }
    }
}

/// A collector on 127.0.0.1; stops when dropped.
pub struct Collector {
    pub port: u16,
    spans: Spans,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Grpc(Spans);

#[async_trait::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// OTLP/gRPC (what Envoy's OpenTelemetry tracer and `--otlp-protocol grpc` send).
    pub async fn grpc() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let port = listener.local_addr().expect("addr").port();
        let spans = Spans::default();
        let service = TraceServiceServer::new(Grpc(Arc::clone(&spans)));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        Collector { port, spans, task }
    }

    /// OTLP/HTTP with protobuf bodies (`--otlp-protocol http`).
    pub async fn http() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let port = listener.local_addr().expect("addr").port();
        let spans = Spans::default();
        let kept = Arc::clone(&spans);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                    let protobuf = headers
                        .get("content-type")
                        .is_some_and(|v| v == "application/x-protobuf");
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(request) if protobuf => {
                            keep(&kept, request);
                            let answer = ExportTraceServiceResponse {
                                partial_success: None,
                            };
                            (
                                axum::http::StatusCode::OK,
                                [("content-type", "application/x-protobuf")],
                                answer.encode_to_vec(),
                            )
                        }
                        _ => (
                            axum::http::StatusCode::BAD_REQUEST,
                            [("content-type", "text/plain")],
                            b"not an OTLP protobuf body".to_vec(),
                        ),
                    }
                },
            ),
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Collector { port, spans, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().expect("spans lock").clone()
    }

    /// The spans received once `done` holds for them, or all received after `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() > deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
