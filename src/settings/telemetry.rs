//! Traces (where spans go and which requests get one), and envoyproxy/ratelimit's Prometheus
//! listener.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::limiter::envoy_stats::DEFAULT_NEAR_LIMIT_RATIO;
use crate::statsd_mapper::{Mapper, MapperError};
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
    /// A listener that serves only envoyproxy/ratelimit's Prometheus metrics, under its names
    /// (`ratelimit_service_rate_limit_total_hits{domain,key1,key2}` and the rest), as its
    /// `USE_PROMETHEUS` does: HOST:PORT, or :PORT for every interface (Envoy Gateway scrapes
    /// :19001). slidegate's own metrics stay on the operator listener.
    #[arg(long, env = "SLIDEGATE_PROMETHEUS_ADDR", value_parser = parse_listen_addr)]
    pub prometheus_addr: Option<SocketAddr>,
    /// The path of that listener's metrics.
    #[arg(long, env = "SLIDEGATE_PROMETHEUS_PATH", default_value = "/metrics", value_parser = parse_metrics_path)]
    pub prometheus_path: String,
    /// A statsd_exporter mapping file (Envoy Gateway mounts its own) instead of envoyproxy/
    /// ratelimit's default mapping; one that does not load stops the start.
    #[arg(long, env = "SLIDEGATE_PROMETHEUS_MAPPER_YAML")]
    pub prometheus_mapper_yaml: Option<PathBuf>,
    /// With the default mapping: the response time in milliseconds, not seconds (envoyproxy/
    /// ratelimit's `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).
    #[arg(long, env = "SLIDEGATE_PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub prometheus_response_time_as_milliseconds: bool,
    /// The share of a limit past which hits count as `near_limit` in envoyproxy/ratelimit's
    /// metrics (its `NEAR_LIMIT_RATIO`), 0.0 to 1.0.
    #[arg(long, env = "SLIDEGATE_NEAR_LIMIT_RATIO", default_value_t = DEFAULT_NEAR_LIMIT_RATIO, value_parser = parse_ratio)]
    pub near_limit_ratio: f32,
}

/// A ratio from 0.0 to 1.0.
fn parse_ratio(text: &str) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err("expected a number from 0.0 to 1.0".into()),
    }
}

/// `HOST:PORT`, or `:PORT` for every interface (Go's form, which envoyproxy/ratelimit takes).
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_string(),
    };
    full.parse()
        .map_err(|e| format!("{e} (HOST:PORT, or :PORT for every interface)"))
}

/// A path the listener can serve: starting with `/`, without `{`, `}` or `*` (which a router
/// reads as parameters).
pub fn parse_metrics_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(['{', '}', '*']) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?}: expected a path such as /metrics (no {{, }} or *)"
        ))
    }
}

/// The mapping file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MapperFileError {
    #[error("cannot read the statsd mapping file {path:?}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the statsd mapping file {path:?} does not load")]
    Invalid { path: PathBuf, source: MapperError },
}

impl TelemetrySettings {
    /// The mapping the Prometheus listener uses: the file given, else envoyproxy/ratelimit's
    /// default.
    pub fn prometheus_mapper(&self) -> Result<Mapper, MapperFileError> {
        let Some(path) = &self.prometheus_mapper_yaml else {
            return Ok(Mapper::ratelimit_default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| MapperFileError::Read {
            path: path.clone(),
            source,
        })?;
        Mapper::from_yaml(&text).map_err(|source| MapperFileError::Invalid {
            path: path.clone(),
            source,
        })
    }

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
