//! The serving state, shared by gRPC health (`grpc.health.v1.Health`) and `GET /healthcheck`.
//!
//! The service is SERVING while the store answers, and NOT_SERVING from the moment shutdown
//! begins. No rules (an empty rule directory) is still SERVING, as in envoyproxy/ratelimit: a
//! Kubernetes ConfigMap may start empty, and every request is answered OK until rules arrive;
//! `GET /healthcheck` says so in its body. With rules from a control plane (xDS), NOT_SERVING
//! until its first rules are in, unless the operator forced a start without them (see
//! [`Health::gated`]). A background task pings the store every second and flips the state;
//! transitions are logged once, not on every ping.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::limiter::RateLimiter;

/// The gRPC health service names that report the rate-limit service's state: the whole server
/// (`""`), the name envoyproxy/ratelimit uses, and the fully qualified service name.
pub const SERVICE_NAMES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// How long one health ping may take before the store counts as down.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// The shared serving state.
pub struct Health {
    reporter: HealthReporter,
    serving: AtomicBool,
    shutting_down: AtomicBool,
    /// Whether a check has run (the first result is logged whatever it is).
    checked: AtomicBool,
    /// Set by a rule source whose rules are not in at start (see [`Health::gated`]).
    rules_in: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("serving", &self.is_serving())
            .finish_non_exhaustive()
    }
}

impl Health {
    /// A NOT_SERVING state reporting to `reporter` (see [`tonic_health::server::health_reporter`]).
    pub async fn new(reporter: HealthReporter) -> Arc<Health> {
        Health::build(reporter, None).await
    }

    /// As [`Health::new`], but NOT_SERVING until `rules_in` is true: set once a control plane's
    /// first rules are in (even none: a control plane that serves no rules means it), see
    /// `config::source::xds`.
    pub async fn gated(reporter: HealthReporter, rules_in: Arc<AtomicBool>) -> Arc<Health> {
        Health::build(reporter, Some(rules_in)).await
    }

    async fn build(reporter: HealthReporter, rules_in: Option<Arc<AtomicBool>>) -> Arc<Health> {
        let health = Arc::new(Health {
            reporter,
            serving: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            checked: AtomicBool::new(false),
            rules_in,
        });
        health.publish(false).await;
        health
    }

    /// Whether requests should be sent here.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Records the result of a check; ignored once shutdown has begun.
    pub async fn set_serving(&self, serving: bool) {
        if self.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        let was = self.serving.swap(serving, Ordering::SeqCst);
        if was != serving {
            self.publish(serving).await;
        }
    }

    /// NOT_SERVING from now on.
    pub async fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.serving.store(false, Ordering::SeqCst);
        self.publish(false).await;
    }

    async fn publish(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in SERVICE_NAMES {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// Checks once: the store answers a ping in time (and a control plane's rules are in).
    pub async fn check(&self, limiter: &RateLimiter) {
        // A control plane's rules: not serving until they are in (an empty set included).
        let rules_in = self
            .rules_in
            .as_ref()
            .is_none_or(|rules_in| rules_in.load(Ordering::SeqCst));
        let store = match tokio::time::timeout(PING_TIMEOUT, limiter.store().ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("ping timed out after {PING_TIMEOUT:?}")),
        };
        let serving = rules_in && store.is_ok();
        let first = !self.checked.swap(true, Ordering::SeqCst);
        let changed = first || serving != self.is_serving();
        if changed && !self.shutting_down.load(Ordering::SeqCst) {
            match &store {
                _ if serving => tracing::info!(store = limiter.store().kind(), "serving"),
                Err(error) => {
                    tracing::warn!(store = limiter.store().kind(), %error, "store down: not serving")
                }
                Ok(()) => tracing::warn!("no rules from the control plane yet: not serving"),
            }
        }
        self.set_serving(serving).await;
    }

    /// Checks now and then every `every`, until the returned task is aborted.
    pub fn spawn_checker(
        self: &Arc<Self>,
        limiter: Arc<RateLimiter>,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let health = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                health.check(&limiter).await;
            }
        })
    }
}
