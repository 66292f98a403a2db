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
//!
//! A message is decoded in two steps, so that its size in memory follows the configured limits
//! and not its length on the wire: [`RequestBytes`] holds the message as received, its
//! descriptors and entries are counted against [`RequestLimits`] without building anything
//! ([`check_counts`]), and only then is it decoded. Two bytes on the wire are an empty descriptor,
//! which decoded would take about a hundred: 4 MiB of them would take hundreds of MiB.
//!
//! Keys and values are decoded as bytes ([`WireRequest`]): a header value that is not UTF-8,
//! which Envoy copies into a descriptor as it is, is decided under a text of its own
//! ([`crate::limiter::entry_text`]) instead of failing the call.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes};

use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
use prost::{DecodeError, Message};
use tonic::Status;

use super::Caller;
pub use super::answer::Answer;
use super::decision::metadata;
use super::front::{Front, Outcome, Transport};
use super::wire::WireRequest;
use crate::limiter::{LimitError, Observer, RequestLimits, Response};
use crate::telemetry::{DecisionSpan, Transport as TraceTransport};

/// The file descriptor set of `proto/` (compiled by `build.rs`), for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/rls_descriptor.bin"));

/// The `RateLimitService`: decodes a `ShouldRateLimit` call for the limiter and encodes its
/// answer. [`crate::server::grpc_port`] serves it over HTTP/2.
#[derive(Debug, Clone)]
pub struct GrpcService {
    front: Arc<Front>,
}

/// The method's path, as Envoy calls it.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl GrpcService {
    pub fn new(front: Arc<Front>) -> Self {
        GrpcService { front }
    }

    /// `ShouldRateLimit`: decode within the limits, decide, encode, and count the call; the
    /// decision log names `caller` when the server named it.
    pub async fn should_rate_limit(
        &self,
        message: RequestBytes,
        caller: Option<&Caller>,
    ) -> Result<Answer, Status> {
        answer(self.decide(message, &mut (), caller).await)
    }

    /// [`GrpcService::should_rate_limit`] for a sampled call with traces on (see
    /// [`GrpcService::span`]), recorded by `span`.
    pub async fn should_rate_limit_traced(
        &self,
        message: RequestBytes,
        mut span: DecisionSpan,
        caller: Option<&Caller>,
    ) -> Result<Answer, Status> {
        let result = self.decide(message, &mut span, caller).await;
        end_span(span, result.as_ref().map(|(response, _)| response));
        answer(result)
    }

    /// Decodes within the limits, decides (told to `observer`), and counts the call; with
    /// `--response-metadata`, the answer's dynamic metadata too, while the request is at hand.
    async fn decide<O: Observer>(
        &self,
        message: RequestBytes,
        observer: &mut O,
        caller: Option<&Caller>,
    ) -> Result<(Response, Option<Vec<u8>>), LimitError> {
        let started = Instant::now();
        let result = match decode(&message.0, &self.front.limiter().options().limits) {
            Ok(wire) => {
                self.front.observe_escaped(Transport::Grpc, wire.escaped());
                let domain = wire.domain();
                let request = wire.request(&domain);
                let decided = self
                    .front
                    .limiter()
                    .should_rate_limit_observed(&request, observer);
                decided.await.map(|response| {
                    self.front
                        .decided(Transport::Grpc, caller, &request, &response);
                    let metadata = (self.front.limiter().options())
                        .response_metadata
                        .then(|| metadata::encode(&request, &response));
                    (response, metadata)
                })
            }
            Err(error) => Err(error),
        };
        let outcome = Outcome::of(result.as_ref().map(|(response, _)| response));
        self.front
            .observe_request(Transport::Grpc, outcome, started.elapsed());
        result
    }

    /// A span for a call with these headers (its metadata), when traces are on and the call is
    /// sampled.
    pub fn span(&self, headers: &http::HeaderMap) -> Option<DecisionSpan> {
        self.front
            .traces()
            .and_then(|traces| traces.begin(headers, TraceTransport::Grpc))
    }
}

/// The call's answer: the response, or the status a [`LimitError`] is answered with.
fn answer(result: Result<(Response, Option<Vec<u8>>), LimitError>) -> Result<Answer, Status> {
    match result {
        Ok((response, metadata)) => Ok(Answer {
            response,
            dynamic_metadata: metadata.unwrap_or_default(),
        }),
        Err(LimitError::InvalidArgument(message)) => Err(Status::invalid_argument(message)),
        Err(error @ LimitError::Unavailable(_)) => Err(Status::unavailable(error.to_string())),
    }
}

/// Ends a traced call's span with the answer the call gets: the gRPC code a [`LimitError`] is
/// answered with.
fn end_span(span: DecisionSpan, result: Result<&Response, &LimitError>) {
    match result {
        Ok(response) => super::decision::span::end(span, Ok(response), 0),
        Err(error) => {
            let code = match error {
                LimitError::InvalidArgument(_) => tonic::Code::InvalidArgument,
                LimitError::Unavailable(_) => tonic::Code::Unavailable,
            };
            super::decision::span::end(span, Err(error), code as u16);
        }
    }
}

/// A `RateLimitRequest` as it arrived, not yet decoded: the message type the gRPC server reads,
/// so that [`GrpcService::should_rate_limit`] can bound the work of decoding it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestBytes(pub Bytes);

