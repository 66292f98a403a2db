//! gRPC for the tests: RateLimitService requests built from (key, value)
//! entries, a call that must succeed, and `ShouldRateLimit` written by hand over HTTP/2 for what
//! a client library would not send.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// A request descriptor of (key, value) entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A request for `domain` with `descriptors` (no request-level `hits_addend`).
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

/// `ShouldRateLimit`, which must succeed (a gRPC error fails the test with its status).
pub async fn call(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    match client.should_rate_limit(req).await {
        Ok(response) => response.into_inner(),
        Err(status) => panic!("ShouldRateLimit failed: {status:?}"),
    }
}

/// What a gRPC call written by hand got back: `grpc-status`, `grpc-message` and the message, if any.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: Option<String>,
    pub message: Option<String>,
    pub body: Vec<u8>,
}

/// `ShouldRateLimit` written by hand over HTTP/2 (the `h2` crate): `body` goes out as is, after
/// `extra` headers. For what a gRPC client library would not send: a `grpc-timeout` it does not
/// enforce itself, a compressed flag, bytes that are not protobuf.
pub async fn raw_should_rate_limit(port: u16, extra: &[(&str, &str)], body: Vec<u8>) -> RawAnswer {
    let mut sender = raw_connection(port).await;
    let uri = format!(
        "http://127.0.0.1:{port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    raw_call(&mut sender, &uri, extra, body).await
}

/// An HTTP/2 connection (the `h2` crate) to `port`, for [`raw_call`].
pub async fn raw_connection(port: u16) -> h2::client::SendRequest<bytes::Bytes> {
    let io = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (sender, connection) = h2::client::handshake(io).await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    sender
}

/// A gRPC call written by hand on `sender`'s connection: a POST to `uri` (its authority goes out
/// as `:authority`) with `extra` headers and `body` as is.
pub async fn raw_call(
    sender: &mut h2::client::SendRequest<bytes::Bytes>,
    uri: &str,
    extra: &[(&str, &str)],
    body: Vec<u8>,
) -> RawAnswer {
    let mut builder = http::Request::post(uri)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(()).expect("request");
    let mut sender = sender.clone().ready().await.expect("ready");
    let (response, mut stream) = sender.send_request(request, false).expect("send");
    stream
        .send_data(bytes::Bytes::from(body), true)
        .expect("send body");
    let response = response.await.expect("response");
    let (head, mut received) = response.into_parts();
    let mut answer = RawAnswer {
        status: header(&head.headers, "grpc-status"),
        message: grpc_message(&head.headers),
        body: Vec::new(),
    };
    while let Some(chunk) = received.data().await {
        answer.body.extend_from_slice(&chunk.expect("data"));
    }
    if let Some(trailers) = received.trailers().await.expect("trailers") {
        answer.status = header(&trailers, "grpc-status");
        answer.message = grpc_message(&trailers);
    }
    answer
}

fn header(headers: &http::HeaderMap, name: &str) -> Option<String> {
    let value = headers.get(name)?.to_str().ok()?;
    Some(value.to_string())
}

/// `grpc-message`, percent-decoded.
fn grpc_message(headers: &http::HeaderMap) -> Option<String> {
    let value = header(headers, "grpc-message")?;
    Some(
        percent_encoding::percent_decode_str(&value)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// A gRPC message: the 5-byte prefix (uncompressed) and `message`.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(message);
    frame
}
