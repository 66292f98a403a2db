//! gRPC over HTTP/2, served with the `h2` crate directly rather than through tonic's server.
//!
//! Why: a `ShouldRateLimit` call is a hundred bytes in and out, and slidegate's own work on it,
//! proto in to proto out, takes about 3 µs. Through tonic's server every call also crossed
//! hyper's per-stream task (one spawn, one large future moved onto the heap), tonic's layers
//! (error recovery, `grpc-timeout`, an axum router) and its streaming codec, which together cost
//! more than the decision. Here the connection's own task reads each call's one message, decides
//! and queues the answer; the answers that one read's calls produce leave in one write.
//!
//! Only `ShouldRateLimit`, the call Envoy makes on every request, takes that path. Every other
//! method (health, reflection, and unknown ones, which answer `UNIMPLEMENTED`) goes to tonic's
//! [`Routes`] through a small bridge, so those services stay tonic's.
//!
//! What the fast path keeps of tonic's behaviour: messages up to 4 MiB (larger ones are
//! `OUT_OF_RANGE` before they are read), `grpc-timeout` (`DEADLINE_EXCEEDED` when it passes),
//! errors as trailers-only responses with a percent-encoded `grpc-message`. Compressed messages
//! are not supported (Envoy does not compress rate-limit calls): a `grpc-encoding` other than
//! `identity` is `UNIMPLEMENTED` with `grpc-accept-encoding: identity`, and a message flagged
//! compressed without one is `INTERNAL`, as the gRPC spec has it. A request that is not a `POST`
//! gets HTTP 405, one whose content-type is not gRPC HTTP 415.
//!
//! What one client may hold (see [`super::limits`]): [`MAX_CONCURRENT_CALLS`] calls per
//! connection, request bytes within [`super::budget`], a message within the body timeout, a
//! connection without calls for the idle timeout, an answer to a keepalive PING within one
//! interval, and its share of reply bytes queued ([`MAX_QUEUED_REPLY`] per stream).
//!
//! The parts, one idea each: `connection` runs one connection (the handshake, the loop that
//! starts its calls and runs them inside its task, keepalive PINGs, the idle timeout); `call`
//! serves a call inline (the gRPC spec's checks of a request, its one message read within the
//! budgets, its deadline, its answer); `framing` is gRPC's wire format on HTTP/2 (the 5-byte
//! message prefix, response headers and trailers); `bridge` hands every other method to tonic.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use tokio::sync::{Semaphore, watch};
use tonic::service::Routes;

use super::budget::ConnectionBudget;
use super::limits::ServerLimits;
use crate::service::rls::{GrpcService, RequestBytes, SHOULD_RATE_LIMIT};
use crate::service::{Caller, PeerKey};
use bridge::bridge;
use call::{refuse, unary};

mod age;
mod bridge;
mod call;
mod connection;
mod framing;

pub use connection::serve_connection;

/// The largest request message, as tonic's default.
const MAX_MESSAGE: usize = 4 << 20;

/// Request bytes one connection's incomplete messages may hold: one message of the largest size.
const CONNECTION_BUDGET: usize = MAX_MESSAGE + 5;

/// Reply bytes queued per stream beyond what the client's flow-control window takes: a reply
/// (a reflection stream's among them) waits for window rather than queueing without bound.
pub const MAX_QUEUED_REPLY: usize = 64 << 10;

/// Concurrent calls one connection may have open. Each open call holds a little memory until its
/// body arrives, so without a bound one client could hold any number of half-sent calls. A
/// client at the bound waits or opens another connection (Envoy's pool does the latter). 100 is
/// what RFC 9113 recommends as the least a server should allow, and what gRPC servers and
/// Envoy's own listeners offer; Envoy itself keeps a handful of calls open per connection to a
/// rate-limit service.
pub const MAX_CONCURRENT_CALLS: u32 = 100;

/// A call in progress on a connection.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the gRPC port serves: the rate-limit service inline, everything else through tonic.
#[derive(Clone)]
pub struct GrpcApp {
    rate_limit: GrpcService,
    others: Routes,
}

impl GrpcApp {
    pub fn new(rate_limit: GrpcService, others: Routes) -> Self {
        GrpcApp { rate_limit, others }
    }

    /// Starts one call: `ShouldRateLimit` inline, anything else through tonic's routes.
    fn call(
        &self,
        request: http::Request<RecvStream>,
        mut respond: SendResponse<Bytes>,
        limits: &CallLimits,
        peer: PeerKey,
        caller: Option<&Caller>,
    ) -> Call {
        if let Some(refusal) = refuse(&request) {
            return Box::pin(async move {
                let _ = refusal.send(&mut respond);
            });
        }
        if request.uri().path() == SHOULD_RATE_LIMIT {
            let service = self.rate_limit.clone();
            let span = service.span(request.headers());
            let caller = caller.cloned();
            Box::pin(unary(
                request,
                respond,
                limits.clone(),
                move |message: RequestBytes| async move {
                    // Boxed: the limiter's future (the request's plans and counters, held across
                    // the store's await) is kilobytes, and each layer of the call (the body
                    // timeout, `grpc-timeout`, the drain) would move it again by value.
                    match span {
                        None => Box::pin(service.should_rate_limit(message, caller.as_ref())).await,
                        Some(span) => {
                            let traced =
                                service.should_rate_limit_traced(message, span, caller.as_ref());
                            Box::pin(traced).await
                        }
                    }
                },
            ))
        } else {
            Box::pin(bridge(
                self.others.clone(),
                request,
                peer,
                respond,
                limits.drain_over.clone(),
            ))
        }
    }
}

/// What a worker's gRPC connections share.
#[derive(Clone)]
pub struct Serving {
    pub limits: Arc<ServerLimits>,
    /// The process-wide budget of buffered request bytes.
    pub buffered: Arc<Semaphore>,
    /// Whether each connection names its caller for the decision log ([`Caller`]).
    pub name_callers: bool,
    /// Turns true on SIGTERM: connections send GOAWAY and finish their calls.
    pub stop: watch::Receiver<bool>,
    /// Turns true when the drain timeout is about to end: calls still open answer UNAVAILABLE.
    pub drain_over: watch::Receiver<bool>,
}

/// What each call of a connection gets.
#[derive(Clone)]
struct CallLimits {
    body_timeout: Duration,
    budget: Arc<ConnectionBudget>,
    drain_over: watch::Receiver<bool>,
}
