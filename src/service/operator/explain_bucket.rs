//! `POST /explain` with a bucket id instead of descriptors (`{"domain": "rlqs", "bucketId":
//! {"user": "alice"}}`): what the Rate Limit Quota Service assigns that bucket now and why, the
//! rule it reaches and each Envoy's share from its ledger, assigning nothing.
//!
//! The answer (JSON): `domain`, `bucketId` (its entries, sorted), `outcome` (`no_rule`,
//! `unlimited` or `shadow`: `ALLOW_ALL`; `too_complex`: `DENY_ALL`; `limited`), the `rule`, its
//! `limits` (`limit`, `window`), and per Envoy holding a share (`envoys`): its `holder`, its token
//! bucket (`maxTokens`, `tokensPerFill`, `fillInterval`), what it `admits` per window of each
//! limit, `endsInMs`, and its reported `demandPerSecond`; `assigned` sums what they admit per
//! window of each limit. Values are `(hidden)` under `--operator-hide-values`.

use std::collections::BTreeMap;

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::explain::{entries_json, human};
use crate::limiter::LimitError;
use crate::service::http_routes::error_response;
use crate::service::rlqs::QuotaService;

/// The body: a domain and a bucket id.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct BucketAsked {
    domain: String,
    bucket_id: BTreeMap<String, String>,
}

impl BucketAsked {
    /// A body that names a bucket id, if this one does.
    pub(super) fn parse(body: &[u8]) -> Option<BucketAsked> {
        serde_json::from_slice(body).ok()
    }
}

pub(super) fn answer(quotas: &QuotaService, asked: BucketAsked, hide: bool) -> Response {
    let entries: Vec<(String, String)> = asked.bucket_id.into_iter().collect();
    let Some(explained) = quotas.explain(&asked.domain, &entries) else {
        let message = "the bucket id is over the request limits (its entries, or a key's length)";
        return error_response(&LimitError::InvalidArgument(message.to_owned()));
    };
    let limits: Vec<Value> = (explained.limits.iter())
        .map(|(n, window)| json!({"limit": n, "window": human(*window)}))
        .collect();
    let mut assigned = vec![0u64; explained.limits.len()];
    let envoys: Vec<Value> = (explained.envoys.iter())
        .map(|e| {
            for (sum, admits) in assigned.iter_mut().zip(&e.admits) {
                *sum = sum.saturating_add(*admits);
            }
            json!({
                "holder": e.holder,
                "maxTokens": e.max_tokens,
                "tokensPerFill": e.tokens_per_fill,
                "fillInterval": human(e.fill_interval),
                "admits": e.admits,
                "endsInMs": u64::try_from(e.ends_in.as_millis()).unwrap_or(u64::MAX),
                "demandPerSecond": e.demand,
            })
        })
        .collect();
    Json(json!({
        "domain": asked.domain,
        "bucketId": entries_json(&entries, hide),
        "outcome": explained.outcome,
        "rule": explained.rule,
        "limits": limits,
        "envoys": envoys,
        "assigned": assigned,
    }))
    .into_response()
}
