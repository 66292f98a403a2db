//! The log, what a decision does, metrics and traces.

use super::value::Value;
use super::{CompatError, Env, Translation, Unhonoured, invalid, set};
use crate::settings::{LogFormat, parse_listen_addr, parse_metrics_path};
use crate::telemetry::Protocol;

/// `LOG_LEVEL` (logrus levels) → `--log-level`, `LOG_FORMAT` → `--log-format`.
pub(super) fn logging<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    if let Some(level) = env.take("LOG_LEVEL") {
        // envoyproxy/ratelimit's levels apply to its own messages: other crates stay at warn.
        let filter = match level.to_ascii_lowercase().as_str() {
            "trace" => "warn,slidegate=trace",
            "debug" => "warn,slidegate=debug",
            "info" => "warn,slidegate=info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => {
                return Err(invalid(
                    "LOG_LEVEL",
                    &level,
                    "expected trace, debug, info, warn, error, fatal or panic",
                ));
            }
        };
        set(out, Value::LogLevel(filter.to_owned()), "LOG_LEVEL");
    }
    if let Some(format) = env.take("LOG_FORMAT") {
        let format = match format.to_ascii_lowercase().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(invalid("LOG_FORMAT", other, "expected text or json")),
        };
        set(out, Value::LogFormat(format), "LOG_FORMAT");
    }
    Ok(())
}

/// What a decision does: shadow and quota mode, response headers and metadata, the handling of denied hits and split
/// domains.
pub(super) fn behaviour<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    if let Some(shadow) = env.flag("SHADOW_MODE")? {
        set(out, Value::ShadowMode(shadow), "SHADOW_MODE");
    }
    if let Some(quota) = env.flag("QUOTA_MODE")? {
        set(out, Value::QuotaMode(quota), "QUOTA_MODE");
    }
    if let Some(metadata) = env.flag("RESPONSE_DYNAMIC_METADATA")? {
        set(
            out,
            Value::ResponseMetadata(metadata),
            "RESPONSE_DYNAMIC_METADATA",
        );
    }
    // envoyproxy/ratelimit sends no headers unless asked; slidegate's default is to send them.
    let headers = env.flag("LIMIT_RESPONSE_HEADERS_ENABLED")?.unwrap_or(false);
    set(
        out,
        Value::ResponseHeaders(headers),
        "LIMIT_RESPONSE_HEADERS_ENABLED",
    );
    for (name, default) in [
        ("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
        ("LIMIT_RESET_HEADER", "RateLimit-Reset"),
    ] {
        if env
            .take(name)
            .is_some_and(|header| !header.eq_ignore_ascii_case(default))
        {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why: "slidegate's header names are fixed (RateLimit-Limit, -Remaining, -Reset)",
            });
        }
    }
    // `false` (recording denied hits too) only when given: unset, slidegate keeps its own
    // default, under which charges (response costs) land and ordinary denied hits do not.
    if let Some(stop) = env.flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
        set(
            out,
            Value::RecordOverLimit(!stop),
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        );
    }
    env.expect_flag(
        "MERGE_DOMAIN_CONFIG",
        false,
        "each domain must be in one rule file; a domain split over files is refused at load",
        out,
    )?;
    // Not needed: slidegate's exact cache of denied counters is on by default (--redis-deny-cache).
    env.take("LOCAL_CACHE_SIZE_IN_BYTES");
    Ok(())
}

/// Metrics and traces: slidegate has its own Prometheus metrics at `/metrics` on the operator
/// listener (`DEBUG_HOST`/`DEBUG_PORT`), envoyproxy/ratelimit's on `PROMETHEUS_ADDR` with
/// `USE_PROMETHEUS=true`, and traces as envoyproxy/ratelimit's `TRACING_*` variables configure
/// them.
pub(super) fn observability<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    tracing(env, out)?;
    env.expect_flag(
        "USE_STATSD",
        false,
        "no StatsD: Prometheus metrics are served at /metrics on the debug port (DEBUG_PORT)",
        out,
    )?;
    prometheus(env, out)
}

