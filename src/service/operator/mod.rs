//! The operator listener (`--admin-addr`): what operators read and ask, never served on the data
//! ports, so a client that may spend quota cannot read the rules, the metrics or the counters.
//!
//! - `GET /rlconfig`: the live rules, one per line (`domain path: limits; flags; source`), after
//!   `#` lines saying when they were loaded and whether the files on disk are the ones served;
//! - `GET /metrics`: Prometheus text format (see [`crate::metrics`]);
//! - `POST /explain`: what a request would get and why, counting nothing ([`explain`]), or what
//!   an RLQS bucket id gets ([`explain_bucket`]);
//! - `GET /`: the operator page ([`page`]), over `GET /status.json` ([`status`]) and the rest;
//! - `GET /limited`: who is being limited now, across replicas ([`limited`]);
//! - `DELETE /counters`: clears a request's counters, behind the operator token ([`counters`],
//!   [`token`]);
//! - `GET /healthcheck`: as on the HTTP port.
//!
//! Bodies are refused (413) except on `POST /explain` and `DELETE /counters`, which take up to
//! `--max-body-bytes`.

mod counters;
mod explain;
mod explain_bucket;
pub mod limited;
mod page;
pub mod status;
pub mod token;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use parking_lot::Mutex;

use super::Caller;
use super::http_routes::{AppState, healthcheck};
use super::rlqs::QuotaService;
use status::History;
use token::AdminToken;

/// How the operator listener answers, from the command line.
#[derive(Clone, Debug, Default)]
pub struct OperatorOptions {
    /// Descriptor values (and the counter keys that carry them) are left out of answers
    /// (`--operator-hide-values`), for operators whose values are personal data.
    pub hide_values: bool,
    /// `--admin-token-file`: without it, what changes state is refused.
    pub token: Option<Arc<AdminToken>>,
    /// This replica's name on the store's notice board ([`limited::replica_name`]).
    pub replica: String,
    /// The decisions of the last minutes, for `/status.json` ([`status::spawn_sampler`]).
    pub history: Arc<Mutex<History>>,
    /// The Rate Limit Quota Service, whose buckets `POST /explain` explains by bucket id.
    pub quotas: Option<QuotaService>,
}

/// The operator listener's routes. `max_body_bytes` bounds the bodies it reads (`/explain`'s and
/// `/counters`').
pub fn admin_router(state: AppState, options: OperatorOptions, max_body_bytes: usize) -> Router {
    let options = Arc::new(options);
    let cleared_total = state
        .front
        .metrics()
        .counter(
            "slidegate_counters_cleared_total",
            "counters that held hits and were cleared by DELETE /counters",
        )
        .ok();
    let explain = {
        let options = Arc::clone(&options);
        move |State(state): State<AppState>, body: Bytes| {
            let options = Arc::clone(&options);
            async move { explain::handler(state, &options, body).await }
        }
    };
    let limited = {
        let options = Arc::clone(&options);
        move |State(state): State<AppState>, query: Query<limited::Asked>| {
            let options = Arc::clone(&options);
            async move { limited::handler(state, options.hide_values, &options.replica, query).await }
        }
    };
    let clear = {
        let options = Arc::clone(&options);
        move |State(state): State<AppState>,
              caller: Option<Extension<Caller>>,
              headers: HeaderMap,
              query: Query<HashMap<String, String>>,
              body: Bytes| {
            let (options, cleared_total) = (Arc::clone(&options), cleared_total.clone());
            async move {
                let request = counters::Request {
                    caller: caller.map(|Extension(c)| c),
                    headers,
                    query,
                    body,
                };
                counters::handler(state, &options, cleared_total.as_ref(), request).await
            }
        }
    };
    let status = {
        let options = Arc::clone(&options);
        move |State(state): State<AppState>| {
            let options = Arc::clone(&options);
            async move {
                let reset = options.token.is_some();
                Json(status::handler(
                    &state,
                    &options.history,
                    reset,
                    options.hide_values,
                ))
            }
        }
    };
    let bounded = || DefaultBodyLimit::max(max_body_bytes);
    Router::new()
        .route("/rlconfig", get(rlconfig))
        .route("/metrics", get(metrics))
        .route("/explain", post(explain).layer(bounded()))
        .route("/counters", delete(clear).layer(bounded()))
        .route("/limited", get(limited))
        .route("/status.json", get(status))
        .route(
            "/",
            get(|State(state): State<AppState>| async move { page::index(&state) }),
        )
        .route("/page.js", get(|| async { page::script() }))
        .route("/page.css", get(|| async { page::style() }))
        .route("/healthcheck", get(healthcheck))
        .layer(DefaultBodyLimit::max(0))
        .with_state(state)
}

/// `#` lines on the rules' freshness, then one line per rule:
/// `domain path: limits; name=..; replaces=..; flags; source=file`.
async fn rlconfig(State(state): State<AppState>) -> Response {
    let rules = state.front.limiter().rules().load();
    let status = state.config_status.load();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# loaded_at: {}",
        humantime::format_rfc3339_seconds(status.loaded_at)
    );
    let _ = writeln!(out, "# served_checksum: {}", status.served);
    let on_disk = status.on_disk.map(|c| c.to_string());
    let _ = writeln!(
        out,
        "# on_disk_checksum: {}",
        on_disk.as_deref().unwrap_or("(unreadable)")
    );
    let _ = writeln!(out, "# stale: {}", status.is_stale());
    for rule in rules.rules() {
        let limits = limits_text(rule);
        let _ = write!(out, "{} {}: {limits}", rule.domain, rule.path);
        // With several limits, each limit's name is shown with it.
        if let Some(name) = rule.name.as_ref().filter(|_| rule.limits.len() <= 1) {
            let _ = write!(out, "; name={name}");
        }
        if !rule.replaces.is_empty() {
            let _ = write!(out, "; replaces={}", rule.replaces.join(","));
        }
        for (set, flag) in [
            (rule.shadow_mode, "shadow_mode"),
            (rule.quota_mode, "quota_mode"),
            (rule.detailed_metric, "detailed_metric"),
            (rule.value_to_metric, "value_to_metric"),
        ] {
            if set {
                let _ = write!(out, "; {flag}");
            }
        }
        let _ = writeln!(out, "; source={}", rule.source);
    }
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response()
}

/// A rule's limits as `/rlconfig` and the page show them: `unlimited`, or each limit with its
/// window and representation (and its name, when the rule has several).
fn limits_text(rule: &crate::config::Rule) -> String {
    if rule.unlimited {
        return "unlimited".to_owned();
    }
    let limits: Vec<String> = rule
        .limits
        .iter()
        .map(|l| {
            let window = humantime::format_duration(l.window());
            match &l.name {
                Some(name) if rule.limits.len() > 1 => {
                    format!("{l} (window {window}, {}, name={name})", l.precision)
                }
                _ => format!("{l} (window {window}, {})", l.precision),
            }
        })
        .collect();
    limits.join(", ")
}

/// Unix milliseconds, for what the operator endpoints show and post.
fn unix_millis(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.front.metrics().render(),
    )
        .into_response()
}
