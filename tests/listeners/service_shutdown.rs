//! Health and shutdown: gRPC health answers for the service's names, the flip to NOT_SERVING a
//! watcher sees on SIGTERM, a clean exit on SIGTERM and SIGINT, and calls in flight (held by a
//! frozen Redis) answered before the process exits.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::service_fixture::{Server, health_status};
use crate::support::{RedisServer, call, descriptor, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flips_on_sigterm_and_the_process_exits_cleanly() {
    let mut server = Server::start(&[]);
    assert_eq!(server.get("/healthcheck").await.status(), 200);
    let channel = server.channel().await;
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        let status = health_status(channel.clone(), service)
            .await
            .expect("health check");
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
    let unknown = health_status(channel.clone(), "nope").await;
    assert_eq!(unknown.map_err(|s| s.code()), Err(tonic::Code::NotFound));

    // A watcher sees the flip: the stream stays open through the drain.
    let mut watch = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first: Option<HealthCheckResponse> = watch.message().await.expect("first status");
    assert_eq!(first.map(|r| r.status()), Some(ServingStatus::Serving));

    server.signal("TERM");
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("a status after SIGTERM");
    assert_eq!(
        next.ok().flatten().map(|r| r.status()),
        Some(ServingStatus::NotServing)
    );
    drop(watch);
    drop(channel);
    server.expect_clean_exit(Duration::from_secs(10));
    // Stopped accepting.
    assert!(std::net::TcpStream::connect(("127.0.0.1", server.http_port)).is_err());
    assert!(server.log().contains("SIGTERM"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_also_drains_and_exits_zero() {
    let mut server = Server::start(&["--drain-timeout", "2s"]);
    assert_eq!(server.get("/healthcheck").await.status(), 200);
    server.signal("INT");
    server.expect_clean_exit(Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_calls_finish() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mut server = Server::start(&["--redis-url", &redis.url(), "--redis-timeout", "1500ms"]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("user", "drain")])]);
    assert_eq!(
        call(&mut client, req.clone()).await.overall_code(),
        Code::Ok
    );

    // A frozen Redis holds the next call until the store's timeout.
    let freeze = |signal: &str| {
        let status = Command::new("kill")
            .args([signal, &redis.process.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    freeze("-STOP");
    let started = Instant::now();
    let in_flight = tokio::spawn(async move { client.should_rate_limit(req).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("TERM");
    let answer = in_flight.await.expect("task");
    freeze("-CONT");
    // The call got its answer (the store timed out: UNAVAILABLE), not a dropped connection.
    let status = answer.expect_err("the store timed out");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "rate-limit store unavailable");
    assert!(started.elapsed() >= Duration::from_millis(1400));
    assert!(
        server.log().contains("kind=\"timeout\""),
        "{}",
        server.log()
    );
    server.expect_clean_exit(Duration::from_secs(10));
}
