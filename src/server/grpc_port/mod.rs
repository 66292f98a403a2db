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

use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::FutureExt as _;
use futures::future::CatchUnwind;
use futures::stream::{FuturesUnordered, StreamExt as _};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http_body::{Body as _, Frame};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, watch};
use tokio::time::{Interval, MissedTickBehavior};
use tonic::Status;
use tonic::codegen::Service;
use tonic::service::Routes;

use super::budget::{ConnectionBudget, Held};
use super::limits::ServerLimits;
use crate::service::rls::{GrpcService, RequestBytes, SHOULD_RATE_LIMIT};

/// The largest request message, as tonic's default.
const MAX_MESSAGE: usize = 4 << 20;

/// Header names looked up or written on every call, parsed once.
static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
static GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");

/// Request bytes one connection's incomplete messages may hold: one message of the largest size.
const CONNECTION_BUDGET: usize = MAX_MESSAGE + 5;

/// Reply bytes queued per stream beyond what the client's flow-control window takes: a reply
/// (a reflection stream's among them) waits for window rather than queueing without bound.
pub const MAX_QUEUED_REPLY: usize = 64 << 10;

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
    ) -> Call {
        if let Some(refusal) = refuse(&request) {
            return Box::pin(async move {
                let _ = refusal.send(&mut respond);
            });
        }
        if request.uri().path() == SHOULD_RATE_LIMIT {
            let service = self.rate_limit.clone();
            let span = service.span(request.headers());
            Box::pin(unary(
                request,
                respond,
                limits.clone(),
                move |message: RequestBytes| async move {
                    match span {
                        None => service.should_rate_limit(message).await,
                        // Boxed: an untraced call's future stays the size it is without traces.
                        Some(span) => {
                            Box::pin(service.should_rate_limit_traced(message, span)).await
                        }
                    }
                },
            ))
        } else {
            Box::pin(bridge(
                self.others.clone(),
                request,
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

/// The times a connection is held to.
#[derive(Clone, Copy, Debug)]
struct Timing {
    handshake: Duration,
    idle: Duration,
    keepalive: Duration,
}

/// Serves one HTTP/2 connection until the client closes it, until it breaks a limit, or until
/// `stop` (then it sends GOAWAY and finishes the calls in flight). The client's preface must
/// arrive by `preface_by` (the handshake timeout from accept, a TLS handshake included).
pub async fn serve_connection<IO>(
    io: IO,
    app: GrpcApp,
    serving: Serving,
    preface_by: tokio::time::Instant,
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
    };
    let start = |request, respond| app.call(request, respond, &limits);
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
    let mut stop = std::pin::pin!(super::stopped(stop));
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

/// Concurrent calls one connection may have open. Each open call holds a little memory until its
/// body arrives, so without a bound one client could hold any number of half-sent calls. A
/// client at the bound waits or opens another connection (Envoy's pool does the latter). 100 is
/// what RFC 9113 recommends as the least a server should allow, and what gRPC servers and
/// Envoy's own listeners offer; Envoy itself keeps a handful of calls open per connection to a
/// rate-limit service.
pub const MAX_CONCURRENT_CALLS: u32 = 100;

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

/// Why a request is answered before any service sees it.
enum Refusal {
    /// Not gRPC at all: an HTTP status.
    Http(http::StatusCode),
    /// gRPC, but not what slidegate speaks: a status, perhaps with `grpc-accept-encoding`.
    Grpc(Status, bool),
}

impl Refusal {
    fn send(self, respond: &mut SendResponse<Bytes>) -> Result<(), h2::Error> {
        match self {
            Refusal::Http(code) => {
                let mut head = http::Response::new(());
                *head.status_mut() = code;
                if code == http::StatusCode::METHOD_NOT_ALLOWED {
                    head.headers_mut()
                        .insert(http::header::ALLOW, HeaderValue::from_static("POST"));
                }
                respond.send_response(head, true).map(drop)
            }
            Refusal::Grpc(status, accept_encoding) => {
                send_status_with(respond, &status, accept_encoding)
            }
        }
    }
}

/// The gRPC spec's checks of a request's method, content-type and encoding.
fn refuse(request: &http::Request<RecvStream>) -> Option<Refusal> {
    if request.method() != http::Method::POST {
        return Some(Refusal::Http(http::StatusCode::METHOD_NOT_ALLOWED));
    }
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(subtype) = content_type.strip_prefix("application/grpc") else {
        return Some(Refusal::Http(http::StatusCode::UNSUPPORTED_MEDIA_TYPE));
    };
    let subtype = subtype.split(';').next().unwrap_or("");
    if !matches!(subtype, "" | "+proto") {
        return Some(Refusal::Grpc(
            Status::unimplemented(format!(
                "content-type {content_type} is not supported; send application/grpc (protobuf)"
            )),
            false,
        ));
    }
    match request.headers().get(&GRPC_ENCODING) {
        Some(encoding) if encoding.as_bytes() != b"identity" => Some(Refusal::Grpc(
            Status::unimplemented(format!(
                "grpc-encoding {} is not supported; send identity",
                String::from_utf8_lossy(encoding.as_bytes())
            )),
            true,
        )),
        _ => None,
    }
}

/// A unary call served inline: read one message, run `handler`, answer its message or status.
/// A call still open when the drain ends answers UNAVAILABLE.
async fn unary<Req, Resp, F, Fut>(
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    limits: CallLimits,
    handler: F,
) where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    let timeout = grpc_timeout(request.headers());
    let outcome = async {
        let body = read_message::<Req>(request.into_body(), &limits.budget);
        let message = tokio::time::timeout(limits.body_timeout, body)
            .await
            .unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(
                    "the request's message did not arrive within the body timeout",
                ))
            })?;
        handler(message).await
    };
    let outcome = async {
        match timeout {
            None => outcome.await,
            Some(timeout) => tokio::time::timeout(timeout, outcome)
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded("the call's grpc-timeout passed"))
                }),
        }
    };
    let outcome = tokio::select! {
        biased;
        outcome = outcome => outcome,
        () = super::stopped(limits.drain_over) => Err(shutting_down()),
    };
    // An error here means the client reset the stream or left: nobody is waiting any more.
    let _ = match outcome {
        Ok(message) => send_message(&mut respond, &message),
        Err(status) => send_status(&mut respond, &status),
    };
}

