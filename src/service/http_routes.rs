//! The HTTP endpoints (axum). The HTTP port ([`data_router`]) serves what clients call; the
//! operator listener ([`super::operator`], `--admin-addr`) what operators read, so a client that
//! may spend quota cannot read the rules or the metrics:
//!
//! - `POST /json`: [`super::json`] (envoyproxy/ratelimit-compatible JSON);
//! - `/check` (any method): [`super::check`] (headers in, status code out; nginx, forward-auth);
//! - `GET /healthcheck` (both): `200 OK` while serving (`OK: no rules loaded` without rules),
//!   `503` otherwise (see [`super::health`]);
//! - `GET /rlconfig`, `GET /metrics`, `POST /explain` (operator): see [`super::operator`].
//!
//! Request bodies over `--max-body-bytes` are refused with 413.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Extension, Router};
use compact_str::CompactString;

use super::Caller;
use super::check::{self, DenyStatus, OVER_HEADER};
use super::front::{Front, Outcome, Transport};
use super::health::Health;
use super::json;
use crate::config::reload::SharedStatus;
use crate::limiter::{self, Code, LimitError};
use crate::telemetry::{DecisionSpan, Transport as TraceTransport};

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    pub front: Arc<Front>,
    pub health: Arc<Health>,
    /// The domain of `/check` requests without `x-ratelimit-domain`.
    pub check_domain: Option<String>,
    /// Whether the served rules are the files on disk, for `/rlconfig`.
    pub config_status: SharedStatus,
}

/// The HTTP port: `/json`, `/check` and `/healthcheck`.
pub fn data_router(state: AppState, max_body_bytes: usize) -> Router {
    data_routes()
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

/// What clients call.
fn data_routes() -> Router<AppState> {
    Router::new()
        .route("/json", post(json_handler))
        .route("/check", any(check_handler))
        .route("/healthcheck", get(healthcheck))
}

async fn json_handler(
    State(state): State<AppState>,
    Traced(mut span): Traced,
    caller: Option<Extension<Caller>>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let decided = match json::parse_request(&body, &state.front.limiter().options().limits) {
        Err(message) => Err(LimitError::InvalidArgument(message)),
        Ok(request) => {
            let request = request.as_request();
            let decided = super::decide(state.front.limiter(), &request, &mut span).await;
            if let Ok(response) = &decided {
                let caller = caller.as_ref().map(|Extension(caller)| caller);
                state
                    .front
                    .decided(Transport::Json, caller, &request, response);
            }
            decided
        }
    };
    let response = match &decided {
        Ok(decision) => {
            let status = match decision.overall {
                Code::Ok => StatusCode::OK,
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            };
            let headers = to_headers(&decision.headers);
            let body = axum::Json(json::render_response(decision));
            (status, headers, body).into_response()
        }
        Err(error) => error_response(error),
    };
    state.front.observe_request(
        Transport::Json,
        Outcome::of(decided.as_ref()),
        started.elapsed(),
    );
    end_span(span, &decided, &response);
    response
}

async fn check_handler(
    State(state): State<AppState>,
    Traced(mut span): Traced,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
) -> Response {
    let started = Instant::now();
    let limits = &state.front.limiter().options().limits;
    let parsed = check::parse(&headers, state.check_domain.as_deref(), limits);
    let (decided, deny_status) = match &parsed {
        Err(message) => (
            Err(LimitError::InvalidArgument(message.clone())),
            DenyStatus::TooManyRequests,
        ),
        Ok(check) => (
            {
                state.front.observe_escaped(Transport::Check, check.escaped);
                let request = check.request.as_request();
                let decided = super::decide(state.front.limiter(), &request, &mut span).await;
                if let Ok(response) = &decided {
                    let caller = caller.as_ref().map(|Extension(caller)| caller);
                    state
                        .front
                        .decided(Transport::Check, caller, &request, response);
                }
                decided
            },
            check.deny_status,
        ),
    };
    let response = match &decided {
        Ok(decision) => {
            let mut headers = to_headers(&decision.headers);
            let status = match (decision.overall, deny_status) {
                (Code::Ok, _) => StatusCode::OK,
                (Code::OverLimit, DenyStatus::TooManyRequests) => StatusCode::TOO_MANY_REQUESTS,
                (Code::OverLimit, DenyStatus::Forbidden) => {
                    headers.insert(
                        HeaderName::from_static(OVER_HEADER),
                        HeaderValue::from_static("1"),
                    );
                    StatusCode::FORBIDDEN
                }
            };
            let body = if status == StatusCode::OK {
                "OK\n"
            } else {
                "over limit\n"
            };
            (status, headers, body).into_response()
        }
        Err(error) => error_response(error),
    };
    state.front.observe_request(
        Transport::Check,
        Outcome::of(decided.as_ref()),
        started.elapsed(),
    );
    end_span(span, &decided, &response);
    response
}

/// The span of a sampled `/json` or `/check` request when traces are on ([`crate::telemetry`]);
/// begun from the request's headers before its body is read.
struct Traced(Option<DecisionSpan>);

impl FromRequestParts<AppState> for Traced {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Infallible> {
        let Some(traces) = state.front.traces() else {
            return Ok(Traced(None));
        };
        let transport = match parts.uri.path() {
            "/json" => TraceTransport::Json,
            _ => TraceTransport::Check(method_name(&parts.method)),
        };
        Ok(Traced(traces.begin(&parts.headers, transport)))
    }
}

/// A span's method: the name of a standard one, else `_OTHER` (OpenTelemetry's HTTP
/// conventions; a client's made-up method must not become a span name).
fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        _ => "_OTHER",
    }
}

fn end_span(
    span: Option<DecisionSpan>,
    decided: &Result<limiter::Response, LimitError>,
    response: &Response,
) {
    if let Some(span) = span {
        let decided = decided.as_ref().map_err(|e| e as &dyn std::fmt::Display);
        super::decision::span::end(span, decided, response.status().as_u16());
    }
}

pub(super) async fn healthcheck(State(state): State<AppState>) -> Response {
    if state.health.is_serving() {
        if state
            .front
            .limiter()
            .rules()
            .load()
            .domain_names()
            .is_empty()
        {
            // Serving, as envoyproxy/ratelimit does, but every request is answered OK.
            return (StatusCode::OK, "OK: no rules loaded\n").into_response();
        }
        (StatusCode::OK, "OK\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "NOT_SERVING\n").into_response()
    }
}

pub(super) fn error_response(error: &LimitError) -> Response {
    let status = match error {
        LimitError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        LimitError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, format!("{error}\n")).into_response()
}

fn to_headers(pairs: &[(&'static str, CompactString)]) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(pairs.len() + 1);
    for (name, value) in pairs {
        // The limiter writes lower-case names and decimal values, which are always valid.
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    headers
}
