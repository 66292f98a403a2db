//! envoyproxy/ratelimit's Prometheus metrics, under its names, for what scrapes it as it is
//! deployed (Envoy Gateway: `USE_PROMETHEUS=true`, `PROMETHEUS_ADDR=:19001`, its mapping file in
//! `PROMETHEUS_MAPPER_YAML`; its dashboard and alerts query `ratelimit_service_*`).
//!
//! envoyproxy/ratelimit writes statsd-style names and turns them into Prometheus names through a
//! statsd_exporter mapping, its default or the file given. Here the same names are built at each
//! scrape from what slidegate counts, and mapped by the same rules ([`crate::statsd_mapper`]):
//! - `ratelimit.service.rate_limit.<domain>.<key>.<stat>` from the per-rule stats
//!   ([`EnvoyStats`]); a name appears once its counter is above 0, as there;
//! - `ratelimit_server.ShouldRateLimit.total_requests` and `.response_time` (milliseconds, times
//!   the mapping's `scale`) from the gRPC transport's request histogram;
//! - `ratelimit.service.config_load_success` and `_error` from the rule reloads.
//!
//! Series that map to the same name and labels are added up (the default mapping folds levels
//! past the second into one series). Names no mapping matches are served escaped and without
//! labels, as statsd_exporter serves them. `SanitizeStatName` is applied to the keys: `:` and
//! `|` become `_`, and so do the dots of an IPv4 address.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use prometheus::proto::{MetricFamily, MetricType};

use crate::limiter::envoy_stats::{EnvoyStats, STATS};
use crate::metrics::Metrics;
use crate::statsd_mapper::{Mapped, Mapper, MetricKind};

/// The gRPC method envoyproxy/ratelimit names its request stats after.
const METHOD: &str = "ShouldRateLimit";