fn shutting_down() -> Status {
    Status::unavailable("the server is shutting down")
}

/// Reads a request body that holds exactly one gRPC message and decodes it.
///
/// Flow-control window goes back to the client only for a message still incomplete, and only
/// once the bytes held fit the connection's and the process's budgets ([`super::budget`]); a
/// complete message's window goes back once it is decoded.
async fn read_message<M: Message + Default>(
    mut body: RecvStream,
    budget: &ConnectionBudget,
) -> Result<M, Status> {
    let mut received = Received::default();
    let mut held = Held::default();
    let mut unreleased = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|error| Status::cancelled(error.to_string()))?;
        unreleased += chunk.len();
        received.push(chunk);
        let complete = match message_length(received.bytes())? {
            Some(length) if received.bytes().len() > 5 + length => {
                return Err(Status::invalid_argument("a unary call takes one message"));
            }
            Some(length) => received.bytes().len() == 5 + length,
            None => false,
        };
        if !complete {
            if !budget.reserve(&mut held, unreleased).await {
                return Err(Status::resource_exhausted(
                    "the request's message does not fit the connection's buffer budget",
                ));
            }
            let _ = body.flow_control().release_capacity(unreleased);
            unreleased = 0;
        }
    }
    let _ = body.flow_control().release_capacity(unreleased);
    let bytes = received.bytes();
    let Some(length) = message_length(bytes)? else {
        return Err(Status::invalid_argument("the request has no message"));
    };
    let message = bytes
        .get(5..5 + length)
        .ok_or_else(|| Status::invalid_argument("the request ends inside its message"))?;
    M::decode(message)
        .map_err(|error| Status::invalid_argument(format!("cannot decode the request: {error}")))
}

/// The bytes of a request body, not copied when they arrive in one DATA frame (as Envoy's do).
#[derive(Default)]
struct Received {
    first: Bytes,
    joined: BytesMut,
}

