//! Redis connections that go stale do not fail requests: through the binary against a real
//! `redis-server`, after Redis closes idle connections (`timeout 1`, as managed services, NAT
//! gateways and load balancers do) and after a `kill -9` and a restart on the same port, every
//! call is answered, and a burst of concurrent calls on one counter (batched into script calls)
//! counts each admitted hit exactly once. The same for a Redis Cluster and a Sentinel's primary
//! closing idle connections.

use std::time::Duration;

use crate::restartable_redis::RestartableRedis;
use crate::support::sentinel::{MASTER, SentinelSet};
use crate::support::{RedisCluster, Slidegate, wait_until};

const RULES: &str = r#"
domain: stale
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1000 }
"#;

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

/// `n` concurrent `POST /json` calls, on one counter `user=value` (hits 1 each): their statuses.
async fn burst(server: &Slidegate, value: &str, n: usize) -> Vec<u16> {
    let client = reqwest::Client::new();
    let body = format!(
        r#"{{"domain":"stale","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
    );
    let calls = (0..n).map(|_| {
        let request = client.post(server.url("/json")).body(body.clone()).send();
        async move { request.await.map_or(0, |r| r.status().as_u16()) }
    });
    futures::future::join_all(calls).await
}

/// What the counter `user=value` holds (a check of 0 hits).
async fn held(server: &Slidegate, value: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"stale","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}],"hitsAddend":0}}]}}"#
    );
    let answer = server.post_json(&body).await;
    let left = answer["statuses"][0]["limitRemaining"]
        .as_u64()
        .unwrap_or(0);
    1000 - left
}

/// After each idle pause longer than Redis's `timeout`, a burst of calls: all answered 200, and
/// the counter holds exactly the admitted hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_closed_by_redis_fail_no_call() {
    let Some(redis) = RestartableRedis::start(&["--timeout", "1"]) else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(rules.path(), &["--redis-url", &redis.url()]);
    bursts_survive_idle_closes(&server, "standalone").await;
}

/// `kill -9` and a restart on the same port (a crash, a failover behind one address): once
/// health answers 200 again, every call is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_fails_no_call_once_health_is_back() {
    let Some(mut redis) = RestartableRedis::start(&[]) else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(rules.path(), &["--redis-url", &redis.url()]);
    assert!(wait_until(Duration::from_secs(10), || server
        .get("/healthcheck")
        .0
        == 200));
    let statuses = burst(&server, "before", 12).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    for round in 0..2 {
        redis.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.restart();
        assert!(
            wait_until(Duration::from_secs(10), || server.get("/healthcheck").0
                == 200),
            "round {round}: health\n{}",
            server.log()
        );
        let value = format!("after{round}");
        let statuses = burst(&server, &value, 24).await;
        assert!(
            statuses.iter().all(|&s| s == 200),
            "round {round}: {statuses:?}\n{}",
            server.log()
        );
        assert_eq!(held(&server, &value).await, 24, "round {round}");
    }
}

/// Bursts of calls separated by idle pauses longer than the servers' `timeout` (1 s): every call
/// answered 200, and the counter holding exactly the admitted hits.
async fn bursts_survive_idle_closes(server: &Slidegate, what: &str) {
    assert!(wait_until(Duration::from_secs(10), || server
        .get("/healthcheck")
        .0
        == 200));
    let mut admitted = 0;
    for round in 0..3 {
        let statuses = burst(server, "idle", 24).await;
        assert!(
            statuses.iter().all(|&s| s == 200),
            "{what}, round {round}: {statuses:?}\n{}",
            server.log()
        );
        admitted += statuses.len() as u64;
        assert_eq!(
            held(server, "idle").await,
            admitted,
            "{what}, round {round}"
        );
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_closed_by_a_cluster_fail_no_call() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    for node in &cluster.nodes {
        node.cli(&["CONFIG", "SET", "timeout", "1"]);
    }
    let rules = rules();
    let nodes = cluster.urls().join(",");
    let server = Slidegate::start(rules.path(), &["--redis-cluster", &nodes]);
    bursts_survive_idle_closes(&server, "cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_closed_by_a_sentinel_primary_fail_no_call() {
    let Some(set) = SentinelSet::start() else {
        return;
    };
    if let Some(primary) = &set.primary {
        primary.cli(&["CONFIG", "SET", "timeout", "1"]);
    }
    let rules = rules();
    let sentinels = set.addrs();
    let args = [
        "--redis-sentinel",
        &sentinels,
        "--redis-sentinel-master",
        MASTER,
    ];
    let server = Slidegate::start(rules.path(), &args);
    bursts_survive_idle_closes(&server, "sentinel").await;
}
