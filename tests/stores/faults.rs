//! Fault tests: the real `slidegate` binary against real redis-server processes that are killed,
//! frozen (`SIGSTOP`), failed over (Redis Cluster with replicas) or brought back; rule files that
//! break while the service runs; SIGTERM while calls are in flight.
//!
//! Windows are short and the assertions tolerant of a slow, shared machine: a bound is checked
//! with a generous margin, never an exact duration. Each test says in its doc comment what it
//! proves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::{
    RedisCluster, RedisServer, Slidegate, TlsRedisServer, descriptor, grpc_frame, http_get,
    metric_value, raw_should_rate_limit, send_signal, wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message as _;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const DOMAIN: &str = "faults";

/// `user` has room for every call a test makes (an exact log, whose hits the tests count with
/// `ZCARD`); `tight` allows 2 per minute.
const RULES: &str = r#"
domain: faults
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 100000, precision: exact }
  - key: tight
    rate_limit: { name: tight, unit: minute, requests_per_unit: 2 }
"#;

// ---------------------------------------------------------------------------------------------
// Helpers

/// A temporary directory holding `rules/rules.yaml`.
struct Rules {
    dir: tempfile::TempDir,
}

impl Rules {
    fn new(text: &str) -> Rules {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
        std::fs::write(dir.path().join("rules/rules.yaml"), text).expect("write rules");
        Rules { dir }
    }

    fn dir(&self) -> PathBuf {
        self.dir.path().join("rules")
    }

    fn file(&self) -> PathBuf {
        self.dir().join("rules.yaml")
    }
}

fn request(entries: &[(&str, &str)]) -> RateLimitRequest {
    crate::support::request(DOMAIN, vec![descriptor(entries)])
}

/// What one call got, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// A decision the store made: OK or OVER_LIMIT with a reset time.
    Store(Code),
    /// OK without a reset time: the `allow` failure mode.
    FailOpen,
    /// OVER_LIMIT without a reset time: the `deny` failure mode.
    FailClosed,
    /// A gRPC error (code, message): UNAVAILABLE is the `error` failure mode.
    Error(tonic::Code, String),
}

fn classify(result: Result<tonic::Response<RateLimitResponse>, tonic::Status>) -> Answer {
    match result {
        Err(status) => Answer::Error(status.code(), status.message().to_string()),
        Ok(response) => {
            let r = response.into_inner();
            let from_store = r
                .statuses
                .first()
                .is_some_and(|s| s.duration_until_reset.is_some());
            match (r.overall_code(), from_store) {
                (code, true) => Answer::Store(code),
                (Code::OverLimit, false) => Answer::FailClosed,
                (_, false) => Answer::FailOpen,
            }
        }
    }
}

/// One call of a load run.
#[derive(Clone, Debug)]
struct Sample {
    started: Instant,
    elapsed: Duration,
    answer: Answer,
}

/// Calls `req` in a loop from `tasks` tasks (each with its own connection) until `stop` is set,
/// pausing `pause` between calls; returns every call.
async fn load(
    server: &Slidegate,
    req: RateLimitRequest,
    tasks: usize,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let mut client = server.client().await;
        let req = req.clone();
        let stop = Arc::clone(&stop);
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let answer = classify(client.should_rate_limit(req.clone()).await);
                samples.push(Sample {
                    started,
                    elapsed: started.elapsed(),
                    answer,
                });
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            samples
        }));
    }
    tokio::spawn(async move {
        let mut all = Vec::new();
        for handle in handles {
            all.extend(handle.await.expect("load task"));
        }
        all.sort_by_key(|s| s.started);
        all
    })
}

fn metrics(server: &Slidegate) -> String {
    let (status, body) = server.get("/metrics");
    assert_eq!(status, 200, "GET /metrics");
    body
}

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