impl Received {
    fn push(&mut self, chunk: Bytes) {
        if self.first.is_empty() && self.joined.is_empty() {
            self.first = chunk;
            return;
        }
        if !self.first.is_empty() {
            self.joined
                .extend_from_slice(&std::mem::take(&mut self.first));
        }
        self.joined.extend_from_slice(&chunk);
    }

    fn bytes(&self) -> &[u8] {
        if self.joined.is_empty() {
            &self.first
        } else {
            &self.joined
        }
    }
}

/// The length of the message whose 5-byte gRPC prefix starts `bytes`, once the prefix is in.
fn message_length(bytes: &[u8]) -> Result<Option<usize>, Status> {
    let Some(&[compressed, a, b, c, d]) = bytes.get(..5) else {
        return Ok(None);
    };
    if compressed != 0 {
        // The call's grpc-encoding is identity (others are refused before the body is read).
        return Err(Status::internal(
            "the message is flagged compressed but the call has no grpc-encoding",
        ));
    }
    let length = u32::from_be_bytes([a, b, c, d]) as usize;
    if length > MAX_MESSAGE {
        return Err(Status::out_of_range(format!(
            "message length too large: found {length} bytes, the limit is {MAX_MESSAGE} bytes"
        )));
    }
    Ok(Some(length))
}

/// `grpc-timeout`: up to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`). Anything else is
/// ignored, as if the client had set no deadline.
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(&GRPC_TIMEOUT)?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Response headers, trailers-only responses included.
fn response_head() -> http::Response<()> {
    let mut head = http::Response::new(());
    head.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    head
}

/// Answers one message, then `grpc-status: 0`.
fn send_message<M: Message>(
    respond: &mut SendResponse<Bytes>,
    message: &M,
) -> Result<(), h2::Error> {
    let frame = encode_frame(message, &mut BytesMut::new());
    let mut stream = respond.send_response(response_head(), false)?;
    stream.send_data(frame, false)?;
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(&GRPC_STATUS, HeaderValue::from_static("0"));
    stream.send_trailers(trailers)
}

/// Encodes `message` as one gRPC message (flag 0 for "uncompressed", the length in 4 bytes
/// big-endian, the protobuf) at the end of `buf` and splits it off. A caller that keeps `buf`
/// (the load generator does) gets its memory back once the frame has been sent and dropped.
pub fn encode_frame(message: &impl Message, buf: &mut BytesMut) -> Bytes {
    let length = message.encoded_len();
    buf.reserve(5 + length);
    buf.put_u8(0);
    // Rate-limit messages are far below 4 GiB (requests are capped at 4 MiB).
    buf.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode_raw(buf);
    buf.split().freeze()
}

/// Answers an error as a trailers-only response.
fn send_status(respond: &mut SendResponse<Bytes>, status: &Status) -> Result<(), h2::Error> {
    send_status_with(respond, status, false)
}

