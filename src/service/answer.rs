//! `ShouldRateLimit`'s answer on the wire: a `RateLimitResponse` written from the limiter's
//! [`Response`] as it stands, with its dynamic metadata already encoded.
//!
//! Building Envoy's message first and encoding that cost a call some 1,250 instructions (about a
//! thirtieth of it): a `String` for each response header's name, a vector of statuses, their
//! drops, and prost's encoder, which works each nested message's length out again at every level
//! of nesting. The writer here reads the response where it is and writes the same bytes as prost
//! would (fields in number order, proto3 defaults left out): the tests hold it to
//! `to_proto(response).encode_to_vec()`.

use std::time::Duration;

use bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint, key_len, skip_field,
};
use prost::{DecodeError, Message};

use super::unit_to_proto;
use crate::limiter::{Code, CurrentLimit, DescriptorStatus, Response};

/// Field numbers of envoy/service/ratelimit/v3/rls.proto and the messages it uses.
mod field {
    // RateLimitResponse
    pub const OVERALL_CODE: u32 = 1;
    pub const STATUSES: u32 = 2;
    pub const RESPONSE_HEADERS_TO_ADD: u32 = 3;
    pub const DYNAMIC_METADATA: u32 = 6;
    // RateLimitResponse.DescriptorStatus
    pub const CODE: u32 = 1;
    pub const CURRENT_LIMIT: u32 = 2;
    pub const LIMIT_REMAINING: u32 = 3;
    pub const DURATION_UNTIL_RESET: u32 = 4;
    // RateLimitResponse.RateLimit
    pub const REQUESTS_PER_UNIT: u32 = 1;
    pub const UNIT: u32 = 2;
    pub const NAME: u32 = 3;
    // google.protobuf.Duration
    pub const SECONDS: u32 = 1;
    pub const NANOS: u32 = 2;
    // envoy.config.core.v3.HeaderValue
    pub const KEY: u32 = 1;
    pub const VALUE: u32 = 2;
}

/// A limiter's response and its dynamic metadata (an encoded `google.protobuf.Struct`, empty for
/// none), encoded as one `RateLimitResponse`. Only ever encoded: decoding one reads nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub response: Response,
    pub dynamic_metadata: Vec<u8>,
}

impl Message for Answer {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        let response = &self.response;
        varint(buf, field::OVERALL_CODE, code(response.overall));
        for status in &response.statuses {
            nested(buf, field::STATUSES, status_len(status));
            varint(buf, field::CODE, code(status.code));
            if let Some(limit) = &status.current_limit {
                nested(buf, field::CURRENT_LIMIT, limit_len(limit));
                varint(
                    buf,
                    field::REQUESTS_PER_UNIT,
                    limit.requests_per_unit.into(),
                );
                varint(buf, field::UNIT, unit(limit));
                text(buf, field::NAME, limit.name.as_deref().unwrap_or(""));
            }
            varint(buf, field::LIMIT_REMAINING, status.limit_remaining.into());
            if let Some(reset) = status.duration_until_reset {
                nested(buf, field::DURATION_UNTIL_RESET, duration_len(reset));
                varint(buf, field::SECONDS, seconds(reset));
                varint(buf, field::NANOS, reset.subsec_nanos().into());
            }
        }
        for (key, value) in &response.headers {
            nested(buf, field::RESPONSE_HEADERS_TO_ADD, header_len(key, value));
            text(buf, field::KEY, key);
            text(buf, field::VALUE, value);
        }
        if !self.dynamic_metadata.is_empty() {
            nested(buf, field::DYNAMIC_METADATA, self.dynamic_metadata.len());
            buf.put_slice(&self.dynamic_metadata);
        }
    }

    fn encoded_len(&self) -> usize {
        let response = &self.response;
        let statuses: usize = (response.statuses.iter())
            .map(|status| nested_len(field::STATUSES, status_len(status)))
            .sum();
        let headers: usize = (response.headers.iter())
            .map(|(key, value)| nested_len(field::RESPONSE_HEADERS_TO_ADD, header_len(key, value)))
            .sum();
        let metadata = match self.dynamic_metadata.len() {
            0 => 0,
            len => nested_len(field::DYNAMIC_METADATA, len),
        };
        varint_len(field::OVERALL_CODE, code(response.overall)) + statuses + headers + metadata
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }

    fn clear(&mut self) {
        self.response.statuses.clear();
        self.response.headers.clear();
        self.dynamic_metadata.clear();
    }
}

fn status_len(status: &DescriptorStatus) -> usize {
    varint_len(field::CODE, code(status.code))
        + (status.current_limit.as_ref()).map_or(0, |limit| {
            nested_len(field::CURRENT_LIMIT, limit_len(limit))
        })
        + varint_len(field::LIMIT_REMAINING, status.limit_remaining.into())
        + (status.duration_until_reset).map_or(0, |reset| {
            nested_len(field::DURATION_UNTIL_RESET, duration_len(reset))
        })
}

fn limit_len(limit: &CurrentLimit) -> usize {
    varint_len(field::REQUESTS_PER_UNIT, limit.requests_per_unit.into())
        + varint_len(field::UNIT, unit(limit))
        + text_len(field::NAME, limit.name.as_deref().unwrap_or(""))
}

fn duration_len(reset: Duration) -> usize {
    varint_len(field::SECONDS, seconds(reset))
        + varint_len(field::NANOS, reset.subsec_nanos().into())
}

