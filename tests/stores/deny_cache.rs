//! The local deny cache: exact (it never denies what Redis would allow, nor caches what a
//! take-back can free), and about one Redis call per reset under a flood.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{PREFIX, cluster_options, counter, hits, redis_options, shadow, two_slots};
use crate::support::{RedisCluster, RedisServer};
use slidegate::store::{Counter, RedisOptions, RedisStore, Store};

// ---------------------------------------------------------------------------------------------
// The local deny cache: exact, and about one Redis call per reset under a flood.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_is_exact_and_spares_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let opts = RedisOptions {
        deny_cache: 1000,
        ..redis_options(server.url())
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    let w = Duration::from_secs(1);
    let c = counter("flood", "a", 5, w, 1);
    let calls_before = server.command_calls("evalsha");
    let started = Instant::now();
    // (sent, answered) of every admitted request.
    let mut admitted_at: Vec<(Duration, Duration)> = Vec::new();
    let mut requests = 0u64;
    while started.elapsed() < Duration::from_millis(2500) {
        let sent = started.elapsed();
        let d = store
            .decide(std::slice::from_ref(&c))
            .await
            .expect("decide");
        requests += 1;
        if d.allowed {
            admitted_at.push((sent, started.elapsed()));
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let calls = server.command_calls("evalsha") - calls_before;
    eprintln!(
        "flood: {requests} requests, {} admitted, {calls} EVALSHA",
        admitted_at.len()
    );
    // Batches of 5 at ~0 s, ~1 s, ~2 s: a hit never comes back before its predecessor 5 places
    // earlier left, and never much later either (the cache does not delay admissions: a cache
    // that waited a window too long would be a second late; 250 ms covers this loop's thread
    // stalled by other tests on two shared cores). Redis decided each somewhere between sending
    // and answering.
    assert_eq!(admitted_at.len(), 15, "{admitted_at:?}");
    for i in 5..admitted_at.len() {
        let (sent, answered) = admitted_at[i];
        let (prev_sent, prev_answered) = admitted_at[i - 5];
        assert!(answered - prev_sent >= w, "too early: {admitted_at:?}");
        assert!(
            sent.saturating_sub(prev_answered) <= w + Duration::from_millis(250),
            "delayed: {admitted_at:?}"
        );
    }
    assert!(requests > 500, "{requests}");
    // 15 admissions, one deny per reset cached, plus a few around each reset instant.
    assert!(calls <= 25, "{calls} Redis calls for {requests} requests");
    assert!(store.deny_cache().is_some_and(|c| c.len() <= 1));
}

/// Many clients (64) hammering one exhausted counter at once: when a cached deny expires, one request
/// asks Redis and the others wait for its answer, so Redis sees about one call per admission and
/// per reset, not one per request in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_single_flight_under_a_concurrent_flood() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = Arc::new(
        RedisStore::connect(&RedisOptions {
            deny_cache: 1000,
            timeout: Duration::from_secs(2),
            ..redis_options(server.url())
        })
        .await
        .expect("connect"),
    );
    let w = Duration::from_secs(1);
    let c = counter("flood", "concurrent", 5, w, 1);
    // Exhaust the counter first: the flood starts against a known-full counter.
    for _ in 0..6 {
        store
            .decide(std::slice::from_ref(&c))
            .await
            .expect("decide");
    }
    let calls_before = server.command_calls("evalsha");
    let started = Instant::now();
    const CLIENTS: u64 = 64;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let store = store.clone();
            let c = c.clone();
            tokio::spawn(async move {
                let (mut requests, mut admitted) = (0u64, 0u64);
                while started.elapsed() < Duration::from_millis(2500) {
                    let d = store
                        .decide(std::slice::from_ref(&c))
                        .await
                        .expect("decide");
                    requests += 1;
                    admitted += u64::from(d.allowed);
                    tokio::time::sleep(Duration::from_micros(500)).await;
                }
                (requests, admitted)
            })
        })
        .collect();
    let (mut requests, mut admitted) = (0, 0);
    for t in tasks {
        let (r, a) = t.await.expect("task");
        requests += r;
        admitted += a;
    }
    let calls = server.command_calls("evalsha") - calls_before;
    eprintln!("concurrent flood: {requests} requests, {admitted} admitted, {calls} EVALSHA");
    assert_eq!(admitted, 10, "5 per window, two resets within 2.5 s");
    assert!(requests > 2_000, "{requests}");
    // Without single flight, every client waiting at a reset asks Redis: about CLIENTS calls
    // per reset. With it, about one call per admission (10 measured on a quiet machine, 39 with
    // 32 clients on a loaded one, where a refresh more often finds the counter still full for
    // less than a round trip): over the whole flood, fewer calls than clients at one reset.
    assert!(
        calls < CLIENTS,
        "{calls} Redis calls for {requests} requests from {CLIENTS} clients"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_never_denies_what_redis_would_allow() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let cached = RedisStore::connect(&RedisOptions {
        deny_cache: 1000,
        ..redis_options(server.url())
    })
    .await
    .expect("connect");
    let plain = RedisStore::connect(&redis_options(server.url()))
        .await
        .expect("connect");
    let w = Duration::from_millis(1500);
    let full = counter("cache", "full", 2, w, 1);
    let other = counter("cache", "other", 10, w, 1);
    for c in [&full, &other] {
        let d = cached
            .decide(std::slice::from_ref(c))
            .await
            .expect("decide");
        assert!(d.allowed);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let d = plain
        .decide(std::slice::from_ref(&full))
        .await
        .expect("decide");
    assert!(d.allowed);
    // Now full: the first deny comes from Redis and is cached.
    let d = cached
        .decide(&[other.clone(), full.clone()])
        .await
        .expect("decide");
    assert!(!d.allowed);
    assert_eq!(d.counters[0].count, 1, "Redis answered");
    let d = cached
        .decide(&[other.clone(), full.clone()])
        .await
        .expect("decide");
    assert!(!d.allowed);
    assert_eq!(
        (
            d.counters[0].over_limit,
            d.counters[0].count,
            d.counters[0].remaining
        ),
        (false, 0, 10),
        "answered locally: the other counter is unknown"
    );
    assert!(d.counters[1].over_limit && d.counters[1].remaining == 0);
    // Shadow counters are never answered from the cache.
    let d = cached
        .decide(&[shadow(full.clone())])
        .await
        .expect("decide");
    assert!(d.allowed && d.counters[0].over_limit);
    // A raised limit is a different entry.
    let raised = Counter {
        limit: 3,
        ..full.clone()
    };
    assert!(cached.decide(&[raised]).await.expect("decide").allowed);
    // Poll both stores with checks until the uncached one admits; from that moment on (a few ms
    // of slack for the two calls) the cached one must admit too.
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "never admitted again"
        );
        let probe = hits(full.clone(), 0);
        let truth = plain
            .decide(std::slice::from_ref(&probe))
            .await
            .expect("decide");
        if truth.allowed {
            let d = cached.decide(&[probe]).await.expect("decide");
            assert!(d.allowed, "cache denied what Redis allows");
            break;
        }
        let d = cached.decide(&[probe]).await.expect("decide");
        assert!(!d.allowed || truth.counters[0].reset_after < Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// In a cluster, the hits of a cross-slot request may be taken back early (the compensation of a
/// deny on another slot), so a counter they fill must not be cached as full: once they are gone,
/// Redis admits again at once, and the cache must too. A counter filled by single-slot requests
/// is cached as on a standalone server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_deny_cache_never_caches_what_a_take_back_can_free() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let store = RedisStore::connect(&RedisOptions {
        deny_cache: 1000,
        ..cluster_options(cluster.urls())
    })
    .await
    .expect("connect");
    let cache = store
        .deny_cache()
        .expect("the cluster store has a deny cache");
    let w = Duration::from_secs(60);

    // A cross-slot request fills `a` (limit 1); its hit is provisional.
    let (a, b) = two_slots("provisional", 1, 5, w);
    let d = store.decide(&[a.clone(), b.clone()]).await.expect("decide");
    assert!(d.allowed);
    let key = format!("{PREFIX}{}", a.key.as_str());
    let log = format!("{key}p");
    let node = cluster.node_for(&key);
    assert_eq!(
        node.cli(&["ZCARD", &log]),
        "1",
        "the hit is in the provisional log"
    );
    // Full now, but only through a provisional hit: denied by Redis, not cached.
    let d = store
        .decide(std::slice::from_ref(&a))
        .await
        .expect("decide");
    assert!(!d.allowed && d.counters[0].over_limit);
    assert_eq!(cache.denied_for(&a.key, a.limit, Instant::now()), None);
    // The hit leaves early, as a late take-back would remove it: `a` admits again at once.
    let member = node.cli(&["ZRANGE", &key, "0", "0"]);
    assert_eq!(node.cli(&["ZREM", &key, member.trim()]), "1");
    assert_eq!(node.cli(&["ZREM", &log, member.trim()]), "1");
    let d = store
        .decide(std::slice::from_ref(&a))
        .await
        .expect("decide");
    assert!(d.allowed, "the cache denied what Redis allows");

    // Filled by a single-slot request (the one just admitted): the deny is cached.
    let d = store
        .decide(std::slice::from_ref(&a))
        .await
        .expect("decide");
    assert!(!d.allowed);
    let cached = cache.denied_for(&a.key, a.limit, Instant::now());
    assert!(
        cached.is_some_and(|left| left > w - Duration::from_secs(5)),
        "{cached:?}"
    );
    let calls = node.command_calls("evalsha");
    let d = store
        .decide(std::slice::from_ref(&a))
        .await
        .expect("decide");
    assert!(!d.allowed && d.counters[0].over_limit);
    assert_eq!(node.command_calls("evalsha"), calls, "denied locally");
}