/// [`send_status`], with `grpc-accept-encoding: identity` when `accept_encoding`.
fn send_status_with(
    respond: &mut SendResponse<Bytes>,
    status: &Status,
    accept_encoding: bool,
) -> Result<(), h2::Error> {
    let mut head = response_head();
    if status.add_header(head.headers_mut()).is_err() {
        // Only a status with binary details can fail to encode; ours have none.
        let _ = Status::internal("").add_header(head.headers_mut());
    }
    if accept_encoding {
        head.headers_mut()
            .insert(&GRPC_ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    respond.send_response(head, true).map(drop)
}

/// Any other method: hand the stream to tonic's routes and copy their answer back. A stream still
/// open when the drain ends gets `UNAVAILABLE` (in trailers, if its answer had begun).
async fn bridge(
    routes: Routes,
    request: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    drain_over: watch::Receiver<bool>,
) {
    let mut stream = None;
    let drained = {
        let work = bridge_answer(routes, request, &mut respond, &mut stream);
        tokio::select! {
            () = work => false,
            () = super::stopped(drain_over) => true,
        }
    };
    if drained {
        let _ = match stream.as_mut() {
            Some(stream) => stream.send_trailers(status_trailers(&shutting_down())),
            None => send_status(&mut respond, &shutting_down()),
        };
    }
}

async fn bridge_answer(
    mut routes: Routes,
    request: http::Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    stream: &mut Option<SendStream<Bytes>>,
) {
    let request = request.map(|body| tonic::body::Body::new(Incoming::new(body)));
    let ready =
        poll_fn(|cx| Service::<http::Request<tonic::body::Body>>::poll_ready(&mut routes, cx));
    let Ok(()) = ready.await;
    let Ok(response) = routes.call(request).await;
    let (head, body) = response.into_parts();
    let end = body.is_end_stream();
    let Ok(sending) = respond.send_response(http::Response::from_parts(head, ()), end) else {
        return;
    };
    let sending = stream.insert(sending);
    if !end {
        let _ = copy_body(body, sending).await;
    }
}

fn status_trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(2);
    let _ = status.add_header(&mut trailers);
    trailers
}

/// Copies a response body (a health `Watch` stream among them) until it ends or the client
/// resets the stream.
async fn copy_body(
    mut body: tonic::body::Body,
    stream: &mut SendStream<Bytes>,
) -> Result<(), h2::Error> {
    loop {
        let next = tokio::select! {
            frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)) => frame,
            _ = poll_fn(|cx| stream.poll_reset(cx)) => return Ok(()),
        };
        let frame = match next {
            None => return stream.send_data(Bytes::new(), true),
            Some(Ok(frame)) => frame,
            Some(Err(_)) => {
                stream.send_reset(h2::Reason::INTERNAL_ERROR);
                return Ok(());
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if !send_within_window(stream, data).await? {
                    return Ok(());
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return stream.send_trailers(trailers);
                }
            }
        }
    }
}

/// Sends `data` as the client's flow-control window allows: h2 queues only what the window (and
/// [`MAX_QUEUED_REPLY`]) grants, and the body is not read further until this returns. `false`
/// when the client reset the stream meanwhile.
async fn send_within_window(
    stream: &mut SendStream<Bytes>,
    mut data: Bytes,
) -> Result<bool, h2::Error> {
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = poll_fn(|cx| {
            if stream.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            stream.poll_capacity(cx)
        })
        .await;
        let granted = match granted {
            Some(granted) => granted?,
            None => return Ok(false),
        };
        if granted > 0 {
            stream.send_data(data.split_to(granted.min(data.len())), false)?;
        }
    }
    Ok(true)
}

/// A request body as an `http_body::Body`, for tonic's routes.
struct Incoming {
    stream: RecvStream,
    data_done: bool,
}

impl Incoming {
    fn new(stream: RecvStream) -> Self {
        Incoming {
            stream,
            data_done: false,
        }
    }
}

impl http_body::Body for Incoming {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_done {
            match ready!(self.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => self.data_done = true,
            }
        }
        self.stream
            .poll_trailers(cx)
            .map(|trailers| trailers.transpose().map(|t| t.map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use tokio::net::TcpStream;

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
    };

    fn timeout(value: &'static str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(&GRPC_TIMEOUT, HeaderValue::from_static(value));
        grpc_timeout(&headers)
    }

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
        body.send_data(
            encode_frame(&RateLimitRequest::default(), &mut BytesMut::new()),
            true,
        )?;
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

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "m", "20", "20x", "+20m", "123456789m", "2 m"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn message_prefixes_are_checked_before_the_message_is_read() {
        assert_eq!(message_length(&[0, 0, 0]).ok(), Some(None));
        assert_eq!(message_length(&[0, 0, 0, 1, 0]).ok(), Some(Some(256)));
        let compressed = message_length(&[1, 0, 0, 0, 1]).err().map(|s| s.code());
        assert_eq!(compressed, Some(tonic::Code::Internal));
        let huge = message_length(&[0, 0x7f, 0, 0, 0]).err().map(|s| s.code());
        assert_eq!(huge, Some(tonic::Code::OutOfRange));
    }

    #[test]
    fn bodies_in_several_frames_are_joined() {
        let mut received = Received::default();
        received.push(Bytes::from_static(b"ab"));
        assert_eq!(received.bytes(), b"ab");
        received.push(Bytes::from_static(b"cd"));
        received.push(Bytes::from_static(b"e"));
        assert_eq!(received.bytes(), b"abcde");
    }
}
