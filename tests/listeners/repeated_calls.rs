//! Calls that repeat what the last one sent. A gRPC client sends the same `:path` and
//! `:authority` in every request, and the server's HTTP/2 layer reuses the last ones it decoded
//! and parsed (vendor/h2/VENDORED.md): this checks that each request is still routed by what it
//! sent, when its path or authority differs from the previous request's on the same connection
//! or on another one.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message as _;

use crate::support::{
    RawAnswer, Slidegate, descriptor, grpc_frame, raw_call, raw_connection, request,
};

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n";

const RLS: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH: &str = "/grpc.health.v1.Health/Check";
const UNKNOWN: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimitTwice";

fn limited_call() -> Vec<u8> {
    let message: RateLimitRequest = request("d", vec![descriptor(&[("k", "v")])]);
    grpc_frame(&message.encode_to_vec())
}

/// The decision of a `ShouldRateLimit` answer.
fn decision(answer: &RawAnswer) -> Code {
    assert_eq!(answer.status.as_deref(), Some("0"), "{answer:?}");
    let message = answer.body.get(5..).expect("a gRPC message");
    let response = RateLimitResponse::decode(message).expect("a RateLimitResponse");
    Code::try_from(response.overall_code).expect("a code")
}

#[tokio::test]
async fn each_call_is_routed_by_its_own_path_and_authority() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let server = Slidegate::start(&rules, &[]);
    let port = server.grpc_port;
    let (ip, localhost) = (
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
    );
    let mut first = raw_connection(port).await;
    let mut second = raw_connection(port).await;

    // The same path twice, then others, then it again: every ShouldRateLimit counts (3 a minute).
    let answer = raw_call(&mut first, &format!("{ip}{RLS}"), &[], limited_call()).await;
    assert_eq!(decision(&answer), Code::Ok);
    let answer = raw_call(&mut first, &format!("{ip}{RLS}"), &[], limited_call()).await;
    assert_eq!(decision(&answer), Code::Ok);

    let health = raw_call(&mut first, &format!("{ip}{HEALTH}"), &[], grpc_frame(&[])).await;
    assert_eq!(health.status.as_deref(), Some("0"), "{health:?}");
    // HealthCheckResponse { status: SERVING }
    assert_eq!(health.body, grpc_frame(&[0x08, 0x01]), "{health:?}");

    let unknown = raw_call(&mut first, &format!("{ip}{UNKNOWN}"), &[], limited_call()).await;
    assert_eq!(
        unknown.status.as_deref(),
        Some("12"),
        "UNIMPLEMENTED: {unknown:?}"
    );

    // Another authority on another connection, then the first one's again.
    let answer = raw_call(
        &mut second,
        &format!("{localhost}{RLS}"),
        &[],
        limited_call(),
    )
    .await;
    assert_eq!(decision(&answer), Code::Ok);
    let unknown = raw_call(
        &mut second,
        &format!("{localhost}{UNKNOWN}"),
        &[],
        limited_call(),
    )
    .await;
    assert_eq!(
        unknown.status.as_deref(),
        Some("12"),
        "UNIMPLEMENTED: {unknown:?}"
    );
    let answer = raw_call(&mut first, &format!("{ip}{RLS}"), &[], limited_call()).await;
    assert_eq!(decision(&answer), Code::OverLimit);
    let health = raw_call(
        &mut second,
        &format!("{localhost}{HEALTH}"),
        &[],
        grpc_frame(&[]),
    )
    .await;
    assert_eq!(health.body, grpc_frame(&[0x08, 0x01]), "{health:?}");
}