fn healthy(server: &Slidegate) -> bool {
    server.get("/healthcheck").0 == 200
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

// ---------------------------------------------------------------------------------------------
// Redis killed, then back on the same port

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

fn server_alive(server: &Slidegate) -> bool {
    Path::new(&format!("/proc/{}", server.pid())).exists()
        && http_get(server.http_port, "/healthcheck").0 != 0
}

// ---------------------------------------------------------------------------------------------
// Redis frozen (SIGSTOP)

/// Redis is frozen with SIGSTOP while 128 concurrent callers keep calling, for 5 s, then thawed.
///
/// Proves: every call returns within the store timeout plus a margin, as UNAVAILABLE "timed out"
/// (never hangs, whatever the client library's own retry policy); slidegate's resident memory
/// stays flat while thousands of calls hit the frozen Redis (no unbounded queue of waiting work);
/// health turns NOT_SERVING; after SIGCONT calls are decided by Redis again, and the calls that
/// timed out, which Redis then runs, record no hit (they reach Redis after their deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_frozen_calls_time_out_and_memory_stays_flat() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new(RULES);
    let timeout = Duration::from_millis(250);
    let server = Slidegate::start(
        &rules.dir(),
        &["--redis-url", &redis.url(), "--redis-timeout", "250ms"],
    );
    assert!(wait_until(Duration::from_secs(10), || healthy(&server)));

    // Warm up with the same concurrency, so allocator pools and connections exist before measuring.
    let req = request(&[("user", "frozen")]);
    let stop = Arc::new(AtomicBool::new(false));
    let warm = load(&server, req.clone(), 64, Duration::ZERO, Arc::clone(&stop)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let warm = warm.await.expect("warm-up");
    assert!(warm.iter().all(|s| s.answer == Answer::Store(Code::Ok)));

    let zcard = || redis.cli(&["ZCARD", "slidegate:{faults:user=frozen}60000"]);
    let hits_before: u64 = zcard().parse().expect("ZCARD");
    send_signal(redis.process.pid(), "STOP");
    let frozen_at = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let run = load(&server, req.clone(), 128, Duration::ZERO, Arc::clone(&stop)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rss_early = server.rss_kib();
    let mut rss_max = rss_early;
    while frozen_at.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        rss_max = rss_max.max(server.rss_kib());
    }
    let health_down = server.get("/healthcheck").0 == 503;
    stop.store(true, Ordering::SeqCst);
    let samples = run.await.expect("load");
    send_signal(redis.process.pid(), "CONT");

    for s in &samples {
        assert!(
            s.elapsed < timeout + Duration::from_millis(750),
            "a call took {:?} against a frozen Redis (timeout {timeout:?})",
            s.elapsed
        );
        match &s.answer {
            Answer::Error(tonic::Code::Unavailable, _) => {}
            other => panic!("unexpected answer against a frozen Redis: {other:?}"),
        }
    }
    // Clients get no internals: the kind of each failure is in the metrics.
    let timed_out = metric_value(
        &metrics(&server),
        r#"slidegate_store_errors_total{kind="timeout"}"#,
    ) as usize;
    eprintln!(
        "{} calls against a frozen Redis ({timed_out} timed out); RSS {rss_early} KiB after 1.5 s, \
         at most {rss_max} KiB",
        samples.len()
    );
    assert!(samples.len() >= 500, "only {} calls", samples.len());
    assert!(
        timed_out * 2 >= samples.len(),
        "{timed_out} of {}",
        samples.len()
    );
    assert!(
        rss_max < rss_early + 8 * 1024,
        "RSS grew from {rss_early} KiB to {rss_max} KiB while Redis was frozen"
    );
    assert!(health_down, "health stayed SERVING with a frozen Redis");

    // Thawed: decided by Redis again (the backlog it read meanwhile is processed first).
    let mut client = server.client().await;
    let back = Instant::now();
    loop {
        let answer = classify(client.should_rate_limit(req.clone()).await);
        if answer == Answer::Store(Code::Ok) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "not back 10 s after SIGCONT: {answer:?}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("back {:?} after SIGCONT", back.elapsed());
    assert!(wait_until(Duration::from_secs(5), || healthy(&server)));
    // Calls that timed out were still in Redis's socket buffer: once thawed, Redis ran them, past
    // their deadline, so they recorded nothing (docs/operations.md, "A call that timed out").
    let hits_after: u64 = zcard().parse().expect("ZCARD");
    let recorded = hits_after.saturating_sub(hits_before + 1);
    let expired = metric_value(&metrics(&server), "slidegate_redis_deadline_expired_total");
    eprintln!("hits recorded by calls answered UNAVAILABLE: {recorded}; {expired} calls expired");
    assert_eq!(recorded, 0, "hits of timed-out calls were recorded");
    assert!(expired >= 1.0, "no expired call counted");
}

/// Envoy sends its call timeout as `grpc-timeout`. With Redis frozen and a long store timeout,
/// a call whose deadline passes first is answered `DEADLINE_EXCEEDED` at its deadline, not held
/// until the store gives up; a call without one waits for the store timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_deadline_ends_the_call_before_the_store_timeout() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new(RULES);
    let server = Slidegate::start(
        &rules.dir(),
        &["--redis-url", &redis.url(), "--redis-timeout", "3s"],
    );
    assert!(wait_until(Duration::from_secs(10), || healthy(&server)));
    let mut client = server.client().await;
    let req = request(&[("user", "deadline")]);
    let warm = classify(client.should_rate_limit(req.clone()).await);
    assert_eq!(warm, Answer::Store(Code::Ok));

    send_signal(redis.process.pid(), "STOP");
    // Written by hand: tonic's client would enforce the deadline itself and hide the server's.
    let started = Instant::now();
    let answer = raw_should_rate_limit(
        server.grpc_port,
        &[("grpc-timeout", "300m")],
        grpc_frame(&req.encode_to_vec()),
    )
    .await;
    let with_deadline = started.elapsed();
    let started = Instant::now();
    let without = classify(client.should_rate_limit(req.clone()).await);
    let without_deadline = started.elapsed();
    send_signal(redis.process.pid(), "CONT");

    // DEADLINE_EXCEEDED is 4.
    assert_eq!(answer.status.as_deref(), Some("4"), "{answer:?}");
    assert!(
        with_deadline >= Duration::from_millis(300) && with_deadline < Duration::from_millis(1500),
        "a 300 ms deadline answered after {with_deadline:?}"
    );
    assert!(
        matches!(without, Answer::Error(tonic::Code::Unavailable, _)),
        "{without:?}"
    );
    assert!(
        without_deadline >= Duration::from_millis(2500),
        "no deadline, 3 s store timeout, answered after {without_deadline:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster failover

/// The Redis key of a counter of `user=value` (default prefix, a minute window).
fn user_key(value: &str) -> String {
    format!("slidegate:{{{DOMAIN}:user={value}}}60000")
}

/// (port, node id) of the master serving `key`, from `CLUSTER NODES` of a live node.
fn master_of(cluster: &RedisCluster, live: &RedisServer, key: &str) -> (u16, String) {
    let slot: u16 = live
        .cli(&["CLUSTER", "KEYSLOT", key])
        .parse()
        .expect("keyslot");
    for line in live.cli(&["CLUSTER", "NODES"]).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
            continue;
        }
        let serves = fields[8..].iter().any(|range| {
            let mut ends = range.split('-').filter_map(|n| n.parse::<u16>().ok());
            match (ends.next(), ends.next()) {
                (Some(a), Some(b)) => (a..=b).contains(&slot),
                (Some(a), None) => a == slot,
                _ => false,
            }
        });
        if serves {
            let port = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .expect("port");
            assert!(cluster.nodes.iter().any(|n| n.port == port));
            return (port, fields[0].to_string());
        }
    }
    panic!("no master serves slot {slot}");
}

/// A 3-master, 3-replica Redis Cluster (node timeout 1 s). The master serving one counter is
/// killed with SIGKILL; its replica is promoted by the cluster.
///
/// Proves: calls whose counters live on other masters keep being decided by Redis during the
/// failover, every one of them; calls on the failed master's slot
/// fail by the failure mode (never hang: each within the timeout plus a margin), then are decided
/// by the promoted replica within a tolerant bound (15 s) without restarting slidegate; and the
/// promoted replica continues the counter (the hits counted before the failover still count).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_master_killed_replica_promoted() {
    let Some(mut cluster) = RedisCluster::start_with_replicas(3, 1, 1000) else {
        return;
    };
    let rules = Rules::new(RULES);
    let seeds: Vec<String> = cluster.urls();
    let server = Slidegate::start(
        &rules.dir(),
        &[
            "--redis-cluster",
            &seeds.join(","),
            "--redis-timeout",
            "500ms",
        ],
    );
    assert!(
        wait_until(Duration::from_secs(15), || healthy(&server)),
        "{}",
        server.log()
    );

    // A value on the master to kill, and one on another master.
    let probe = &cluster.nodes[0];
    let victim_value = "victim".to_string();
    let (victim_port, victim_id) = master_of(&cluster, probe, &user_key(&victim_value));
    let other_value = (0..1000)
        .map(|i| format!("other{i}"))
        .find(|v| master_of(&cluster, probe, &user_key(v)).0 != victim_port)
        .expect("a value on another master");

    let mut client = server.client().await;
    let victim_req = request(&[("user", &victim_value)]);
    let other_req = request(&[("user", &other_value)]);
    for _ in 0..5 {
        assert_eq!(
            classify(client.should_rate_limit(victim_req.clone()).await),
            Answer::Store(Code::Ok)
        );
        assert_eq!(
            classify(client.should_rate_limit(other_req.clone()).await),
            Answer::Store(Code::Ok)
        );
    }
    // Let the replica catch up (replication is asynchronous), then kill the master.
    let victim_index = cluster
        .nodes
        .iter()
        .position(|n| n.port == victim_port)
        .expect("victim node");
    let replica_synced = wait_until(Duration::from_secs(5), || {
        cluster.nodes.iter().any(|n| {
            n.port != victim_port
                && n.cli(&["INFO", "replication"])
                    .contains(&format!("master_port:{victim_port}"))
                && n.cli(&["DBSIZE"]) != "0"
        })
    });
    assert!(replica_synced, "the replica never got the counter");
    // Each node the calls used has its own state series.
    let node_up = |port: u16| {
        let series = format!("slidegate_redis_node_up{{node=\"127.0.0.1:{port}\"}}");
        metric_value(&metrics(&server), &series)
    };
    assert_eq!(node_up(victim_port), 1.0, "{}", metrics(&server));
    let victim = cluster.nodes.remove(victim_index);
    let killed_at = Instant::now();
    drop(victim);

    let timeout = Duration::from_millis(500);
    // Steady load on the other master's slot, from its own connections.
    let stop = Arc::new(AtomicBool::new(false));
    let other_run = load(
        &server,
        other_req.clone(),
        2,
        Duration::from_millis(10),
        Arc::clone(&stop),
    )
    .await;
    let mut recovered: Option<(Duration, RateLimitResponse)> = None;
    while killed_at.elapsed() < Duration::from_secs(20) {
        let started = Instant::now();
        let victim = client.should_rate_limit(victim_req.clone()).await;
        assert!(
            started.elapsed() < timeout + Duration::from_secs(1),
            "a call on the failed slot took {:?}",
            started.elapsed()
        );
        if let Ok(response) = victim {
            let response = response.into_inner();
            if response.statuses[0].duration_until_reset.is_some() {
                recovered = Some((killed_at.elapsed(), response));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let other = other_run.await.expect("load");
    let nodes = cluster.nodes[0].cli(&["CLUSTER", "NODES"]);
    let (after, response) = recovered.unwrap_or_else(|| {
        panic!(
            "the failed slot did not recover in 20 s\nnodes:\n{nodes}\nlog:\n{}",
            server.log()
        )
    });
    let other_failures: Vec<(Duration, Duration, &Answer)> = other
        .iter()
        .filter(|s| s.answer != Answer::Store(Code::Ok))
        .map(|s| (s.started - killed_at, s.elapsed, &s.answer))
        .collect();
    eprintln!(
        "failed slot back after {after:?}; other slot: {} of {} calls failed: {other_failures:?}",
        other_failures.len(),
        other.len()
    );
    assert!(after < Duration::from_secs(15), "recovered after {after:?}");
    // The replica that took over is a master now, and not the killed node.
    let (new_port, new_id) = master_of(&cluster, &cluster.nodes[0], &user_key(&victim_value));
    assert_ne!(
        (new_port, new_id.as_str()),
        (victim_port, victim_id.as_str())
    );
    // The killed node's series says so; the promoted replica's says it serves.
    assert_eq!(node_up(victim_port), 0.0, "{}", metrics(&server));
    assert_eq!(node_up(new_port), 1.0, "{}", metrics(&server));
    // 5 hits before the failover and this one: the promoted replica kept the counter.
    assert_eq!(response.statuses[0].limit_remaining, 100_000 - 6);
    // The other master was never down: every call answered in time and decided by Redis (the
    // cluster runs with `cluster-require-full-coverage no`; with the default `yes` Redis itself
    // refuses every slot from the moment the master is marked failed until the promotion).
    // redis-rs holds every call, on every node, while it refreshes its slot map after the failed
    // slot's errors; on a loaded machine a refresh can outlast the timeout, so a few calls (at
    // most 2%) may time out during the failover, and only then, never fail otherwise.
    for s in &other {
        assert!(s.elapsed < timeout + Duration::from_secs(1), "{s:?}");
    }
    let held = |(started, _, answer): &(Duration, Duration, &Answer)| {
        *started < after
            && matches!(answer, Answer::Error(tonic::Code::Unavailable, m) if m.contains("timed out"))
    };
    assert!(
        other_failures.iter().all(held) && other_failures.len() * 50 <= other.len(),
        "other slot failed {} of {} times: {other_failures:?}",
        other_failures.len(),
        other.len()
    );
    for _ in 0..20 {
        assert_eq!(
            classify(client.should_rate_limit(other_req.clone()).await),
            Answer::Store(Code::Ok)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Reload faults

/// Waits until `slidegate_config_reloads_total{result="failure"}` reaches `n`.
fn wait_failures(server: &Slidegate, n: usize) -> bool {
    wait_until(Duration::from_secs(10), || {
        metric_value(
            &metrics(server),
            r#"slidegate_config_reloads_total{result="failure"}"#,
        ) >= n as f64
    })
}

/// `tight=t` is over its limit (2 per minute, used up at the start), and `user` still has its
/// old limit: the previous rules are serving, with their counters.
async fn old_rules_still_serve(client: &mut RateLimitServiceClient<Channel>, what: &str) {
    let r = client
        .should_rate_limit(request(&[("tight", "t")]))
        .await
        .expect("call")
        .into_inner();
    assert_eq!(r.overall_code(), Code::OverLimit, "after {what}: {r:?}");
    let r = client
        .should_rate_limit(request(&[("user", "u")]))
        .await
        .expect("call")
        .into_inner();
    let limit = r.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit),
        ("per_user", 100_000),
        "after {what}"
    );
}

/// The rule lines of `/rlconfig` (not its `#` header, which shows the on-disk checksum).
fn rule_lines(server: &Slidegate) -> Vec<String> {
    let (status, body) = server.get("/rlconfig");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Replaces `path` (whatever it is now) by `make`.
fn replace(path: &Path, make: impl FnOnce(&Path)) {
    if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path).expect("remove dir");
    } else if path.symlink_metadata().is_ok() {
        std::fs::remove_file(path).expect("remove file");
    }
    make(path);
}

/// One way to break the rule file: its name, what it does to the path, a fragment of the reason
/// slidegate must log, and whether it is a fault in a directory of several rule files too
/// (deleting one file there, or replacing it by a directory, removes its domain on purpose).
struct Fault {
    what: &'static str,
    make: Box<dyn Fn(&Path)>,
    reason: &'static str,
    in_directory: bool,
}

fn faults() -> Vec<Fault> {
    let truncated = &RULES[..RULES.find("requests_per_unit: 2").expect("rule") + 9];
    vec![
        Fault {
            what: "garbage",
            make: Box::new(|p| std::fs::write(p, b"\x00\xff\xfe{{{ ]]] :: \x01").expect("write")),
            reason: "",
            in_directory: true,
        },
        Fault {
            what: "truncated mid-write",
            make: Box::new(move |p| std::fs::write(p, truncated).expect("write")),
            reason: "",
            in_directory: true,
        },
        Fault {
            what: "truncated to nothing",
            make: Box::new(|p| std::fs::write(p, "").expect("write")),
            reason: "empty file",
            in_directory: true,
        },
        Fault {
            what: "a dangling symlink",
            make: Box::new(|p| {
                std::os::unix::fs::symlink("/nonexistent/slidegate-rules.yaml", p).expect("symlink")
            }),
            reason: "cannot read",
            in_directory: true,
        },
        Fault {
            what: "a FIFO (reading it would block forever)",
            make: Box::new(|p| {
                let status = std::process::Command::new("mkfifo")
                    .arg(p)
                    .status()
                    .expect("mkfifo");
                assert!(status.success());
            }),
            reason: "not a regular file",
            in_directory: true,
        },
        Fault {
            what: "deleted",
            make: Box::new(|_| {}),
            reason: "cannot read",
            in_directory: false,
        },
        Fault {
            what: "replaced by a directory",
            make: Box::new(|p| std::fs::create_dir(p).expect("mkdir")),
            reason: "no rule files",
            in_directory: false,
        },
    ]
}

/// Runs every fault against a server watching `config` (the rule file, or its directory), whose
/// rule file is `file`. Between faults the good file is put back.
async fn reload_faults(config: &Path, file: &Path) -> Slidegate {
    let server = Slidegate::start(config, &[]);
    let mut client = server.client().await;
    for _ in 0..2 {
        let r = client
            .should_rate_limit(request(&[("tight", "t")]))
            .await
            .expect("call");
        assert_eq!(r.into_inner().overall_code(), Code::Ok);
    }
    old_rules_still_serve(&mut client, "start").await;
    let rlconfig = rule_lines(&server);
    let rules_loaded = metric_value(&metrics(&server), "slidegate_rules_loaded");
    assert!(rules_loaded >= 2.0);

    let mut failures = 0;
    let in_directory = config.is_dir();
    for Fault {
        what,
        make,
        reason,
        in_directory: applies,
    } in faults()
    {
        if in_directory && !applies {
            continue;
        }
        let log_before = server.log().len();
        replace(file, |p| make(p));
        failures += 1;
        assert!(
            wait_failures(&server, failures),
            "{what}: no failed reload counted\n{}",
            server.log()
        );
        old_rules_still_serve(&mut client, what).await;
        assert_eq!(rule_lines(&server), rlconfig, "{what}");
        let m = metrics(&server);
        assert_eq!(
            metric_value(&m, "slidegate_rules_loaded"),
            rules_loaded,
            "{what}"
        );
        assert!(
            healthy(&server),
            "{what}: health must not depend on a bad reload"
        );
        // Logged with the file and the reason.
        let log = server.log();
        let new = &log[log_before..];
        let line = new
            .lines()
            .find(|l| l.contains("rule reload failed"))
            .unwrap_or_else(|| panic!("{what}: no log line\n{new}"));
        let shown = if config.is_dir() { config } else { file };
        assert!(
            line.contains(&shown.display().to_string()) && line.contains("reason="),
            "{what}: {line}"
        );
        assert!(line.contains(reason), "{what}: {line} lacks {reason:?}");
        eprintln!("{what}: {line}");
        // SIGHUP re-reads the broken file: another failure, counted and survived.
        server.signal("HUP");
        failures += 1;
        assert!(
            wait_failures(&server, failures),
            "{what}: SIGHUP not counted"
        );
        old_rules_still_serve(&mut client, what).await;

        // Put the good file back (a reload of the same rules may or may not be counted).
        replace(file, |p| std::fs::write(p, RULES).expect("write"));
        tokio::time::sleep(Duration::from_millis(600)).await;
        failures = metric_value(
            &metrics(&server),
            r#"slidegate_config_reloads_total{result="failure"}"#,
        ) as usize;
        old_rules_still_serve(&mut client, "restoring").await;
    }
    server
}

/// `--config` is the rule file itself. It is overwritten with garbage, truncated in the middle of
/// a line, truncated to nothing, deleted, replaced by a directory and by a dangling symlink (tests
/// run as root, for whom `chmod 000` does not make a file unreadable; a directory or a dangling
/// symlink does, for anyone).
///
/// Proves, for each: the previous rules keep serving (a counter used up before still denies, the
/// old limit still applies, `/rlconfig` and `slidegate_rules_loaded` unchanged); the failure is
/// counted in `slidegate_config_reloads_total{result="failure"}` (and again on SIGHUP) and logged
/// with the file and the reason; health stays SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_faults_keep_the_previous_rules_single_file() {
    let rules = Rules::new(RULES);
    drop(reload_faults(&rules.file(), &rules.file()).await);
}

/// As above with `--config` a directory holding the rule file and a second domain's file: the
/// broken file must not silently drop its domain either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_faults_keep_the_previous_rules_directory() {
    let rules = Rules::new(RULES);
    std::fs::write(
        rules.dir().join("other.yaml"),
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    )
    .expect("write other");
    let server = reload_faults(&rules.dir(), &rules.file()).await;

    // Deleting one file of several is how a domain is removed: a successful reload.
    let successes = |server: &Slidegate| {
        metric_value(
            &metrics(server),
            r#"slidegate_config_reloads_total{result="success"}"#,
        )
    };
    let before = successes(&server);
    std::fs::remove_file(rules.dir().join("other.yaml")).expect("delete other.yaml");
    assert!(wait_until(Duration::from_secs(10), || successes(&server) > before));
    assert_eq!(
        metric_value(&metrics(&server), "slidegate_rules_loaded"),
        2.0
    );
    assert!(!server.get("/rlconfig").1.contains("other"));
}

// ---------------------------------------------------------------------------------------------
// SIGTERM under load

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

// ---------------------------------------------------------------------------------------------
// Redis requiring client certificates

/// Redis over TLS with `tls-auth-clients yes`. Proves: slidegate given `--redis-tls-cert-file`
/// and `--redis-tls-key-file` (as `SLIDEGATE_*` variables) is healthy and decides by Redis (the
/// third call on a limit of 2 is denied); one without them stays up, answers by its failure mode
/// (`allow`: 200, and so stays SERVING) and logs why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_requiring_a_client_certificate() {
    let Some(redis) = TlsRedisServer::start(&["--tls-auth-clients", "yes"]) else {
        return;
    };
    let rules = Rules::new(RULES);
    let url = redis.url(None);
    let ca = redis.ca_file.to_string_lossy().into_owned();
    let common = [
        "--redis-url",
        &url,
        "--redis-tls-ca-file",
        &ca,
        "--redis-timeout",
        "500ms",
        "--failure-mode",
        "allow",
    ];
    let cert = redis.client_cert_file.to_string_lossy().into_owned();
    let key = redis.client_key_file.to_string_lossy().into_owned();
    let with_cert = Slidegate::start_with_env(
        &rules.dir(),
        &common,
        &[
            ("SLIDEGATE_REDIS_TLS_CERT_FILE", &cert),
            ("SLIDEGATE_REDIS_TLS_KEY_FILE", &key),
        ],
    );
    let without = Slidegate::start(&rules.dir(), &common);

    assert!(
        wait_until(Duration::from_secs(10), || healthy(&with_cert)),
        "not healthy with a client certificate:\n{}",
        with_cert.log()
    );
    let http = reqwest::Client::new();
    let check = async |server: &Slidegate| {
        let mut answers = Vec::new();
        for _ in 0..3 {
            let response = http
                .get(server.url("/check"))
                .header("x-ratelimit-domain", DOMAIN)
                .header("x-ratelimit-descriptor", "tight=mtls")
                .send()
                .await
                .expect("GET /check");
            answers.push(response.status().as_u16());
        }
        answers
    };
    let answers = check(&with_cert).await;
    assert_eq!(answers, [200, 200, 429], "{}", with_cert.log());

    // rustls names the server's refusal.
    let refused = wait_until(Duration::from_secs(5), || {
        without.log().contains("CertificateRequired")
    });
    assert!(refused, "no reason logged:\n{}", without.log());
    let answers = check(&without).await;
    assert_eq!(answers, [200, 200, 200], "failure mode allow");
    // Readiness stays: under `allow` the replica answers every request (the store errors alert).
    assert_eq!(without.get("/healthcheck").0, 200);
    assert!(server_alive(&without), "{}", without.log());
    let log = without.log();
    assert!(!log.contains("panicked"), "{log}");
}
