//! `POST /json`: Envoy's `RateLimitRequest` / `RateLimitResponse` in protobuf's JSON mapping, as
//! envoyproxy/ratelimit's `/json` endpoint speaks them.
//!
//! Request (field names in lowerCamelCase or as in the proto, snake_case; integers as numbers or
//! strings; `null` means unset). As in protobuf's JSON mapping, unknown fields are rejected, and
//! so is a field given twice, by one name or by both (`"domain"` twice, or `hitsAddend` and
//! `hits_addend`): otherwise one reading of the body would decide and another be logged.
//! `--max-descriptors` and `--max-entries` are checked before a descriptor is built.
//!
//! ```json
//! {"domain": "api",
//!  "descriptors": [{"entries": [{"key": "user", "value": "alice"}],
//!                   "hitsAddend": 2,
//!                   "limit": {"requestsPerUnit": 5, "unit": "MINUTE"}}],
//!  "hitsAddend": 1}
//! ```
//!
//! Response (protojson output: default values are omitted, enums by name, durations as strings):
//!
//! ```json
//! {"overallCode": "OK",
//!  "statuses": [{"code": "OK",
//!                "currentLimit": {"requestsPerUnit": 5, "unit": "MINUTE"},
//!                "limitRemaining": 3, "durationUntilReset": "60s"}],
//!  "responseHeadersToAdd": [{"key": "ratelimit-limit", "value": "5"}]}
//! ```
//!
//! HTTP status: 200 for OK, 429 for OVER_LIMIT, 400 for a bad body or request, 413 for a body over
//! `--max-body-bytes`, 503 when the store fails under `--failure-mode error`.

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};

use super::{OwnedDescriptor, OwnedRequest, unit_from_override};
use crate::config::Unit;
use crate::limiter::{
    Code, DescriptorStatus, LimitOverride, RequestLimits, Response, entry_text_owned,
};

/// Parses a request body within `limits`; the error is a message for the client.
pub fn parse_request(body: &[u8], limits: &RequestLimits) -> Result<OwnedRequest, String> {
    let Strict(value) =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let object = fields(&value, "request")?;
    let mut request = OwnedRequest::default();
    for (field, value) in object {
        match field.as_str() {
            "domain" => request.domain = string(value, "domain")?,
            "descriptors" => {
                let descriptors = array(value, "descriptors")?;
                limits
                    .check_descriptors(descriptors.len())
                    .map_err(|e| e.to_string())?;
                for (i, d) in descriptors.iter().enumerate() {
                    request.descriptors.push(descriptor(d, i, limits)?);
                }
            }
            "hitsAddend" | "hits_addend" => {
                request.hits_addend = uint(value, "hitsAddend", u64::from(u32::MAX))?.unwrap_or(0)
            }
            other => return Err(format!("unknown field {other:?} in request")),
        }
    }
    Ok(request)
}

fn descriptor(value: &Value, i: usize, limits: &RequestLimits) -> Result<OwnedDescriptor, String> {
    let path = format!("descriptors[{i}]");
    let mut descriptor = OwnedDescriptor::default();
    for (field, value) in fields(value, &path)? {
        match field.as_str() {
            "entries" => {
                let entries = array(value, &format!("{path}.entries"))?;
                limits
                    .check_entries(i, entries.len())
                    .map_err(|e| e.to_string())?;
                for (j, e) in entries.iter().enumerate() {
                    descriptor
                        .entries
                        .push(entry(e, &format!("{path}.entries[{j}]"))?);
                }
            }
            "limit" if value.is_null() => {}
            "limit" => descriptor.limit = Some(limit(value, &format!("{path}.limit"))?),
            "hitsAddend" | "hits_addend" => {
                descriptor.hits_addend = uint(value, &format!("{path}.hitsAddend"), u64::MAX)?
            }
            "isNegativeHits" | "is_negative_hits" => {
                descriptor.negative_hits = match value {
                    Value::Null => false,
                    Value::Bool(b) => *b,
                    _ => return Err(format!("{path}.isNegativeHits must be a boolean")),
                }
            }
            other => return Err(format!("unknown field {other:?} in {path}")),
        }
    }
    Ok(descriptor)
}

fn entry(value: &Value, path: &str) -> Result<(String, String), String> {
    let mut entry = (String::new(), String::new());
    for (field, value) in fields(value, path)? {
        match field.as_str() {
            "key" => entry.0 = entry_text(string(value, &format!("{path}.key"))?),
            "value" => entry.1 = entry_text(string(value, &format!("{path}.value"))?),
            other => return Err(format!("unknown field {other:?} in {path}")),
        }
    }
    Ok(entry)
}

