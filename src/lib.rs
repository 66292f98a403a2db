//! slidegate: a sliding-window rate-limit service for Envoy's RateLimitService v3 and nginx.
//!
//! The layers follow the flow of a request, each in its own module:
//!
//! - [`config`]: the YAML rule files, their validation, the descriptor-matching tree and reloads.
//! - [`limiter`]: turns a request (domain + descriptors) into counters using the rules, asks the
//!   store for one all-or-nothing decision, and turns the answer into per-descriptor statuses.
//! - [`store`]: the sliding-window stores (embedded memory, Redis, Redis Cluster) behind one trait.
//! - [`service`]: the transports (gRPC RLS, HTTP `/json`, `/check`, health, `/rlconfig`, `/metrics`).
//! - [`metrics`]: the Prometheus registry, which each layer registers its own families into.
//! - [`telemetry`]: OpenTelemetry traces, one span per decision, exported over OTLP.
//! - [`settings`]: everything `serve` is told, typed: the flags, their defaults, what they build.
//! - [`compat`]: envoyproxy/ratelimit's environment variables, mapped onto slidegate's settings.

pub mod compat;
pub mod config;
pub mod limiter;
pub mod metrics;
pub mod server;
pub mod service;
pub mod settings;
pub mod statsd_mapper;
pub mod store;
pub mod telemetry;
pub mod throttle;

/// Working space that lives for one request: a request has one to a few descriptors and
/// counters, so these stay on the stack, where a heap allocation each would cost more than the
/// arithmetic of the decision.
pub(crate) type Scratch<T> = smallvec::SmallVec<[T; 4]>;
