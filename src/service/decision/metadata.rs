//! The decision in a `ShouldRateLimit` answer's dynamic metadata (`--response-metadata`).
//!
//! Why: the first question when a client reports 429s is which rule denied it. Envoy's ratelimit
//! filter keeps an answer's `dynamic_metadata` under `envoy.filters.http.ratelimit`, where the
//! access log (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:rule)%`), Lua and later filters
//! read it. Access-log format strings reach fields by name but cannot index lists, so the rule
//! that decided the request is in flat top-level fields, and every descriptor in a list beside
//! them:
//! - `code`: `OK` or `OVER_LIMIT`, the overall answer;
//! - `rule`, `limit`, `window`, `remaining`, `shadow`: the descriptor that decided, the first
//!   over its limit, else the one with the least remaining (its rule's `name`, or its path
//!   `key_value.key`; `limit` the requests per window, `window` as `1m` or `30s`); absent when
//!   no descriptor had a limit;
//! - `descriptors`: for each descriptor of the request, in order, its `entries` (`"key=value"`),
//!   its own `hitsAddend` when it has one, and with a limit the fields above and its `code`.
//!
//! The same answer carries what envoyproxy/ratelimit sends with `RESPONSE_DYNAMIC_METADATA=true`
//! (`ratelimitToMetadata`), so a Lua filter or access log written for it reads the same fields:
//! - `domain`; `descriptors[].entries` and `descriptors[].hitsAddend` as above; `hitsAddend`, the
//!   request's, when not 0;
//! - `metadata`: the YAML `metadata` of the rules of every descriptor that passed (not over its
//!   limit), merged in the request's order: a name already set keeps its first value, and maps
//!   under the same name are merged the same way.
//!
//! Written straight in protobuf's wire format (a `google.protobuf.Struct`), not built as prost's
//! `Struct` and encoded: that would be a hash map per level and a string per name, about 20,000
//! instructions per call; written, the whole is one buffer.
//!
//! One difference: envoyproxy/ratelimit writes a descriptor's limit override as Go's protobuf
//! text in `descriptors[].limit`, a format Go keeps deliberately unstable; here `limit` is the
//! limit that applied, override or rule, as a number.

use std::fmt::Write as _;

use bytes::BufMut;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use super::code_name as code;
use crate::config::RuleMetadata;
use crate::limiter::{Code, DescriptorStatus, Request, Response};

/// The longest value echoed in `descriptors[].entries`: values come from clients (a header, a
/// path), and a value over the request's `max_value_bytes` is still decided (under its digest).
pub const MAX_ECHOED_VALUE_BYTES: usize = 256;

/// The most `descriptors[].entries` text one answer echoes, over all its descriptors; past it,
/// the remaining entries are left out.
pub const MAX_ECHOED_BYTES: usize = 16 * 1024;

