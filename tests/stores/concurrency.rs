//! Exactness under concurrency (the memory store, Redis and Redis Cluster replicas, requests that
//! share a script call), and clock skew between replicas: one replica runs with its clock an hour
//! ahead (libfaketime), and both enforce one limit exactly.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::{PREFIX, cluster_options, counter, hits, redis_options, two_slots};
use crate::support::{RedisCluster, RedisServer};
use redis::cluster_routing::Slot;
use slidegate::store::{Clock, Counter, MemoryStore, RedisOptions, RedisStore, Store};

// ---------------------------------------------------------------------------------------------
// Exactness under concurrency.

/// Runs `n` requests concurrently, alternating over `stores`; returns how many were admitted.
async fn admitted_of(stores: &[Arc<dyn Store>], counters: Vec<Counter>, n: usize) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let counters = counters.clone();
            tokio::spawn(async move { store.decide(&counters).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let decision = task.await.expect("task").expect("decide");
        admitted += usize::from(decision.allowed);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_is_exact_under_concurrency() {
    let clock: Arc<dyn Clock> = Arc::new(slidegate::store::SystemClock);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock));
    let w = Duration::from_secs(60);
    let one = counter("conc", "one", 50, w, 1);
    assert_eq!(
        admitted_of(std::slice::from_ref(&store), vec![one], 400).await,
        50
    );
    // Two counters on (very likely) different shards, all or nothing.
    let a = counter("conc", "a", 50, w, 1);
    let b = counter("conc", "b", 30, w, 1);
    assert_eq!(
        admitted_of(
            std::slice::from_ref(&store),
            vec![a.clone(), b.clone()],
            400
        )
        .await,
        30
    );
    let d = store
        .decide(&[hits(a, 0), hits(b, 0)])
        .await
        .expect("decide");
    assert_eq!((d.counters[0].count, d.counters[1].count), (30, 30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_redis_replicas_are_exact_under_concurrency() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for cache in [0, 1000] {
        let opts = RedisOptions {
            deny_cache: cache,
            ..redis_options(server.url())
        };
        stores.push(Arc::new(RedisStore::connect(&opts).await.expect("connect")));
    }
    let c = counter("conc", "redis", 50, Duration::from_secs(60), 1);
    assert_eq!(admitted_of(&stores, vec![c.clone()], 400).await, 50);
    let key = format!("{PREFIX}{}", c.key.as_str());
    assert_eq!(server.cli(&["ZCARD", &key]), "50");
}

/// Requests that one thread starts together share script calls (at most 16 requests each), and
/// each stays all or nothing: 64 requests, each on a shared counter (limit 40) and a counter of
/// its own, start at once on one thread.
#[tokio::test(flavor = "current_thread")]
async fn requests_started_together_share_a_script_call_and_stay_all_or_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = Arc::new(
        RedisStore::connect(&redis_options(server.url()))
            .await
            .expect("connect"),
    );
    store.ping().await.expect("ping");
    let w = Duration::from_secs(60);
    let shared = counter("batch", "shared", 40, w, 1);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            let counters = vec![
                shared.clone(),
                counter("batch", &format!("own{i}"), 1, w, 1),
            ];
            tokio::spawn(async move { (store.decide(&counters).await, counters) })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let (decision, counters) = task.await.expect("task");
        let decision = decision.expect("decide");
        admitted += usize::from(decision.allowed);
        let own = format!("{PREFIX}{}", counters[1].key.as_str());
        let recorded = if decision.allowed { "1" } else { "0" };
        assert_eq!(
            server.cli(&["ZCARD", &own]),
            recorded,
            "{own}: all or nothing"
        );
    }
    assert_eq!(admitted, 40);
    let key = format!("{PREFIX}{}", shared.key.as_str());
    assert_eq!(server.cli(&["ZCARD", &key]), "40");
    // 64 requests in 4 calls of 16; a first call may meet NOSCRIPT and be sent again.
    let calls = server.command_calls("evalsha");
    assert!((4..=8).contains(&calls), "{calls} EVALSHA for 64 requests");
}

