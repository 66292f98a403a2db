//! What Redis does to the counters when it stalls, fills up or restarts, and what slidegate's
//! store metrics say about it: the real `slidegate` binary against real redis-server processes.
//!
//! - A call that reaches Redis after its deadline (Redis paused with `CLIENT PAUSE` longer than
//!   `--redis-timeout`) records nothing, and is counted as expired.
//! - Redis at `maxmemory` with `noeviction` refuses the script: calls fail by the failure mode,
//!   counted as `oom`, logged; they succeed again once memory is freed. An evicting
//!   `maxmemory-policy` is warned about.
//! - With AOF (`appendfsync always`) a Redis killed and restarted keeps the windows; without
//!   persistence the counters start empty.
//!
//! Windows are long (a minute) so that nothing leaves them during a test; waits are bounded
//! generously for a slow, shared machine.

use std::time::{Duration, Instant};

use crate::restartable_redis::RestartableRedis;
use crate::support::{
    Slidegate, descriptor, metric_value, promtool_check_metrics, redis_server_major, wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use futures::future::join_all;
use tonic::transport::Channel;

const RULES: &str = r#"
domain: health
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 100000, precision: exact }
  - key: tight
    rate_limit: { unit: minute, requests_per_unit: 5, precision: exact }
"#;

/// The sorted set of `key=value`'s one-minute counter.
fn counter(key: &str, value: &str) -> String {
    format!("slidegate:{{health:{key}={value}}}60000")
}

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

/// The answer to one call: the overall code, or the gRPC error.
async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
    value: &str,
) -> Result<Code, tonic::Status> {
    let request = crate::support::request("health", vec![descriptor(&[(key, value)])]);
    client
        .should_rate_limit(request)
        .await
        .map(|r: tonic::Response<RateLimitResponse>| r.into_inner().overall_code())
}

fn metrics(server: &Slidegate) -> String {
    let (status, body) = server.get("/metrics");
    assert_eq!(status, 200, "GET /metrics");
    body
}

fn zcard(redis: &RestartableRedis, key: &str) -> u64 {
    redis.cli(&["ZCARD", key]).parse().unwrap_or(0)
}

