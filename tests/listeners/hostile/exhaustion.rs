//! One client must not exhaust the server (issue 25). Each attack runs for seconds against the
//! real binary with one worker (so that the attacker and a normal client share it), while the
//! normal client calls `ShouldRateLimit` every 10 ms on a connection of its own. The limits are
//! set through SLIDEGATE_* variables, which a binary without them ignores, so each test can be run
//! against an older build to see it fail. The runner in `attack.rs` keeps these attacks going
//! against a running server for `bench/scripts/bench-attacks`, with the helpers below.
use std::time::{Duration, Instant};

use crate::support::{Slidegate, call, descriptor, grpc_frame, rss_kib};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use prost::Message as _;
use tonic::transport::Channel;

use super::{Rules, request};

/// The bound on every call of the normal client during an attack (a debug build on a shared
/// machine: the calls take well under a millisecond when nothing else runs).
const NORMAL_CALL_BOUND: Duration = Duration::from_secs(1);

/// Calls of the normal client: how long each took, and how many got no answer in time.
#[derive(Debug, Default)]
struct NormalCalls {
    latencies: Vec<Duration>,
    failed: usize,
}

impl NormalCalls {
    fn p99(&self) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        sorted
            .get(sorted.len().saturating_sub(1) * 99 / 100)
            .copied()
            .unwrap_or_default()
    }

    /// Every call answered within [`NORMAL_CALL_BOUND`], and enough of them to mean something.
    fn assert_served(&self, attack: &str) {
        let slowest = self.latencies.iter().max().copied().unwrap_or_default();
        assert!(
            self.failed == 0 && self.latencies.len() >= 20 && slowest <= NORMAL_CALL_BOUND,
            "during {attack}: {} calls answered, {} failed, p99 {:?}, slowest {slowest:?}",
            self.latencies.len(),
            self.failed,
            self.p99()
        );
    }
}