fn header_len(key: &str, value: &str) -> usize {
    text_len(field::KEY, key) + text_len(field::VALUE, value)
}

/// `Code` as its enum number (OK 1, OVER_LIMIT 2).
fn code(code: Code) -> u64 {
    match code {
        Code::Ok => 1,
        Code::OverLimit => 2,
    }
}

fn unit(limit: &CurrentLimit) -> u64 {
    // Unit numbers are small and positive.
    u64::try_from(unit_to_proto(limit.unit)).unwrap_or(0)
}

/// `Duration.seconds`, an int64.
fn seconds(reset: Duration) -> u64 {
    reset.as_secs().min(i64::MAX as u64)
}

/// A varint field; proto3 leaves out a zero.
fn varint(buf: &mut impl BufMut, tag: u32, value: u64) {
    if value != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(value, buf);
    }
}

fn varint_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(value)
    }
}

/// A string field; proto3 leaves out an empty one.
fn text(buf: &mut impl BufMut, tag: u32, value: &str) {
    if !value.is_empty() {
        nested(buf, tag, value.len());
        buf.put_slice(value.as_bytes());
    }
}

fn text_len(tag: u32, value: &str) -> usize {
    if value.is_empty() {
        0
    } else {
        nested_len(tag, value.len())
    }
}

/// The key and length of a length-delimited field whose `len` bytes follow.
fn nested(buf: &mut impl BufMut, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

fn nested_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Unit;
    use crate::service::unit_to_proto;
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus as ProtoStatus, RateLimit,
    };
    use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
    use proptest::prelude::*;

    /// The oracle: the response as Envoy's message, built field by field.
    fn to_proto(response: &Response) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: code(response.overall) as i32,
            statuses: (response.statuses.iter())
                .map(|status| ProtoStatus {
                    code: code(status.code) as i32,
                    current_limit: status.current_limit.as_ref().map(|limit| RateLimit {
                        name: limit.name.clone().unwrap_or_default(),
                        requests_per_unit: limit.requests_per_unit,
                        unit: unit_to_proto(limit.unit),
                    }),
                    limit_remaining: status.limit_remaining,
                    duration_until_reset: status.duration_until_reset.map(|d| ProtoDuration {
                        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
                    }),
                    quota: None,
                })
                .collect(),
            response_headers_to_add: (response.headers.iter())
                .map(|(key, value)| HeaderValue {
                    key: key.to_string(),
                    value: value.to_string(),
                    ..HeaderValue::default()
                })
                .collect(),
            ..RateLimitResponse::default()
        }
    }

    const UNITS: [Unit; 7] = Unit::ALL;
    const HEADER_NAMES: [&str; 3] = ["ratelimit-limit", "retry-after", ""];

    fn a_code() -> impl Strategy<Value = Code> {
        prop_oneof![Just(Code::Ok), Just(Code::OverLimit)]
    }

    fn a_status() -> impl Strategy<Value = DescriptorStatus> {
        let limit = (
            proptest::option::of("[a-z_]{0,12}"),
            any::<u32>(),
            0..UNITS.len(),
        )
            .prop_map(|(name, requests_per_unit, unit)| CurrentLimit {
                name,
                requests_per_unit,
                unit: UNITS[unit],
                window: Duration::from_secs(60),
            });
        let reset = (
            prop_oneof![Just(0u64), 0..100_000u64, Just(u64::MAX)],
            0..1_000_000_000u32,
        )
            .prop_map(|(secs, nanos)| Duration::new(secs, nanos));
        (
            a_code(),
            proptest::option::of(limit),
            prop_oneof![Just(0u32), any::<u32>()],
            proptest::option::of(reset),
            any::<bool>(),
        )
            .prop_map(
                |(code, current_limit, limit_remaining, duration_until_reset, shadow)| {
                    DescriptorStatus {
                        code,
                        current_limit,
                        limit_remaining,
                        duration_until_reset,
                        rule: None,
                        shadow,
                    }
                },
            )
    }

    fn a_response() -> impl Strategy<Value = Response> {
        (
            a_code(),
            proptest::collection::vec(a_status(), 0..5),
            proptest::collection::vec((0..HEADER_NAMES.len(), "[0-9a-z;=, ]{0,20}"), 0..6),
        )
            .prop_map(|(overall, statuses, headers)| Response {
                overall,
                statuses,
                headers: (headers.into_iter())
                    .map(|(name, value)| (HEADER_NAMES[name], value.into()))
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn writes_what_prost_writes_for_envoys_message(
            response in a_response(),
            metadata in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut expected = to_proto(&response).encode_to_vec();
            if !metadata.is_empty() {
                prost::encoding::bytes::encode(field::DYNAMIC_METADATA, &metadata, &mut expected);
            }
            let answer = Answer { response, dynamic_metadata: metadata };
            let written = answer.encode_to_vec();
            prop_assert_eq!(answer.encoded_len(), written.len());
            prop_assert_eq!(written, expected);
        }
    }

    #[test]
    fn an_empty_answer_is_its_overall_code_alone() {
        let answer = Answer {
            response: Response {
                overall: Code::OverLimit,
                statuses: Vec::new(),
                headers: Vec::new(),
            },
            dynamic_metadata: Vec::new(),
        };
        assert_eq!(answer.encode_to_vec(), [0x08, 0x02]);
    }
}