/// A request that names one counter twice, once that counter's cached deny has expired: its first
/// occurrence leads the refresh, and the second must not wait for it (it would wait for its own
/// request, waking at once and looking again until a quarter of the timeout had passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_a_request_never_waits_for_its_own_refresh() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&RedisOptions {
        deny_cache: 1000,
        timeout: Duration::from_secs(20),
        ..redis_options(server.url())
    })
    .await
    .expect("connect");
    let w = Duration::from_secs(1);
    let c = counter("own-refresh", "a", 1, w, 1);
    let decide = |counters: Vec<Counter>| {
        let store = &store;
        async move { store.decide(&counters).await.expect("decide") }
    };
    assert!(decide(vec![c.clone()]).await.allowed);
    assert!(
        !decide(vec![c.clone()]).await.allowed,
        "full: the deny is cached"
    );
    tokio::time::sleep(w + Duration::from_millis(100)).await;
    let started = Instant::now();
    let d = decide(vec![c.clone(), c.clone()]).await;
    let took = started.elapsed();
    assert!(!d.allowed, "2 hits of one counter exceed its limit of 1");
    // Not a measure of speed: spinning would take 5 s (a quarter of the timeout), one call takes
    // well under a millisecond.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    assert!(
        decide(vec![c]).await.allowed,
        "nothing was recorded or cached"
    );
}