fn limit(value: &Value, path: &str) -> Result<LimitOverride, String> {
    let mut limit = LimitOverride {
        requests_per_unit: 0,
        unit: None,
    };
    for (field, value) in fields(value, path)? {
        match field.as_str() {
            "requestsPerUnit" | "requests_per_unit" => {
                let n = uint(
                    value,
                    &format!("{path}.requestsPerUnit"),
                    u64::from(u32::MAX),
                )?;
                limit.requests_per_unit = u32::try_from(n.unwrap_or(0)).unwrap_or(u32::MAX);
            }
            "unit" => limit.unit = unit(value, &format!("{path}.unit"))?,
            other => return Err(format!("unknown field {other:?} in {path}")),
        }
    }
    Ok(limit)
}

/// A unit by name or number; `None` for `UNKNOWN`/unset, which the limiter rejects.
fn unit(value: &Value, path: &str) -> Result<Option<Unit>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(name) => match name.as_str() {
            "UNKNOWN" => Ok(None),
            "SECOND" => Ok(Some(Unit::Second)),
            "MINUTE" => Ok(Some(Unit::Minute)),
            "HOUR" => Ok(Some(Unit::Hour)),
            "DAY" => Ok(Some(Unit::Day)),
            "WEEK" => Ok(Some(Unit::Week)),
            "MONTH" => Ok(Some(Unit::Month)),
            "YEAR" => Ok(Some(Unit::Year)),
            _ => Err(format!(
                "{path}: unknown unit {name:?} (expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR)"
            )),
        },
        Value::Number(n) => match n.as_i64().and_then(|n| i32::try_from(n).ok()) {
            Some(n) => Ok(unit_from_override(n)),
            None => Err(format!("{path}: unknown unit {n}")),
        },
        _ => Err(format!("{path} must be a unit name")),
    }
}

/// The fields of an object, refusing one given under both of its names (`hitsAddend` and
/// `hits_addend`), as protobuf's JSON mapping does. Repeated keys were refused by [`Strict`].
fn fields<'v>(value: &'v Value, path: &str) -> Result<&'v Map<String, Value>, String> {
    let object = value
        .as_object()
        .ok_or_else(|| format!("{path} must be a JSON object"))?;
    for (camel, snake) in [
        ("hitsAddend", "hits_addend"),
        ("isNegativeHits", "is_negative_hits"),
        ("requestsPerUnit", "requests_per_unit"),
    ] {
        if object.contains_key(camel) && object.contains_key(snake) {
            return Err(format!("{path} has both {camel} and {snake}: give one"));
        }
    }
    Ok(object)
}

/// A JSON value as serde_json parses it, except that an object repeating a key is an error
/// (serde_json keeps the last).
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(A::Error::custom(format!("duplicate field {key:?}")));
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

fn array<'v>(value: &'v Value, path: &str) -> Result<&'v [Value], String> {
    match value {
        Value::Null => Ok(&[]),
        Value::Array(items) => Ok(items),
        _ => Err(format!("{path} must be an array")),
    }
}

/// A key or value as gRPC and `/check` count it: JSON text is UTF-8, but one holding a NUL is
/// escaped as over the other transports ([`crate::limiter::entry_text`]), so the same bytes
/// share one counter whichever transport sent them.
fn entry_text(text: String) -> String {
    entry_text_owned(text.into_bytes()).0
}

fn string(value: &Value, path: &str) -> Result<String, String> {
    match value {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        _ => Err(format!("{path} must be a string")),
    }
}

/// An unsigned integer as a JSON number or a decimal string (protojson accepts both), at most
/// `max`; `None` for `null`.
fn uint(value: &Value, path: &str, max: u64) -> Result<Option<u64>, String> {
    let n = match value {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if n <= max => Ok(Some(n)),
        _ => Err(format!(
            "{path} must be an unsigned integer of at most {max}"
        )),
    }
}