/// A normal client's calls, one every 10 ms, until `until`.
async fn normal_client(mut client: RateLimitServiceClient<Channel>, until: Instant) -> NormalCalls {
    let mut calls = NormalCalls::default();
    while Instant::now() < until {
        let started = Instant::now();
        let call = client.should_rate_limit(request(vec![descriptor(&[("plain", "normal")])]));
        match tokio::time::timeout(NORMAL_CALL_BOUND * 5, call).await {
            Ok(Ok(_)) => calls.latencies.push(started.elapsed()),
            _ => calls.failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    calls
}

/// The highest RSS of `pid` (KiB), sampled every 50 ms until `until`.
async fn peak_rss(pid: u32, until: Instant) -> u64 {
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(rss_kib(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak
}

pub(crate) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// An HTTP/2 connection to the gRPC port (the h2 client, with `builder`'s settings).
pub(crate) async fn h2_connection(
    port: u16,
    builder: h2::client::Builder,
) -> h2::client::SendRequest<bytes::Bytes> {
    let io = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (sender, connection) = builder.handshake(io).await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    sender.ready().await.expect("ready")
}

pub(crate) fn grpc_request(port: u16, path: &str) -> http::Request<()> {
    http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

/// Sends `bytes` on `stream` as fast as the server's flow-control window lets it (never more:
/// the attacker's own memory stays small), then holds the stream open without ending it.
pub(crate) async fn send_as_window_allows(
    mut stream: h2::SendStream<bytes::Bytes>,
    bytes: bytes::Bytes,
) {
    let mut left = bytes;
    while !left.is_empty() {
        stream.reserve_capacity(left.len());
        match std::future::poll_fn(|cx| stream.poll_capacity(cx)).await {
            Some(Ok(granted)) if granted > 0 => {
                let n = granted.min(left.len());
                if stream.send_data(left.split_to(n), false).is_err() {
                    return;
                }
            }
            Some(Ok(_)) => {}
            _ => return,
        }
    }
    std::future::pending::<()>().await;
}

/// Item 2. Four connections each open 64 calls that announce a 4 MiB message and send all of it
/// but the last byte, as fast as the server lets them, for 3 s (before the budgets: 1 GiB the
/// server would take in). With a process budget of 16 MiB the server's RSS grows by less than
/// 96 MiB; the body timeout (2 s) answers the half-sent calls DEADLINE_EXCEEDED; the normal
/// client's calls are each answered within [`NORMAL_CALL_BOUND`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_bodies_stay_within_the_buffer_budgets() {
    let rules = Rules::new();
    let server = Slidegate::start_with_env(
        rules.path(),
        &[],
        &[
            ("SLIDEGATE_WORKERS", "1"),
            ("SLIDEGATE_MAX_BUFFERED_BYTES", "16777216"),
            ("SLIDEGATE_BODY_TIMEOUT", "2s"),
        ],
    );
    let client = server.client().await;
    let rss_before = server.rss_kib();
    let until = Instant::now() + Duration::from_secs(3);
    let normal = tokio::spawn(normal_client(client, until));
    let peak = tokio::spawn(peak_rss(server.pid(), until));

    let message_length = 4 << 20;
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message_length).expect("4 MiB").to_be_bytes());
    body.resize(5 + message_length - 1, 0);
    let body = bytes::Bytes::from(body);
    let mut attack = tokio::task::JoinSet::new();
    let mut responses = Vec::new();
    for _ in 0..4 {
        let mut sender = h2_connection(server.grpc_port, h2::client::Builder::new()).await;
        for _ in 0..64 {
            sender = sender.ready().await.expect("ready");
            let request = grpc_request(server.grpc_port, SHOULD_RATE_LIMIT);
            let (response, stream) = sender.send_request(request, false).expect("open a call");
            responses.push(response);
            attack.spawn(send_as_window_allows(stream, body.clone()));
        }
    }
    let first = responses.swap_remove(0);
    let answered = tokio::time::timeout(Duration::from_secs(4), first).await;
    let peak = peak.await.expect("RSS sampler");
    normal
        .await
        .expect("normal client")
        .assert_served("half-sent 4 MiB bodies");
    attack.abort_all();
    assert!(
        peak < rss_before + 96 * 1024,
        "RSS grew from {rss_before} KiB to {peak} KiB"
    );
    let status = answered
        .ok()
        .and_then(Result::ok)
        .and_then(|r| r.headers().get("grpc-status").cloned());
    assert_eq!(
        status.as_ref().map(|s| s.as_bytes()),
        Some(&b"4"[..]),
        "a half-sent call is answered DEADLINE_EXCEEDED after the body timeout"
    );
}

/// Item 3. A client that opens no flow-control window (initial window 0) and sends reflection
/// `file_containing_symbol` requests on one stream for 3 s: the server queues what one stream
/// may (64 KiB) and stops reading the stream, instead of queueing every reply (before: 5 KiB per
/// request without bound). RSS grows by less than 32 MiB; the normal client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_wait_for_the_clients_window() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

    let rules = Rules::new();
    let server = Slidegate::start_with_env(rules.path(), &[], &[("SLIDEGATE_WORKERS", "1")]);
    let client = server.client().await;
    let rss_before = server.rss_kib();
    let until = Instant::now() + Duration::from_secs(3);
    let normal = tokio::spawn(normal_client(client, until));
    let peak = tokio::spawn(peak_rss(server.pid(), until));

    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    let mut sender = h2_connection(server.grpc_port, builder).await;
    let request = grpc_request(
        server.grpc_port,
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    );
    sender = sender.ready().await.expect("ready");
    let (_response, stream) = sender
        .send_request(request, false)
        .expect("open the stream");
    let one = grpc_frame(
        &ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "envoy.service.ratelimit.v3.RateLimitService".to_string(),
            )),
        }
        .encode_to_vec(),
    );
    let requests = bytes::Bytes::from(one.repeat(18_000));
    let attack = tokio::spawn(send_as_window_allows(stream, requests));
    let peak = peak.await.expect("RSS sampler");
    normal
        .await
        .expect("normal client")
        .assert_served("a reflection stream with window 0");
    attack.abort();
    assert!(
        peak < rss_before + 32 * 1024,
        "RSS grew from {rss_before} KiB to {peak} KiB"
    );
}

