//! Redis Sentinel: the real `slidegate` binary against a real primary, replica and three
//! sentinels (`redis-server FILE --sentinel`), started by the test on free ports.
//!
//! The failover test SIGKILLs the primary under `slidegate-bench` load and checks what an
//! operator pages on: no call fails beyond the failure mode's answers, limits are enforced again
//! within [`RECOVERY_BOUND`] of the sentinels naming the new primary, and two instances on the
//! promoted primary admit exactly N of a burst. The startup tests check that a missing sentinel
//! set or an unknown master name stops `serve` quickly, with an error that names what was tried
//! and no password.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::sentinel::{MASTER, SentinelServer, SentinelSet};
use crate::support::{
    CertFiles, KillOnDrop, RedisServer, Slidegate, bench_command, descriptor, free_port,
    metric_value, request, slidegate_command, wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use futures::future::join_all;

/// How soon after the sentinels name the new primary slidegate enforces limits again (stated
/// in docs/operations.md, "Redis Sentinel"): a lookup every 100 ms while the primary is missing, plus
/// one lookup and a connection.
const RECOVERY_BOUND: Duration = Duration::from_secs(1);

/// `client`: the bench load; `probe`: 1 per minute, so once used, only a deciding store denies
/// it (with `--failure-mode allow` a failing store admits); `burst`: the exactness check.
const RULES: &str = r#"
domain: sentinel
descriptors:
  - key: client
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: probe
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: burst
    rate_limit: { unit: minute, requests_per_unit: 10 }
"#;

fn rules_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, RULES).expect("rules");
    path
}

async fn probe(server: &Slidegate) -> Code {
    let mut client = server.client().await;
    let req = request("sentinel", vec![descriptor(&[("probe", "p")])]);
    match client.should_rate_limit(req).await {
        Ok(answer) => answer.into_inner().overall_code(),
        Err(status) => panic!("ShouldRateLimit failed: {status:?}"),
    }
}

/// SIGKILL of the primary under load, with `--failure-mode allow`: every call is answered, the
/// store follows the promoted replica, limits hold again within [`RECOVERY_BOUND`] of the
/// promotion, and afterwards two instances admit exactly 10 of a burst of 40 on one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_under_load_and_stays_exact() {
    let Some(mut set) = SentinelSet::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = rules_file(&dir);
    let sentinels = set.addrs();
    let args = [
        "--redis-sentinel",
        &sentinels,
        "--redis-sentinel-master",
        MASTER,
        "--failure-mode",
        "allow",
        // Every probe goes to Redis (a cached deny would hide a store that does not decide).
        "--redis-deny-cache",
        "0",
    ];
    let first = Slidegate::start(&rules, &args);
    assert_eq!(probe(&first).await, Code::Ok);
    assert_eq!(probe(&first).await, Code::OverLimit, "the store decides");

    let bench = bench_command()
        .args(["--target", &first.grpc_uri(), "--json"])
        .args(["--domain", "sentinel", "--key", "client", "--keys", "50"])
        .args(["--duration", "8s", "--warmup", "0s", "--timeout", "2s"])
        .args(["--concurrency", "8", "--connections", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn slidegate-bench");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let old_primary = set.primary.as_ref().map(|p| p.port).expect("a primary");
    let killed = set.kill_primary();
    // Watch the sentinels and the probe at once: promotion as the test's sentinel sees it, and
    // the first deny after the kill (the store deciding again, on the new primary).
    let mut promoted = None;
    let mut enforced = None;
    let mut failed_open = false;
    while enforced.is_none() || promoted.is_none() {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no recovery 30 s after the kill (promoted: {promoted:?}):\n{}",
            first.log()
        );
        if promoted.is_none() && set.sentinels[0].primary_port() == Some(set.replica.port) {
            promoted = Some(Instant::now());
        }
        if enforced.is_none() {
            match probe(&first).await {
                Code::OverLimit if failed_open => enforced = Some(Instant::now()),
                Code::Ok => failed_open = true,
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (promoted, enforced) = (promoted.unwrap_or(killed), enforced.unwrap_or(killed));
    let lag = enforced.saturating_duration_since(promoted);
    eprintln!(
        "promotion {:?} after the kill; limits enforced {:?} after the kill, {lag:?} after the promotion",
        promoted - killed,
        enforced - killed
    );
    assert!(
        lag < RECOVERY_BOUND,
        "limits enforced {lag:?} after the promotion:\n{}",
        first.log()
    );

    // Not killed on a failed assertion above: it ends by itself after its --duration.
    let output = tokio::task::spawn_blocking(move || bench.wait_with_output())
        .await
        .expect("join")
        .expect("bench output");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "bench report ({e}): {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");
    assert!(report["requests"].as_u64() > Some(100), "{report}");
    assert_eq!(output.status.code(), Some(0), "{report}");

    let (_, metrics) = first.get("/metrics");
    assert_eq!(
        metric_value(&metrics, "slidegate_store_failovers_total"),
        1.0
    );
    // The node's series follows the primary: the killed one is down, the promoted one up.
    let node_up = |port: u16| {
        let series = format!("slidegate_redis_node_up{{node=\"127.0.0.1:{port}\"}}");
        metric_value(&metrics, &series)
    };
    assert_eq!(
        (node_up(old_primary), node_up(set.replica.port)),
        (0.0, 1.0),
        "{metrics}"
    );
    let failed_open = metric_value(&metrics, "slidegate_failure_mode_total{mode=\"allow\"}");
    assert!(failed_open > 0.0);
    eprintln!("{failed_open} calls answered by the failure mode; bench: {report}");

    // Exactness after the failover: a second instance (fresh) and the first (failed over) share
    // the promoted primary; 40 concurrent calls on one key with a limit of 10 admit exactly 10.
    let second = Slidegate::start(&rules, &args);
    let mut clients = Vec::new();
    for server in [&first, &second] {
        for _ in 0..4 {
            clients.push(server.client().await);
        }
    }
    let calls = (0..40).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        async move {
            let req = request("sentinel", vec![descriptor(&[("burst", "b")])]);
            let answer = client.should_rate_limit(req).await.expect("answered");
            answer.into_inner().overall_code()
        }
    });
    let codes = join_all(calls).await;
    let admitted = codes.iter().filter(|c| **c == Code::Ok).count();
    assert_eq!(admitted, 10, "{codes:?}");
    let (_, metrics) = second.get("/metrics");
    assert_eq!(
        metric_value(&metrics, "slidegate_failure_mode_total{mode=\"allow\"}"),
        0.0,
        "the burst was decided by the store"
    );
}

