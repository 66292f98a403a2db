//! Fault tests: Redis killed (SIGKILL) under load, then started again on the same port, with one
//! slidegate per failure mode (`error`, `allow`, `deny`): the answers, health, metrics and the
//! recovery.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::faults_fixture::{
    Answer, DOMAIN, RULES, Rules, healthy, load, metrics, request, server_alive,
};
use crate::support::{RedisServer, Slidegate, metric_value, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn store_errors(text: &str) -> f64 {
    ["timeout", "connection", "refused", "backend"]
        .iter()
        .map(|k| {
            metric_value(
                text,
                &format!(r#"slidegate_store_errors_total{{kind="{k}"}}"#),
            )
        })
        .sum()
}

async fn grpc_health(server: &Slidegate) -> ServingStatus {
    let response = HealthClient::new(server.channel().await)
        .check(HealthCheckRequest {
            service: "ratelimit".to_string(),
        })
        .await
        .expect("gRPC health check");
    response.into_inner().status()
}

/// Restarts redis-server on the port a killed one used.
fn restart_redis(port: u16) -> RedisServer {
    RedisServer::spawn(&["--port", &port.to_string()], port).expect("restart redis-server")
}

/// The failure answer a mode gives.
fn failure_answer(mode: &str, answer: &Answer) -> bool {
    match mode {
        "error" => matches!(answer, Answer::Error(tonic::Code::Unavailable, _)),
        "allow" => *answer == Answer::FailOpen,
        "deny" => *answer == Answer::FailClosed,
        _ => unreachable!("unknown mode {mode}"),
    }
}

/// Three slidegates share one Redis, one per failure mode (`error`, `allow`, `deny`), each under
/// continuous gRPC load. Redis is killed with SIGKILL, then started again on the same port.
///
/// Proves: the processes stay up; while Redis is down every call is answered within the store
/// timeout (plus a margin) with exactly its mode's answer (UNAVAILABLE / OK / OVER_LIMIT, and HTTP
/// 503 / 200 / 429), nothing else; readiness turns NOT_SERVING (HTTP 503 and gRPC) under `error`
/// only, since `allow` and `deny` answer every request (were they to leave the endpoints, every
/// replica would at once), and liveness (`/rlconfig`) stays 200 under all three; every failed
/// call is counted once in `slidegate_store_errors_total` and `slidegate_failure_mode_total`; and
/// within 2 s of Redis coming back every call is decided by Redis again, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_under_load_then_back_on_the_same_port() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let port = redis.port;
    let url = redis.url();
    let rules = Rules::new(RULES);
    let timeout = Duration::from_millis(200);
    let modes = ["error", "allow", "deny"];
    let servers: Vec<Slidegate> = modes
        .iter()
        .map(|mode| {
            Slidegate::start(
                &rules.dir(),
                &[
                    "--redis-url",
                    &url,
                    "--redis-timeout",
                    "200ms",
                    "--failure-mode",
                    mode,
                ],
            )
        })
        .collect();
    for server in &servers {
        assert!(
            wait_until(Duration::from_secs(10), || healthy(server)),
            "not healthy at start:\n{}",
            server.log()
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut runs = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let req = request(&[("user", &format!("kill-{i}"))]);
        runs.push(load(server, req, 3, Duration::from_millis(5), Arc::clone(&stop)).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let killed_at = Instant::now();
    drop(redis); // SIGKILL, and its directory is removed
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Health follows under `error` (the checker pings every second)...
    let down = wait_until(Duration::from_secs(5), || {
        servers[0].get("/healthcheck") == (503, "NOT_SERVING\n".to_string())
    });
    assert!(
        down,
        "health did not turn NOT_SERVING:\n{}",
        servers[0].log()
    );
    assert_eq!(grpc_health(&servers[0]).await, ServingStatus::NotServing);
    // ...and not under `allow` or `deny`, past the checker's next round; liveness never does.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (mode, server) in modes.iter().zip(&servers) {
        if *mode != "error" {
            assert_eq!(server.get("/healthcheck").0, 200, "{mode}");
            assert_eq!(grpc_health(server).await, ServingStatus::Serving, "{mode}");
        }
        assert_eq!(server.get("/rlconfig").0, 200, "{mode}: liveness");
    }
    // The HTTP transports answer by the failure mode too.
    let http = reqwest::Client::new();
    for (mode, server) in modes.iter().zip(&servers) {
        let body =
            r#"{"domain":"faults","descriptors":[{"entries":[{"key":"user","value":"http"}]}]}"#;
        let json = http
            .post(server.url("/json"))
            .body(body)
            .send()
            .await
            .expect("POST /json");
        let check = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", DOMAIN)
            .header("x-ratelimit-descriptor", "user=http")
            .send()
            .await
            .expect("GET /check");
        let expected = match *mode {
            "error" => (503, 503),
            "allow" => (200, 200),
            _ => (429, 429),
        };
        assert_eq!(
            (json.status().as_u16(), check.status().as_u16()),
            expected,
            "{mode}"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Redis may answer from the moment its process starts, before `restart_redis` returns.
    let restarting_at = Instant::now();
    let _redis = restart_redis(port);
    let back_at = Instant::now();
    // Health comes back too (checker interval 1 s).
    for server in &servers {
        let up = wait_until(Duration::from_secs(4), || healthy(server));
        assert!(up, "health did not recover:\n{}", server.log());
    }
    let elapsed = back_at.elapsed();
    if elapsed < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(2500) - elapsed).await;
    }
    stop.store(true, Ordering::SeqCst);

    for ((mode, server), run) in modes.iter().zip(&servers).zip(runs) {
        let samples = run.await.expect("load");
        let log = server.log();
        assert!(server_alive(server), "slidegate ({mode}) died:\n{log}");
        let mut failures = 0;
        let mut first_back: Option<Instant> = None;
        for s in &samples {
            assert!(
                s.elapsed < timeout + Duration::from_millis(800),
                "{mode}: a call took {:?} (timeout {timeout:?}): {s:?}",
                s.elapsed
            );
            let ok = s.answer == Answer::Store(Code::Ok);
            let failed = failure_answer(mode, &s.answer);
            assert!(ok || failed, "{mode}: unexpected answer {s:?}");
            failures += usize::from(failed);
            let finished = s.started + s.elapsed;
            if finished < killed_at {
                assert!(ok, "{mode}: failed before the kill: {s:?}");
            }
            // Redis is surely gone 100 ms after SIGKILL, and back only once restarted.
            if s.started > killed_at + Duration::from_millis(100) && finished < restarting_at {
                assert!(failed, "{mode}: answered without Redis: {s:?}");
            }
            if ok && s.started > back_at && first_back.is_none() {
                first_back = Some(s.started);
            }
            if s.started > back_at + Duration::from_secs(2) {
                assert!(ok, "{mode}: still failing 2 s after Redis came back: {s:?}");
            }
        }
        let first_back = first_back.expect("no store-backed answer after Redis came back");
        assert!(
            first_back - back_at < Duration::from_secs(2),
            "{mode}: back after {:?}",
            first_back - back_at
        );
        assert!(failures >= 10, "{mode}: only {failures} failed calls");

        let m = metrics(server);
        let counted = metric_value(
            &m,
            &format!(r#"slidegate_failure_mode_total{{mode="{mode}"}}"#),
        );
        // The /json and /check calls above went through the failure mode too.
        assert_eq!(counted, (failures + 2) as f64, "{mode}:\n{m}");
        assert_eq!(store_errors(&m), counted, "{mode}:\n{m}");
        eprintln!(
            "{mode}: {} calls, {failures} answered by the failure mode, back {:?} after restart",
            samples.len(),
            first_back - back_at
        );
    }
}