/// Whether the server closes `stream` within `within`: a read sees the end or an error. Bytes
/// the server sends first (a 408, a GOAWAY) are read and skipped.
pub(crate) async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Writes `chunks` one every `pause` (stopping at the first error: the server closed).
async fn trickle(stream: &mut tokio::net::TcpStream, chunks: &[&[u8]], pause: Duration) {
    use tokio::io::AsyncWriteExt as _;
    for chunk in chunks {
        if stream.write_all(chunk).await.is_err() {
            return;
        }
        tokio::time::sleep(pause).await;
    }
}

/// Item 4. With a 1 s handshake timeout, 2 s idle and body timeouts and a cap of 200 connections
/// per peer: 300 connections that never send the HTTP/2 preface are all closed within 3 s (those
/// over the cap at once, the rest by the handshake timeout: how many of each depends on how fast
/// the machine accepts them, so the count of refusals is asserted by the test after this one); an
/// HTTP request trickling a header line every 300 ms, an idle HTTP/1.1 keep-alive connection, a
/// body trickling a byte every 300 ms, an HTTP connection that sends nothing, an idle gRPC
/// connection and an idle HTTP/2 connection to the HTTP port (one request, then only the
/// keepalive PINGs it answers) are all closed within 4 s (before: all stayed open). The normal
/// client, connected first, is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_closed_and_capped() {
    use tokio::io::AsyncWriteExt as _;
    let rules = Rules::new();
    let server = Slidegate::start_with_env(
        rules.path(),
        &[],
        &[
            ("SLIDEGATE_WORKERS", "1"),
            ("SLIDEGATE_HANDSHAKE_TIMEOUT", "1s"),
            ("SLIDEGATE_IDLE_TIMEOUT", "2s"),
            ("SLIDEGATE_BODY_TIMEOUT", "2s"),
            ("SLIDEGATE_MAX_CONNECTIONS_PER_PEER", "200"),
        ],
    );
    let client = server.client().await;
    let until = Instant::now() + Duration::from_secs(4);
    let normal = tokio::spawn(normal_client(client, until));

    let connect = |port: u16| async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect")
    };
    // The slow HTTP clients and the idle gRPC connection first, within the cap.
    let mut headers = connect(server.http_port).await;
    let slow_headers = async {
        let lines: &[&[u8]] = &[
            b"GET /healthcheck HTTP/1.1\r\n",
            b"Host: x\r\n",
            b"X-A: 1\r\n",
        ];
        let lines: Vec<&[u8]> = lines.iter().copied().cycle().take(20).collect();
        tokio::select! {
            () = trickle(&mut headers, &lines, Duration::from_millis(300)) => {}
            _ = tokio::time::sleep(Duration::from_secs(4)) => {}
        }
        closed_within(&mut headers, Duration::from_millis(100)).await
    };
    let mut keep_alive = connect(server.http_port).await;
    let idle_keep_alive = async {
        keep_alive
            .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("request");
        closed_within(&mut keep_alive, Duration::from_secs(4)).await
    };
    let mut body = connect(server.http_port).await;
    let slow_body = async {
        body.write_all(
            b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        )
        .await
        .expect("headers");
        let bytes: Vec<&[u8]> = std::iter::repeat_n(&b" "[..], 20).collect();
        tokio::select! {
            () = trickle(&mut body, &bytes, Duration::from_millis(300)) => {}
            _ = tokio::time::sleep(Duration::from_secs(4)) => {}
        }
        closed_within(&mut body, Duration::from_millis(100)).await
    };
    let mut silent_http = connect(server.http_port).await;
    let silent_http = closed_within(&mut silent_http, Duration::from_secs(4));
    // Connected before the flood below fills the cap, so the server's own goodbye (GOAWAY, a
    // clean end) is what closes them, not a refusal at accept.
    let grpc_io = connect(server.grpc_port).await;
    let http2_io = connect(server.http_port).await;
    // Spawned at once: their prefaces must not wait for the 300 connections below (a loaded
    // machine took longer than the 1 s handshake timeout to open them).
    let idle_grpc = tokio::spawn(async move {
        let (_sender, connection) = h2::client::handshake(grpc_io).await.expect("handshake");
        let ended = tokio::time::timeout(Duration::from_secs(4), connection).await;
        matches!(ended, Ok(Ok(())))
    });
    let idle_http2 = tokio::spawn(async move {
        let (sender, connection) = h2::client::handshake(http2_io).await.expect("handshake");
        let mut connection = std::pin::pin!(connection);
        // The client keeps a handle: h2 closes a client connection whose handles are all gone.
        let _keep = sender.clone();
        let request = async {
            let mut sender = sender.ready().await.expect("ready");
            let get = http::Request::get("http://x/healthcheck")
                .body(())
                .expect("request");
            let (response, _) = sender.send_request(get, true).expect("send");
            response.await.expect("response").status()
        };
        let status = tokio::select! {
            status = request => status,
            ended = connection.as_mut() => panic!("closed before the request was answered: {ended:?}"),
        };
        assert_eq!(status, 200, "GET /healthcheck over HTTP/2");
        let ended = tokio::time::timeout(Duration::from_secs(4), connection).await;
        matches!(ended, Ok(Ok(())))
    });
    // Then 300 connections that never send the preface.
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(connect(server.grpc_port).await);
    }
    let all_silent_closed = async {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut closed = 0;
        for stream in &mut silent {
            let left = deadline.saturating_duration_since(Instant::now());
            closed += usize::from(closed_within(stream, left).await);
        }
        closed
    };
    let (
        slow_headers,
        idle_keep_alive,
        slow_body,
        silent_http,
        (idle_grpc, idle_http2),
        silent_closed,
    ) = tokio::join!(
        slow_headers,
        idle_keep_alive,
        slow_body,
        silent_http,
        async {
            let (grpc, http2) = tokio::join!(idle_grpc, idle_http2);
            (
                grpc.expect("idle gRPC task"),
                http2.expect("idle HTTP/2 task"),
            )
        },
        all_silent_closed
    );
    normal
        .await
        .expect("normal client")
        .assert_served("slow and idle connections");
    assert_eq!(
        silent_closed, 300,
        "connections without a preface are closed"
    );
    assert!(slow_headers, "a request whose headers trickle is closed");
    assert!(idle_keep_alive, "an idle keep-alive connection is closed");
    assert!(slow_body, "a request whose body trickles is closed");
    assert!(
        silent_http,
        "an HTTP connection that sends nothing is closed"
    );
    assert!(idle_grpc, "an idle gRPC connection is closed");
    assert!(
        idle_http2,
        "an idle HTTP/2 connection to the HTTP port is closed"
    );
}