/// Runs `slidegate serve` with `args` and waits (at most 20 s) for it to exit; returns the exit
/// code, its stderr and how long it ran.
fn serve_until_exit(args: &[&str]) -> (Option<i32>, String, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = rules_file(&dir);
    let log_path = dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let started = Instant::now();
    let mut child = KillOnDrop(
        slidegate_command()
            .arg("serve")
            .arg("--config")
            .arg(&rules)
            .args(["--grpc-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
            .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn slidegate serve"),
    );
    let mut status = None;
    wait_until(Duration::from_secs(20), || {
        status = child.0.try_wait().ok().flatten();
        status.is_some()
    });
    let elapsed = started.elapsed();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(status.is_some(), "serve still runs after 20 s:\n{text}");
    (status.and_then(|s| s.code()), text, elapsed)
}

/// No sentinel answers: `serve` exits non-zero within a few seconds, naming each sentinel it
/// tried and the master name, and neither password.
#[test]
fn serve_stops_when_no_sentinel_answers() {
    let (a, b) = (free_port(), free_port());
    let sentinels = format!("127.0.0.1:{a},127.0.0.1:{b}");
    let (code, log, elapsed) = serve_until_exit(&[
        "--redis-sentinel",
        &sentinels,
        "--redis-sentinel-master",
        "orders",
        "--redis-sentinel-password",
        "hunter2",
        "--redis-url",
        "redis://:s3cret@orders",
    ]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}:\n{log}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    for expected in [
        format!("127.0.0.1:{a}"),
        format!("127.0.0.1:{b}"),
        "\"orders\"".into(),
    ] {
        assert!(log.contains(&expected), "{expected} missing:\n{log}");
    }
    assert!(!log.contains("hunter2") && !log.contains("s3cret"), "{log}");
}

/// Sentinels that answer but do not know the master name: `serve` exits non-zero quickly, the
/// error says so, naming the name and the sentinel; the sentinel's password (right, here) is
/// not shown.
#[test]
fn serve_stops_when_the_sentinels_do_not_know_the_master_name() {
    let Some(primary) = RedisServer::start() else {
        return;
    };
    let Some(sentinel) = SentinelServer::start(primary.port, &["requirepass hunter2"]) else {
        return;
    };
    let addr = format!("127.0.0.1:{}", sentinel.port);
    let (code, log, elapsed) = serve_until_exit(&[
        "--redis-sentinel",
        &addr,
        "--redis-sentinel-master",
        "no-such-master",
        "--redis-sentinel-password",
        "hunter2",
    ]);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}:\n{log}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert!(log.contains(&addr), "{log}");
    assert!(log.contains("\"no-such-master\""), "{log}");
    assert!(log.contains("knows no master of that name"), "{log}");
    assert!(!log.contains("hunter2"), "{log}");
}

/// envoyproxy/ratelimit's `REDIS_TYPE=sentinel`, `REDIS_URL=MASTER,HOST:PORT` and
/// `REDIS_SENTINEL_AUTH` start slidegate on the primary the sentinel names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_ratelimit_sentinel_variables_work() {
    let Some(primary) = RedisServer::start_with(&["--requirepass", "primary-pw"]) else {
        return;
    };
    let sentinel_lines = [
        "requirepass sentinel-pw",
        &format!("sentinel auth-pass {MASTER} primary-pw"),
    ];
    let Some(sentinel) = SentinelServer::start(primary.port, &sentinel_lines) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = rules_file(&dir);
    let url = format!("{MASTER},127.0.0.1:{}", sentinel.port);
    let env = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_AUTH", "primary-pw"),
        ("REDIS_SENTINEL_AUTH", "sentinel-pw"),
    ];
    let server = Slidegate::start_with_env(&rules, &[], &env);
    assert_eq!(probe(&server).await, Code::Ok);
    assert_eq!(probe(&server).await, Code::OverLimit);
    let keys = primary.cli(&["-a", "primary-pw", "--no-auth-warning", "KEYS", "*probe*"]);
    assert!(
        keys.contains("probe"),
        "the counter is on the primary: {keys:?}"
    );
    assert!(!server.log().contains("-pw"), "{}", server.log());
}

