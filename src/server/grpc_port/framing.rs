//! gRPC's wire format on HTTP/2 as the port reads and writes it: the header names looked up on
//! every call, the 5-byte prefix of a message (a compressed flag, then the length big-endian),
//! and responses: one message then `grpc-status: 0`, or an error as a trailers-only response.

use bytes::{BufMut, Bytes, BytesMut};
use h2::server::SendResponse;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use prost::Message;
use tonic::Status;

use super::MAX_MESSAGE;

/// Header names looked up or written on every call, parsed once.
pub(super) static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
pub(super) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
pub(super) static GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
pub(super) static GRPC_ACCEPT_ENCODING: HeaderName =
    HeaderName::from_static("grpc-accept-encoding");

/// The bytes of a request body, not copied when they arrive in one DATA frame (as Envoy's do).
#[derive(Default)]
pub(super) struct Received {
    first: Bytes,
    joined: BytesMut,
}

impl Received {
    pub(super) fn push(&mut self, chunk: Bytes) {
        if self.first.is_empty() && self.joined.is_empty() {
            self.first = chunk;
            return;
        }
        if !self.first.is_empty() {
            self.joined
                .extend_from_slice(&std::mem::take(&mut self.first));
        }
        self.joined.extend_from_slice(&chunk);
    }

    pub(super) fn bytes(&self) -> &[u8] {
        if self.joined.is_empty() {
            &self.first
        } else {
            &self.joined
        }
    }
}

/// The length of the message whose 5-byte gRPC prefix starts `bytes`, once the prefix is in.
pub(super) fn message_length(bytes: &[u8]) -> Result<Option<usize>, Status> {
    let Some(&[compressed, a, b, c, d]) = bytes.get(..5) else {
        return Ok(None);
    };
    if compressed != 0 {
        // The call's grpc-encoding is identity (others are refused before the body is read).
        return Err(Status::internal(
            "the message is flagged compressed but the call has no grpc-encoding",
        ));
    }
    let length = u32::from_be_bytes([a, b, c, d]) as usize;
    if length > MAX_MESSAGE {
        return Err(Status::out_of_range(format!(
            "message length too large: found {length} bytes, the limit is {MAX_MESSAGE} bytes"
        )));
    }
    Ok(Some(length))
}

/// Response headers, trailers-only responses included.
fn response_head() -> http::Response<()> {
    let mut head = http::Response::new(());
    head.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    head
}

/// Answers one message, then `grpc-status: 0`.
pub(super) fn send_message<M: Message>(
    respond: &mut SendResponse<Bytes>,
    message: &M,
) -> Result<(), h2::Error> {
    let frame = encode_frame(message);
    let mut stream = respond.send_response(response_head(), false)?;
    stream.send_data(frame, false)?;
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(&GRPC_STATUS, HeaderValue::from_static("0"));
    stream.send_trailers(trailers)
}

/// Encodes `message` as one gRPC message: flag 0 for "uncompressed", the length in 4 bytes
/// big-endian, the protobuf. Into a `Vec` of the exact size that the `Bytes` takes over: one
/// allocation (a `BytesMut` split off into `Bytes` allocates its shared header too).
pub(super) fn encode_frame(message: &impl Message) -> Bytes {
    let length = message.encoded_len();
    let mut buf = Vec::with_capacity(5 + length);
    buf.put_u8(0);
    // Rate-limit messages are far below 4 GiB (requests are capped at 4 MiB).
    buf.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode_raw(&mut buf);
    Bytes::from(buf)
}

/// Answers an error as a trailers-only response.
pub(super) fn send_status(
    respond: &mut SendResponse<Bytes>,
    status: &Status,
) -> Result<(), h2::Error> {
    send_status_with(respond, status, false)
}

/// [`send_status`], with `grpc-accept-encoding: identity` when `accept_encoding`.
pub(super) fn send_status_with(
    respond: &mut SendResponse<Bytes>,
    status: &Status,
    accept_encoding: bool,
) -> Result<(), h2::Error> {
    let mut head = response_head();
    if status.add_header(head.headers_mut()).is_err() {
        // Only a status with binary details can fail to encode; ours have none.
        let _ = Status::internal("").add_header(head.headers_mut());
    }
    if accept_encoding {
        head.headers_mut()
            .insert(&GRPC_ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    respond.send_response(head, true).map(drop)
}

pub(super) fn status_trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(2);
    let _ = status.add_header(&mut trailers);
    trailers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_prefixes_are_checked_before_the_message_is_read() {
        assert_eq!(message_length(&[0, 0, 0]).ok(), Some(None));
        assert_eq!(message_length(&[0, 0, 0, 1, 0]).ok(), Some(Some(256)));
        let compressed = message_length(&[1, 0, 0, 0, 1]).err().map(|s| s.code());
        assert_eq!(compressed, Some(tonic::Code::Internal));
        let huge = message_length(&[0, 0x7f, 0, 0, 0]).err().map(|s| s.code());
        assert_eq!(huge, Some(tonic::Code::OutOfRange));
    }

    #[test]
    fn bodies_in_several_frames_are_joined() {
        let mut received = Received::default();
        received.push(Bytes::from_static(b"ab"));
        assert_eq!(received.bytes(), b"ab");
        received.push(Bytes::from_static(b"cd"));
        received.push(Bytes::from_static(b"e"));
        assert_eq!(received.bytes(), b"abcde");
    }
}
