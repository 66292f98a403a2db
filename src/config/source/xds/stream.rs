//! The discovery protocol: one ADS stream after another, each response applied and answered.
//!
//! On a stream, the first request names the node, the resource type and the version of the rules
//! in force (empty at start); every response is answered with an ACK (its version and nonce) or a
//! NACK (the version still in force, the response's nonce and the errors in `error_detail`). No
//! resource names are sent: a wildcard subscription, so each response holds every domain.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status;
use tonic::transport::Endpoint;

use super::super::super::reload::{ConfigStatus, ReloadHook, ReloadOutcome, SharedStatus};
use super::super::super::{ConfigError, ConfigErrors, LiveRules, RuleSet};
use super::resource::{RESOURCE_TYPE, rules_from};
use super::{MAX_RESPONSE_BYTES, MAX_RETRY_INTERVAL, XdsOptions, bound, connect};

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Keeps streams open for as long as the task runs, waiting between attempts.
pub(super) async fn run(options: XdsOptions, endpoint: Endpoint, mut applier: Applier) {
    let node = connect::node(&options);
    let mut backoff = Backoff::new(options.retry_interval);
    loop {
        let mut received = false;
        let ended = session(&endpoint, &node, &mut applier, &mut received).await;
        // Jitter, so that replicas cut off together do not all come back at the same instant.
        let pause = backoff
            .after(received)
            .mul_f64(rand::random_range(0.8..1.2));
        tracing::warn!(
            server = %options.server,
            reason = %ended,
            retry_in = ?pause,
            "xDS stream to the control plane ended; the rules in force stay until it is back"
        );
        tokio::time::sleep(pause).await;
    }
}

/// The wait before the next connection attempt: the retry interval, doubled after each attempt
/// that got no response, up to [`MAX_RETRY_INTERVAL`] (or the interval, if longer). A stream that
/// delivered a response starts the sequence again: the next trouble is a new one.
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(first: Duration) -> Backoff {
        Backoff {
            first,
            max: MAX_RETRY_INTERVAL.max(first),
            next: first,
        }
    }

    /// The wait after a stream ended; `received`: whether it delivered a response.
    fn after(&mut self, received: bool) -> Duration {
        if received {
            self.next = self.first;
        }
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        wait
    }
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("cannot connect: {}", chain(.0))]
    Connect(tonic::transport::Error),
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    #[error("the control plane closed the stream")]
    Closed,
}

/// An error with its sources: tonic's transport errors say only "transport error" themselves.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// One stream, until it ends. `received` is set once a response has arrived on it.
async fn session(
    endpoint: &Endpoint,
    node: &Node,
    applier: &mut Applier,
    received: &mut bool,
) -> Ended {
    let channel = match endpoint.connect().await {
        Ok(channel) => channel,
        Err(error) => return Ended::Connect(error),
    };
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    let (requests, outgoing) = futures::channel::mpsc::unbounded();
    let subscribe = DiscoveryRequest {
        version_info: applier.version.clone(),
        node: Some(node.clone()),
        type_url: RESOURCE_TYPE.to_owned(),
        ..DiscoveryRequest::default()
    };
    // The receiver is alive: it is in `outgoing`, not yet handed over.
    let _ = requests.unbounded_send(subscribe);
    let mut responses = match client.stream_aggregated_resources(outgoing).await {
        Ok(responses) => responses.into_inner(),
        Err(status) => return Ended::Status(status),
    };
    tracing::info!(version = %applier.version, "xDS stream to the control plane open");
    loop {
        match responses.message().await {
            Ok(Some(response)) => {
                *received = true;
                let reply = applier.apply(response).await;
                if requests.unbounded_send(reply).is_err() {
                    return Ended::Closed;
                }
            }
            Ok(None) => return Ended::Closed,
            Err(status) => return Ended::Status(status),
        }
    }
}