/// What the listener renders from.
#[derive(Clone)]
pub struct RatelimitPrometheus {
    pub stats: Arc<EnvoyStats>,
    pub metrics: Arc<Metrics>,
    pub mapper: Arc<Mapper>,
    /// The response time in milliseconds whatever the mapping's `scale` (envoyproxy/ratelimit's
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`, which removes the scale from its default).
    pub response_time_ms: bool,
    /// Rule loads before the reloads count (1 for the rule files read at start; rules from a
    /// control plane count from their first response).
    pub initial_loads: u64,
}

/// A series' labels, by name.
type Labels = Vec<(String, String)>;

/// One mapped family: its type and its series (labels → value).
struct Family {
    kind: &'static str,
    series: BTreeMap<Vec<(String, String)>, f64>,
}

impl RatelimitPrometheus {
    /// The Prometheus text format of every mapped stat.
    pub fn render(&self) -> String {
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        let mut counter = |name: &str, value: u64| {
            if value == 0 {
                return;
            }
            let Some((name, labels, scale)) = self.mapped(name, MetricKind::Counter) else {
                return;
            };
            let family = families.entry(name).or_insert_with(|| Family {
                kind: "counter",
                series: BTreeMap::new(),
            });
            let mut labels = labels;
            labels.sort();
            *family.series.entry(labels).or_default() += value as f64 * scale.unwrap_or(1.0);
        };
        for (key, values) in self.stats.snapshot() {
            let key = sanitize(&key);
            for (stat, value) in STATS.iter().zip(values) {
                counter(&format!("ratelimit.service.rate_limit.{key}.{stat}"), value);
            }
        }
        let gathered = self.metrics.gather();
        let reloads = |result: &str| {
            counter_value(
                &gathered,
                "slidegate_config_reloads_total",
                ("result", result),
            )
        };
        counter(
            "ratelimit.service.config_load_success",
            self.initial_loads + reloads("success"),
        );
        counter("ratelimit.service.config_load_error", reloads("failure"));
        let requests = grpc_requests(&gathered);
        if let Some(histogram) = &requests {
            counter(
                &format!("ratelimit_server.{METHOD}.total_requests"),
                histogram.get_sample_count(),
            );
        }
        let mut out = String::with_capacity(4096);
        for (name, family) in &families {
            write_family(&mut out, name, family);
        }
        if let Some(histogram) = requests {
            self.response_time(&mut out, &histogram);
        }
        // The standard process metrics, as envoyproxy/ratelimit's default registry serves them.
        let process: Vec<MetricFamily> = gathered
            .into_iter()
            .filter(|f| f.name().starts_with("process_"))
            .collect();
        let mut text = Vec::new();
        if prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &process, &mut text).is_ok()
        {
            out.push_str(&String::from_utf8_lossy(&text));
        }
        out
    }

    /// The Prometheus name, labels and scale of the statsd name `name`; `None` when dropped.
    fn mapped(&self, name: &str, kind: MetricKind) -> Option<(String, Labels, Option<f64>)> {
        match self.mapper.map(name, kind) {
            Mapped::Drop => None,
            Mapped::Unmapped { name } => Some((name, Vec::new(), None)),
            Mapped::Metric {
                name,
                labels,
                scale,
                ..
            } => Some((name, labels, scale)),
        }
    }

    /// `ratelimit_server.ShouldRateLimit.response_time` as a histogram, mapped: envoyproxy/
    /// ratelimit observes milliseconds, which the mapping's `scale` turns into seconds (its
    /// default mapping) or not (Envoy Gateway's file has no `scale`).
    fn response_time(&self, out: &mut String, histogram: &prometheus::proto::Histogram) {
        let statsd = format!("ratelimit_server.{METHOD}.response_time");
        let Some((name, labels, scale)) = self.mapped(&statsd, MetricKind::Observer) else {
            return;
        };
        let scale = if self.response_time_ms { None } else { scale };
        let unit = 1000.0 * scale.unwrap_or(1.0);
        let _ = writeln!(
            out,
            "# HELP {name} Metric autogenerated by statsd_exporter."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        let with = |extra: Option<(&str, String)>| {
            let mut all: Vec<(String, String)> = labels.clone();
            if let Some((k, v)) = extra {
                all.push((k.to_string(), v));
            }
            render_labels(&all)
        };
        for bucket in histogram.get_bucket() {
            let le = bucket.upper_bound() * unit;
            let _ = writeln!(
                out,
                "{name}_bucket{} {}",
                with(Some(("le", le.to_string()))),
                bucket.cumulative_count()
            );
        }
        let count = histogram.get_sample_count();
        let _ = writeln!(
            out,
            "{name}_bucket{} {count}",
            with(Some(("le", "+Inf".into())))
        );
        let _ = writeln!(
            out,
            "{name}_sum{} {}",
            with(None),
            histogram.get_sample_sum() * unit
        );
        let _ = writeln!(out, "{name}_count{} {count}", with(None));
    }
}

/// Serves `view` at `path` on `listener` until `stop`, and nothing else (404).
pub async fn serve(
    listener: tokio::net::TcpListener,
    path: String,
    view: RatelimitPrometheus,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use axum::http::header::CONTENT_TYPE;
    let app = axum::Router::new().route(
        &path,
        axum::routing::get(move || {
            let view = view.clone();
            async move {
                let text = view.render();
                (
                    [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                    text,
                )
            }
        }),
    );
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(stopped)
        .await
    {
        tracing::warn!(%error, "the Prometheus listener stopped");
    }
}

/// envoyproxy/ratelimit's `SanitizeStatName`: `:` and `|` become `_`, and so do the dots inside
/// what looks like an IPv4 address (four groups of one to three digits).
pub fn sanitize(key: &str) -> String {
    let replaced: String = key
        .chars()
        .map(|c| if c == ':' || c == '|' { '_' } else { c })
        .collect();
    let bytes = replaced.as_bytes();
    let mut out = String::with_capacity(replaced.len());
    let mut i = 0;
    while i < bytes.len() {
        match ipv4_at(bytes, i) {
            Some(end) => {
                out.push_str(&replaced[i..end].replace('.', "_"));
                i = end;
            }
            None => {
                let next = replaced[i..].chars().next().map_or(1, char::len_utf8);
                out.push_str(&replaced[i..i + next]);
                i += next;
            }
        }
    }
    out
}

/// The end of an IPv4-looking run (`\d{1,3}(\.\d{1,3}){3}`) starting at `at`, matched leftmost
/// and greedy as Go's regexp does.
fn ipv4_at(bytes: &[u8], at: usize) -> Option<usize> {
    let mut i = at;
    for group in 0..4 {
        if group > 0 {
            if bytes.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let digits = bytes[i.min(bytes.len())..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        i += digits;
    }
    Some(i)
}

fn write_family(out: &mut String, name: &str, family: &Family) {
    let _ = writeln!(
        out,
        "# HELP {name} Metric autogenerated by statsd_exporter."
    );
    let _ = writeln!(out, "# TYPE {name} {}", family.kind);
    for (labels, value) in &family.series {
        let _ = writeln!(out, "{name}{} {value}", render_labels(labels));
    }
}

fn render_labels(labels: &[(String, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut text = String::from("{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(text, "{k}=\"{v}\"");
    }
    text.push('}');
    text
}

/// The value of the counter family `name`'s series with `label`.
fn counter_value(families: &[MetricFamily], name: &str, label: (&str, &str)) -> u64 {
    families
        .iter()
        .filter(|f| f.name() == name && f.get_field_type() == MetricType::COUNTER)
        .flat_map(|f| f.get_metric())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == label.0 && l.value() == label.1)
        })
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// The gRPC transport's request-duration histogram: its series of every `code`, merged (they
/// share their buckets).
fn grpc_requests(families: &[MetricFamily]) -> Option<prometheus::proto::Histogram> {
    let mut merged: Option<prometheus::proto::Histogram> = None;
    let grpc = families
        .iter()
        .filter(|f| f.name() == "slidegate_request_duration_seconds")
        .flat_map(|f| f.get_metric())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "transport" && l.value() == "grpc")
        });
    for metric in grpc {
        let histogram = metric.get_histogram();
        match &mut merged {
            None => merged = Some(histogram.clone()),
            Some(total) => {
                total.set_sample_count(total.get_sample_count() + histogram.get_sample_count());
                total.set_sample_sum(total.get_sample_sum() + histogram.get_sample_sum());
                let mut buckets = total.get_bucket().to_vec();
                for (bucket, more) in buckets.iter_mut().zip(histogram.get_bucket()) {
                    bucket
                        .set_cumulative_count(bucket.cumulative_count() + more.cumulative_count());
                }
                total.set_bucket(buckets);
            }
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizes_as_envoyproxy_ratelimit() {
        assert_eq!(
            sanitize("d.remote_address_10.0.0.1"),
            "d.remote_address_10_0_0_1"
        );
        assert_eq!(sanitize("d.a:b|c.v1.2"), "d.a_b_c.v1.2");
        assert_eq!(sanitize("d.k_1234.5.6.7"), "d.k_1234_5_6_7");
    }

    #[test]
    fn renders_the_default_names() {
        let stats = Arc::new(EnvoyStats::default());
        stats.rule("d", "a").record(10, 8, 0, 3, false, false);
        stats.rule("d", "a_v.b").record(2, 1, 2, 1, true, false);
        stats.rule("d", "a_v.b.c").record(2, 1, 2, 4, true, false);
        let prometheus = RatelimitPrometheus {
            stats,
            metrics: Arc::new(Metrics::new()),
            mapper: Arc::new(Mapper::ratelimit_default()),
            response_time_ms: false,
            initial_loads: 1,
        };
        let text = prometheus.render();
        for line in [
            r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="a"} 3"#,
            r#"ratelimit_service_rate_limit_within_limit{domain="d",key1="a"} 3"#,
            // The third level folds into the second's series: 1 + 4 over.
            r#"ratelimit_service_rate_limit_over_limit{domain="d",key1="a_v",key2="b"} 5"#,
            "# TYPE ratelimit_service_rate_limit_total_hits counter",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        assert!(
            !text.contains("shadow_mode"),
            "zero counters are not shown\n{text}"
        );
    }
}