/// The response body in protojson form.
pub fn render_response(response: &Response) -> Value {
    let mut body = Map::new();
    body.insert("overallCode".into(), json!(code_name(response.overall)));
    let statuses: Vec<Value> = response.statuses.iter().map(render_status).collect();
    body.insert("statuses".into(), Value::Array(statuses));
    if !response.headers.is_empty() {
        let headers: Vec<Value> = response
            .headers
            .iter()
            .map(|(key, value)| json!({"key": key, "value": value.as_str()}))
            .collect();
        body.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(body)
}

fn render_status(status: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), json!(code_name(status.code)));
    if let Some(limit) = &status.current_limit {
        let mut current = Map::new();
        if limit.requests_per_unit != 0 {
            current.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
        }
        current.insert("unit".into(), json!(limit.unit.as_str()));
        if let Some(name) = limit.name.as_deref().filter(|n| !n.is_empty()) {
            current.insert("name".into(), json!(name));
        }
        out.insert("currentLimit".into(), Value::Object(current));
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(status.limit_remaining));
    }
    if let Some(reset) = status.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(duration(reset)));
    }
    Value::Object(out)
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// protojson's `google.protobuf.Duration`: seconds with 0, 3, 6 or 9 fractional digits.
pub fn duration(d: std::time::Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    if nanos == 0 {
        format!("{secs}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{secs}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{secs}.{:06}s", nanos / 1_000)
    } else {
        format!("{secs}.{nanos:09}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(body: &[u8]) -> Result<OwnedRequest, String> {
        let limits = RequestLimits {
            max_descriptors: 4,
            ..RequestLimits::default()
        };
        parse_request(body, &limits)
    }

    #[test]
    fn parses_camel_and_snake_case() {
        let camel = br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],
            "hitsAddend":"3","limit":{"requestsPerUnit":5,"unit":"HOUR"}}],"hitsAddend":2}"#;
        let snake = br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],
            "hits_addend":3,"limit":{"requests_per_unit":"5","unit":3}}],"hits_addend":"2"}"#;
        let a = parse(camel).unwrap_or_else(|e| panic!("{e}"));
        let b = parse(snake).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a, b);
        assert_eq!(a.hits_addend, 2);
        assert_eq!(a.descriptors[0].hits_addend, Some(3));
        assert_eq!(
            a.descriptors[0].limit,
            Some(LimitOverride {
                requests_per_unit: 5,
                unit: Some(Unit::Hour)
            })
        );
        // A NUL is escaped as over gRPC and `/check`, so the same bytes share one counter.
        let r = parse(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"a\u0000b"}]}]}"#,
        );
        assert_eq!(
            r.map(|r| r.descriptors[0].entries.clone()),
            Ok(vec![("k".into(), "a\0\0b".into())])
        );
        // An entry without a value is the empty value.
        let r = parse(br#"{"domain":"d","descriptors":[{"entries":[{"key":"k"}]}]}"#);
        assert_eq!(
            r.map(|r| r.descriptors[0].entries.clone()),
            Ok(vec![("k".into(), String::new())])
        );
    }

    #[test]
    fn rejects_bad_bodies_with_a_path() {
        for (body, expected) in [
            (&b"{"[..], "invalid JSON"),
            (b"[]", "request must be a JSON object"),
            (br#"{"domian":"d"}"#, "unknown field \"domian\""),
            (br#"{"domain":1}"#, "domain must be a string"),
            (
                br#"{"descriptors":[{"entries":[{"key":"k","valu":"v"}]}]}"#,
                "descriptors[0].entries[0]",
            ),
            (
                br#"{"hitsAddend":-1}"#,
                "hitsAddend must be an unsigned integer",
            ),
            (
                br#"{"hitsAddend":4294967296}"#,
                "hitsAddend must be an unsigned integer",
            ),
            (
                br#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#,
                "unknown unit \"FORTNIGHT\"",
            ),
            (
                br#"{"domain":"nope","domain":"d"}"#,
                "duplicate field \"domain\"",
            ),
            (
                br#"{"descriptors":[{"entries":[{"key":"k","key":"j"}]}]}"#,
                "duplicate field \"key\"",
            ),
            (
                br#"{"domain":"d","hitsAddend":1,"hits_addend":2}"#,
                "request has both hitsAddend and hits_addend",
            ),
            (
                br#"{"descriptors":[{"hits_addend":1,"hitsAddend":2}]}"#,
                "descriptors[0] has both hitsAddend and hits_addend",
            ),
            (
                br#"{"descriptors":[{},{},{},{},{}]}"#,
                "too many descriptors: 5",
            ),
        ] {
            match parse(body) {
                Err(message) => {
                    assert!(message.contains(expected), "{message:?} lacks {expected:?}")
                }
                Ok(r) => panic!("accepted {r:?}"),
            }
        }
    }

    #[test]
    fn durations_as_protojson() {
        assert_eq!(duration(Duration::from_secs(60)), "60s");
        assert_eq!(duration(Duration::from_millis(1500)), "1.500s");
        assert_eq!(duration(Duration::from_micros(1)), "0.000001s");
        assert_eq!(duration(Duration::from_nanos(5)), "0.000000005s");
    }
}
