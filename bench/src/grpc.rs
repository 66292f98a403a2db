//! One unary gRPC call on an HTTP/2 stream the worker drives itself: a POST with one
//! length-prefixed protobuf message, answered by one message and a `grpc-status` trailer. The
//! request is encoded into a buffer the worker reuses.

use bytes::{BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use h2::RecvStream;
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue, TE};
use http::uri::Uri;
use http::{Method, Request, StatusCode};
use prost::Message;

/// Why a call failed. Failures are only counted; naming them keeps [`call`] readable.
#[derive(Debug, PartialEq, Eq)]
pub enum CallError {
    /// The connection or the stream failed.
    Http2,
    /// The HTTP status was not 200.
    HttpStatus,
    /// `grpc-status` was missing or not 0.
    GrpcStatus,
    /// The body was not exactly one well-formed, uncompressed message.
    Frame,
    /// No answer within `--timeout`.
    Timeout,
    /// A `redis://` target's store failed (Redis error, lost connection or timeout).
    Store,
}

impl From<h2::Error> for CallError {
    fn from(_: h2::Error) -> Self {
        CallError::Http2
    }
}

/// One unary gRPC call on a new stream: the request head, the one message `frame`, then the
/// response's message and its status. On timeout the caller drops this future, and dropping the
/// stream's handles resets the stream.
pub async fn call(
    send: &mut SendRequest<Bytes>,
    head: Request<()>,
    frame: Bytes,
) -> Result<RateLimitResponse, CallError> {
    std::future::poll_fn(|cx| send.poll_ready(cx)).await?;
    let (response, mut request_body) = send.send_request(head, false)?;
    request_body.send_data(frame, true)?;
    let (head, mut body) = response.await?.into_parts();
    if head.status != StatusCode::OK {
        return Err(CallError::HttpStatus);
    }
    let message = read_body(&mut body).await?;
    // A trailers-only response (how errors usually come) has its status in the headers.
    let trailers = body.trailers().await?;
    if !grpc_ok(trailers.as_ref().unwrap_or(&head.headers)) {
        return Err(CallError::GrpcStatus);
    }
    decode_frame(&message)
}

/// The head of a gRPC request to `uri`.
pub fn grpc_request(uri: &Uri) -> Request<()> {
    let mut request = Request::new(());
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri.clone();
    let headers = request.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    request
}

/// Reads a response body to its end, handing the flow-control capacity back as it arrives. The
/// message nearly always comes in one DATA frame, which is kept as is; more are joined.
async fn read_body(body: &mut RecvStream) -> Result<Bytes, CallError> {
    let mut message = Bytes::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
        message = if message.is_empty() {
            chunk
        } else {
            [message, chunk].concat().into()
        };
    }
    Ok(message)
}

/// Whether `headers` say `grpc-status: 0`.
fn grpc_ok(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"0")
}

/// Decodes one gRPC message: uncompressed, and exactly as long as its prefix says.
pub fn decode_frame<M: Message + Default>(frame: &[u8]) -> Result<M, CallError> {
    match frame {
        [0, a, b, c, d, message @ ..]
            if u32::from_be_bytes([*a, *b, *c, *d]) as usize == message.len() =>
        {
            M::decode(message).map_err(|_| CallError::Frame)
        }
        _ => Err(CallError::Frame),
    }
}

/// Encodes `message` as one gRPC message (flag 0 for "uncompressed", the length in 4 bytes
/// big-endian, the protobuf) at the end of `buf` and splits it off: the worker keeps `buf` and
/// gets its memory back once the frame has been sent and dropped.
pub fn encode_frame(message: &impl Message, buf: &mut BytesMut) -> Bytes {
    let length = message.encoded_len();
    buf.reserve(5 + length);
    buf.put_u8(0);
    // Rate-limit messages are far below 4 GiB.
    buf.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode_raw(buf);
    buf.split().freeze()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

    use super::*;
    use crate::keys::{request_template, set_values};

    #[test]
    fn frames_round_trip() {
        let mut request = request_template("bench", "client", 2, 3);
        set_values(&mut request, |position| position as u64 + 7);
        assert_eq!(request.descriptors[1].entries[0].value, "1-8");
        let mut buf = BytesMut::new();
        let frame = encode_frame(&request, &mut buf);
        assert_eq!(frame[0], 0, "uncompressed");
        assert_eq!(
            decode_frame::<RateLimitRequest>(&frame),
            Ok(request.clone())
        );
        // Encoding again into the same buffer gives the same bytes.
        assert_eq!(encode_frame(&request, &mut buf), frame);

        let response = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            ..Default::default()
        };
        let frame = encode_frame(&response, &mut buf);
        assert_eq!(decode_frame(&frame), Ok(response));
        let mut compressed = frame.to_vec();
        compressed[0] = 1;
        let mut too_long = frame.to_vec();
        too_long.push(0);
        let bad: [&[u8]; 5] = [
            &[],
            &frame[..3],
            &frame[..frame.len() - 1],
            &compressed,
            &too_long,
        ];
        for bad in bad {
            assert_eq!(
                decode_frame::<RateLimitResponse>(bad),
                Err(CallError::Frame),
                "{bad:?}"
            );
        }
    }
}
