//! Fault tests: Redis Cluster failover. A master is killed, its replica promoted; calls on other
//! masters keep being decided, the failed slot recovers without a restart and keeps its counter.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::faults_fixture::{
    Answer, DOMAIN, RULES, Rules, classify, healthy, load, metrics, request,
};
use crate::support::{RedisCluster, RedisServer, Slidegate, metric_value, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

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