/// `USE_PROMETHEUS=true` → `--prometheus-addr` (`PROMETHEUS_ADDR`, default `:9090`), its path,
/// mapping file and response-time unit: envoyproxy/ratelimit's metrics under its names on their
/// own listener, where Envoy Gateway's scrape and dashboard look.
fn prometheus<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let variables = [
        "PROMETHEUS_ADDR",
        "PROMETHEUS_PATH",
        "PROMETHEUS_MAPPER_YAML",
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    ];
    if env.flag("USE_PROMETHEUS")? != Some(true) {
        for name in variables {
            env.unhonoured_if_set(name, "only read with USE_PROMETHEUS=true", out);
        }
        return Ok(());
    }
    let addr = (env.take("PROMETHEUS_ADDR")).unwrap_or_else(|| ":9090".into());
    let parsed = parse_listen_addr(&addr)
        .map_err(|_| invalid("PROMETHEUS_ADDR", &addr, "expected HOST:PORT or :PORT"))?;
    set(out, Value::PrometheusAddr(parsed), "PROMETHEUS_ADDR");
    if let Some(path) = env.take("PROMETHEUS_PATH") {
        let path = parse_metrics_path(&path)
            .map_err(|_| invalid("PROMETHEUS_PATH", &path, "expected a path such as /metrics"))?;
        set(out, Value::PrometheusPath(path), "PROMETHEUS_PATH");
    }
    if let Some(file) = env.take("PROMETHEUS_MAPPER_YAML") {
        set(
            out,
            Value::PrometheusMapperYaml(file.into()),
            "PROMETHEUS_MAPPER_YAML",
        );
    }
    if let Some(ratio) = env.take("NEAR_LIMIT_RATIO") {
        let parsed = ratio
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| invalid("NEAR_LIMIT_RATIO", &ratio, "expected 0.0 to 1.0"))?;
        set(out, Value::NearLimitRatio(parsed), "NEAR_LIMIT_RATIO");
    }
    if let Some(ms) = env.flag("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")? {
        set(
            out,
            Value::PrometheusResponseTimeAsMilliseconds(ms),
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        );
    }
    Ok(())
}

/// `TRACING_ENABLED=true` → `--otlp-endpoint` from the OpenTelemetry variables that
/// envoyproxy/ratelimit's exporter reads (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT`, else a collector on localhost), and the other `TRACING_*`
/// variables → the other `--otlp-*` flags and `--trace-sampling-ratio`, with
/// envoyproxy/ratelimit's defaults: HTTP, service name `RateLimit`, every request sampled.
/// Without `TRACING_ENABLED=true` they are read and unused, as there.
fn tracing<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let enabled = env.flag("TRACING_ENABLED")? == Some(true);
    let protocol = env
        .take("TRACING_EXPORTER_PROTOCOL")
        .unwrap_or_else(|| "http".to_owned());
    let protocol = match protocol.as_str() {
        "http" => Protocol::Http,
        "grpc" => Protocol::Grpc,
        _ => {
            return Err(invalid(
                "TRACING_EXPORTER_PROTOCOL",
                &protocol,
                "expected http or grpc",
            ));
        }
    };
    let ratio = match env.take("TRACING_SAMPLING_RATE") {
        Some(value) => match value.parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
            _ => {
                return Err(invalid(
                    "TRACING_SAMPLING_RATE",
                    &value,
                    "expected 0.0 to 1.0",
                ));
            }
        },
        None => 1.0,
    };
    let name = env
        .take("TRACING_SERVICE_NAME")
        .unwrap_or_else(|| "RateLimit".to_owned());
    let namespace = env.take("TRACING_SERVICE_NAMESPACE");
    let instance = env.take("TRACING_SERVICE_INSTANCE_ID");
    if !enabled {
        return Ok(());
    }
    let (endpoint, from) = match (
        env.take("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        env.take("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        (Some(url), _) => (url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        (None, Some(url)) => (url, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (None, None) if protocol == Protocol::Grpc => {
            ("localhost:4317".to_owned(), "TRACING_ENABLED")
        }
        (None, None) => ("localhost:4318".to_owned(), "TRACING_ENABLED"),
    };
    // Go's exporters take `host:port` too; slidegate's flag takes a URL.
    let endpoint = match endpoint.contains("://") {
        true => endpoint,
        false => format!("http://{endpoint}"),
    };
    set(out, Value::OtlpEndpoint(endpoint), from);
    set(
        out,
        Value::OtlpProtocol(protocol),
        "TRACING_EXPORTER_PROTOCOL",
    );
    set(
        out,
        Value::TraceSamplingRatio(ratio),
        "TRACING_SAMPLING_RATE",
    );
    set(out, Value::OtlpServiceName(name), "TRACING_SERVICE_NAME");
    if let Some(namespace) = namespace {
        set(
            out,
            Value::OtlpServiceNamespace(namespace),
            "TRACING_SERVICE_NAMESPACE",
        );
    }
    if let Some(instance) = instance {
        set(
            out,
            Value::OtlpServiceInstanceId(instance),
            "TRACING_SERVICE_INSTANCE_ID",
        );
    }
    Ok(())
}