/// The per-peer cap refuses at accept, and counts each refusal: with a handshake timeout far
/// longer than the test (so that nothing else closes a connection), 30 silent connections from
/// one peer (127.0.0.2, so that the harness's own readiness probes from 127.0.0.1 are another
/// peer) under a cap of 20 per peer leave the first 20 open and the last 10 closed at once, and
/// `slidegate_connections_refused_total` says 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_peer_cap_are_refused_and_counted() {
    let rules = Rules::new();
    let server = Slidegate::start_with_env(
        rules.path(),
        &[],
        &[
            ("SLIDEGATE_HANDSHAKE_TIMEOUT", "60s"),
            ("SLIDEGATE_MAX_CONNECTIONS_PER_PEER", "20"),
        ],
    );
    let mut silent = Vec::new();
    for _ in 0..30 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(([127, 0, 0, 2], 0).into())
            .expect("bind 127.0.0.2");
        let address = ([127, 0, 0, 1], server.grpc_port).into();
        silent.push(socket.connect(address).await.expect("connect"));
    }
    // Watched all at once: those refused close at once, the others stay open for the 2 s.
    let closed = futures::future::join_all(
        silent
            .iter_mut()
            .map(|stream| closed_within(stream, Duration::from_secs(2))),
    )
    .await;
    let expected: Vec<bool> = (0..30).map(|i| i >= 20).collect();
    assert_eq!(closed, expected, "which connections were closed");
    let (_, metrics) = server.get("/metrics");
    let refused = crate::support::metric_value(
        &metrics,
        "slidegate_connections_refused_total{listener=\"grpc\",reason=\"max_connections_per_peer\"}",
    );
    assert_eq!(refused, 10.0, "refusals counted\n{metrics}");
}

