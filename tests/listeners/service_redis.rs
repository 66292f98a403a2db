//! The service with a real redis-server: replicas sharing counters, the failure modes (`error`,
//! `allow`, `deny`) and health when Redis is gone, and worker threads deciding on the same
//! counters with the memory store and with Redis.

use std::time::Duration;

use crate::service_fixture::{
    Server, get_text_blocking, headers, health_status, limit, reset_secs,
};
use crate::support::{RedisServer, call, descriptor, free_port, request, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_is_shared_by_replicas() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let a = Server::start(&["--redis-url", &url, "--redis-prefix", "sg-test:"]);
    let b = Server::start(&["--redis-url", &url, "--redis-prefix", "sg-test:"]);
    assert!(wait_until(Duration::from_secs(10), || {
        get_text_blocking(&a.url("/healthcheck")).starts_with("OK")
    }));
    let req = request("test", vec![descriptor(&[("user", "r")])]);
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    assert_eq!(
        call(&mut ca, req.clone()).await.statuses[0].limit_remaining,
        2
    );
    assert_eq!(
        call(&mut cb, req.clone()).await.statuses[0].limit_remaining,
        1
    );
    let r = call(&mut ca, req.clone()).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!((59.0..=60.0).contains(&reset_secs(&r.statuses[0])));
    let r = call(&mut cb, req.clone()).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert!(headers(&r).contains_key("retry-after"));
    let keys = redis.cli(&["--scan", "--pattern", "sg-test:*"]);
    assert!(keys.contains("sg-test:{test:user=r}60000"), "{keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failure_modes_and_health() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let server = Server::start(&["--redis-url", &url, "--redis-timeout", "200ms"]);
    assert!(wait_until(Duration::from_secs(10), || {
        get_text_blocking(&server.url("/healthcheck")).starts_with("OK")
    }));
    let mut client = server.client().await;
    let req = request(
        "test",
        vec![
            descriptor(&[("user", "f")]),
            descriptor(&[("nothing", "f")]),
        ],
    );
    assert_eq!(
        call(&mut client, req.clone()).await.overall_code(),
        Code::Ok
    );

    drop(redis);
    // Failure mode error: UNAVAILABLE, and health goes down.
    let status = client
        .should_rate_limit(req.clone())
        .await
        .expect_err("store is down");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let down = wait_until(Duration::from_secs(10), || {
        get_text_blocking(&server.url("/healthcheck")).starts_with("NOT_SERVING")
    });
    assert!(down, "health did not flip; log:\n{}", server.log());
    let health = health_status(server.channel().await, "ratelimit").await;
    assert_eq!(health.ok(), Some(ServingStatus::NotServing));
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"f"}]}]}"#;
    let r = reqwest::Client::new()
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("json");
    assert_eq!(r.status(), 503);
    let m = server.metrics().await;
    assert!(m.get(r#"slidegate_failure_mode_total{mode="error"}"#) >= 2.0);
    let errors: f64 = ["timeout", "connection", "refused", "backend"]
        .iter()
        .map(|k| m.get(&format!(r#"slidegate_store_errors_total{{kind="{k}"}}"#)))
        .sum();
    assert!(errors >= 2.0, "{}", m.0);

    // allow and deny, against a port where nothing listens.
    let dead = format!("redis://127.0.0.1:{}", free_port());
    for (mode, code) in [("allow", Code::Ok), ("deny", Code::OverLimit)] {
        let server = Server::start(&[
            "--redis-url",
            &dead,
            "--redis-timeout",
            "100ms",
            "--failure-mode",
            mode,
        ]);
        let mut client = server.client().await;
        let r = call(&mut client, req.clone()).await;
        assert_eq!(r.overall_code(), code, "{mode}");
        assert_eq!(r.statuses[0].code(), code, "{mode}");
        assert_eq!(
            limit(&r.statuses[0]),
            Some(("per_user".into(), 3, Unit::Minute))
        );
        assert_eq!(r.statuses[1].code(), Code::Ok, "no rule stays OK");
        let m = server.metrics().await;
        assert_eq!(
            m.get(&format!(r#"slidegate_failure_mode_total{{mode="{mode}"}}"#)),
            1.0
        );
        let check = reqwest::Client::new()
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test")
            .header("x-ratelimit-descriptor", "user=f")
            .send()
            .await
            .expect("check");
        assert_eq!(check.status(), if mode == "allow" { 200 } else { 429 });
        // Readiness stays: under `allow` and `deny` the replica answers every request.
        assert_eq!(server.get("/healthcheck").await.status(), 200);
    }
}

/// Connections are dealt out to the worker threads, and every worker decides on the same
/// counters: calls over eight connections to four workers admit exactly the limit, with the
/// memory store and with Redis (where each worker has a Redis connection of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_share_counters_across_connections() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    // A long Redis timeout: four workers on a loaded two-core machine can stall a call past the
    // default 50 ms, and this test is about sharing counters, not about timeouts.
    let redis_store = ["--redis-url", url.as_str(), "--redis-timeout", "5s"];
    for store in [&[][..], &redis_store[..]] {
        let server = Server::start(&[&["--workers", "4"], store].concat());
        let workers = || {
            std::fs::read_dir(format!("/proc/{}/task", server.pid()))
                .expect("/proc")
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with("slidegate-worke"))
                .count()
        };
        // The listeners open before the worker threads start.
        wait_until(Duration::from_secs(10), || workers() == 4);
        assert_eq!(workers(), 4, "one thread per worker");

        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(server.client().await);
        }
        let req = request("test", vec![descriptor(&[("user", "workers")])]);
        let calls = clients.into_iter().map(|mut client| {
            let req = req.clone();
            tokio::spawn(async move {
                let mut allowed = 0;
                for _ in 0..5 {
                    if call(&mut client, req.clone()).await.overall_code() == Code::Ok {
                        allowed += 1;
                    }
                }
                allowed
            })
        });
        let mut allowed = 0;
        for handle in calls.collect::<Vec<_>>() {
            allowed += handle.await.expect("client task");
        }
        assert_eq!(
            allowed, 3,
            "limit 3 per minute over 40 calls, store {store:?}"
        );
        if !store.is_empty() {
            // Ours (CLIENT LIST), the main thread's and one per worker that took a connection.
            let clients = redis.cli(&["CLIENT", "LIST"]);
            assert!(
                clients.lines().count() > 3,
                "workers use Redis connections of their own:\n{clients}"
            );
        }
    }
}
