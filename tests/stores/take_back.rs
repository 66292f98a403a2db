//! A late take-back on a Redis Cluster: a cross-slot request records its hits on one node while
//! the other node, asleep (`DEBUG SLEEP`), holds its deny back; meanwhile its bucket leaves the
//! window and another request fills the counter. The compensation that finally comes must take
//! back only what the bucket still holds (nothing: it left), never the other request's hits; nor
//! take again what a refund that came first took.

use std::time::{Duration, Instant};

use crate::support::RedisCluster;
use slidegate::store::{Counter, CounterKey, Precision, RedisOptions, RedisStore, Store};

const W: Duration = Duration::from_secs(1);
const G: Duration = Duration::from_millis(100);

fn counter(name: &str, limit: u64, hits: u64) -> Counter {
    let precision = Precision::Buckets(G);
    Counter {
        key: CounterKey::new("take-back", [("k", name)], W),
        kind: slidegate::store::HitKind::Admitted,
        limit,
        window: W,
        hits,
        shadow: false,
        precision,
    }
}

/// The store on `cluster` under `prefix`, without the deny cache (every call goes to Redis).
async fn store_on(cluster: &RedisCluster, prefix: &str) -> RedisStore {
    RedisStore::connect(&RedisOptions {
        cluster_nodes: cluster.urls(),
        prefix: prefix.to_string(),
        timeout: Duration::from_secs(4),
        deny_cache: 0,
        ..RedisOptions::default()
    })
    .await
    .expect("connect")
}

/// A cluster whose nodes take `DEBUG SLEEP` (Redis 6 allows DEBUG without being asked).
fn cluster_with_debug() -> Option<RedisCluster> {
    let major = crate::support::redis_server_major()?;
    let debug = |_| match major {
        7.. => vec!["--enable-debug-command".to_string(), "local".to_string()],
        _ => Vec::new(),
    };
    RedisCluster::start_with(&debug)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_take_back_never_removes_another_requests_hits() {
    let Some(cluster) = cluster_with_debug() else {
        return;
    };
    let prefix = "sgtakeback:";
    let store = store_on(&cluster, prefix).await;
    let a = counter("a", 5, 2);
    let node_a = cluster
        .node_for(&format!("{prefix}{}", a.key.as_str()))
        .port;
    // A counter that always denies, on another node.
    let b = (0..)
        .map(|i| counter(&format!("b{i}"), 0, 1))
        .find(|b| {
            cluster
                .node_for(&format!("{prefix}{}", b.key.as_str()))
                .port
                != node_a
        })
        .expect("a key on another node");
    let sleeper = cluster.node_for(&format!("{prefix}{}", b.key.as_str()));
    // A first call on each slot, so the script is loaded and the slots known.
    let probe = |c: &Counter| Counter {
        hits: 0,
        ..c.clone()
    };
    store.decide(&[probe(&a)]).await.expect("a");
    store.decide(&[probe(&b)]).await.expect("b");

    let sleep = std::process::Command::new("redis-cli")
        .args(["-p", &sleeper.port.to_string(), "DEBUG", "SLEEP", "1.6"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli DEBUG SLEEP");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let first = {
        let (store, a, b) = (&store, a.clone(), b.clone());
        async move { store.decide(&[a, b]).await.expect("the first request") }
    };
    let second = async {
        // After the first request's bucket has left the window (W + G after it at most).
        tokio::time::sleep(W + G + Duration::from_millis(50)).await;
        let d = store
            .decide(&[counter("a", 5, 3)])
            .await
            .expect("the second request");
        assert!(d.allowed, "the first request's hits left: {d:?}");
        assert_eq!(d.counters[0].count, 3, "{d:?}");
    };
    let (first, ()) = tokio::join!(first, second);
    assert!(!first.allowed, "b denies: {first:?}");
    let slept = sleep.wait_with_output().expect("redis-cli DEBUG SLEEP");
    assert_eq!(
        String::from_utf8_lossy(&slept.stdout).trim(),
        "OK",
        "the node slept"
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed < W + W,
        "the second request's hits are still in the window: {elapsed:?}"
    );

    let check = store
        .decide(&[probe(&a)])
        .await
        .expect("a check after the take-back");
    assert_eq!(
        check.counters[0].count, 3,
        "the late take-back left the second request's hits: {check:?}"
    );
    let more = store
        .decide(&[counter("a", 5, 3)])
        .await
        .expect("a request over the limit");
    assert!(!more.allowed, "3 + 3 > 5: {more:?}");
}

/// A refund (returned hits) that lands on a cross-slot request's provisional hits before its
/// compensation: the refund takes them as the provisional ones, so the compensation that follows
/// takes nothing more, and never the hits of a request that came after the refund into the same
/// bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_before_the_take_back_never_removes_hits_twice() {
    let Some(cluster) = cluster_with_debug() else {
        return;
    };
    // Buckets of 2 s, so the three calls below land in one bucket.
    let (window, width) = (Duration::from_secs(4), Duration::from_secs(2));
    let counter = |name: &str, limit: u64, hits: u64| Counter {
        key: CounterKey::new("refund-first", [("k", name)], window),
        kind: slidegate::store::HitKind::Admitted,
        limit,
        window,
        hits,
        shadow: false,
        precision: Precision::Buckets(width),
    };
    let prefix = "sgrefund:";
    let store = store_on(&cluster, prefix).await;
    let node = |c: &Counter| {
        cluster
            .node_for(&format!("{prefix}{}", c.key.as_str()))
            .port
    };
    let a = counter("a", 10, 2);
    let b = (0..)
        .map(|i| counter(&format!("b{i}"), 0, 1))
        .find(|b| node(b) != node(&a))
        .expect("a key on another node");
    let probe = |c: &Counter| Counter {
        hits: 0,
        ..c.clone()
    };
    store.decide(&[probe(&a)]).await.expect("a");
    store.decide(&[probe(&b)]).await.expect("b");
    // Start early in a bucket (the servers share this machine's clock).
    let width_ms = width.as_millis();
    loop {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis();
        if ms % width_ms < 300 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let sleep = std::process::Command::new("redis-cli")
        .args(["-p", &node(&b).to_string(), "DEBUG", "SLEEP", "1.0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli DEBUG SLEEP");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let first = {
        let (store, a, b) = (&store, a.clone(), b.clone());
        async move { store.decide(&[a, b]).await.expect("the cross-slot request") }
    };
    let others = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let refund = Counter {
            kind: slidegate::store::HitKind::Returned,
            ..counter("a", 10, 2)
        };
        let r = store.decide(&[refund]).await.expect("the refund");
        assert_eq!(
            r.counters[0].count, 0,
            "the refund took the provisional hits: {r:?}"
        );
        let q = store
            .decide(&[counter("a", 10, 3)])
            .await
            .expect("a request after the refund");
        assert!(q.allowed, "{q:?}");
    };
    let (first, ()) = tokio::join!(first, others);
    assert!(!first.allowed, "b denies: {first:?}");
    let slept = sleep.wait_with_output().expect("redis-cli DEBUG SLEEP");
    assert_eq!(String::from_utf8_lossy(&slept.stdout).trim(), "OK");
    let check = store.decide(&[probe(&a)]).await.expect("a check");
    assert_eq!(
        check.counters[0].count, 3,
        "the hits were taken back once, by the refund: {check:?}"
    );
}