/// An HTTP/2 frame header and payload.
pub(crate) fn h2_frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("small").to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    frame
}

/// Floods `frame` (after the preface and an empty SETTINGS) as fast as the connection takes it,
/// reading whatever comes back, for up to `within`: whether the server closed the connection.
pub(crate) async fn flood(port: u16, frame: &[u8], within: Duration) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (mut read, mut write) = stream.into_split();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    start.extend(h2_frame(4, 0, &[]));
    let batch = frame.repeat(1000);
    let writer = async {
        if write.write_all(&start).await.is_err() {
            return;
        }
        while write.write_all(&batch).await.is_ok() {}
    };
    let closed = tokio::select! {
        () = writer => true,
        _ = reader => true,
        _ = tokio::time::sleep(within) => false,
    };
    closed
}

/// Item 5. A client that sends PINGs as fast as it can (reading the answers), and one that does
/// the same with SETTINGS, each for up to 3 s: each connection is closed within that time
/// (before: served without end, at the cost of the worker), and the normal client on the same
/// worker is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_frame_floods_close_the_connection() {
    let rules = Rules::new();
    let server = Slidegate::start_with_env(rules.path(), &[], &[("SLIDEGATE_WORKERS", "1")]);
    let client = server.client().await;
    let until = Instant::now() + Duration::from_secs(4);
    let normal = tokio::spawn(normal_client(client, until));
    let ping = h2_frame(6, 0, &[7; 8]);
    let settings = h2_frame(4, 0, &[0, 3, 0, 0, 0, 100]);
    let (pings, settings) = tokio::join!(
        flood(server.grpc_port, &ping, Duration::from_secs(3)),
        flood(server.grpc_port, &settings, Duration::from_secs(3)),
    );
    let http_pings = flood(server.http_port, &ping, Duration::from_secs(3)).await;
    normal
        .await
        .expect("normal client")
        .assert_served("PING and SETTINGS floods");
    assert!(pings, "a PING flood on the gRPC port is closed");
    assert!(settings, "a SETTINGS flood on the gRPC port is closed");
    assert!(http_pings, "a PING flood on the HTTP port is closed");
}

/// A call written by hand: method, content-type, extra headers and body as given. The HTTP
/// status, `grpc-status` and `grpc-accept-encoding` of the answer.
async fn raw_call(
    port: u16,
    method: &str,
    content_type: &str,
    extra: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, Option<String>, Option<String>) {
    let mut sender = h2_connection(port, h2::client::Builder::new()).await;
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{SHOULD_RATE_LIMIT}"))
        .header("content-type", content_type);
    for (name, value) in extra {
        builder = builder.header(*name, *value);
    }
    sender = sender.ready().await.expect("ready");
    let (response, mut stream) = sender
        .send_request(builder.body(()).expect("request"), false)
        .expect("send");
    let _ = stream.send_data(bytes::Bytes::from(body), true);
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("answered in time")
        .expect("answered");
    let (head, mut received) = response.into_parts();
    let text = |h: &http::HeaderMap, name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let mut status = text(&head.headers, "grpc-status");
    let accept = text(&head.headers, "grpc-accept-encoding");
    while let Some(Ok(_)) = received.data().await {}
    if let Ok(Some(trailers)) = received.trailers().await {
        status = status.or(text(&trailers, "grpc-status"));
    }
    (head.status.as_u16(), status, accept)
}

