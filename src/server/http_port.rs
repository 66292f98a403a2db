//! The HTTP port's connections, served with hyper (HTTP/1.1 and HTTP/2) under the server's limits.
//!
//! Why not `axum::serve`: it gives hyper no timer, which turns off hyper's header-read timeout,
//! and offers no keepalive, stream limit or body timeout. Here: a request's headers must arrive
//! within the handshake timeout (hyper's header-read timeout, which also closes an HTTP/1.1
//! connection idle that long between requests), a request must be read and answered within the
//! body timeout (else 408), HTTP/2 connections get keepalive PINGs and
//! [`super::grpc_port::MAX_CONCURRENT_CALLS`] streams, a connection without a request in flight for
//! the idle timeout is asked to close (keepalive PINGs alone would hold an HTTP/2 connection
//! open forever), and on shutdown every connection is asked to close and, at the drain
//! deadline, closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::service::Caller;

use super::flood::Metered;
use super::grpc_port::MAX_CONCURRENT_CALLS;
use super::http_budget::{CONNECTION_WINDOW, ConnectionShare, HttpBudget, STREAM_WINDOW};
use super::limits::ServerLimits;
use super::socket::Peer;
use super::tls::{self, Listener, Stream, Tls};
use super::{Handoff, stopped, take_over};

