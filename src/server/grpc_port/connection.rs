//! One HTTP/2 connection of the gRPC port: the client's preface within the handshake timeout,
//! then a loop that takes every call the connection has read and runs them inside the
//! connection's own task (so the answers of one read leave in one write), keepalive PINGs, the
//! idle timeout, the connection age, and GOAWAY on shutdown.

use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::CatchUnwind;
use futures::stream::{FuturesUnordered, StreamExt as _};
use h2::RecvStream;
use h2::server::SendResponse;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::time::{Interval, MissedTickBehavior};

use super::age::{Age, Aged};
use super::{
    CONNECTION_BUDGET, Call, CallLimits, GrpcApp, MAX_CONCURRENT_CALLS, MAX_QUEUED_REPLY, Serving,
};
use crate::server::budget::ConnectionBudget;
use crate::service::{Caller, PeerKey};

/// The times a connection is held to.
#[derive(Clone, Copy, Debug)]
struct Timing {
    handshake: Duration,
    idle: Duration,
    keepalive: Duration,
    max_age: Duration,
    max_age_grace: Duration,
}

/// Serves one HTTP/2 connection until the client closes it, until it breaks a limit, or until
/// `stop` (then it sends GOAWAY and finishes the calls in flight). The client's preface must
/// arrive by `preface_by` (the handshake timeout from accept, a TLS handshake included). `from`
/// is the peer, and its name where callers are named.
pub async fn serve_connection<IO>(
    io: IO,
    app: GrpcApp,
    serving: Serving,
    preface_by: tokio::time::Instant,
    from: (PeerKey, Option<Caller>),
) -> Result<(), h2::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let limits = CallLimits {
        body_timeout: serving.limits.body_timeout,
        budget: Arc::new(ConnectionBudget::new(&serving.buffered, CONNECTION_BUDGET)),
        drain_over: serving.drain_over,
    };
    let timing = Timing {
        handshake: preface_by.saturating_duration_since(tokio::time::Instant::now()),
        idle: serving.limits.idle_timeout,
        keepalive: serving.limits.keepalive_interval,
        max_age: serving.limits.grpc_max_connection_age,
        max_age_grace: serving.limits.grpc_max_connection_age_grace,
    };
    let (peer, caller) = from;
    let start = |request, respond| app.call(request, respond, &limits, peer, caller.as_ref());
    serve_calls(io, start, serving.stop, timing).await
}