/// Turns responses into live rules, status and metrics, and says how to answer each.
pub(super) struct Applier {
    live: LiveRules,
    hook: ReloadHook,
    status: SharedStatus,
    ready: Arc<AtomicBool>,
    /// The version of the rules in force ("" before the first): sent in NACKs and when a stream
    /// opens.
    version: String,
    /// Whether the last response was refused: then a response equal to the rules in force is
    /// applied again (and reported), since it ends the failure.
    failing: bool,
}

impl Applier {
    pub(super) fn new(
        live: LiveRules,
        hook: ReloadHook,
        status: SharedStatus,
        ready: Arc<AtomicBool>,
    ) -> Applier {
        Applier {
            live,
            hook,
            status,
            ready,
            version: String::new(),
            failing: false,
        }
    }

    /// Applies one response all or nothing; returns its ACK or NACK.
    async fn apply(&mut self, response: DiscoveryResponse) -> DiscoveryRequest {
        let DiscoveryResponse {
            version_info,
            resources,
            type_url,
            nonce,
            ..
        } = response;
        let count = resources.len();
        let result = if type_url != RESOURCE_TYPE {
            Err(ConfigErrors(vec![ConfigError {
                file: "xds".to_owned(),
                message: format!("type_url: `{type_url}` is not `{RESOURCE_TYPE}`"),
            }]))
        } else {
            // Compiling a large rule set takes a while: not on the thread that runs health checks.
            tokio::task::spawn_blocking(move || {
                bound::check(&resources)?;
                rules_from(&resources)
            })
            .await
            .unwrap_or_else(|error| {
                Err(ConfigErrors(vec![ConfigError {
                    file: "xds".to_owned(),
                    message: format!("rule compilation failed: {error}"),
                }]))
            })
        };
        let mut reply = DiscoveryRequest {
            type_url: RESOURCE_TYPE.to_owned(),
            response_nonce: nonce,
            ..DiscoveryRequest::default()
        };
        match result {
            Ok(rules) => {
                self.accept(rules, &version_info, count);
                self.version = version_info;
            }
            Err(errors) => {
                self.refuse(&errors, &version_info);
                reply.error_detail = Some(Status {
                    code: INVALID_ARGUMENT,
                    message: errors.to_string(),
                    details: Vec::new(),
                });
            }
        }
        reply.version_info = self.version.clone();
        reply
    }

    fn accept(&mut self, rules: RuleSet, version: &str, resources: usize) {
        self.ready.store(true, Ordering::SeqCst);
        let checksum = rules.checksum();
        if checksum == self.live.load().checksum() && !self.failing {
            tracing::debug!(version, "xDS response holds the rules in force");
            return;
        }
        self.failing = false;
        let count = rules.rule_count();
        let domains = rules.domain_names().len();
        self.live.store(Arc::new(rules));
        tracing::info!(
            version,
            resources,
            domains,
            rules = count,
            "xDS rules applied"
        );
        let status = ConfigStatus {
            served: checksum,
            on_disk: Some(checksum),
            loaded_at: SystemTime::now(),
            last_error: None,
        };
        (self.hook)(&ReloadOutcome::Loaded { rules: count }, &status);
        self.status.store(Arc::new(status));
    }

    fn refuse(&mut self, errors: &ConfigErrors, version: &str) {
        self.failing = true;
        for error in &errors.0 {
            tracing::warn!(
                version,
                resource = %error.file,
                reason = %error.message,
                "xDS response refused (NACK); keeping the rules in force"
            );
        }
        let mut status = ConfigStatus::clone(&self.status.load());
        status.on_disk = None;
        (self.hook)(&ReloadOutcome::Failed(errors.clone()), &status);
        self.status.store(Arc::new(status));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_starts_again_after_a_response() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(20_000));
        let waits: Vec<Duration> = [false, false, false, false, true, false]
            .into_iter()
            .map(|received| backoff.after(received))
            .collect();
        let expected = [20_000, 40_000, 60_000, 60_000, 20_000, 40_000].map(ms);
        assert_eq!(waits, expected);
        // An interval longer than the cap is used as it is.
        let mut slow = Backoff::new(ms(90_000));
        assert_eq!([slow.after(false), slow.after(false)], [ms(90_000); 2]);
    }
}