/// A request that waits for another request's refresh of a counter waits at most a quarter of its
/// own timeout, then asks Redis itself, however long the leader takes: here the leader is never
/// polled again after sending its call, so it holds its refresh until it is dropped.
///
/// One thread: the leader's call goes out in a task of its own, which on a second worker could
/// send it, and have its answer, before the leader's first poll returns (when the machine is busy
/// and the test's thread is preempted in between): the leader would then not be waiting at all.
#[tokio::test(flavor = "current_thread")]
async fn deny_cache_a_waiter_waits_only_its_own_share_of_the_timeout() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&RedisOptions {
        deny_cache: 1000,
        timeout: Duration::from_secs(2),
        ..redis_options(server.url())
    })
    .await
    .expect("connect");
    let w = Duration::from_secs(1);
    let c = counter("stuck-leader", "a", 1, w, 1);
    let one = std::slice::from_ref(&c);
    assert!(store.decide(one).await.expect("decide").allowed);
    assert!(!store.decide(one).await.expect("decide").allowed);
    tokio::time::sleep(w + Duration::from_millis(100)).await;
    let mut leader = Box::pin(store.decide(one));
    let pending =
        std::future::poll_fn(|cx| std::task::Poll::Ready(leader.as_mut().poll(cx).is_pending()))
            .await;
    assert!(pending, "the leader is waiting for Redis");
    let waiter = store.decide(one).await;
    let d = waiter.expect("the waiter asked Redis itself within its own timeout");
    assert!(!d.allowed, "the leader's hit filled the counter");
    drop(leader);
}

/// The compensation of a denied cross-slot request takes its hits out of the counter before (or
/// together with) its provisional log: in between, a counter full of hits that are about to go
/// would look full for good, and a deny cache would keep denying after they left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_take_back_empties_the_counter_before_the_provisional_log() {
    use std::io::BufRead;
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let store = RedisStore::connect(&cluster_options(cluster.urls()))
        .await
        .expect("connect");
    let w = Duration::from_secs(60);
    let (full, b) = two_slots("take-back-order", 1, 5, w);
    assert!(
        store
            .decide(std::slice::from_ref(&full))
            .await
            .expect("decide")
            .allowed
    );
    let key = format!("{PREFIX}{}", b.key.as_str());
    let log = format!("{key}p");
    let node = cluster.node_for(&key);

    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &node.port.to_string(), "MONITOR"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("redis-cli MONITOR");
    let stdout = monitor.stdout.take().expect("stdout");
    let _monitor = crate::support::KillOnDrop(monitor);
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next = || {
        lines
            .recv_timeout(Duration::from_secs(10))
            .expect("MONITOR line")
    };
    assert_eq!(next(), "OK");

    let d = store
        .decide(&[b.clone(), full.clone()])
        .await
        .expect("decide");
    assert!(!d.allowed);
    let gone = crate::support::wait_until(Duration::from_secs(5), || {
        node.cli(&["ZCARD", &key]) == "0" && node.cli(&["ZCARD", &log]) == "0"
    });
    assert!(gone, "the compensation ran");
    node.cli(&["ECHO", "end-of-test"]);
    let mut removals = Vec::new();
    loop {
        let line = next();
        if line.contains("end-of-test") {
            break;
        }
        if line.contains("\"ZREM\"") {
            removals.push(line);
        }
    }
    let position = |k: &str| {
        removals
            .iter()
            .position(|l| l.contains(&format!("\"ZREM\" \"{k}\" ")))
    };
    assert!(
        matches!((position(&key), position(&log)), (Some(c), Some(l)) if c < l),
        "{removals:#?}"
    );
}