/// The connection loop of [`serve_connection`], given how to start a call.
async fn serve_calls<IO>(
    io: IO,
    mut start: impl FnMut(http::Request<RecvStream>, SendResponse<Bytes>) -> Call,
    stop: watch::Receiver<bool>,
    timing: Timing,
) -> Result<(), h2::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut stop = std::pin::pin!(crate::server::stopped(stop));
    // A client that connects and never sends the preface holds a descriptor and some memory.
    let handshake = tokio::time::timeout(timing.handshake, settings().handshake(io));
    let mut connection = tokio::select! {
        connection = handshake => match connection {
            Ok(connection) => connection?,
            Err(_) => {
                tracing::debug!("no HTTP/2 preface within the handshake timeout; closed");
                return Ok(());
            }
        },
        () = &mut stop => return Ok(()),
    };
    let mut keepalive = Keepalive::new(connection.ping_pong(), timing.keepalive);
    let mut idle = Idle::new(timing.idle);
    let mut age = Age::new(timing.max_age, timing.max_age_grace);
    // A call that panics (a bug: no input should make one) ends alone, as it did when every call
    // was a task of its own: unwinding drops its stream handles, which resets its stream, and
    // the connection's other calls go on. The state it shares lives behind `parking_lot` locks
    // and atomics, which a panic does not poison.
    let mut calls = FuturesUnordered::<CatchUnwind<AssertUnwindSafe<Call>>>::new();
    let mut stopping = false;
    let mut closing = false;
    let mut close_next = false;
    // Each round: take every call the connection has read, then run every call that can go on.
    // Polling the connection also writes what is queued, so the answers of one round leave in
    // one write; polling it between calls would send each answer in a write of its own. Queued
    // answers wake this task, and the next round writes them.
    poll_fn(|cx| {
        if !stopping && stop.as_mut().poll(cx).is_ready() {
            connection.graceful_shutdown();
            stopping = true;
        }
        match age.poll(cx) {
            Some(Aged::GoAway) if !stopping => {
                tracing::debug!("connection older than --grpc-max-connection-age; GOAWAY sent");
                connection.graceful_shutdown();
                stopping = true;
            }
            Some(Aged::Cut) => {
                tracing::debug!("calls still open after --grpc-max-connection-age-grace; closed");
                return Poll::Ready(Ok(()));
            }
            _ => {}
        }
        loop {
            match connection.poll_accept(cx) {
                Poll::Ready(Some(Ok((request, respond)))) => {
                    idle.started();
                    calls.push(AssertUnwindSafe(start(request, respond)).catch_unwind());
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(error)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        while let Poll::Ready(Some(ended)) = calls.poll_next_unpin(cx) {
            if ended.is_err() {
                tracing::error!("a gRPC call panicked; its stream was reset");
            }
        }
        // Without calls in flight, a stopping or idle connection closes now: a graceful GOAWAY
        // would wait for the client to answer a PING, which a client need not do. It closes one
        // round later, once polling the connection has written the last answers (an abrupt
        // GOAWAY drops what is still queued).
        let done = !closing && calls.is_empty() && (stopping || idle.poll_expired(cx));
        if done && close_next {
            connection.abrupt_shutdown(h2::Reason::NO_ERROR);
            closing = true;
        }
        close_next = done;
        if done {
            cx.waker().wake_by_ref();
        }
        if keepalive.poll_unanswered(cx) {
            tracing::debug!("no answer to a keepalive PING within its interval; closed");
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    })
    .await
}

/// Server PINGs at an interval; a connection that has not answered one by the next is dead (a
/// peer gone without a FIN, or one that stopped reading).
struct Keepalive {
    ping_pong: Option<h2::PingPong>,
    tick: Option<Interval>,
    waiting: bool,
}

impl Keepalive {
    fn new(ping_pong: Option<h2::PingPong>, interval: Duration) -> Self {
        let tick = (!interval.is_zero()).then(|| {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick
        });
        Keepalive {
            ping_pong,
            tick,
            waiting: false,
        }
    }

    /// True when the connection should close.
    fn poll_unanswered(&mut self, cx: &mut Context<'_>) -> bool {
        let (Some(ping_pong), Some(tick)) = (self.ping_pong.as_mut(), self.tick.as_mut()) else {
            return false;
        };
        loop {
            if self.waiting {
                match ping_pong.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => self.waiting = false,
                    Poll::Ready(Err(_)) => return true,
                    Poll::Pending => {}
                }
            }
            if tick.poll_tick(cx).is_pending() {
                return false;
            }
            if self.waiting || ping_pong.send_ping(h2::Ping::opaque()).is_err() {
                return true;
            }
            self.waiting = true;
        }
    }
}

/// The idle timeout, checked at a quarter of its length: a connection that started no call and
/// had none in flight for four checks in a row is idle.
struct Idle {
    tick: Option<Interval>,
    started: bool,
    quiet: u8,
}

impl Idle {
    fn new(timeout: Duration) -> Self {
        let tick = (!timeout.is_zero()).then(|| {
            let quarter = timeout / 4;
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + quarter, quarter);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick
        });
        Idle {
            tick,
            started: false,
            quiet: 0,
        }
    }

    fn started(&mut self) {
        self.started = true;
    }

    /// Called only while no call is in flight: whether the connection has been idle long enough.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(tick) = self.tick.as_mut() else {
            return false;
        };
        while tick.poll_tick(cx).is_ready() {
            if std::mem::take(&mut self.started) {
                self.quiet = 0;
            } else {
                self.quiet = self.quiet.saturating_add(1);
            }
        }
        self.quiet >= 4
    }
}

