//! `slidegate-bench` against the real binary: dialing again after a server restart (measured run
//! and `--prefill`), its exit codes, and `--target redis://` writing the very counters a server
//! writes.

use std::time::{Duration, Instant};

use crate::service_fixture::Server;
use crate::support::{RedisServer, Slidegate, bench_command, free_port, metric_sum, run_ok};

/// `slidegate-bench` rides out a server restart: calls fail while nothing listens, then the
/// generator dials again and loads the new server on the same port. It still reports the run, and
/// exits 3 so that a script does not take the failed calls for a measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_dials_again_after_the_server_restarts() {
    let args = ["--duration", "4s", "--warmup", "0s", "--json"];
    let (output, second) = bench_across_a_restart(&args, 500.0).await;
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    let errors = report["errors"].as_u64().expect("errors");
    assert!(
        errors > 0,
        "no call failed while the server was down: {report}"
    );
    assert_eq!(output.status.code(), Some(3), "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{errors} of ")) && stderr.contains("calls failed"),
        "{stderr}"
    );
    let served = grpc_calls_served(&second);
    assert!(
        served > 100.0,
        "the restarted server served {served} calls: the generator did not dial again"
    );
}

/// The same during `--prefill`: the prefill goes on against the restarted server. The measured
/// phase is paced at 10 calls per second, so nearly all the calls the new server sees are the
/// prefill's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prefill_dials_again_after_the_server_restarts() {
    let args = ["--prefill", "20", "--keys", "500"];
    let paced = ["--duration", "200ms", "--rate", "10"];
    let (output, second) = bench_across_a_restart(&[&args[..], &paced[..]].concat(), 500.0).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("prefilled 500 keys x 20"),
        "the prefill ran into the restart: {stderr}"
    );
    let served = grpc_calls_served(&second);
    assert!(
        served > 1000.0,
        "the restarted server served {served} calls: the prefill did not dial again\n{stderr}"
    );
}

/// `slidegate-bench`'s exit code is an interface: 2 for arguments it refuses, 1 when there is
/// nothing to measure (no server listening), both with a message and no report. (3, a run with
/// failed calls, and 0 are checked by the restart test and the Redis baseline test.)
#[test]
fn bench_exit_codes_tell_bad_arguments_from_no_server() {
    let nothing_listens = format!("http://127.0.0.1:{}", free_port());
    let cases: [(&[&str], i32, &str); 3] = [
        (
            &["--descriptors", "0"],
            2,
            "--descriptors must be at least 1",
        ),
        (&["--concurrency", "nine"], 2, "--concurrency"),
        (&["--duration", "1s"], 1, "cannot connect"),
    ];
    for (args, code, message) in cases {
        let out = bench_command()
            .args(["--json", "--target", &nothing_listens])
            .args(args)
            .output()
            .expect("run slidegate-bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: a report without a run");
    }
}

