//! `POST /explain`: the body of `POST /json`, answered with what the request would get now and why,
//! from the live rules and the live store, counting nothing ([`RateLimiter::explain`]).
//!
//! The answer (JSON): `domain`, `domainKnown`, `store`, `overallCode` (what all or nothing would
//! answer now), and per descriptor: its `entries`, `hits` and what they would do (`hitsKind`),
//! `code`, `outcome` (`no_rule`, `unlimited`, `replaced` with `replacedBy`, `limited`,
//! `override`, `over_budget`), the `path` it took through the rule tree, the matched `rule`, and
//! per limit a `counter`: its `key`, `limit`, `window`, `precision`, `shadow`, the hits it `holds`,
//! `remaining`, `resetsInMs` and `resetsAt`, and whether the request's hits would be `over`.
//! Under `--operator-hide-values` every value the request carried is `(hidden)` and counter keys
//! are left out.
//!
//! [`RateLimiter::explain`]: crate::limiter::RateLimiter::explain

use std::time::{Duration, SystemTime};

use axum::Json;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::limiter::{ExplainedDescriptor, Explanation, LimitError, Outcome};
use crate::service::decision::code_name;
use crate::service::http_routes::{AppState, error_response};
use crate::service::{OwnedRequest, json};
use crate::store::HitKind;

use super::explain_bucket;

/// What a hidden value shows as.
pub(super) const HIDDEN: &str = "(hidden)";

pub(super) async fn handler(
    state: AppState,
    options: &super::OperatorOptions,
    body: Bytes,
) -> Response {
    let hide = options.hide_values;
    let limiter = state.front.limiter();
    if let Some(quotas) = &options.quotas
        && let Some(asked) = explain_bucket::BucketAsked::parse(&body)
    {
        return explain_bucket::answer(quotas, asked, hide);
    }
    let request = match json::parse_request(&body, &limiter.options().limits) {
        Ok(request) => request,
        Err(message) => return error_response(&LimitError::InvalidArgument(message)),
    };
    match limiter.explain(&request.as_request()).await {
        Ok(explanation) => {
            let body = render(&request, &explanation, limiter.store().kind(), hide);
            Json(body).into_response()
        }
        Err(error) => error_response(&error),
    }
}

fn render(request: &OwnedRequest, explanation: &Explanation, store: &str, hide: bool) -> Value {
    let descriptors: Vec<Value> = request
        .descriptors
        .iter()
        .zip(&explanation.descriptors)
        .map(|(asked, explained)| descriptor(&asked.entries, explained, hide))
        .collect();
    json!({
        "domain": request.domain,
        "domainKnown": explanation.domain_known,
        "store": store,
        "overallCode": code_name(explanation.overall),
        "descriptors": descriptors,
    })
}

fn descriptor(entries: &[(String, String)], explained: &ExplainedDescriptor, hide: bool) -> Value {
    let mut out = Map::new();
    out.insert("entries".into(), entries_json(entries, hide));
    out.insert("hits".into(), json!(explained.hits));
    let kind = match explained.kind {
        HitKind::Admitted => "admitted",
        HitKind::Charged => "charged",
        HitKind::Returned => "returned",
    };
    out.insert("hitsKind".into(), json!(kind));
    out.insert("code".into(), json!(code_name(explained.code)));
    if let Outcome::Replaced { by } = &explained.outcome {
        out.insert("replacedBy".into(), json!(by));
    }
    out.insert("outcome".into(), json!(outcome_name(&explained.outcome)));
    let shown = hide.then_some(HIDDEN);
    let path: Vec<String> = explained.trace.iter().map(|s| s.render(shown)).collect();
    out.insert("path".into(), json!(path));
    if let Some(rule) = &explained.rule {
        out.insert(
            "rule".into(),
            json!({
                "name": rule.name,
                "path": rule.path,
                "line": rule.to_string(),
                "shadow": rule.shadow_mode,
                "quota": rule.quota_mode,
                "replaces": rule.replaces,
                "source": &*rule.source,
            }),
        );
    }
    let now = SystemTime::now();
    let counters: Vec<Value> = explained
        .counters
        .iter()
        .map(|c| {
            let mut counter = Map::new();
            if !hide {
                counter.insert("key".into(), json!(c.key.as_str()));
            }
            counter.insert("name".into(), json!(c.name));
            counter.insert("limit".into(), json!(c.limit));
            counter.insert("window".into(), json!(human(c.window)));
            counter.insert("windowMs".into(), json!(c.window.as_millis()));
            counter.insert("precision".into(), json!(c.precision.to_string()));
            counter.insert("shadow".into(), json!(c.shadow));
            counter.insert("holds".into(), json!(c.held));
            counter.insert("remaining".into(), json!(c.remaining));
            counter.insert("resetsInMs".into(), json!(c.reset_after.as_millis()));
            let at = now.checked_add(c.reset_after).unwrap_or(now);
            let at = humantime::format_rfc3339_millis(at).to_string();
            counter.insert("resetsAt".into(), json!(at));
            counter.insert("over".into(), json!(c.over));
            Value::Object(counter)
        })
        .collect();
    out.insert("counters".into(), Value::Array(counters));
    Value::Object(out)
}

/// A request's entries as `[{"key", "value"}]`, each value `(hidden)` when `hide`.
pub(super) fn entries_json(entries: &[(String, String)], hide: bool) -> Value {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(key, value)| json!({"key": key, "value": if hide { HIDDEN } else { value }}))
        .collect();
    Value::Array(entries)
}

/// How a descriptor is decided, as the answers name it.
pub(super) fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::NoRule => "no_rule",
        Outcome::Unlimited => "unlimited",
        Outcome::Replaced { .. } => "replaced",
        Outcome::Limited { by_override: false } => "limited",
        Outcome::Limited { by_override: true } => "override",
        Outcome::OverBudget => "over_budget",
    }
}

pub(super) fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
