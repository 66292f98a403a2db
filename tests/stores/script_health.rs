//! Which Redis servers can decide, and what health says about those that cannot: the real
//! `slidegate` binary against real redis-server processes (the one `SLIDEGATE_REDIS_SERVER`
//! names, else Debian's; `.ci/run` runs this module against Redis 6.2 as well as 7).
//!
//! - Redis 6.x cannot read the script's `#!lua` header: the store sends it without, and decides
//!   as on 7.x.
//! - A store that cannot be reached is an outage: NOT_SERVING while it lasts under slidegate's own
//!   settings, SERVING with `--health-ignores-store-outage` and under envoyproxy/ratelimit's
//!   environment unless `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true`.
//! - A store that answers but cannot run the script (`EVALSHA` renamed away, forbidden by an
//!   ACL) is NOT_SERVING under every setting, logged at `error` (once per 30 s, not per call) and
//!   counted.

use std::time::Duration;

use crate::restartable_redis::RestartableRedis;
use crate::support::{
    RedisServer, Slidegate, descriptor, metric_value, redis_server_major, wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const RULES: &str = r#"
domain: script
descriptors:
  - key: exact
    rate_limit: { unit: minute, requests_per_unit: 5, precision: exact }
  - key: buckets
    rate_limit: { unit: minute, requests_per_unit: 5, precision: 6s }
"#;

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

/// The overall code of one call for `key=value`, or the gRPC error.
async fn call(server: &Slidegate, key: &str, value: &str) -> Result<Code, tonic::Status> {
    let request = crate::support::request("script", vec![descriptor(&[(key, value)])]);
    server
        .client()
        .await
        .should_rate_limit(request)
        .await
        .map(|r: tonic::Response<RateLimitResponse>| r.into_inner().overall_code())
}

fn healthcheck(server: &Slidegate) -> u16 {
    server.get("/healthcheck").0
}

/// Health settles at `want` within a few checks (one per second).
fn settles_at(server: &Slidegate, want: u16) -> bool {
    wait_until(Duration::from_secs(10), || healthcheck(server) == want)
}

/// envoyproxy/ratelimit's environment for a Redis on `port`, with `extra` variables.
fn envoy_ratelimit_env(port: u16, extra: &[(&'static str, &'static str)]) -> Vec<(String, String)> {
    let mut env = vec![
        ("REDIS_SOCKET_TYPE".to_string(), "tcp".to_string()),
        ("REDIS_URL".to_string(), format!("127.0.0.1:{port}")),
        ("USE_STATSD".to_string(), "false".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

fn start_with_env(rules: &std::path::Path, env: &[(String, String)]) -> Slidegate {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Slidegate::start_with_env(rules, &[], &env)
}

/// A limit of 5 per minute, as an exact log and as buckets, on the Redis under test.
///
/// Proves: on every supported version (6.2 and 7.x in CI) the calls are decided by Redis (five
/// allowed, the sixth denied, for both representations), health is SERVING, and no call failed.
/// Before the store knew Redis 6, every call there failed (UNAVAILABLE) while health said SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_supported_redis_decides_and_health_says_so() {
    let Some(major) = redis_server_major() else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &redis.url(), "--redis-deny-cache", "0"],
    );
    for key in ["exact", "buckets"] {
        for n in 1..=5 {
            let code = call(&server, key, "a").await;
            assert_eq!(
                code.ok(),
                Some(Code::Ok),
                "{key} call {n}:\n{}",
                server.log()
            );
        }
        assert_eq!(call(&server, key, "a").await.ok(), Some(Code::OverLimit));
    }
    assert!(settles_at(&server, 200), "{}", server.log());
    let (_, metrics) = server.get("/metrics");
    assert_eq!(
        metric_value(&metrics, r#"slidegate_redis_calls_total{result="ok"}"#),
        12.0,
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "slidegate_redis_incompatible_total"),
        0.0
    );
    let headerless = server.log().contains("runs without its flags line");
    assert_eq!(headerless, major < 7, "Redis {major}:\n{}", server.log());
}

/// Redis answers but has no `EVALSHA` (`rename-command EVALSHA ""`, as some managed services
/// do), under slidegate's own settings, with `--health-ignores-store-outage`, and under
/// envoyproxy/ratelimit's environment without `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`.
///
/// Proves: NOT_SERVING under all three from the start; a call fails (UNAVAILABLE); the log has
/// one `ERROR` naming the cause for many failures (calls and health probes); the failures are
/// counted in `slidegate_redis_incompatible_total` and `slidegate_redis_calls_total{result=
/// "incompatible"}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_cannot_run_the_script_is_not_serving_under_every_setting() {
    let Some(redis) = RedisServer::start_with(&["--rename-command", "EVALSHA", ""]) else {
        return;
    };
    let rules = rules();
    let own = Slidegate::start(rules.path(), &["--redis-url", &redis.url()]);
    let ignoring = Slidegate::start(
        rules.path(),
        &["--redis-url", &redis.url(), "--health-ignores-store-outage"],
    );
    let envoy_ratelimit = start_with_env(rules.path(), &envoy_ratelimit_env(redis.port, &[]));
    for server in [&own, &ignoring, &envoy_ratelimit] {
        assert_eq!(healthcheck(server), 503, "{}", server.log());
        let status = call(server, "exact", "a").await.expect_err("decided");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), "rate-limit store unavailable");
        let (_, metrics) = server.get("/metrics");
        assert!(
            metric_value(
                &metrics,
                r#"slidegate_store_errors_total{kind="incompatible"}"#
            ) >= 1.0,
            "{metrics}"
        );
    }
    for _ in 0..5 {
        let _ = call(&own, "exact", "a").await;
    }
    // A few health probes more, each one failing.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(healthcheck(&own), 503);
    let log = own.log();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Redis answers but cannot run the rate-limit script"))
        .collect();
    assert_eq!(errors.len(), 1, "one error for many failures:\n{log}");
    assert!(
        errors[0].contains("ERROR") && errors[0].contains("unknown command"),
        "{log}"
    );
    assert!(
        log.contains("store answers but cannot run the rate-limit script: not serving"),
        "{log}"
    );
    let (_, metrics) = own.get("/metrics");
    assert!(
        metric_value(&metrics, "slidegate_redis_incompatible_total") >= 8.0,
        "6 calls and 2+ probes:\n{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            r#"slidegate_redis_calls_total{result="incompatible"}"#
        ),
        6.0,
        "{metrics}"
    );
}