/// Serves the HTTP connections handed to this worker until `stop`, then lets them finish their
/// requests until `drain_over`.
pub async fn serve(
    mut handoffs: mpsc::UnboundedReceiver<Handoff>,
    app: Router,
    (limits, budget): (&ServerLimits, Option<HttpBudget>),
    (tls, listener, name_callers): (Option<Arc<Tls>>, Listener, bool),
    stop: watch::Receiver<bool>,
    drain_over: watch::Receiver<bool>,
) {
    let body_timeout = limits.body_timeout;
    let app = app.layer(axum::middleware::from_fn(move |request, next| {
        within(body_timeout, request, next)
    }));

    let builder = builder(limits);
    let (handshake_timeout, idle_timeout) = (limits.handshake_timeout, limits.idle_timeout);
    let drain_timeout = limits.drain_timeout;
    let mut connections = JoinSet::new();
    let mut stopping = std::pin::pin!(stopped(stop.clone()));
    let mut open = true;
    loop {
        tokio::select! {
            () = &mut stopping => break,
            handoff = handoffs.recv(), if open => match handoff {
                Some((stream, peer, ticket)) => {
                    let Some(io) = take_over(stream) else { continue };
                    let tls = tls.clone();
                    let connection = Connection {
                        builder: builder.clone(),
                        app: app.clone(),
                        handshake_timeout,
                        idle_timeout,
                        budget: budget.as_ref().map(HttpBudget::for_connection),
                        caller: name_callers.then_some(peer),
                        stop: stop.clone(),
                        drain_over: drain_over.clone(),
                    };
                    connections.spawn(async move {
                        // One handshake timeout from accept to the first byte, TLS included.
                        let timeout = connection.handshake_timeout;
                        let first_byte_by = tokio::time::Instant::now() + timeout;
                        let secured = tls::secure(tls.as_deref(), io, peer, listener, timeout);
                        if let Some((io, revoked)) = secured.await {
                            let (stop, drain_over) = revoked.or_stop(connection.stop.clone(), connection.drain_over.clone(), drain_timeout);
                            Connection { stop, drain_over, ..connection }.serve(io, first_byte_by).await;
                        }
                        drop(ticket);
                    });
                }
                // The acceptor stopped: only the shutdown signal ends this server now.
                None => open = false,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    while connections.join_next().await.is_some() {}
}

/// What one connection is served with.
struct Connection {
    builder: Builder<TokioExecutor>,
    app: Router,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    /// This connection's share of the HTTP port's buffer budget (none on the operator listener).
    budget: Option<ConnectionShare>,
    /// Who is calling, when this listener names callers: its requests carry it ([`Caller`]) for
    /// the logs of what changes state and the decision log.
    caller: Option<Peer>,
    stop: watch::Receiver<bool>,
    drain_over: watch::Receiver<bool>,
}

impl Connection {
    /// Serves `io` until the client closes it; on `stop`, asks it to close; at `drain_over`,
    /// closes it. Closes it at once when no byte has come by `first_byte_by`.
    async fn serve(self, io: Stream, first_byte_by: tokio::time::Instant) {
        // hyper has no timeout for the first byte (it waits for it to tell HTTP/1.1 from
        // HTTP/2): a client that sends nothing is closed here. Waiting on the decrypted stream
        // (not the socket) also covers bytes TLS read ahead with its handshake.
        let mut io = BufReader::with_capacity(FIRST_READ, io);
        let started = tokio::time::timeout_at(first_byte_by, io.fill_buf()).await;
        if !matches!(started, Ok(Ok(bytes)) if !bytes.is_empty()) {
            return;
        }
        let activity = Arc::new(Activity::default());
        // Outside the body timeout: a request that does not fit is answered before anything else.
        let app = match self.budget {
            Some(share) => self
                .app
                .layer(axum::middleware::from_fn(move |request, next| {
                    share.clone().admit(request, next)
                })),
            None => self.app,
        };
        let app = match self.caller {
            Some(peer) => app.layer(axum::Extension(Caller::new(peer))),
            None => app,
        };
        let app = {
            let activity = Arc::clone(&activity);
            app.layer(axum::middleware::from_fn(move |request, next: Next| {
                let in_flight = InFlight::begin(&activity);
                async move {
                    let response = next.run(request).await;
                    drop(in_flight);
                    response
                }
            }))
        };
        let connection = self.builder.serve_connection(
            TokioIo::new(Metered::new(io)),
            TowerToHyperService::new(app),
        );
        let mut connection = std::pin::pin!(connection);
        let finished = tokio::select! {
            _ = connection.as_mut() => true,
            () = stopped(self.stop) => false,
            () = activity.idle_for(self.idle_timeout) => false,
        };
        if !finished {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stopped(self.drain_over) => {}
            }
        }
    }
}

/// Requests in flight on one connection, and whether one began or ended since the idle check
/// last looked.
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    touched: AtomicBool,
}

impl Activity {
    /// Resolves once the connection has had no request in flight for about `timeout` (checked
    /// every quarter of it, as the gRPC port does); never when `timeout` is zero.
    async fn idle_for(&self, timeout: Duration) {
        if timeout.is_zero() {
            return std::future::pending().await;
        }
        let quarter = timeout / 4;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + quarter, quarter);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut quiet = 0;
        while quiet < 4 {
            tick.tick().await;
            let busy = self.touched.swap(false, Ordering::Relaxed)
                || self.in_flight.load(Ordering::Relaxed) > 0;
            quiet = if busy { 0 } else { quiet + 1 };
        }
    }
}

/// One request in flight: counted from its headers until its answer (or until hyper drops it).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.touched.store(true, Ordering::Relaxed);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touched.store(true, Ordering::Relaxed);
    }
}

/// The first read of a connection, kept for hyper to read again; later reads larger than this
/// go straight through.
const FIRST_READ: usize = 4 << 10;

/// hyper's connection settings from the limits.
fn builder(limits: &ServerLimits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.handshake_timeout);
    let keepalive = (!limits.keepalive_interval.is_zero()).then_some(limits.keepalive_interval);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(keepalive)
        .keep_alive_timeout(limits.keepalive_interval)
        .max_concurrent_streams(MAX_CONCURRENT_CALLS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(16 << 10);
    builder
}

/// Runs a request within `timeout` (a body trickled byte by byte included): 408 when it passes.
async fn within(timeout: Duration, request: Request, next: Next) -> Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (
            axum::http::StatusCode::REQUEST_TIMEOUT,
            "the request did not arrive within the body timeout\n",
        )
            .into_response(),
    }
}