/// In a cluster too, requests started together share a script call per slot: a hot counter's
/// requests, and the hot slot's parts of cross-slot requests, each part still all or nothing.
#[tokio::test(flavor = "current_thread")]
async fn cluster_requests_started_together_share_a_script_call_per_slot() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    // The test options leave the deny cache off: every request reaches Redis.
    let opts = cluster_options(cluster.urls());
    let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&opts).await.expect("connect"));
    store.ping().await.expect("ping");
    let w = Duration::from_secs(60);
    let hot = counter("cbatch", "hot", 40, w, 1);
    let hot_key = format!("{PREFIX}{}", hot.key.as_str());
    let node = cluster.node_for(&hot_key);
    let calls_before = node.command_calls("evalsha");
    assert_eq!(
        admitted_of(std::slice::from_ref(&store), vec![hot.clone()], 64).await,
        40
    );
    // 64 requests in 4 calls of 16; a first call may meet NOSCRIPT and be sent again.
    let calls = node.command_calls("evalsha") - calls_before;
    assert!((4..=8).contains(&calls), "{calls} EVALSHA for 64 requests");

    // Cross-slot: 32 requests on a second hot counter (limit 10) and a fresh counter of their own
    // on another slot. Every own part admits, so exactly the first 10 are admitted; the other 22
    // take their own hit back.
    let (hot2, _) = two_slots("cbatch2", 10, 1, w);
    let slot = Slot::for_key(format!("{PREFIX}{}", hot2.key.as_str()));
    let owns: Vec<Counter> = (0..)
        .map(|i| counter("cbatch2", &format!("own{i}"), 1, w, 1))
        .filter(|c| Slot::for_key(format!("{PREFIX}{}", c.key.as_str())) != slot)
        .take(32)
        .collect();
    let tasks: Vec<_> = owns
        .iter()
        .map(|own| {
            let (store, counters) = (store.clone(), vec![hot2.clone(), own.clone()]);
            tokio::spawn(async move { store.decide(&counters).await })
        })
        .collect();
    let mut admitted = 0;
    for (task, own) in tasks.into_iter().zip(&owns) {
        let decision = task.await.expect("task").expect("decide");
        admitted += usize::from(decision.allowed);
        let key = format!("{PREFIX}{}", own.key.as_str());
        let recorded = if decision.allowed { "1" } else { "0" };
        assert_eq!(
            cluster.node_for(&key).cli(&["ZCARD", &key]),
            recorded,
            "{key}"
        );
    }
    assert_eq!(admitted, 10);
    let hot2_key = format!("{PREFIX}{}", hot2.key.as_str());
    for key in [hot2_key.clone(), format!("{hot2_key}p")] {
        assert_eq!(cluster.node_for(&key).cli(&["ZCARD", &key]), "10", "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_cluster_replicas_are_exact_under_concurrency() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    // One replica with the deny cache (the default), one without.
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for deny_cache in [1000, 0] {
        let opts = RedisOptions {
            deny_cache,
            ..cluster_options(cluster.urls())
        };
        stores.push(Arc::new(RedisStore::connect(&opts).await.expect("connect")));
    }
    let w = Duration::from_secs(60);
    let c = counter("conc", "cluster", 50, w, 1);
    assert_eq!(admitted_of(&stores, vec![c], 400).await, 50);

    // Across slots: never over-admitted, and nothing of a denied request is left behind.
    let (a, b) = two_slots("conc-xslot", 50, 30, w);
    // Every part is decided before any take-back arrives, so if the requests that the two slots
    // admitted first are different ones, none is admitted: spurious denials, never over-admission.
    let admitted = admitted_of(&stores, vec![a.clone(), b.clone()], 400).await;
    assert!(admitted <= 30, "admitted {admitted}");
    for c in [&a, &b] {
        let key = format!("{PREFIX}{}", c.key.as_str());
        let log = format!("{key}p");
        for key in [&key, &log] {
            let card = cluster.node_for(key).cli(&["ZCARD", key]);
            assert_eq!(card, admitted.to_string(), "{key}");
        }
    }
    // The denied requests' hits are all back: the next request fits unless 30 were admitted (the
    // replica with the deny cache decides it, which must not have cached `b` as full).
    let next = stores[0].decide(&[a, b]).await.expect("decide");
    assert_eq!(next.allowed, admitted < 30, "after {admitted} admitted");
    eprintln!(
        "cross-slot under contention: {admitted} of 30 admitted (the rest spuriously denied)"
    );
}

// ---------------------------------------------------------------------------------------------
// Clock skew: one replica runs with its clock an hour ahead (libfaketime), the other with the real
// clock; both enforce one limit exactly, because the script reads Redis's TIME.

const SKEW_URL_ENV: &str = "SLIDEGATE_TEST_SKEW_REDIS_URL";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_between_replicas_is_irrelevant() {
    let Some(faketime) = crate::support::require_program("faketime") else {
        return;
    };
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::connect(&redis_options(server.url()))
            .await
            .expect("connect"),
    );
    let c = skew_counter();
    // This replica admits 20 of 50.
    assert_eq!(
        admitted_of(std::slice::from_ref(&store), vec![c.clone()], 20).await,
        20
    );
    // The skewed replica, in its own process, sends 60: exactly 30 fit.
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(faketime)
        .args(["-m", "-f", "+1h"])
        .arg(exe)
        .args([
            "--ignored",
            "--exact",
            "concurrency::skew_replica_process",
            "--nocapture",
        ])
        .env(SKEW_URL_ENV, server.url())
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output()
        .expect("run skewed replica");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "skewed replica failed:\n{stdout}\n{stderr}"
    );
    let admitted: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SKEWED_ADMITTED="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no result from skewed replica:\n{stdout}\n{stderr}"));
    assert_eq!(admitted, 30, "the skewed replica takes exactly the rest");
    // And this replica now finds the limit used up.
    assert_eq!(
        admitted_of(std::slice::from_ref(&store), vec![c.clone()], 20).await,
        0
    );
    let key = format!("{PREFIX}{}", c.key.as_str());
    assert_eq!(server.cli(&["ZCARD", &key]), "50");
    // Every score is Redis time (this machine's real clock), none an hour ahead.
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_micros() as f64;
    let scores = server.cli(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]);
    for score in scores.lines().skip(1).step_by(2) {
        let score: f64 = score.parse().expect("score");
        assert!(
            (now_us - score).abs() < 60e6,
            "score {score} vs now {now_us}"
        );
    }
}

fn skew_counter() -> Counter {
    counter("skew", "shared", 50, Duration::from_secs(120), 1)
}

/// The skewed replica of `clock_skew_between_replicas_is_irrelevant`, run in a child process under
/// faketime; does nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by clock_skew_between_replicas_is_irrelevant"]
async fn skew_replica_process() {
    let Ok(url) = std::env::var(SKEW_URL_ENV) else {
        return;
    };
    let local = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    let redis_time = {
        let client = redis::Client::open(url.as_str()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("conn");
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .expect("TIME");
        Duration::from_secs(s) + Duration::from_micros(us)
    };
    let skew = local.as_secs_f64() - redis_time.as_secs_f64();
    assert!(
        skew > 3000.0,
        "faketime did not move this process's clock: skew {skew} s"
    );
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::connect(&redis_options(url))
            .await
            .expect("connect"),
    );
    let admitted = admitted_of(&[store], vec![skew_counter()], 60).await;
    println!("SKEWED_ADMITTED={admitted}");
}