/// TLS to the sentinel and to the primary (`rediss://` entry, `--redis-url rediss://...`), both
/// trusted through `--redis-tls-ca-file`; without that CA, `serve` stops naming the sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_and_primary_over_tls() {
    let ca = CertFiles::new();
    let tls_args = ca.server_args();
    let primary_port = free_port();
    let port_arg = primary_port.to_string();
    let mut args: Vec<&str> = vec!["--port", "0", "--tls-port", &port_arg];
    args.extend(tls_args.iter().map(String::as_str));
    let Some(_primary) = RedisServer::spawn(&args, primary_port) else {
        return;
    };
    let sentinel_tls_port = free_port();
    let path = |p: &PathBuf| p.display().to_string();
    let lines = [
        format!("tls-port {sentinel_tls_port}"),
        format!("tls-cert-file {}", path(&ca.cert_file)),
        format!("tls-key-file {}", path(&ca.key_file)),
        format!("tls-ca-cert-file {}", path(&ca.ca_file)),
        "tls-auth-clients no".to_string(),
        "tls-replication yes".to_string(),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let Some(sentinel) = SentinelServer::start(primary_port, &lines) else {
        return;
    };
    let known = wait_until(Duration::from_secs(10), || {
        sentinel.primary_port() == Some(primary_port)
    });
    assert!(known, "the sentinel does not name the primary");
    let entry = format!("rediss://127.0.0.1:{sentinel_tls_port}");
    let ca_file = path(&ca.ca_file);
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = rules_file(&dir);
    let flags = [
        "--redis-sentinel",
        &entry,
        "--redis-sentinel-master",
        MASTER,
        "--redis-url",
        "rediss://primary",
        // A TLS handshake of a debug build on a busy machine can take longer than 50 ms.
        "--redis-timeout",
        "1s",
    ];
    let mut with_ca: Vec<&str> = flags.to_vec();
    with_ca.extend(["--redis-tls-ca-file", &ca_file]);
    let server = Slidegate::start(&rules, &with_ca);
    assert_eq!(probe(&server).await, Code::Ok);
    assert_eq!(probe(&server).await, Code::OverLimit);
    drop(server);

    let (code, log, _) = serve_until_exit(&flags);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}:\n{log}");
    assert!(
        log.contains(&format!("127.0.0.1:{sentinel_tls_port}")),
        "{log}"
    );
}