/// Item 6. As the gRPC spec has it: a content-type that is not gRPC gets HTTP 415, another
/// method 405, `application/grpc+json` UNIMPLEMENTED, a message flagged compressed without
/// `grpc-encoding` INTERNAL, and an unsupported `grpc-encoding` UNIMPLEMENTED with
/// `grpc-accept-encoding` (before: all answered as protobuf, or UNIMPLEMENTED alone). And 1,000
/// connections reset as soon as they are open write at most 2 warnings, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_checked_as_the_grpc_spec_says() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let port = server.grpc_port;
    let message = grpc_frame(&request(vec![descriptor(&[("plain", "spec")])]).encode_to_vec());
    let grpc = "application/grpc";
    assert_eq!(
        raw_call(port, "POST", "text/plain", &[], message.clone())
            .await
            .0,
        415
    );
    assert_eq!(
        raw_call(port, "GET", grpc, &[], message.clone()).await.0,
        405
    );
    let json = raw_call(port, "POST", "application/grpc+json", &[], message.clone()).await;
    assert_eq!(json.1.as_deref(), Some("12"), "{json:?}");
    let proto = raw_call(port, "POST", "application/grpc+proto", &[], message.clone()).await;
    assert_eq!(proto.1.as_deref(), Some("0"), "{proto:?}");
    let mut compressed = message.clone();
    compressed[0] = 1;
    let flagged = raw_call(port, "POST", grpc, &[], compressed.clone()).await;
    assert_eq!(flagged.1.as_deref(), Some("13"), "{flagged:?}");
    let gzip = raw_call(port, "POST", grpc, &[("grpc-encoding", "gzip")], compressed).await;
    assert_eq!(gzip.1.as_deref(), Some("12"), "{gzip:?}");
    assert_eq!(gzip.2.as_deref(), Some("identity"), "{gzip:?}");

    for port in [server.grpc_port, server.http_port] {
        for _ in 0..500 {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
            stream.set_zero_linger().expect("linger 0");
            drop(stream); // RST
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = server.log();
    let warnings = log.matches("cannot take over a connection").count();
    assert!(warnings <= 2, "{warnings} warnings for reset connections");
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "after")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

/// Item 6, shutdown. With a gRPC connection that never reads (so never answers the PING of a
/// graceful GOAWAY), an HTTP connection with half-sent headers and a call whose message never
/// ends: on SIGTERM with a 2 s drain timeout, the call is answered UNAVAILABLE before the drain
/// ends, the process exits 0 within 3 s, and it does not warn of calls still in flight (before:
/// the call's connection was dropped without a status, and the drain waited its full time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_answers_open_calls_and_is_not_held_by_idle_connections() {
    use tokio::io::AsyncWriteExt as _;
    let rules = Rules::new();
    let mut server = Slidegate::start_with_env(
        rules.path(),
        &["--drain-timeout", "2s"],
        &[("SLIDEGATE_BODY_TIMEOUT", "30s")],
    );
    let mut deaf = tokio::net::TcpStream::connect(("127.0.0.1", server.grpc_port))
        .await
        .expect("connect");
    let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    start.extend(h2_frame(4, 0, &[]));
    deaf.write_all(&start).await.expect("preface");
    let mut half_headers = tokio::net::TcpStream::connect(("127.0.0.1", server.http_port))
        .await
        .expect("connect");
    half_headers
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("half the headers");
    let mut sender = h2_connection(server.grpc_port, h2::client::Builder::new()).await;
    sender = sender.ready().await.expect("ready");
    let (response, mut stream) = sender
        .send_request(grpc_request(server.grpc_port, SHOULD_RATE_LIMIT), false)
        .expect("open a call");
    stream
        .send_data(bytes::Bytes::from_static(&[0, 0, 0, 1, 0]), false)
        .expect("half a message");
    tokio::time::sleep(Duration::from_millis(200)).await;

    server.signal("TERM");
    let answer = tokio::time::timeout(Duration::from_secs(3), response).await;
    let status = answer
        .ok()
        .and_then(Result::ok)
        .and_then(|r| r.headers().get("grpc-status").cloned());
    assert_eq!(
        status.as_ref().map(|s| s.as_bytes()),
        Some(&b"14"[..]),
        "the open call is answered UNAVAILABLE"
    );
    server.expect_clean_exit(Duration::from_secs(3));
    let log = server.log();
    assert!(!log.contains("still in flight"), "{log}");
    drop((deaf, half_headers, stream));
}
