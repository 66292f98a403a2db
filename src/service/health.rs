//! The serving state, shared by gRPC health (`grpc.health.v1.Health`) and `GET /healthcheck`.
//!
//! The service is SERVING while the store can decide, and NOT_SERVING from the moment shutdown
//! begins. The store's health check is a call of its own (for Redis, the script deciding nothing),
//! and its failures are of two kinds:
//! - **unreachable** (connection refused or lost, a timeout): an outage, which passes by itself.
//!   NOT_SERVING while it lasts, unless `--health-ignores-store-outage` (envoyproxy/ratelimit's
//!   behaviour, which its environment selects unless `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true`):
//!   a liveness probe on `/healthcheck` would otherwise restart every replica for an outage that
//!   a restart cannot fix, while Envoy's failure mode already covers the calls.
//! - **incompatible** (the store answers but cannot run the script: a server too old, `EVALSHA`
//!   renamed or forbidden, a Lua error, Redis named in the wrong mode): permanent until the
//!   server changes, so NOT_SERVING whatever the settings. A pod in a restart loop is visible;
//!   calls failing open are not. The store logs it at `error` (rate-limited) and counts it.
//!
//! No rules (an empty rule directory) is still SERVING, as in envoyproxy/ratelimit: a
//! Kubernetes ConfigMap may start empty, and every request is answered OK until rules arrive;
//! `GET /healthcheck` says so in its body. With rules from a control plane (xDS), NOT_SERVING
//! until its first rules are in, unless the operator forced a start without them (see
//! [`Health::gated`]). A background task checks the store every second and flips the state;
//! transitions are logged once, not on every check.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus::{IntGauge, IntGaugeVec};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::limiter::RateLimiter;
use crate::metrics::Metrics;
use crate::store::StoreError;

/// The gRPC health service names that report the rate-limit service's state: the whole server
/// (`""`), the name envoyproxy/ratelimit uses, and the fully qualified service name.
pub const SERVICE_NAMES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// How long one health ping may take before the store counts as down (the Redis store's probe
/// waits up to 1.5 s for a connection, so that its error says what happened).
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// What the last check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Condition {
    Serving = 1,
    /// The store is unreachable and health follows it.
    Outage,
    /// The store is unreachable and health ignores it.
    OutageIgnored,
    Incompatible,
    /// The store refuses the credentials.
    Auth,
    /// The store can decide, but a control plane's first rules are not in.
    NoRules,
}

/// No check has run yet (the first result is logged whatever it is).
const UNCHECKED: u8 = 0;

impl Condition {
    /// Whether the store side of health is SERVING.
    fn serving(self) -> bool {
        matches!(self, Condition::Serving | Condition::OutageIgnored)
    }
}

/// The shared serving state.
pub struct Health {
    reporter: HealthReporter,
    serving: AtomicBool,
    shutting_down: AtomicBool,
    /// The [`Condition`] the last check found (`UNCHECKED` before the first): a change is logged.
    condition: AtomicU8,
    /// SERVING while the store is unreachable (see the module docs).
    ignore_outage: AtomicBool,
    /// Set by a rule source whose rules are not in at start (see [`Health::gated`]).
    rules_in: Option<Arc<AtomicBool>>,
    /// `slidegate_serving` and `slidegate_store_up`, once [`Health::export`] registered them.
    gauges: OnceLock<Gauges>,
}

struct Gauges {
    serving: IntGauge,
    store_up: IntGaugeVec,
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
            condition: AtomicU8::new(UNCHECKED),
            ignore_outage: AtomicBool::new(false),
            rules_in,
            gauges: OnceLock::new(),
        });
        health.publish(false).await;
        health
    }

    /// Stays SERVING while the store is unreachable (`--health-ignores-store-outage`); a store
    /// that cannot run the script is NOT_SERVING all the same.
    pub fn ignore_store_outage(&self, ignore: bool) {
        self.ignore_outage.store(ignore, Ordering::SeqCst);
    }

    /// Shows the state in `metrics`: `slidegate_serving` (1 while SERVING) and
    /// `slidegate_store_up{store}` (1 while the store answers its health probe).
    pub fn export(&self, metrics: &Metrics) {
        let serving = metrics.gauge(
            "slidegate_serving",
            "1 while this process is SERVING (gRPC health and /healthcheck), else 0.",
        );
        let store_up = metrics.gauge_vec(
            "slidegate_store_up",
            "1 while the store answers its health probe, else 0, by store kind.",
            &["store"],
        );
        if let (Ok(serving), Ok(store_up)) = (serving, store_up) {
            serving.set(i64::from(self.is_serving()));
            let _ = self.gauges.set(Gauges { serving, store_up });
        }
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
        if let Some(gauges) = self.gauges.get() {
            gauges.serving.set(i64::from(serving));
        }
        if was != serving {
            self.publish(serving).await;
        }
    }

    /// NOT_SERVING from now on.
    pub async fn shut_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.serving.store(false, Ordering::SeqCst);
        if let Some(gauges) = self.gauges.get() {
            gauges.serving.set(0);
        }
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

    /// Checks once: the store can decide (and a control plane's rules are in).
    pub async fn check(&self, limiter: &RateLimiter) {
        // A control plane's rules: not serving until they are in (an empty set included).
        let rules_in = self
            .rules_in
            .as_ref()
            .is_none_or(|rules_in| rules_in.load(Ordering::SeqCst));
        let store = match tokio::time::timeout(PING_TIMEOUT, limiter.store().ping()).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(PING_TIMEOUT)),
        };
        let condition = match &store {
            Err(StoreError::Incompatible(_)) => Condition::Incompatible,
            Err(StoreError::Auth(_)) => Condition::Auth,
            Err(_) if self.ignore_outage.load(Ordering::SeqCst) => Condition::OutageIgnored,
            Err(_) => Condition::Outage,
            Ok(()) if !rules_in => Condition::NoRules,
            Ok(()) => Condition::Serving,
        };
        let serving = rules_in && condition.serving();
        if let Some(gauges) = self.gauges.get() {
            let up = gauges.store_up.with_label_values(&[limiter.store().kind()]);
            up.set(i64::from(store.is_ok()));
        }
        let was = self.condition.swap(condition as u8, Ordering::SeqCst);
        if was != condition as u8 && !self.shutting_down.load(Ordering::SeqCst) {
            let kind = limiter.store().kind();
            let error = store.err().map(|e| e.to_string()).unwrap_or_default();
            match condition {
                _ if serving && error.is_empty() => tracing::info!(store = kind, "serving"),
                Condition::Incompatible => tracing::error!(
                    store = kind,
                    %error,
                    "store answers but cannot run the rate-limit script: not serving"
                ),
                Condition::Auth => tracing::error!(
                    store = kind,
                    %error,
                    "store refuses slidegate's credentials (check the password and user in \
                     --redis-url or --redis-password-file): not serving"
                ),
                Condition::OutageIgnored => tracing::warn!(
                    store = kind,
                    %error,
                    "store unreachable: calls fail by the failure mode; health stays serving \
                     (--health-ignores-store-outage)"
                ),
                Condition::Outage => {
                    tracing::warn!(store = kind, %error, "store unreachable: not serving")
                }
                _ => tracing::warn!("no rules from the control plane yet: not serving"),
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
