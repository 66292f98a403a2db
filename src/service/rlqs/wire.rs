//! The Rate Limit Quota Service's messages as they are on the wire, with a bucket id's values
//! read as bytes, and the gRPC route that reads them.
//!
//! A bucket id's values come from a client's request (`custom_value` from a header), and Envoy
//! copies header bytes into them unchanged, UTF-8 or not (obs-text). prost refuses a proto3
//! `string` that is not UTF-8, and with envoy-types' messages one such value failed the whole
//! report and ended the stream: every bucket of that Envoy went unanswered from then on (its
//! assignments expired, and it reopened the stream with the same report). Read as bytes, a report
//! is decoded whatever its values hold, and its other buckets are answered.
//!
//! The bucket itself cannot be: an answer names its bucket by the id as reported, and Envoy's
//! gRPC client, which checks that strings are UTF-8 when it reads a message, refuses the whole
//! answer and closes the stream (`INTERNAL`, seen with Envoy 1.40). So such a bucket keeps
//! Envoy's `no_assignment_behavior` (the service counts it), and a `rate_limit_quota` filter
//! whose bucket ids take a client's header should deny by default (`DENY_ALL`), as the example
//! does for users.
//!
//! Field numbers and types are those of `envoy.service.rate_limit_quota.v3`; the actions are
//! envoy-types' own.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::body::Body;
use tonic::codegen::{Body as HttpBody, BoxFuture, Service, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use super::{Answers, QuotaService};

/// `RateLimitQuotaUsageReports`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireReports {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub bucket_quota_usages: Vec<WireUsage>,
}

/// `RateLimitQuotaUsageReports.BucketQuotaUsage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireUsage {
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<WireBucketId>,
    #[prost(message, optional, tag = "2")]
    pub time_elapsed: Option<ProtoDuration>,
    #[prost(uint64, tag = "3")]
    pub num_requests_allowed: u64,
    #[prost(uint64, tag = "4")]
    pub num_requests_denied: u64,
}

/// `BucketId`: its keys come from Envoy's configuration (text), its values from requests (bytes).
/// Answered only when every value is UTF-8 (see the module docs), so an answer holds only text.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct WireBucketId {
    #[prost(map = "string, bytes", tag = "1")]
    pub bucket: HashMap<String, Vec<u8>>,
}

/// `RateLimitQuotaResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireResponse {
    #[prost(message, repeated, tag = "1")]
    pub bucket_action: Vec<WireBucketAction>,
}

/// `RateLimitQuotaResponse.BucketAction`: the bucket id as it was reported, and envoy-types'
/// action.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireBucketAction {
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<WireBucketId>,
    #[prost(oneof = "Action", tags = "2, 3")]
    pub bucket_action: Option<Action>,
}

/// The full name of the one method.
const STREAM_RATE_LIMIT_QUOTAS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// The gRPC route of the service, as tonic's generated server would be, with [`WireReports`]
/// in and [`WireResponse`] out.
#[derive(Clone)]
pub struct QuotaServer {
    service: Arc<QuotaService>,
    max_report_bytes: usize,
}

impl QuotaServer {
    pub(super) fn new(service: QuotaService, max_report_bytes: usize) -> QuotaServer {
        QuotaServer {
            service: Arc::new(service),
            max_report_bytes,
        }
    }
}

impl NamedService for QuotaServer {
    const NAME: &'static str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
}

impl<B> Service<http::Request<B>> for QuotaServer
where
    B: HttpBody + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != STREAM_RATE_LIMIT_QUOTAS {
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let method = Method(Arc::clone(&self.service));
        let max_report_bytes = self.max_report_bytes;
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<WireResponse, WireReports>::default())
                .apply_max_message_size_config(Some(max_report_bytes), None);
            Ok(grpc.streaming(method, request).await)
        })
    }
}

/// `StreamRateLimitQuotas`, as tonic's server calls it.
struct Method(Arc<QuotaService>);

impl StreamingService<WireReports> for Method {
    type Response = WireResponse;
    type ResponseStream = Answers;
    type Future = BoxFuture<Response<Answers>, Status>;

    fn call(&mut self, request: Request<Streaming<WireReports>>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { service.stream(request) })
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
    use prost::Message as _;

    use super::*;

    /// A report with a value that is not UTF-8 is read here, where envoy-types' message refuses
    /// it whole; the same report in UTF-8 reads the same either way.
    #[test]
    fn a_report_is_read_whatever_its_values_hold() {
        let report = |value: &[u8]| WireReports {
            domain: "rlqs".to_owned(),
            bucket_quota_usages: vec![WireUsage {
                bucket_id: Some(WireBucketId {
                    bucket: HashMap::from([("user".to_owned(), value.to_vec())]),
                }),
                time_elapsed: None,
                num_requests_allowed: 3,
                num_requests_denied: 0,
            }],
        };
        let bytes = report(b"b\xf6b").encode_to_vec();
        assert_eq!(WireReports::decode(bytes.as_slice()), Ok(report(b"b\xf6b")));
        assert!(RateLimitQuotaUsageReports::decode(bytes.as_slice()).is_err());

        let bytes = report("böb".as_bytes()).encode_to_vec();
        let envoy = RateLimitQuotaUsageReports::decode(bytes.as_slice()).expect("UTF-8");
        let id = envoy.bucket_quota_usages[0]
            .bucket_id
            .as_ref()
            .expect("an id");
        assert_eq!(id.bucket["user"], "böb");
        assert_eq!(envoy.bucket_quota_usages[0].num_requests_allowed, 3);
    }
}