/// `slidegate-bench --target redis://` is the baseline of a Redis-store run: slidegate's own store
/// called from the generator, no server in between. It must write the very counters a server with
/// `bench/scripts/bench`'s rule (100 per second) writes for the same requests, make at most one script
/// call per request, and count allowed and denied calls from the store's decisions.
#[test]
fn bench_calls_redis_directly_with_the_servers_counters() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // Every command goes to the slow log, with its arguments: the keys the scripts were run on,
    // which expire a second after their last hit.
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let keys_written = || {
        let log = redis.cli(&["SLOWLOG", "GET", "128"]);
        redis.cli(&["SLOWLOG", "RESET"]);
        let mut keys: Vec<String> = log
            .lines()
            // Counter keys: not the reset generation a server with a deny cache reads, the
            // node's clock every recording call moves, nor the two keys the health probe names
            // (and leaves alone) to find a cluster node.
            .filter(|line| line.starts_with("slidegate:"))
            .filter(|line| {
                ![
                    "slidegate:resets",
                    "slidegate:clock",
                    "slidegate:probe{0}",
                    "slidegate:probe{1}",
                ]
                .contains(line)
            })
            .map(str::to_string)
            .collect();
        keys.dedup();
        keys
    };
    let bench = |target: &str| {
        let mut command = bench_command();
        command.args(["--target", target, "--json", "--keys", "1"]);
        command.args(["--duration", "1s", "--warmup", "0s", "--timeout", "2s"]);
        command.args(["--concurrency", "4", "--connections", "2"]);
        let out = run_ok(&mut command, "slidegate-bench");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        let count = |field: &str| report[field].as_u64().expect(field);
        let (requests, allowed) = (count("requests"), count("allowed"));
        assert_eq!(count("errors"), 0, "{report}");
        assert_eq!(allowed + count("denied"), requests, "{report}");
        // One key, 100 per sliding second, four workers flat out for one second: the first 100
        // are allowed, and at most 100 more as the window slides; the rest are denied.
        assert!((100..=200).contains(&allowed), "{report}");
        assert!(requests > allowed, "nothing was denied: {report}");
        requests
    };
    let key = "slidegate:{bench:client=0-0}1000";

    let requests = bench(&redis.url());
    let evalsha = redis.command_calls("evalsha");
    // Every request went to Redis (no deny cache), in script calls of one to four requests (the
    // calls a generator thread has in flight at once), plus one NOSCRIPT answer for each of the
    // (at most 4) calls sent before the script was loaded.
    assert!(
        (requests / 4..=requests + 4).contains(&evalsha),
        "{evalsha} EVALSHA for {requests} requests"
    );
    assert_eq!(keys_written(), [key]);

    // A server with the same rule, loaded the same way, runs the script on the same key.
    let rules = r#"
domain: bench
descriptors:
  - key: client
    rate_limit: { unit: second, requests_per_unit: 100 }
"#;
    let server = Server::start_with_rules(rules, &["--redis-url", &redis.url()]);
    bench(&server.grpc_uri());
    assert_eq!(keys_written(), [key]);
}

/// Runs `slidegate-bench` (8 workers on 2 connections, plus `args`) against a server that is
/// killed once it has answered `after_calls` calls (progress, not time, so that a faster machine
/// does not finish first) and started again on the same port; returns the generator's output,
/// once it has exited with a report (0, or 3 if calls failed), and the second server.
async fn bench_across_a_restart(
    args: &[&str],
    after_calls: f64,
) -> (std::process::Output, Slidegate) {
    let first = Server::start(&[]);
    let bench = bench_command()
        .args(["--target", &first.grpc_uri(), "--timeout", "500ms"])
        .args(["--concurrency", "8", "--connections", "2", "--threads", "1"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn slidegate-bench");
    let deadline = Instant::now() + Duration::from_secs(30);
    while grpc_calls_served(&first) < after_calls {
        assert!(Instant::now() < deadline, "the generator made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = restart(first).await;
    let output = tokio::task::spawn_blocking(move || bench.wait_with_output())
        .await
        .expect("join")
        .expect("bench output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "bench failed: {:?} {stderr}",
        output.status
    );
    (output, second)
}

/// Kills `server` (SIGKILL: its connections die with it) and starts a new one on the same port
/// with the same rules, 300 ms later.
async fn restart(server: Server) -> Slidegate {
    let port = server.grpc_port;
    let rules = server
        .rules_file()
        .parent()
        .expect("rules dir")
        .to_path_buf();
    let Server {
        slidegate,
        rules: kept,
    } = server;
    drop(slidegate);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = Slidegate::start_on(&rules, port, &[], &[]);
    drop(kept);
    second
}

/// gRPC calls a server has answered, from its metrics.
fn grpc_calls_served(server: &Slidegate) -> f64 {
    let (status, text) = server.get("/metrics");
    assert_eq!(status, 200, "GET /metrics: {text}");
    metric_sum(
        &text,
        "slidegate_request_duration_seconds_count",
        "transport=\"grpc\"",
    )
}
