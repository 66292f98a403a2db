//! The HTTP port's budget of buffered request bytes, all connections together.
//!
//! Why: a request's body is read whole before it is decided (`POST /json`), and HTTP/2 lets one
//! connection carry 100 requests at once. Without a process-wide bound, clients that open many
//! connections, each with many half-sent bodies, make the process hold all of them (measured
//! before this budget: 60 h2c connections × 100 unfinished 65,000-byte bodies took 502 MiB).
//!
//! Each request reserves, when its headers arrive, from its connection's share
//! ([`PER_CONNECTION`], so that one connection cannot take the whole budget from the others) and
//! from the budget, the bytes its body may take (its
//! `Content-Length`, or `--max-body-bytes` when it declares none; nothing for `GET` and `HEAD`)
//! plus its headers' size, and keeps them until it is answered. A request that does not fit is
//! answered at once `503 Service Unavailable` with `Retry-After: 1` and a body that names the
//! budget, and counted in `slidegate_http_buffer_refused_total`: nothing of its body is read, and
//! the requests already admitted go on. Unlike the gRPC port, which makes a call wait for room
//! (its client waits on flow control), an HTTP client gets a status it can act on at once.
//! Beside it, each HTTP/2 connection's flow-control windows ([`STREAM_WINDOW`],
//! [`CONNECTION_WINDOW`]) bound what a client can send unasked.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::IntCounter;
use tokio::sync::Semaphore;

/// The most one connection may hold of the budget: its HTTP/2 window, or four of the largest
/// default bodies in flight.
pub const PER_CONNECTION: usize = 256 << 10;

/// What an HTTP/2 stream may send before the server reads it: one default `--max-body-bytes`.
pub const STREAM_WINDOW: u32 = 64 << 10;

/// What an HTTP/2 connection may send before the server reads it, all its streams together.
pub const CONNECTION_WINDOW: u32 = 256 << 10;

/// The budget and what a request may reserve of it.
#[derive(Clone, Debug)]
pub struct HttpBudget {
    bytes: Arc<Semaphore>,
    /// The reservation of a body that declares no length (`--max-body-bytes`).
    max_body: usize,
    refused: IntCounter,
}

impl HttpBudget {
    pub fn new(max_bytes: usize, max_body: usize, refused: IntCounter) -> HttpBudget {
        HttpBudget {
            bytes: Arc::new(Semaphore::new(max_bytes.min(Semaphore::MAX_PERMITS))),
            max_body,
            refused,
        }
    }

    /// The bytes `request` reserves (see the module docs).
    fn reservation(&self, request: &Request) -> usize {
        let headers: usize = request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 32)
            .sum();
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        let body = match declared {
            // A longer body is refused with 413 by the body limit, having read no more than it.
            Some(length) => length.min(self.max_body),
            None if matches!(*request.method(), Method::GET | Method::HEAD) => 0,
            None => self.max_body,
        };
        headers + body
    }

    /// A new connection's share of the budget (see the module docs).
    pub fn for_connection(&self) -> ConnectionShare {
        ConnectionShare {
            budget: self.clone(),
            own: Arc::new(Semaphore::new(PER_CONNECTION)),
        }
    }
}

/// One connection's share of the [`HttpBudget`].
#[derive(Clone, Debug)]
pub struct ConnectionShare {
    budget: HttpBudget,
    own: Arc<Semaphore>,
}

impl ConnectionShare {
    /// Runs `request` if its reservation fits in the connection's share and in the budget, else
    /// answers 503.
    pub async fn admit(self, request: Request, next: Next) -> Response {
        let wanted = u32::try_from(self.budget.reservation(&request)).unwrap_or(u32::MAX);
        let own = Arc::clone(&self.own).try_acquire_many_owned(wanted);
        let shared = Arc::clone(&self.budget.bytes).try_acquire_many_owned(wanted);
        let (Ok(own), Ok(shared)) = (own, shared) else {
            self.budget.refused.inc();
            let mut response = (
                StatusCode::SERVICE_UNAVAILABLE,
                "the HTTP port's buffer budget is full (--http-max-buffered-bytes): retry\n",
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        };
        let response = next.run(request).await;
        drop((own, shared));
        response
    }
}
