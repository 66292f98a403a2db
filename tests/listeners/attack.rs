//! The attacker of `bench/scripts/bench-attacks`: not a test but one ignored runner that keeps an
//! attack of issue 25 (or a flood of distinct counters against the memory store's budget, or one
//! of the two floods whose bounds issue 45 added) going for as long as asked, against a server
//! already running, while the script measures a normal client. It lives apart from `hostile/`,
//! whose tests check each attack once against a server of their own, because that file had passed
//! 2,000 lines; the frame and connection helpers the two share stay there.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::hostile::{
    SHOULD_RATE_LIMIT, closed_within, flood, grpc_request, h2_connection, h2_frame,
    send_as_window_allows,
};
use crate::support::{descriptor, grpc_frame, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use prost::Message as _;

/// Descriptors in one call of the key flood (what the memory budget test sends too).
const FLOOD_DESCRIPTORS: usize = 64;

/// Padding after each flood value's distinct prefix: about 4 KiB a value, so a call asks for
/// about 256 KiB of new counters.
const FLOOD_PADDING: usize = 4080;

/// Connections of the key flood: the server's flow-control window is 128 KiB per connection,
/// so a 256 KiB call on one connection waits for window updates; a few connections fill the
/// store faster.
const FLOOD_CONNECTIONS: usize = 4;

/// Calls of the key flood in flight at once on each connection.
const FLOOD_IN_FLIGHT: usize = 2;

/// h2c connections of the body flood on the HTTP port (what the test of its buffer budget in
/// `http_bounds.rs` opens too).
const BODY_CONNECTIONS: usize = 40;

/// `POST /json` streams the body flood keeps open on each connection: the server's
/// `max_concurrent_streams`.
const BODY_STREAMS: usize = 100;

/// The `Content-Length` each request of the body flood announces, and the bytes of it sent:
/// never all of it, so no request ends.
const BODY_DECLARED: &str = "65000";
const BODY_SENT: usize = 60_000;

/// Connections of the WINDOW_UPDATE flood at once (each reconnects when the server closes it).
const WINDOW_UPDATE_TASKS: usize = 8;

/// Not a test: an attack for as long as asked, against a server already running, for
/// docs/benchmarks.md (a normal client's latency during each attack). `ATTACK` is one of
/// `half-sent`, `window-0`, `silent`, `ping`, `settings`, `reset` (the attacks the tests of
/// `hostile/` check once each), `key-flood`: calls for domain `bench` of 64 descriptors, each
/// `k` = a distinct 4 KiB value, on [`FLOOD_CONNECTIONS`] connections, [`FLOOD_IN_FLIGHT`] at a
/// time on each, each sent as soon as the one before it is answered (every value is a new
/// counter, until the memory store's budget decides the calls over limit), or one of the floods
/// of issue 45 (`http_bounds.rs` checks each once): `http-body`, [`BODY_CONNECTIONS`] h2c
/// connections to the HTTP port, each with [`BODY_STREAMS`] `POST /json` that announce
/// [`BODY_DECLARED`] bytes and send [`BODY_SENT`] of them as fast as the server's window allows,
/// a stream reopened as soon as it is answered (the HTTP port's buffer budget answers 503 at
/// once what does not fit) or reset, a connection as soon as it is closed; `window-update`,
/// [`WINDOW_UPDATE_TASKS`] connections to the gRPC port that send WINDOW_UPDATE frames (stream 0,
/// increment 1) as fast as they are taken, each reconnected when the server closes it; how many
/// it closed is printed to stderr at the end (seen with `--nocapture`). `ATTACK_GRPC_PORT`,
/// `ATTACK_HTTP_PORT` and `ATTACK_SECONDS` say where and how long:
///
/// ```text
/// ATTACK=ping ATTACK_GRPC_PORT=50051 ATTACK_HTTP_PORT=8080 ATTACK_SECONDS=12 \
///     cargo test --test listeners -- --ignored --exact attack::attack
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an attack on a running server, for benchmarks"]
async fn attack() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("set {name}"));
    let port = |name: &str| var(name).parse::<u16>().expect("a port");
    let (kind, grpc, http) = (
        var("ATTACK"),
        port("ATTACK_GRPC_PORT"),
        port("ATTACK_HTTP_PORT"),
    );
    let seconds: u64 = var("ATTACK_SECONDS").parse().expect("seconds");
    let until = Instant::now() + Duration::from_secs(seconds);
    let left = || until.saturating_duration_since(Instant::now());
    let mut tasks = tokio::task::JoinSet::new();
    match kind.as_str() {
        "ping" | "settings" => {
            let frame = if kind == "ping" {
                h2_frame(6, 0, &[7; 8])
            } else {
                h2_frame(4, 0, &[0, 3, 0, 0, 0, 100])
            };
            while !left().is_zero() {
                flood(grpc, &frame, left()).await;
            }
        }
        "half-sent" => {
            let mut body = vec![0u8, 0, 0x40, 0, 0];
            body.resize(5 + (4 << 20) - 1, 0);
            let body = bytes::Bytes::from(body);
            for _ in 0..4 {
                let body = body.clone();
                tasks.spawn(async move {
                    let mut sender = h2_connection(grpc, h2::client::Builder::new()).await;
                    let mut responses = Vec::new();
                    let mut streams = tokio::task::JoinSet::new();
                    while Instant::now() < until {
                        let Ok(ready) = sender.ready().await else {
                            break;
                        };
                        sender = ready;
                        let request = grpc_request(grpc, SHOULD_RATE_LIMIT);
                        let Ok((response, stream)) = sender.send_request(request, false) else {
                            break;
                        };
                        responses.push(response);
                        streams.spawn(send_as_window_allows(stream, body.clone()));
                        if responses.len() >= 64 {
                            // Wait for one call to end (the body timeout) before opening another.
                            let _ = responses.remove(0).await;
                        }
                    }
                });
            }
        }
        "window-0" => {
            use tonic_reflection::pb::v1::ServerReflectionRequest;
            use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
            let symbol = "envoy.service.ratelimit.v3.RateLimitService".to_string();
            let one = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::FileContainingSymbol(symbol)),
            };
            let requests = bytes::Bytes::from(grpc_frame(&one.encode_to_vec()).repeat(18_000));
            while !left().is_zero() {
                let mut builder = h2::client::Builder::new();
                builder.initial_window_size(0);
                let mut sender = h2_connection(grpc, builder).await;
                let path = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
                sender = sender.ready().await.expect("ready");
                let (_response, stream) = sender
                    .send_request(grpc_request(grpc, path), false)
                    .expect("open the stream");
                let _ =
                    tokio::time::timeout(left(), send_as_window_allows(stream, requests.clone()))
                        .await;
            }
        }
        "silent" => {
            for i in 0..3000 {
                let port = if i % 2 == 0 { grpc } else { http };
                tasks.spawn(async move {
                    while Instant::now() < until {
                        if let Ok(mut stream) =
                            tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                        {
                            let left = until.saturating_duration_since(Instant::now());
                            closed_within(&mut stream, left).await;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                });
            }
        }
        "reset" => {
            while !left().is_zero() {
                for port in [grpc, http] {
                    if let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = stream.set_zero_linger();
                    }
                }
            }
        }
        "key-flood" => {
            let next = Arc::new(AtomicU64::new(0));
            let padding: Arc<str> = "v".repeat(FLOOD_PADDING).into();
            for _ in 0..FLOOD_CONNECTIONS {
                // A tonic channel is one connection (reconnected if the server closes it); the
                // clones share it.
                let client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
                    .await
                    .expect("connect");
                for _ in 0..FLOOD_IN_FLIGHT {
                    let (mut client, next, padding) =
                        (client.clone(), next.clone(), padding.clone());
                    tasks.spawn(async move {
                        while Instant::now() < until {
                            let call = next.fetch_add(1, Ordering::Relaxed);
                            let descriptors = (0..FLOOD_DESCRIPTORS)
                                .map(|i| {
                                    descriptor(&[("k", &format!("{call:010}-{i:02}-{padding}"))])
                                })
                                .collect();
                            let left = until.saturating_duration_since(Instant::now());
                            let answer = client.should_rate_limit(request("bench", descriptors));
                            match tokio::time::timeout(left, answer).await {
                                Ok(Ok(_)) => {}
                                // Refused or broken: do not spin while the server cannot answer.
                                Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
                                Err(_) => break,
                            }
                        }
                    });
                }
            }
        }
        "http-body" => {
            let body = bytes::Bytes::from(vec![b' '; BODY_SENT]);
            for _ in 0..BODY_CONNECTIONS {
                let body = body.clone();
                tasks.spawn(async move {
                    while Instant::now() < until {
                        let mut sender = h2_connection(http, h2::client::Builder::new()).await;
                        // This connection's streams, each until answered or reset; dropped (so
                        // reset) with the connection.
                        let mut streams = tokio::task::JoinSet::new();
                        loop {
                            let left = until.saturating_duration_since(Instant::now());
                            if streams.len() >= BODY_STREAMS {
                                if tokio::time::timeout(left, streams.join_next())
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                                continue;
                            }
                            // Closed (or going away): reconnect.
                            let Ok(Ok(ready)) = tokio::time::timeout(left, sender.ready()).await
                            else {
                                break;
                            };
                            sender = ready;
                            let request =
                                http::Request::post(format!("http://127.0.0.1:{http}/json"))
                                    .header("content-type", "application/json")
                                    .header("content-length", BODY_DECLARED)
                                    .body(())
                                    .expect("request");
                            let Ok((response, stream)) = sender.send_request(request, false) else {
                                break;
                            };
                            let body = body.clone();
                            streams.spawn(async move {
                                // `send_as_window_allows` ends only if the stream is reset.
                                tokio::select! {
                                    _ = response => {}
                                    () = send_as_window_allows(stream, body) => {}
                                }
                            });
                        }
                    }
                });
            }
        }
        "window-update" => {
            let update = h2_frame(8, 0, &1u32.to_be_bytes());
            let (opened, closed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            for _ in 0..WINDOW_UPDATE_TASKS {
                let (update, opened, closed) = (update.clone(), opened.clone(), closed.clone());
                tasks.spawn(async move {
                    while Instant::now() < until {
                        opened.fetch_add(1, Ordering::Relaxed);
                        let left = until.saturating_duration_since(Instant::now());
                        if flood(grpc, &update, left).await {
                            closed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            let _ =
                tokio::time::timeout(left(), async { while tasks.join_next().await.is_some() {} })
                    .await;
            eprintln!(
                "window-update: {} connections closed by the server, of {} opened",
                closed.load(Ordering::Relaxed),
                opened.load(Ordering::Relaxed)
            );
        }
        other => panic!("unknown attack {other}"),
    }
    let _ =
        tokio::time::timeout(left(), async { while tasks.join_next().await.is_some() {} }).await;
}