/// HTTP/2 settings: 64 KiB flow-control windows per stream and 128 KiB per connection (a
/// `ShouldRateLimit` call is a few hundred bytes; what a client may send unasked is what an idle
/// attacker's connection can make the server hold), a 16 KiB limit on a request's headers,
/// [`MAX_CONCURRENT_CALLS`] and [`MAX_QUEUED_REPLY`].
fn settings() -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(64 << 10)
        .initial_connection_window_size(128 << 10)
        .max_header_list_size(16 << 10)
        .max_concurrent_streams(MAX_CONCURRENT_CALLS)
        .max_send_buffer_size(MAX_QUEUED_REPLY);
    builder
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::grpc_port::call::unary;
    use crate::server::grpc_port::framing::{GRPC_STATUS, encode_frame};
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use http::header::CONTENT_TYPE;
    use tokio::net::TcpStream;
    use tokio::sync::Semaphore;

    fn call_limits(drain_over: watch::Receiver<bool>) -> CallLimits {
        CallLimits {
            body_timeout: Duration::from_secs(10),
            budget: Arc::new(ConnectionBudget::new(
                &Arc::new(Semaphore::new(1 << 20)),
                1 << 20,
            )),
            drain_over,
        }
    }

    const TIMING: Timing = Timing {
        handshake: Duration::from_secs(10),
        idle: Duration::from_secs(60),
        keepalive: Duration::from_secs(30),
        max_age: Duration::ZERO,
        max_age_grace: Duration::ZERO,
    };

    /// One call of `path` from an h2 client: the `grpc-status` trailer, or the stream's error.
    async fn call(
        client: &h2::client::SendRequest<Bytes>,
        path: &str,
    ) -> Result<String, h2::Error> {
        let mut client = client.clone().ready().await?;
        let request = http::Request::post(format!("http://slidegate{path}"))
            .header(CONTENT_TYPE, "application/grpc")
            .body(())
            .expect("a valid request");
        let (response, mut body) = client.send_request(request, false)?;
        body.send_data(encode_frame(&RateLimitRequest::default()), true)?;
        let mut response = response.await?.into_body();
        while let Some(data) = response.data().await {
            data?;
        }
        let trailers = response.trailers().await?.unwrap_or_default();
        Ok(trailers
            .get(&GRPC_STATUS)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_string())
    }

    #[tokio::test]
    async fn a_panicking_call_resets_its_stream_and_the_connection_goes_on() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local address");
        let (_stop, stop) = watch::channel(false);
        let limits = call_limits(stop.clone());
        let server = tokio::spawn(async move {
            let (io, _) = listener.accept().await.expect("accept");
            let start = |request: http::Request<RecvStream>, respond| -> Call {
                let panics = request.uri().path() == "/test/Panic";
                Box::pin(unary(
                    request,
                    respond,
                    limits.clone(),
                    move |_: RateLimitRequest| async move {
                        if panics {
                            panic!("a bug in a call");
                        }
                        Ok(RateLimitResponse::default())
                    },
                ))
            };
            serve_calls(io, start, stop, TIMING).await
        });
        let io = TcpStream::connect(addr).await.expect("connect");
        let (client, connection) = h2::client::handshake(io).await.expect("handshake");
        tokio::spawn(connection);

        assert_eq!(call(&client, "/test/Fine").await.ok().as_deref(), Some("0"));
        let panicked = call(&client, "/test/Panic").await;
        assert!(
            panicked.as_ref().is_err_and(|e| e.is_reset()),
            "the panicking call's stream is reset: {panicked:?}"
        );
        for _ in 0..3 {
            assert_eq!(call(&client, "/test/Fine").await.ok().as_deref(), Some("0"));
        }
        assert!(!server.is_finished(), "the connection is still served");
    }
}
