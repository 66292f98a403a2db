//! The fixture of the `service_*` tests: the rules they serve (`RULES`), a `Server` (the real
//! `slidegate` binary on free ports with those rules, killed on drop), and the helpers that read
//! its answers: RateLimit headers, limits, reset times, `/metrics` series and gRPC health.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::support::{Slidegate, metric_sum, metric_value};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

pub(crate) const RULES: &str = r#"
domain: test
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 3 }
  - key: window
    rate_limit: { unit: second, unit_multiplier: 30, requests_per_unit: 10 }
  - key: free
    rate_limit: { unlimited: true }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: general
    rate_limit: { name: general, unit: minute, requests_per_unit: 1 }
  - key: specific
    rate_limit:
      name: specific
      unit: minute
      requests_per_unit: 5
      replaces: [{ name: general }]
  - key: two
    rate_limits:
      - { unit: second, requests_per_unit: 2 }
      - { unit: minute, requests_per_unit: 5 }
"#;
pub(crate) const RULE_COUNT: usize = 7;

/// A running slidegate on free ports, killed on drop.
pub(crate) struct Server {
    pub(crate) slidegate: Slidegate,
    pub(crate) rules: tempfile::TempDir,
}

/// The process-level helpers (ports, log, signals, exit) are those of [`Slidegate`].
impl std::ops::Deref for Server {
    type Target = Slidegate;
    fn deref(&self) -> &Slidegate {
        &self.slidegate
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut Slidegate {
        &mut self.slidegate
    }
}

impl Server {
    pub(crate) fn start(args: &[&str]) -> Server {
        Server::start_with_rules(RULES, args)
    }

    pub(crate) fn start_with_rules(rules: &str, args: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
        std::fs::write(dir.path().join("rules/rules.yaml"), rules).expect("write rules");
        Server {
            slidegate: Slidegate::start(&dir.path().join("rules"), args),
            rules: dir,
        }
    }

    pub(crate) fn rules_file(&self) -> PathBuf {
        self.rules.path().join("rules/rules.yaml")
    }

    pub(crate) async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(self.url(path)).await.expect("GET")
    }

    pub(crate) async fn metrics(&self) -> Metrics {
        Metrics(
            self.get("/metrics")
                .await
                .text()
                .await
                .expect("metrics body"),
        )
    }
}

pub(crate) fn headers(response: &RateLimitResponse) -> HashMap<String, String> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.to_ascii_lowercase(), h.value.clone()))
        .collect()
}

pub(crate) fn limit(status: &DescriptorStatus) -> Option<(String, u32, Unit)> {
    status
        .current_limit
        .as_ref()
        .map(|l| (l.name.clone(), l.requests_per_unit, l.unit()))
}

pub(crate) fn reset_secs(status: &DescriptorStatus) -> f64 {
    let d = status.duration_until_reset.expect("duration_until_reset");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// The Prometheus text of `/metrics`, with a lookup by series.
pub(crate) struct Metrics(pub(crate) String);

impl Metrics {
    /// The value of one series, e.g. `slidegate_unknown_domain_total` or
    /// `slidegate_no_rule_total{domain="test"}` (labels in the order the encoder writes them:
    /// alphabetical). Missing series are 0.
    pub(crate) fn get(&self, series: &str) -> f64 {
        metric_value(&self.0, series)
    }

    /// The sum of a family's series that carry `label`, whatever their other labels.
    pub(crate) fn sum(&self, family: &str, label: &str) -> f64 {
        metric_sum(&self.0, family, label)
    }
}

pub(crate) async fn health_status(
    channel: Channel,
    service: &str,
) -> Result<ServingStatus, tonic::Status> {
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await?;
    Ok(response.into_inner().status())
}

/// A blocking GET for polling inside `wait_until`; the body, or "" on any error.
pub(crate) fn get_text_blocking(url: &str) -> String {
    let url = url.to_string();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async { reqwest::get(&url).await.ok()?.text().await.ok() })
    })
    .join()
    .ok()
    .flatten()
    .unwrap_or_default()
}
