//! The transports: gRPC RateLimitService v3 and the HTTP endpoints.
//!
//! Each transport only decodes a request into a [`limiter::Request`](crate::limiter::Request),
//! calls [`RateLimiter::should_rate_limit`](crate::limiter::RateLimiter::should_rate_limit) and
//! encodes the answer; the decisions live in [`crate::limiter`].
//!
//! - [`rls`]: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, `grpc.health.v1.Health`,
//!   server reflection.
//! - [`http_routes`]: `POST /json`, `/check` (nginx `auth_request`, forward-auth), `GET /healthcheck`,
//!   on the HTTP port;
//! - [`operator`]: the operator listener: `GET /rlconfig`, `GET /metrics`, `POST /explain`.
//! - [`rlqs`]: the Rate Limit Quota Service (`StreamRateLimitQuotas`), beside `rls` on the gRPC
//!   port.
//! - [`side`]: gRPC health and reflection, beside RateLimitService.
//! - [`health`]: the serving state shared by both.
//! - [`front`]: the limiter, traces and metrics every transport shares.
//! - [`caller`]: who called, for the lines that say what a request did.
//! - [`decision`]: what a decision shows to traces and to the answer's dynamic metadata.

use crate::config::Unit;
use crate::limiter::{Descriptor, LimitError, LimitOverride, RateLimiter, Request, Response};
use crate::telemetry::DecisionSpan;
pub use caller::{Caller, PeerKey};

pub mod answer;
pub mod caller;
pub mod check;
pub mod decision;
pub mod front;
pub mod health;
pub mod http_routes;
pub mod json;
pub mod operator;
pub mod ratelimit_prometheus;
pub mod rlqs;
pub mod rls;
pub mod side;
pub mod wire;

/// A decoded request that owns its strings (for the HTTP transports, whose bodies and headers are
/// decoded into new strings). [`OwnedRequest::as_request`] borrows it for the limiter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedRequest {
    pub domain: String,
    pub descriptors: Vec<OwnedDescriptor>,
    pub hits_addend: u64,
}

/// One descriptor of an [`OwnedRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedDescriptor {
    pub entries: Vec<(String, String)>,
    pub limit: Option<LimitOverride>,
    pub hits_addend: Option<u64>,
    pub negative_hits: bool,
}

impl OwnedRequest {
    pub fn as_request(&self) -> Request<'_> {
        Request {
            domain: &self.domain,
            descriptors: self
                .descriptors
                .iter()
                .map(|d| Descriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    negative_hits: d.negative_hits,
                })
                .collect(),
            hits_addend: self.hits_addend,
            costs_are_charges: false,
        }
    }
}

/// Decides `request`, recorded by `span` when the request is traced: the one call every
/// transport makes.
pub async fn decide(
    limiter: &RateLimiter,
    request: &Request<'_>,
    span: &mut Option<DecisionSpan>,
) -> Result<Response, LimitError> {
    match span {
        None => limiter.should_rate_limit(request).await,
        // Boxed: the untraced requests' futures keep the size they have without traces.
        Some(span) => Box::pin(limiter.should_rate_limit_observed(request, span)).await,
    }
}

/// The number of a unit in Envoy's `RateLimitResponse.RateLimit.Unit`.
pub fn unit_to_proto(unit: Unit) -> i32 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 2,
        Unit::Hour => 3,
        Unit::Day => 4,
        Unit::Month => 5,
        Unit::Year => 6,
        Unit::Week => 7,
    }
}

/// A unit of a limit override; `None` for `UNKNOWN` and numbers Envoy does not define.
///
/// The override's type, `envoy.type.v3.RateLimitUnit`, has no WEEK, but the response's
/// `RateLimit.Unit` has WEEK = 7, and envoyproxy/ratelimit reads an override's number as the
/// response's unit: 7 is a week there, and so here.
pub fn unit_from_override(number: i32) -> Option<Unit> {
    match number {
        1 => Some(Unit::Second),
        2 => Some(Unit::Minute),
        3 => Some(Unit::Hour),
        4 => Some(Unit::Day),
        5 => Some(Unit::Month),
        6 => Some(Unit::Year),
        7 => Some(Unit::Week),
        _ => None,
    }
}