impl Message for RequestBytes {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    /// Not called: [`RequestBytes::merge`] takes the whole message.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }

    /// Keeps the bytes (one copy, the size of the message).
    fn merge(&mut self, mut buf: impl Buf) -> Result<(), DecodeError> {
        self.0 = buf.copy_to_bytes(buf.remaining());
        Ok(())
    }
}

/// Decodes a `RateLimitRequest` once [`check_counts`] has found it within the limits, keys and
/// values as bytes ([`WireRequest`]): no value a client chooses makes it undecodable.
pub fn decode(bytes: &[u8], limits: &RequestLimits) -> Result<WireRequest, LimitError> {
    let undecodable = |error: &dyn std::fmt::Display| {
        LimitError::InvalidArgument(format!("cannot decode the request: {error}"))
    };
    check_counts(bytes, limits).map_err(|error| match error {
        Counted::Over(error) => error,
        Counted::Undecodable(error) => undecodable(&error),
    })?;
    WireRequest::decode(bytes).map_err(|error| undecodable(&error))
}

/// Why [`check_counts`] stopped.
#[derive(Debug)]
pub enum Counted {
    /// Over `--max-descriptors` or `--max-entries`.
    Over(LimitError),
    /// Not protobuf.
    Undecodable(String),
}

impl From<DecodeError> for Counted {
    fn from(error: DecodeError) -> Self {
        Counted::Undecodable(error.to_string())
    }
}

/// Walks an encoded `RateLimitRequest` (`descriptors` = 2; in each, `entries` = 1) counting
/// descriptors and entries, and stops at the first over its bound. Nothing is allocated.
pub fn check_counts(mut bytes: &[u8], limits: &RequestLimits) -> Result<(), Counted> {
    let mut descriptors = 0;
    while !bytes.is_empty() {
        let (tag, wire_type) = decode_key(&mut bytes)?;
        if tag != 2 || wire_type != WireType::LengthDelimited {
            skip_field(wire_type, tag, &mut bytes, DecodeContext::default())?;
            continue;
        }
        let descriptor = length_delimited(&mut bytes)?;
        limits
            .check_descriptors(descriptors + 1)
            .map_err(Counted::Over)?;
        let entries = count_fields(descriptor, 1, limits.max_entries)?;
        limits
            .check_entries(descriptors, entries)
            .map_err(Counted::Over)?;
        descriptors += 1;
    }
    Ok(())
}

/// The number of length-delimited `field`s in a message, counting no further than one past `max`.
fn count_fields(mut bytes: &[u8], field: u32, max: usize) -> Result<usize, Counted> {
    let mut count = 0;
    while !bytes.is_empty() && count <= max {
        let (tag, wire_type) = decode_key(&mut bytes)?;
        if tag == field && wire_type == WireType::LengthDelimited {
            length_delimited(&mut bytes)?;
            count += 1;
        } else {
            skip_field(wire_type, tag, &mut bytes, DecodeContext::default())?;
        }
    }
    Ok(count)
}

/// The payload of a length-delimited field whose key has been read; `bytes` moves past it.
fn length_delimited<'b>(bytes: &mut &'b [u8]) -> Result<&'b [u8], Counted> {
    let length = usize::try_from(decode_varint(bytes)?).unwrap_or(usize::MAX);
    if length > bytes.len() {
        return Err(Counted::Undecodable("buffer underflow".into()));
    }
    let (payload, rest) = bytes.split_at(length);
    *bytes = rest;
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    fn limits() -> RequestLimits {
        RequestLimits {
            max_descriptors: 3,
            max_entries: 2,
            ..RequestLimits::default()
        }
    }

    fn encoded(descriptors: usize, entries: usize) -> Vec<u8> {
        let entry = Entry {
            key: "k".into(),
            value: "v".into(),
        };
        RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![entry; entries],
                    ..RateLimitDescriptor::default()
                };
                descriptors
            ],
            ..RateLimitRequest::default()
        }
        .encode_to_vec()
    }

    fn message(result: Result<WireRequest, LimitError>) -> String {
        match result {
            Ok(r) => panic!("decoded {r:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn counts_descriptors_and_entries_before_decoding() {
        let ok = decode(&encoded(3, 2), &limits()).map(|r| r.descriptors.len());
        assert!(matches!(ok, Ok(3)), "{ok:?}");
        let many = message(decode(&encoded(4, 1), &limits()));
        assert!(many.contains("too many descriptors: 4"), "{many}");
        let deep = message(decode(&encoded(1, 3), &limits()));
        assert!(
            deep.contains("descriptors[0] has too many entries: 3"),
            "{deep}"
        );
        // 4 MiB of empty descriptors (`12 00`): refused at the fourth, nothing built.
        let bomb = [0x12, 0x00].repeat(2 << 20);
        let refused = message(decode(&bomb, &limits()));
        assert!(refused.contains("too many descriptors: 4"), "{refused}");
        // Truncated and garbage bytes are decode errors, as prost's.
        let mut truncated = encoded(1, 1);
        truncated.pop();
        assert!(message(decode(&truncated, &limits())).contains("cannot decode"));
        assert!(message(decode(&[0xff; 8], &limits())).contains("cannot decode"));
    }
}
