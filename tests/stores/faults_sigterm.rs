//! Fault tests: SIGTERM while gRPC and `/json` calls are in flight (held by a frozen Redis): every
//! call gets its answer and the process exits 0 within the drain timeout.

use std::time::{Duration, Instant};

use crate::faults_fixture::{Answer, RULES, Rules, classify, healthy, request};
use crate::support::{RedisServer, Slidegate, send_signal, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// 100 gRPC calls (on 4 connections) and 20 `/json` calls are in flight, held by a frozen Redis,
/// when SIGTERM arrives; Redis thaws half a second later.
///
/// Proves: no call is dropped mid-flight: every call started before SIGTERM gets its proper
/// answer (OK from Redis), and the process exits 0 within the drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_answers_every_call_in_flight() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new(RULES);
    let mut server = Slidegate::start(
        &rules.dir(),
        &[
            "--redis-url",
            &redis.url(),
            "--redis-timeout",
            "5s",
            "--drain-timeout",
            "8s",
        ],
    );
    assert!(wait_until(Duration::from_secs(10), || healthy(&server)));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut c = server.client().await;
        let r = c.should_rate_limit(request(&[("user", "warm")])).await;
        assert_eq!(classify(r), Answer::Store(Code::Ok));
        clients.push(c);
    }
    let http = reqwest::Client::new();

    send_signal(redis.process.pid(), "STOP");
    let mut grpc_calls = Vec::new();
    for i in 0..100 {
        let mut c = clients[i % clients.len()].clone();
        let req = request(&[("user", &format!("term-{i}"))]);
        grpc_calls.push(tokio::spawn(async move {
            classify(c.should_rate_limit(req).await)
        }));
    }
    let mut json_calls = Vec::new();
    for i in 0..20 {
        let http = http.clone();
        let url = server.url("/json");
        let body = format!(
            r#"{{"domain":"faults","descriptors":[{{"entries":[{{"key":"user","value":"json-{i}"}}]}}]}}"#
        );
        json_calls.push(tokio::spawn(async move {
            match http.post(url).body(body).send().await {
                Ok(r) => r.status().as_u16(),
                Err(e) => panic!("/json call dropped: {e}"),
            }
        }));
    }
    // Let every call reach the server and wait on Redis.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let term_at = Instant::now();
    server.signal("TERM");
    tokio::time::sleep(Duration::from_millis(500)).await;
    send_signal(redis.process.pid(), "CONT");

    for (i, call) in grpc_calls.into_iter().enumerate() {
        let answer = call.await.expect("task");
        assert_eq!(
            answer,
            Answer::Store(Code::Ok),
            "gRPC call {i}\n{}",
            server.log()
        );
    }
    for (i, call) in json_calls.into_iter().enumerate() {
        assert_eq!(call.await.expect("task"), 200, "/json call {i}");
    }
    server.expect_clean_exit(Duration::from_secs(8));
    let exited_after = term_at.elapsed();
    eprintln!("exited {exited_after:?} after SIGTERM");
    // Calls made after SIGTERM were refused, not accepted and dropped.
    assert!(server.log().contains("shutting down"));
}
