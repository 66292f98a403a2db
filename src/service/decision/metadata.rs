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
//! One difference: envoyproxy/ratelimit writes a descriptor's limit override as Go's protobuf
//! text in `descriptors[].limit`, a format Go keeps deliberately unstable; here `limit` is the
//! limit that applied, override or rule, as a number.

use std::collections::HashMap;

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, NullValue, Struct, Value};

use super::code_name as code;
use crate::config::RuleMetadata;
use crate::limiter::{Code, DescriptorStatus, Request, Response};

/// The metadata of the answer `response` to `request`.
pub fn of(request: &Request<'_>, response: &Response) -> Struct {
    let mut fields = HashMap::with_capacity(12);
    if let Some(decided) = deciding(&response.statuses) {
        decision_fields(decided, &mut fields);
    }
    fields.insert("code".into(), text(code(response.overall)));
    fields.insert("domain".into(), text(request.domain));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".into(), number(request.hits_addend as f64));
    }
    let descriptors = request
        .descriptors
        .iter()
        .zip(&response.statuses)
        .map(|(descriptor, status)| {
            let mut fields = HashMap::with_capacity(8);
            let entries = descriptor
                .entries
                .iter()
                .map(|(key, value)| text(&format!("{key}={value}")))
                .collect();
            fields.insert("entries".into(), list(entries));
            if let Some(hits) = descriptor.hits_addend {
                fields.insert("hitsAddend".into(), number(hits as f64));
            }
            decision_fields(status, &mut fields);
            structure(fields)
        })
        .collect();
    fields.insert("descriptors".into(), list(descriptors));
    let mut passed = serde_json::Map::new();
    for status in &response.statuses {
        if status.code == Code::Ok
            && let Some(metadata) = status.rule.as_ref().and_then(|r| r.metadata.as_ref())
        {
            merge(&mut passed, metadata);
        }
    }
    if !passed.is_empty() {
        fields.insert("metadata".into(), structure(object(&passed)));
    }
    Struct { fields }
}

/// The descriptor that decided: the first over its limit, else the one with the least remaining.
fn deciding(statuses: &[DescriptorStatus]) -> Option<&DescriptorStatus> {
    let named = || statuses.iter().filter(|s| s.rule.is_some());
    named()
        .find(|s| s.code == Code::OverLimit && !s.shadow)
        .or_else(|| named().find(|s| s.code == Code::OverLimit))
        .or_else(|| named().min_by_key(|s| s.limit_remaining))
}

/// `rule`, `code`, `limit`, `window`, `remaining` and `shadow` of one descriptor with a limit;
/// nothing for one without.
fn decision_fields(status: &DescriptorStatus, fields: &mut HashMap<String, Value>) {
    let (Some(rule), Some(limit)) = (&status.rule, &status.current_limit) else {
        return;
    };
    fields.insert("rule".into(), text(&rule.name));
    fields.insert("code".into(), text(code(status.code)));
    fields.insert("limit".into(), number(f64::from(limit.requests_per_unit)));
    fields.insert(
        "window".into(),
        text(&humantime::format_duration(limit.window).to_string()),
    );
    fields.insert(
        "remaining".into(),
        number(f64::from(status.limit_remaining)),
    );
    fields.insert("shadow".into(), kind(Kind::BoolValue(status.shadow)));
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

/// A JSON map as protobuf `Struct` fields.
fn object(map: &RuleMetadata) -> HashMap<String, Value> {
    map.iter()
        .map(|(name, value)| (name.clone(), json(value)))
        .collect()
}

fn json(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => kind(Kind::NullValue(NullValue::NullValue as i32)),
        serde_json::Value::Bool(b) => kind(Kind::BoolValue(*b)),
        serde_json::Value::Number(n) => number(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => text(s),
        serde_json::Value::Array(values) => list(values.iter().map(json).collect()),
        serde_json::Value::Object(map) => structure(object(map)),
    }
}

fn structure(fields: HashMap<String, Value>) -> Value {
    kind(Kind::StructValue(Struct { fields }))
}

fn list(values: Vec<Value>) -> Value {
    kind(Kind::ListValue(ListValue { values }))
}

fn text(text: &str) -> Value {
    kind(Kind::StringValue(text.to_string()))
}

fn number(n: f64) -> Value {
    kind(Kind::NumberValue(n))
}

fn kind(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}
