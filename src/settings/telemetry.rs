//! Traces: where spans go and which requests get one.

use crate::telemetry::{Protocol, TraceSettings};

#[derive(clap::Args, Debug, Clone)]
pub struct TelemetrySettings {
    /// OpenTelemetry collector to send traces to, one span per decision (docs/traces.md):
    /// `http://HOST:4317` for gRPC, `http://HOST:4318` for HTTP (a URL without a path gets
    /// `/v1/traces`). Without it no span is made at all.
    #[arg(long, env = "SLIDEGATE_OTLP_ENDPOINT", hide_env_values = true)]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc`, or `http` (protobuf bodies).
    #[arg(long, env = "SLIDEGATE_OTLP_PROTOCOL", default_value = "grpc")]
    pub otlp_protocol: Protocol,
    /// The `service.name` of the spans.
    #[arg(long, env = "SLIDEGATE_OTLP_SERVICE_NAME", default_value = "slidegate")]
    pub otlp_service_name: String,
    /// The `service.namespace` of the spans.
    #[arg(long, env = "SLIDEGATE_OTLP_SERVICE_NAMESPACE")]
    pub otlp_service_namespace: Option<String>,
    /// The `service.instance.id` of the spans (a pod's name, for instance).
    #[arg(long, env = "SLIDEGATE_OTLP_SERVICE_INSTANCE_ID")]
    pub otlp_service_instance_id: Option<String>,
    /// Share of requests traced when the caller sent no sampling decision, 0.0 to 1.0; a caller's
    /// `traceparent` or B3 sampled flag is always followed.
    #[arg(long, env = "SLIDEGATE_TRACE_SAMPLING_RATIO", default_value_t = 1.0)]
    pub trace_sampling_ratio: f64,
}

impl TelemetrySettings {
    /// The trace settings when --otlp-endpoint is given.
    pub fn traces(&self) -> Option<TraceSettings> {
        Some(TraceSettings {
            endpoint: self.otlp_endpoint.clone()?,
            protocol: self.otlp_protocol,
            sampling_ratio: self.trace_sampling_ratio,
            service_name: self.otlp_service_name.clone(),
            service_namespace: self.otlp_service_namespace.clone(),
            service_instance_id: self.otlp_service_instance_id.clone(),
        })
    }
}