/// The metadata of the answer `response` to `request`: an encoded `google.protobuf.Struct`.
pub fn encode(request: &Request<'_>, response: &Response) -> Vec<u8> {
    let mut out = StructWriter::with_capacity(256);
    let mut scratch = Scratch::default();
    if let Some(decided) = deciding(&response.statuses) {
        decision_fields(decided, &mut out, &mut scratch, false);
    }
    out.field("code", Scalar::Text(code(response.overall)));
    out.field("domain", Scalar::Text(request.domain));
    if request.hits_addend != 0 {
        out.field("hitsAddend", Scalar::Number(request.hits_addend as f64));
    }
    let mut descriptors = ListWriter::default();
    let mut echoed = 0;
    for (descriptor, status) in request.descriptors.iter().zip(&response.statuses) {
        let mut fields = StructWriter::with_capacity(128);
        let mut entries = ListWriter::default();
        for (key, value) in descriptor.entries.iter() {
            let value = cut(value, MAX_ECHOED_VALUE_BYTES);
            echoed += key.len() + 1 + value.len();
            if echoed > MAX_ECHOED_BYTES {
                break;
            }
            entries.item(Scalar::Pair(key, value));
        }
        fields.field("entries", Scalar::List(&entries.0));
        if let Some(hits) = descriptor.hits_addend {
            fields.field("hitsAddend", Scalar::Number(hits as f64));
        }
        decision_fields(status, &mut fields, &mut scratch, true);
        descriptors.item(Scalar::Struct(&fields.0));
    }
    out.field("descriptors", Scalar::List(&descriptors.0));
    let mut passed = RuleMetadata::new();
    for status in &response.statuses {
        if status.code == Code::Ok
            && let Some(metadata) = status.rule.as_ref().and_then(|r| r.metadata.as_ref())
        {
            merge(&mut passed, metadata);
        }
    }
    if !passed.is_empty() {
        let fields = object(&passed);
        out.field("metadata", Scalar::Struct(&fields.0));
    }
    out.0
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The descriptor that decided: the first over its limit, else the one with the least remaining.
fn deciding(statuses: &[DescriptorStatus]) -> Option<&DescriptorStatus> {
    let named = || statuses.iter().filter(|s| s.rule.is_some());
    named()
        .find(|s| s.code == Code::OverLimit && !s.shadow)
        .or_else(|| named().find(|s| s.code == Code::OverLimit))
        .or_else(|| named().min_by_key(|s| s.limit_remaining))
}

/// Reused text for the fields that are formatted.
#[derive(Default)]
struct Scratch {
    window: String,
}

/// `rule`, `limit`, `window`, `remaining`, `shadow` (and `code` when `with_code`) of one
/// descriptor with a limit; nothing for one without.
fn decision_fields(
    status: &DescriptorStatus,
    out: &mut StructWriter,
    scratch: &mut Scratch,
    with_code: bool,
) {
    let (Some(rule), Some(limit)) = (&status.rule, &status.current_limit) else {
        return;
    };
    out.field("rule", Scalar::Text(&rule.name));
    if with_code {
        out.field("code", Scalar::Text(code(status.code)));
    }
    out.field("limit", Scalar::Number(f64::from(limit.requests_per_unit)));
    scratch.window.clear();
    let _ = write!(
        scratch.window,
        "{}",
        humantime::format_duration(limit.window)
    );
    out.field("window", Scalar::Text(&scratch.window));
    out.field(
        "remaining",
        Scalar::Number(f64::from(status.limit_remaining)),
    );
    out.field("shadow", Scalar::Bool(status.shadow));
}

/// Adds to `into` the names of `from` it does not have; a map under a name both have is merged
/// the same way (envoyproxy/ratelimit's `mergeMetadata`).
fn merge(into: &mut RuleMetadata, from: &RuleMetadata) {
    for (name, value) in from {
        match (into.get_mut(name), value) {
            (None, _) => {
                into.insert(name.clone(), value.clone());
            }
            (Some(serde_json::Value::Object(mine)), serde_json::Value::Object(theirs)) => {
                merge(mine, theirs);
            }
            (Some(_), _) => {}
        }
    }
}

/// A JSON map as `Struct` fields (its depth is bounded at load: `config::MAX_METADATA_DEPTH`).
fn object(map: &RuleMetadata) -> StructWriter {
    let mut out = StructWriter::with_capacity(64);
    for (name, value) in map {
        json(value, &mut |scalar| out.field(name, scalar));
    }
    out
}

/// Gives `write` the `Value` of a JSON value (a number JSON holds as an integer is a double, as
/// in every `Struct`).
fn json(value: &serde_json::Value, write: &mut dyn FnMut(Scalar<'_>)) {
    match value {
        serde_json::Value::Null => write(Scalar::Null),
        serde_json::Value::Bool(b) => write(Scalar::Bool(*b)),
        serde_json::Value::Number(n) => write(Scalar::Number(n.as_f64().unwrap_or(0.0))),
        serde_json::Value::String(s) => write(Scalar::Text(s)),
        serde_json::Value::Array(values) => {
            let mut list = ListWriter::default();
            for value in values {
                json(value, &mut |scalar| list.item(scalar));
            }
            write(Scalar::List(&list.0));
        }
        serde_json::Value::Object(map) => write(Scalar::Struct(&object(map).0)),
    }
}

/// One `google.protobuf.Value`, with its nested messages already encoded.
#[derive(Clone, Copy)]
enum Scalar<'a> {
    Null,
    Number(f64),
    Text(&'a str),
    /// The text `key=value`, written without joining the two first.
    Pair(&'a str, &'a str),
    Bool(bool),
    /// An encoded `Struct`.
    Struct(&'a [u8]),
    /// An encoded `ListValue`.
    List(&'a [u8]),
}

impl Scalar<'_> {
    /// Its `Value` message's length.
    fn len(self) -> usize {
        match self {
            Scalar::Null | Scalar::Bool(_) => 2,
            Scalar::Number(_) => 9,
            Scalar::Text(s) => delimited(s.len()),
            Scalar::Pair(k, v) => delimited(k.len() + 1 + v.len()),
            Scalar::Struct(b) | Scalar::List(b) => delimited(b.len()),
        }
    }

    /// Writes its `Value` message (without a length in front).
    fn write(self, buf: &mut Vec<u8>) {
        match self {
            Scalar::Null => {
                encode_key(1, WireType::Varint, buf);
                buf.put_u8(0);
            }
            Scalar::Number(n) => {
                encode_key(2, WireType::SixtyFourBit, buf);
                buf.put_f64_le(n);
            }
            Scalar::Text(s) => bytes(3, s.as_bytes(), buf),
            Scalar::Pair(k, v) => {
                encode_key(3, WireType::LengthDelimited, buf);
                encode_varint((k.len() + 1 + v.len()) as u64, buf);
                buf.extend_from_slice(k.as_bytes());
                buf.push(b'=');
                buf.extend_from_slice(v.as_bytes());
            }
            Scalar::Bool(b) => {
                encode_key(4, WireType::Varint, buf);
                buf.put_u8(u8::from(b));
            }
            Scalar::Struct(b) => bytes(5, b, buf),
            Scalar::List(b) => bytes(6, b, buf),
        }
    }
}

/// The fields of a `Struct` (field 1, one map entry each), encoded one after another.
struct StructWriter(Vec<u8>);

impl StructWriter {
    fn with_capacity(capacity: usize) -> Self {
        StructWriter(Vec::with_capacity(capacity))
    }

    /// One map entry: `key` (1) the name, `value` (2) the `Value`.
    fn field(&mut self, name: &str, value: Scalar<'_>) {
        let value_len = value.len();
        let entry_len = delimited(name.len()) + delimited(value_len);
        encode_key(1, WireType::LengthDelimited, &mut self.0);
        encode_varint(entry_len as u64, &mut self.0);
        bytes(1, name.as_bytes(), &mut self.0);
        encode_key(2, WireType::LengthDelimited, &mut self.0);
        encode_varint(value_len as u64, &mut self.0);
        value.write(&mut self.0);
    }
}

/// The values of a `ListValue` (field 1, repeated), encoded one after another.
#[derive(Default)]
struct ListWriter(Vec<u8>);

impl ListWriter {
    fn item(&mut self, value: Scalar<'_>) {
        encode_key(1, WireType::LengthDelimited, &mut self.0);
        encode_varint(value.len() as u64, &mut self.0);
        value.write(&mut self.0);
    }
}

/// A length-delimited field of `payload` bytes: its one-byte key, the length and the payload.
fn delimited(payload: usize) -> usize {
    1 + encoded_len_varint(payload as u64) + payload
}

fn bytes(tag: u32, payload: &[u8], buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(payload.len() as u64, buf);
    buf.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::Struct;
    use envoy_types::pb::google::protobuf::value::Kind;
    use prost::Message as _;

    use super::*;

    #[test]
    fn what_is_written_decodes_as_a_struct() {
        let mut out = StructWriter::with_capacity(0);
        let mut list = ListWriter::default();
        list.item(Scalar::Pair("user", "é"));
        list.item(Scalar::Null);
        let mut inner = StructWriter::with_capacity(0);
        inner.field("n", Scalar::Number(2.5));
        out.field("list", Scalar::List(&list.0));
        out.field("inner", Scalar::Struct(&inner.0));
        out.field("yes", Scalar::Bool(true));
        let long = "x".repeat(300);
        out.field(&long, Scalar::Text(&long));
        let decoded = Struct::decode(out.0.as_slice()).expect("a Struct");
        let Some(Kind::ListValue(list)) = &decoded.fields["list"].kind else {
            panic!("{decoded:?}");
        };
        assert_eq!(
            list.values[0].kind,
            Some(Kind::StringValue("user=é".into()))
        );
        assert_eq!(list.values[1].kind, Some(Kind::NullValue(0)));
        let Some(Kind::StructValue(inner)) = &decoded.fields["inner"].kind else {
            panic!("{decoded:?}");
        };
        assert_eq!(inner.fields["n"].kind, Some(Kind::NumberValue(2.5)));
        assert_eq!(decoded.fields["yes"].kind, Some(Kind::BoolValue(true)));
        assert_eq!(
            decoded.fields[&long].kind,
            Some(Kind::StringValue(long.clone()))
        );
    }
}
