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
//!   `key_value.key`; `limit` the requests per window, `window` as `1m` or `30s`);
//! - `descriptors`: the same fields (and `code`) for each descriptor of the request, in order;
//!   `{}` for one no limit applied to.
//!
//! Present when a descriptor of the request had a limit.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};

use super::code_name as code;
use crate::limiter::{Code, DescriptorStatus, Response};

/// The metadata of `response`, if any of its descriptors had a limit and named its rule.
pub fn of(response: &Response) -> Option<Struct> {
    let decided = deciding(&response.statuses)?;
    let mut fields = descriptor_fields(decided);
    fields.insert("code".into(), text(code(response.overall)));
    let descriptors = response
        .statuses
        .iter()
        .map(|status| Value {
            kind: Some(Kind::StructValue(Struct {
                fields: descriptor_fields(status).into_iter().collect(),
            })),
        })
        .collect();
    fields.insert(
        "descriptors".into(),
        Value {
            kind: Some(Kind::ListValue(ListValue {
                values: descriptors,
            })),
        },
    );
    Some(Struct {
        fields: fields.into_iter().collect(),
    })
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
fn descriptor_fields(status: &DescriptorStatus) -> std::collections::BTreeMap<String, Value> {
    let mut fields = std::collections::BTreeMap::new();
    let (Some(rule), Some(limit)) = (&status.rule, &status.current_limit) else {
        return fields;
    };
    fields.insert("rule".into(), text(rule));
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
    fields.insert(
        "shadow".into(),
        Value {
            kind: Some(Kind::BoolValue(status.shadow)),
        },
    );
    fields
}

fn text(text: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(text.to_string())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}