/// Redis is paused (`CLIENT PAUSE ... ALL`) for longer than `--redis-timeout` while 64 calls
/// are in flight; each times out (UNAVAILABLE). When the pause ends Redis runs them all.
///
/// Proves: the counter holds no hit of those calls afterwards (without the deadline, every one of
/// them was recorded); `slidegate_redis_deadline_expired_total` counts the expired calls,
/// `slidegate_redis_calls_total{result="timeout"}` the timed-out ones, and no call is counted as
/// recorded late; calls are decided by Redis again after the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_reach_redis_after_their_deadline_record_nothing() {
    let Some(redis) = RestartableRedis::start(&[]) else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &redis.url(), "--redis-timeout", "200ms"],
    );
    let mut client = server.client().await;
    // Replies before the pause tell the store Redis's clock.
    for _ in 0..20 {
        assert_eq!(
            call(&mut client, "user", "paused").await.expect("warm-up"),
            Code::Ok
        );
    }
    let key = counter("user", "paused");
    assert_eq!(zcard(&redis, &key), 20);

    assert_eq!(redis.cli(&["CLIENT", "PAUSE", "1500", "ALL"]), "OK");
    let paused = Instant::now();
    let calls = (0..64).map(|_| {
        let server = &server;
        async move {
            let mut client = server.client().await;
            call(&mut client, "user", "paused").await
        }
    });
    let answers = join_all(calls).await;
    assert!(
        paused.elapsed() < Duration::from_millis(1500),
        "the calls outlasted the pause: {:?}",
        paused.elapsed()
    );
    for answer in &answers {
        let status = answer
            .as_ref()
            .expect_err("a call decided while Redis was paused");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }

    // After the pause: decided by Redis again.
    let back = wait_until(Duration::from_secs(10), || redis.cli(&["PING"]) == "PONG");
    assert!(back);
    let mut decided = false;
    for _ in 0..100 {
        if call(&mut client, "user", "paused").await.is_ok() {
            decided = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(decided, "not decided after the pause:\n{}", server.log());
    assert_eq!(
        zcard(&redis, &key),
        21,
        "hits of calls that timed out were recorded"
    );

    let text = metrics(&server);
    let expired = metric_value(&text, "slidegate_redis_deadline_expired_total");
    let timed_out = metric_value(&text, r#"slidegate_redis_calls_total{result="timeout"}"#);
    let errors = metric_value(&text, r#"slidegate_store_errors_total{kind="timeout"}"#);
    eprintln!("{timed_out} script calls timed out, {expired} expired, {errors} decisions failed");
    assert!(timed_out >= 1.0 && expired >= 1.0, "{text}");
    assert_eq!(errors, 64.0);
    assert_eq!(
        metric_value(&text, "slidegate_redis_late_recorded_total"),
        0.0
    );
    assert!(metric_value(&text, r#"slidegate_redis_calls_total{result="ok"}"#) >= 21.0);
    promtool_check_metrics(rules.path(), &text);
}

/// Redis with `maxmemory` and `noeviction` is filled past its limit (`DEBUG POPULATE` in another
/// database), then emptied again. The same on Redis 6.x (`SLIDEGATE_REDIS_SERVER`), whose script
/// makes the check up front that the `#!lua` header makes on 7.x.
///
/// Proves: while full, every call fails by the failure mode (`error`: UNAVAILABLE naming "out of
/// memory"), is counted as `kind="oom"` / `result="oom"`, and records nothing; one warning names
/// the cause in the log (not one per call); the node stays up; once memory is freed calls are
/// decided again. `noeviction` is not warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_fails_by_the_failure_mode_then_recovers() {
    let Some(major) = redis_server_major() else {
        return;
    };
    let mut args = vec!["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"];
    // Redis 6 allows DEBUG without being asked.
    if major >= 7 {
        args.extend(["--enable-debug-command", "local"]);
    }
    let Some(redis) = RestartableRedis::start(&args) else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(
        rules.path(),
        &[
            "--redis-url",
            &redis.url(),
            "--redis-timeout",
            "500ms",
            "--redis-deny-cache",
            "0",
        ],
    );
    let mut client = server.client().await;
    assert_eq!(
        call(&mut client, "user", "oom").await.expect("call"),
        Code::Ok
    );
    let key = counter("user", "oom");

    assert_eq!(
        redis.cli(&["-n", "1", "DEBUG", "POPULATE", "60000", "filler", "100"]),
        "OK"
    );
    for _ in 0..20 {
        let status = call(&mut client, "user", "oom")
            .await
            .expect_err("decided while Redis is out of memory");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        // The kind is in the metrics below and the log; clients get no internals.
        assert_eq!(status.message(), "rate-limit store unavailable");
    }
    assert_eq!(zcard(&redis, &key), 1, "hits recorded past maxmemory");
    let text = metrics(&server);
    assert_eq!(
        metric_value(&text, r#"slidegate_store_errors_total{kind="oom"}"#),
        20.0
    );
    assert_eq!(
        metric_value(&text, r#"slidegate_redis_calls_total{result="oom"}"#),
        20.0
    );
    let node = format!(
        r#"slidegate_redis_node_up{{node="127.0.0.1:{}"}}"#,
        redis.port
    );
    assert_eq!(metric_value(&text, &node), 1.0, "{text}");
    let log = server.log();
    assert_eq!(
        log.matches("Redis is out of memory").count(),
        1,
        "one warning for 20 refusals:\n{log}"
    );

    assert_eq!(redis.cli(&["-n", "1", "FLUSHDB"]), "OK");
    assert_eq!(
        call(&mut client, "user", "oom").await.expect("call"),
        Code::Ok
    );
    assert_eq!(zcard(&redis, &key), 2);
    assert!(!server.log().contains("can evict"), "{}", server.log());
    promtool_check_metrics(rules.path(), &metrics(&server));
}

/// Redis runs with `maxmemory-policy allkeys-lru`, then (after a restart) `volatile-lru`.
///
/// Proves: slidegate warns, naming the policy, when it first reaches Redis and again when it
/// reconnects after an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_maxmemory_policy_is_warned_about_at_start_and_on_reconnect() {
    let Some(mut redis) = RestartableRedis::start(&["--maxmemory-policy", "allkeys-lru"]) else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(rules.path(), &["--redis-url", &redis.url()]);
    assert!(
        wait_until(Duration::from_secs(10), || server
            .log()
            .contains("maxmemory-policy allkeys-lru can evict")),
        "no warning:\n{}",
        server.log()
    );
    redis.kill();
    let mut client = server.client().await;
    assert!(call(&mut client, "user", "policy").await.is_err());
    redis.restart();
    assert_eq!(
        redis.cli(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]),
        "OK"
    );
    assert!(
        wait_until(Duration::from_secs(10), || server
            .log()
            .contains("maxmemory-policy volatile-lru can evict")),
        "no warning after the reconnect:\n{}",
        server.log()
    );
}

/// Fills `tight=value` (5 per minute) and checks the sixth call is denied.
async fn fill(client: &mut RateLimitServiceClient<Channel>, value: &str) {
    for i in 0..5 {
        assert_eq!(
            call(client, "tight", value).await.expect("call"),
            Code::Ok,
            "call {i}"
        );
    }
    assert_eq!(
        call(client, "tight", value).await.expect("call"),
        Code::OverLimit
    );
}

/// The first answer Redis decides after a restart (failures meanwhile are the failure mode).
async fn first_decision(client: &mut RateLimitServiceClient<Channel>, value: &str) -> Code {
    let started = Instant::now();
    loop {
        if let Ok(code) = call(client, "tight", value).await {
            return code;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no decision");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A Redis with AOF (`appendonly yes`, `appendfsync always`) is killed (SIGKILL) after a limit
/// of 5 was used up, and started again on the same port and directory.
///
/// Proves: the window survives: the next calls are denied and the counter holds the 5 hits
/// (nothing admitted beyond N across the restart), without a restart of slidegate (the deny cache
/// is off, so Redis decides). The node gauge reads 0 while Redis is down and 1 after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_a_restarted_redis_keeps_the_windows() {
    let Some(mut redis) =
        RestartableRedis::start(&["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &redis.url(), "--redis-deny-cache", "0"],
    );
    let mut client = server.client().await;
    fill(&mut client, "aof").await;

    redis.kill();
    assert!(call(&mut client, "tight", "aof").await.is_err());
    let node = format!(
        r#"slidegate_redis_node_up{{node="127.0.0.1:{}"}}"#,
        redis.port
    );
    assert_eq!(metric_value(&metrics(&server), &node), 0.0);
    redis.restart();
    assert_eq!(first_decision(&mut client, "aof").await, Code::OverLimit);
    for _ in 0..5 {
        assert_eq!(
            call(&mut client, "tight", "aof").await.expect("call"),
            Code::OverLimit
        );
    }
    assert_eq!(zcard(&redis, &counter("tight", "aof")), 5);
    let text = metrics(&server);
    assert_eq!(metric_value(&text, &node), 1.0);
    let failed = ["connection", "refused", "timeout"].map(|result| {
        metric_value(
            &text,
            &format!(r#"slidegate_redis_calls_total{{result="{result}"}}"#),
        )
    });
    assert!(failed.iter().sum::<f64>() >= 1.0, "{text}");
    promtool_check_metrics(rules.path(), &text);
}

/// The same without persistence: the restarted Redis starts empty and the limit starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_persistence_a_restarted_redis_starts_empty() {
    let Some(mut redis) = RestartableRedis::start(&[]) else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &redis.url(), "--redis-deny-cache", "0"],
    );
    let mut client = server.client().await;
    fill(&mut client, "plain").await;
    redis.restart();
    assert_eq!(first_decision(&mut client, "plain").await, Code::Ok);
    assert_eq!(zcard(&redis, &counter("tight", "plain")), 1);
}