/// A Redis user whose ACL forbids `EVALSHA` (`-evalsha`).
///
/// Proves: the `NOPERM` answer is an incompatible store, not an outage: NOT_SERVING even with
/// `--health-ignores-store-outage`, and the error names the ACL's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_forbidding_evalsha_is_not_serving() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    assert_eq!(
        redis.cli(&[
            "ACL", "SETUSER", "limiter", "on", ">secret", "~*", "+@all", "-evalsha"
        ]),
        "OK"
    );
    let rules = rules();
    let url = format!("redis://limiter:secret@127.0.0.1:{}", redis.port);
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &url, "--health-ignores-store-outage"],
    );
    assert_eq!(healthcheck(&server), 503, "{}", server.log());
    assert!(call(&server, "exact", "a").await.is_err());
    let log = server.log();
    assert!(
        log.contains("ERROR") && log.contains("no permissions to run the 'evalsha' command"),
        "{log}"
    );
    assert!(!log.contains("secret"), "{log}");
}

/// Redis goes away (SIGKILL) under four slidegates: slidegate's own settings,
/// `--health-ignores-store-outage`, envoyproxy/ratelimit's environment without and with
/// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true`; then comes back on the same port.
///
/// Proves: all four are SERVING while Redis answers; during the outage the first and the last
/// are NOT_SERVING and the other two SERVING (their calls still fail by the failure mode); after
/// it all four are SERVING again. An outage is not an incompatible store: nothing is logged at
/// `error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_follows_the_health_setting() {
    let Some(mut redis) = RestartableRedis::start(&[]) else {
        return;
    };
    let rules = rules();
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let own = Slidegate::start(rules.path(), &["--redis-url", &url]);
    let ignoring = Slidegate::start(
        rules.path(),
        &["--redis-url", &url, "--health-ignores-store-outage"],
    );
    let envoy_ratelimit = start_with_env(rules.path(), &envoy_ratelimit_env(redis.port, &[]));
    let active = start_with_env(
        rules.path(),
        &envoy_ratelimit_env(
            redis.port,
            &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")],
        ),
    );
    let all = [
        (&own, 503),
        (&ignoring, 200),
        (&envoy_ratelimit, 200),
        (&active, 503),
    ];
    for (server, _) in all {
        assert!(settles_at(server, 200), "{}", server.log());
    }
    redis.kill();
    for (server, during) in all {
        assert!(
            settles_at(server, during),
            "want {during}:\n{}",
            server.log()
        );
    }
    // Stays so: checked twice more a second apart.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_secs(1));
        for (server, during) in all {
            assert_eq!(healthcheck(server), during, "{}", server.log());
        }
    }
    assert!(call(&ignoring, "exact", "a").await.is_err());
    redis.restart();
    for (server, _) in all {
        assert!(settles_at(server, 200), "{}", server.log());
        assert!(!server.log().contains("ERROR"), "{}", server.log());
    }
}
