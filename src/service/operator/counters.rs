//! `DELETE /counters`: clears the counters of the descriptors in the body (the body of
//! `POST /json`), every limit of each or, with `?name=NAME`, only the limits that name picks;
//! behind the operator token ([`super::token`]). Both stores, exact logs and buckets; on Redis
//! every replica stops denying the cleared keys within 500 ms (`store::redis::resets`).
//!
//! The answer (JSON): `domain`, `cleared` (how many counters held hits and were cleared) and per
//! descriptor its `entries`, `outcome` and `rule`, and the `counters` cleared: `key`, `name`,
//! `window` and the hits each `held`. Each clear is logged with the caller's address and counted
//! in `slidegate_counters_cleared_total`.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::Query;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use prometheus::IntCounter;
use serde_json::{Map, Value, json};

use super::explain::{entries_json, human, outcome_name};
use super::{OperatorOptions, token};
use crate::limiter::LimitError;
use crate::service::Caller;
use crate::service::http_routes::{AppState, error_response};
use crate::service::json;

pub(super) struct Request {
    pub(super) caller: Option<Caller>,
    pub(super) headers: HeaderMap,
    pub(super) query: Query<HashMap<String, String>>,
    pub(super) body: Bytes,
}

pub(super) async fn handler(
    state: AppState,
    options: &OperatorOptions,
    cleared_total: Option<&IntCounter>,
    request: Request,
) -> Response {
    if let Err(refused) = token::authorize(options.token.as_deref(), &request.headers) {
        return refused.into_response();
    }
    let limiter = state.front.limiter();
    let mut asked = match json::parse_request(&request.body, &limiter.options().limits) {
        Ok(asked) => asked,
        Err(message) => return error_response(&LimitError::InvalidArgument(message)),
    };
    // Which counters, not how many hits: every descriptor planned as one hit.
    asked.hits_addend = 0;
    for descriptor in &mut asked.descriptors {
        descriptor.hits_addend = None;
    }
    let name = request.query.get("name").map(String::as_str);
    let cleared = match limiter.clear(&asked.as_request(), name).await {
        Ok(cleared) => cleared,
        Err(error) => return error_response(&error),
    };
    let hide = options.hide_values;
    let mut held_hits = 0u64;
    let mut keys = Vec::new();
    let descriptors: Vec<Value> = asked
        .descriptors
        .iter()
        .zip(&cleared.descriptors)
        .map(|(asked, explained)| {
            let mut out = Map::new();
            out.insert("entries".into(), entries_json(&asked.entries, hide));
            out.insert("outcome".into(), json!(outcome_name(&explained.outcome)));
            if let Some(rule) = &explained.rule {
                out.insert(
                    "rule".into(),
                    json!(rule.name.as_ref().unwrap_or(&rule.path)),
                );
            }
            let counters: Vec<Value> = explained
                .counters
                .iter()
                .map(|c| {
                    held_hits += u64::from(c.held > 0);
                    let mut counter = Map::new();
                    if !hide {
                        counter.insert("key".into(), json!(c.key.as_str()));
                        keys.push(c.key.as_str().to_owned());
                    }
                    counter.insert("name".into(), json!(c.name));
                    counter.insert("window".into(), json!(human(c.window)));
                    counter.insert("held".into(), json!(c.held));
                    Value::Object(counter)
                })
                .collect();
            out.insert("counters".into(), Value::Array(counters));
            Value::Object(out)
        })
        .collect();
    if let Some(total) = cleared_total {
        total.inc_by(held_hits);
    }
    let caller = request
        .caller
        .map_or_else(|| "-".to_owned(), |c| c.to_string());
    tracing::info!(
        caller,
        domain = asked.domain,
        name,
        cleared = held_hits,
        keys = ?keys,
        "counters cleared through DELETE /counters"
    );
    Json(json!({
        "domain": asked.domain,
        "cleared": held_hits,
        "descriptors": descriptors,
    }))
    .into_response()
}
