//! `RateLimitRequest` as it is on the wire: the same field numbers and wire types as Envoy's
//! messages, with the descriptor keys and values read as bytes.
//!
//! Envoy copies header values into descriptors as bytes, and a header may carry bytes that are
//! not UTF-8. prost refuses a proto3 `string` that is not UTF-8, which would fail the whole call
//! (`INVALID_ARGUMENT`, and Envoy's default `failure_mode_deny: false` then passes the request
//! uncounted). Read as `bytes`, every key and value becomes text by
//! [`entry_text`](crate::limiter::entry_text): bytes that are UTF-8 stand for themselves, others
//! are escaped into a text of their own, so such a value is decided under its own counter.

use bytes::{Buf, BufMut, Bytes};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::encoding::{DecodeContext, WireType, bytes as wire_bytes, skip_field, string};
use prost::{DecodeError, Message};

use super::unit_from_override;
use crate::limiter::{Descriptor, LimitOverride, Request, entry_text, entry_text_owned};

/// `envoy.service.ratelimit.v3.RateLimitRequest` with its domain as bytes (`Bytes`, not a
/// `Vec`: prost fills a `Vec<u8>` through a `Bytes` copied first, two allocations for one).
#[derive(Clone, PartialEq, Message)]
pub struct WireRequest {
    #[prost(bytes = "bytes", tag = "1")]
    pub domain: Bytes,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<WireDescriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct WireDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<WireEntry>,
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.Entry` (`key` = 1, `value` = 2), each read as bytes and kept as the text
/// [`entry_text`] gives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireEntry {
    pub key: String,
    pub value: String,
    /// Whether the key or the value was escaped (for `slidegate_escaped_entries_total`).
    pub escaped: bool,
}

impl Message for WireEntry {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.key.is_empty() {
            string::encode(1, &self.key, buf);
        }
        if !self.value.is_empty() {
            string::encode(2, &self.value, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let field = match tag {
            1 => &mut self.key,
            2 => &mut self.value,
            _ => return skip_field(wire_type, tag, buf, ctx),
        };
        // Into `Bytes`, then a `Vec` that takes over its allocation: one copy of the bytes.
        // (prost's merge into a `Vec<u8>` copies them into a `Bytes` and then into the `Vec`.)
        let mut raw = Bytes::new();
        wire_bytes::merge(wire_type, &mut raw, buf, ctx)?;
        let (text, escaped) = entry_text_owned(Vec::from(raw));
        *field = text;
        // A field given twice keeps its last text (protobuf): the flag is whether the text kept
        // is escaped (an escaped text holds a NUL, no other does), looked at again only when an
        // escaped one may have been replaced.
        self.escaped =
            escaped || (self.escaped && (self.key.contains('\0') || self.value.contains('\0')));
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        let len = |tag, text: &String| {
            if text.is_empty() {
                0
            } else {
                string::encoded_len(tag, text)
            }
        };
        len(1, &self.key) + len(2, &self.value)
    }

    fn clear(&mut self) {
        *self = WireEntry::default();
    }
}

impl WireRequest {
    /// Entries whose key or value was escaped (not UTF-8, or holding a NUL).
    pub fn escaped(&self) -> usize {
        self.descriptors
            .iter()
            .flat_map(|d| &d.entries)
            .filter(|e| e.escaped)
            .count()
    }

    /// The domain as text ([`entry_text`]), to be borrowed by [`WireRequest::request`].
    pub fn domain(&self) -> std::borrow::Cow<'_, str> {
        entry_text(&self.domain)
    }

    /// Borrows the request for the limiter, with `domain` from [`WireRequest::domain`].
    pub fn request<'a>(&'a self, domain: &'a str) -> Request<'a> {
        Request {
            domain,
            descriptors: self
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
            hits_addend: u64::from(self.hits_addend),
            // Over gRPC a descriptor's own `hits_addend` is a charge (see `limiter::Request`).
            costs_are_charges: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    /// An entry with raw bytes, encoded by hand: prost's own types cannot hold them.
    fn raw_entry(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut entry = Vec::new();
        wire_bytes::encode(1, &key.to_vec(), &mut entry);
        wire_bytes::encode(2, &value.to_vec(), &mut entry);
        entry
    }

    fn raw_request(values: &[&[u8]]) -> Vec<u8> {
        let mut message = Vec::new();
        string::encode(1, &"d".to_string(), &mut message);
        for value in values {
            let mut descriptor = Vec::new();
            wire_bytes::encode(1, &raw_entry(b"path", value), &mut descriptor);
            wire_bytes::encode(2, &descriptor, &mut message);
        }
        message
    }

    fn values(request: &WireRequest) -> Vec<&str> {
        request
            .descriptors
            .iter()
            .map(|d| d.entries[0].value.as_str())
            .collect()
    }

    #[test]
    fn decodes_what_envoy_types_decodes() {
        let proto = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: "jos\u{e9}".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: 2,
                }),
                hits_addend: Some(UInt64Value { value: 3 }),
                is_negative_hits: true,
            }],
            hits_addend: 7,
        };
        let wire = WireRequest::decode(proto.encode_to_vec().as_slice()).expect("decodes");
        let domain = wire.domain();
        let request = wire.request(&domain);
        let expected = Request {
            domain: "edge",
            descriptors: vec![Descriptor {
                entries: [("user", "jos\u{e9}")].into_iter().collect(),
                limit: Some(LimitOverride {
                    requests_per_unit: 5,
                    unit: unit_from_override(2),
                }),
                hits_addend: Some(3),
                negative_hits: true,
            }]
            .into(),
            hits_addend: 7,
            costs_are_charges: true,
        };
        assert_eq!(request, expected);
        assert_eq!(wire.escaped(), 0);
        // Encoding it again gives Envoy's message back.
        assert_eq!(
            RateLimitRequest::decode(wire.encode_to_vec().as_slice()).ok(),
            Some(proto.clone())
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_decided_under_distinct_text() {
        let raw = raw_request(&[b"x\xff", b"x\xfe", b"x\\xff", b"/api/\xff\xfe", b"ok"]);
        assert!(
            RateLimitRequest::decode(raw.as_slice()).is_err(),
            "prost refuses them"
        );
        let wire = WireRequest::decode(raw.as_slice()).expect("decodes");
        assert_eq!(
            values(&wire),
            ["x\0\\xff", "x\0\\xfe", "x\\xff", "/api/\0\\xff\\xfe", "ok"]
        );
        assert_eq!(wire.escaped(), 3);
    }

    /// A field given twice keeps its last text, and the escape count follows the text kept.
    #[test]
    fn an_entry_given_twice_is_escaped_as_its_last_text() {
        let entry = |fields: &[(u8, &[u8])]| {
            let mut entry = Vec::new();
            for (tag, bytes) in fields {
                entry.extend([tag << 3 | 2, bytes.len() as u8]);
                entry.extend_from_slice(bytes);
            }
            // A request of one descriptor (field 2) of this one entry (field 1).
            let descriptor = [&[1 << 3 | 2, entry.len() as u8][..], &entry].concat();
            [&[2 << 3 | 2, descriptor.len() as u8][..], &descriptor].concat()
        };
        let replaced = entry(&[(1, b"\xff"), (1, b"a"), (2, b"v")]);
        let wire = WireRequest::decode(replaced.as_slice()).expect("decodes");
        assert_eq!(wire.descriptors[0].entries[0].key, "a");
        assert_eq!(wire.escaped(), 0);
        let kept = entry(&[(1, b"\xff"), (2, b"a"), (2, b"v")]);
        assert_eq!(
            WireRequest::decode(kept.as_slice())
                .expect("decodes")
                .escaped(),
            1
        );
        let last = entry(&[(1, b"a"), (1, b"\xfe")]);
        assert_eq!(
            WireRequest::decode(last.as_slice())
                .expect("decodes")
                .escaped(),
            1
        );
    }

    #[test]
    fn a_nul_is_escaped_so_no_text_names_an_escape() {
        // Sent as UTF-8, the escaped text of `x\xff` is escaped again rather than taken as is.
        let raw = raw_request(&[b"x\0\\xff", b"\0a"]);
        let wire = WireRequest::decode(raw.as_slice()).expect("decodes");
        assert_eq!(values(&wire), ["x\0\0\\\\xff", "\0\0a"]);
    }
}
