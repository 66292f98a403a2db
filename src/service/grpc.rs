//! gRPC: Envoy's `envoy.service.ratelimit.v3.RateLimitService`, `grpc.health.v1.Health` and server
//! reflection (v1 and v1alpha), so `grpcurl -plaintext HOST:8081 list` and calls work without
//! proto files.
//!
//! `ShouldRateLimit` answers one status per request descriptor, in order:
//!
//! | descriptor | `code` | `current_limit` | `limit_remaining` | `duration_until_reset` |
//! |---|---|---|---|---|
//! | no rule (or unknown domain) | OK | unset | 0 | unset |
//! | `unlimited` rule | OK | unset | 4294967295 | unset |
//! | rule replaced by another matched rule | OK | unset | 0 | unset |
//! | limited rule | OK / OVER_LIMIT | `requests_per_unit`, `unit`, `name` | hits left | time until the oldest hit leaves the window (when over: until the request would fit) |
//!
//! A rule with `unit_multiplier` (a window of several units) is reported with its configured
//! `requests_per_unit` and `unit`: Envoy's `RateLimit` message cannot express the multiplier. The
//! true window is in the `RateLimit-Policy` response header (`10;w=30`).
//!
//! A malformed request is `INVALID_ARGUMENT` with a message naming the field; a store failure with
//! `--failure-mode error` is `UNAVAILABLE`.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus as ProtoStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::Status;

use super::{unit_from_override, unit_to_proto};
use crate::limiter::{
    Code, Descriptor, DescriptorStatus, LimitError, LimitOverride, RateLimiter, Request, Response,
};
use crate::metrics::Transport;

/// The file descriptor set of `proto/` (compiled by `build.rs`), for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/rls_descriptor.bin"));

/// The `RateLimitService`: decodes a `ShouldRateLimit` call for the limiter and encodes its
/// answer. [`crate::server::grpc`] serves it over HTTP/2.
#[derive(Debug, Clone)]
pub struct GrpcService {
    limiter: Arc<RateLimiter>,
}

/// The method's path, as Envoy calls it.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl GrpcService {
    pub fn new(limiter: Arc<RateLimiter>) -> Self {
        GrpcService { limiter }
    }

    /// `ShouldRateLimit`: decide, encode, and count the call.
    pub async fn should_rate_limit(
        &self,
        proto: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        let result = self.limiter.should_rate_limit(&from_proto(&proto)).await;
        self.limiter
            .metrics()
            .observe_request(Transport::Grpc, started.elapsed());
        match result {
            Ok(response) => Ok(to_proto(response)),
            Err(LimitError::InvalidArgument(message)) => Err(Status::invalid_argument(message)),
            Err(error @ LimitError::Unavailable(_)) => Err(Status::unavailable(error.to_string())),
        }
    }
}

/// Borrows a proto request as a limiter request.
pub fn from_proto(proto: &RateLimitRequest) -> Request<'_> {
    Request {
        domain: &proto.domain,
        descriptors: proto
            .descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect(),
                limit: d.limit.as_ref().map(|l| LimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: unit_from_override(l.unit),
                }),
                hits_addend: d.hits_addend.as_ref().map(|h| h.value),
                negative_hits: d.is_negative_hits,
            })
            .collect(),
        hits_addend: u64::from(proto.hits_addend),
    }
}

/// Encodes a limiter response.
pub fn to_proto(response: Response) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(response.overall) as i32,
        statuses: response.statuses.into_iter().map(status).collect(),
        response_headers_to_add: response
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_string(),
                value,
                ..HeaderValue::default()
            })
            .collect(),
        ..RateLimitResponse::default()
    }
}

fn code(code: Code) -> ProtoCode {
    match code {
        Code::Ok => ProtoCode::Ok,
        Code::OverLimit => ProtoCode::OverLimit,
    }
}

fn status(status: DescriptorStatus) -> ProtoStatus {
    ProtoStatus {
        code: code(status.code) as i32,
        current_limit: status.current_limit.map(|limit| RateLimit {
            name: limit.name.unwrap_or_default(),
            requests_per_unit: limit.requests_per_unit,
            unit: unit_to_proto(limit.unit),
        }),
        limit_remaining: status.limit_remaining,
        duration_until_reset: status.duration_until_reset.map(|d| ProtoDuration {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        }),
        quota: None,
    }
}
