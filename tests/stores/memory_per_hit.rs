//! Memory per tracked hit: Redis's bytes per hit in a log, a bucket counter's bounded memory and
//! bookkeeping, and the bytes-per-counter benchmark of docs/benchmarks.md.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::store::{PREFIX, bucketed, counter, hits, redis_options};
use crate::support::RedisServer;
use slidegate::store::{
    Counter, CounterKey, ManualClock, MemoryStore, Precision, RedisStore, Store,
};

// ---------------------------------------------------------------------------------------------
// Redis memory per tracked hit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bytes_per_tracked_hit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::connect(&redis_options(server.url()))
            .await
            .expect("connect"),
    );
    let used = || -> f64 {
        let info = server.cli(&["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("used_memory")
    };
    let w = Duration::from_secs(600);
    // Small logs (listpack encoding, up to 128 entries): 500 counters x 100 single hits.
    let before = used();
    fill(&store, 500, 100, w).await;
    let small = (used() - before) / 50_000.0;
    let one = format!("{PREFIX}{}", counter("mem100", "0", 100, w, 1).key.as_str());
    // Redis 6 calls the compact encoding ziplist.
    let encoding = server.cli(&["OBJECT", "ENCODING", &one]);
    assert!(
        matches!(encoding.as_str(), "listpack" | "ziplist"),
        "{encoding}"
    );
    let usage: f64 = server
        .cli(&["MEMORY", "USAGE", &one, "SAMPLES", "0"])
        .parse()
        .expect("usage");
    // Large logs (skiplist encoding): 20 counters x 1000 single hits.
    let before = used();
    fill(&store, 20, 1000, w).await;
    let large = (used() - before) / 20_000.0;
    let big = format!(
        "{PREFIX}{}",
        counter("mem1000", "0", 1000, w, 1).key.as_str()
    );
    assert_eq!(server.cli(&["OBJECT", "ENCODING", &big]), "skiplist");
    eprintln!(
        "Redis bytes per tracked hit: {small:.1} (listpack, 100 per key; MEMORY USAGE of one key \
         {usage} B = {:.1}/hit), {large:.1} (skiplist, 1000 per key)",
        usage / 100.0
    );
    assert!(small > 5.0 && small < 60.0, "listpack {small}");
    assert!(large > 20.0 && large < 160.0, "skiplist {large}");
}

/// One counter of 10,000,000 per day (automatic buckets of 24 minutes) taking 200,000 admitted
/// single hits grows Redis's `used_memory` by less than 64 KB: a hash of a few buckets, where the
/// log would hold 200,000 members (about 20 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bucket_counter_memory_is_bounded() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::connect(&redis_options(server.url()))
            .await
            .expect("connect"),
    );
    store.ping().await.expect("ping");
    let used = || -> i64 {
        let info = server.cli(&["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("used_memory")
    };
    let day = Duration::from_secs(86_400);
    let precision = Precision::automatic(10_000_000, day);
    assert_eq!(precision, Precision::Buckets(Duration::from_secs(24 * 60)));
    let c = bucketed(
        counter("day", "tenant", 10_000_000, day, 1),
        Duration::from_secs(24 * 60),
    );
    let load = |c: Counter, requests: usize| {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (store, c) = (store.clone(), c.clone());
                tokio::spawn(async move {
                    for _ in 0..requests.div_ceil(64) {
                        let d = store
                            .decide(std::slice::from_ref(&c))
                            .await
                            .expect("decide");
                        assert!(d.allowed);
                    }
                })
            })
            .collect();
        async move {
            for t in tasks {
                t.await.expect("task");
            }
        }
    };
    // The same load on another counter first: the script cache and the connections' buffers
    // are then in place, and what grows after is the counter.
    let warm = counter("day", "warm-up", 10_000_000, day, 1);
    load(bucketed(warm, Duration::from_secs(24 * 60)), 2_000).await;
    let before = used();
    load(c.clone(), 200_000).await;
    let grown = used() - before;
    let d = store.decide(&[hits(c.clone(), 0)]).await.expect("check");
    assert!(d.counters[0].count >= 200_000, "{d:?}");
    eprintln!(
        "one bucket counter, {} hits: used_memory +{grown} B",
        d.counters[0].count
    );
    assert!(grown < 64 * 1024, "used_memory grew by {grown} bytes");
    let key = format!("{PREFIX}{}", c.key.as_str());
    let buckets: u64 = server.cli(&["HLEN", &key]).parse().expect("HLEN");
    assert!((1..=61).contains(&buckets), "{buckets} buckets");
}

/// A Redis bucket counter's bookkeeping under irregular traffic (gaps shorter than a bucket, longer
/// than the window, and between): after every decision its total field `t` is the sum of its
/// buckets and the count reported, its `o` is at or before its oldest bucket, every bucket is
/// within the window of `o`, and no bucket that left the window is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bucket_counter_keeps_its_total_and_oldest() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&redis_options(server.url()))
        .await
        .expect("connect");
    let (w, g) = (Duration::from_millis(400), Duration::from_millis(50));
    let span = 8;
    let c = bucketed(counter("bookkeeping", "a", 6, w, 1), g);
    let key = format!("{PREFIX}{}", c.key.as_str());
    let mut seed: u64 = 0x5eed;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let gaps = [0, 5, 20, 60, 130, 520];
    for step in 0..120 {
        tokio::time::sleep(Duration::from_millis(gaps[next(6) as usize])).await;
        let sent = Instant::now();
        let d = store
            .decide(&[hits(c.clone(), next(4))])
            .await
            .expect("decide");
        let fields = server.cli(&["HGETALL", &key]);
        if fields.trim().is_empty() && sent.elapsed() >= d.counters[0].reset_after {
            // Looked at so late (a loaded machine) that the counter may have expired since: its
            // key lives at least until its oldest hits leave the window (`reset_after`).
            continue;
        }
        let lines: Vec<&str> = fields.lines().filter(|l| !l.is_empty()).collect();
        let mut buckets: Vec<(u64, u64)> = Vec::new();
        let (mut total, mut oldest, mut newest) = (None, None, None);
        for pair in lines.chunks(2) {
            let value: u64 = pair[1].parse().expect("a count");
            match pair[0] {
                "t" => total = Some(value),
                "o" => oldest = Some(value),
                "n" => newest = Some(value),
                "w" => assert_eq!(value, 50_000, "the width"),
                index => buckets.push((index.parse().expect("an index"), value)),
            }
        }
        let sum: u64 = buckets.iter().map(|(_, hits)| hits).sum();
        let what = format!("step {step}: {d:?} {buckets:?} t={total:?} o={oldest:?}");
        assert_eq!(total.unwrap_or(0), sum, "{what}");
        assert_eq!(d.counters[0].count, sum, "{what}");
        assert!(buckets.iter().all(|&(_, hits)| hits > 0), "{what}");
        if let Some(o) = oldest {
            assert!(
                buckets.iter().all(|&(i, _)| i >= o && i <= o + span),
                "{what}"
            );
        }
        if let Some(n) = newest {
            assert!(buckets.iter().all(|&(i, _)| i <= n), "{what} n={n}");
        }
        // No bucket is later than the node's clock.
        let clock: u64 = server
            .cli(&["GET", &format!("{PREFIX}clock")])
            .parse()
            .expect("the clock");
        assert!(
            buckets.iter().all(|&(i, _)| i <= clock / 50_000),
            "{what} clock={clock}"
        );
        assert!(buckets.is_empty() == total.is_none(), "{what}");
    }
}

/// docs/benchmarks.md, "Bytes per counter": one counter of N per hour and per day at saturation, as an
/// exact log and as automatic buckets (a sixtieth of the window), in Redis (`MEMORY USAGE`) and in
/// the memory store (its own accounting). A benchmark, not a test of behaviour: run it with
/// `cargo test --test stores -- --ignored bytes_per_counter_at_saturation --nocapture`.
///
/// The log is filled through the store (the script's own members). A bucket hash at saturation
/// cannot be reached in real time (a day of traffic), so it is written as the script leaves it:
/// the B + 1 buckets that overlap the window, indexed `floor(now / g)`, each with its share of N,
/// and the total `t`, oldest index `o` and newest index `n`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints docs/benchmarks.md's bytes per counter"]
async fn bytes_per_counter_at_saturation() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&redis_options(server.url()))
        .await
        .expect("connect");
    let usage = |key: &str| -> u64 {
        let usage = server.cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
        usage
            .parse()
            .unwrap_or_else(|_| panic!("MEMORY USAGE {key}: {usage}"))
    };
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64;
    eprintln!(
        "| N per W | exact log, Redis | buckets, Redis | exact log, memory store | buckets, memory store |"
    );
    eprintln!("|---|---|---|---|---|");
    for (unit, w) in [("hour", 3_600u64), ("day", 86_400)] {
        for n in [100u64, 10_000, 1_000_000] {
            let window = Duration::from_secs(w);
            let width = Duration::from_secs(w / 60);
            // Redis, exact log: N hits through the script, at most 4096 per request.
            let log = counter(&format!("sat-{unit}"), &format!("log{n}"), n, window, 1);
            let mut left = n;
            while left > 0 {
                let take = left.min(4096);
                assert!(
                    store
                        .decide(&[hits(log.clone(), take)])
                        .await
                        .expect("fill")
                        .allowed
                );
                left -= take;
            }
            let log_redis = usage(&format!("{PREFIX}{}", log.key.as_str()));
            server.cli(&["DEL", &format!("{PREFIX}{}", log.key.as_str())]);
            // Redis, buckets: the B + 1 overlapping buckets, N spread over them.
            let key = format!("{PREFIX}sat-{unit}-{n}");
            let current = now_us / width.as_micros() as u64;
            let mut args: Vec<String> = vec!["HSET".into(), key.clone()];
            args.extend([
                "t".into(),
                n.to_string(),
                "o".into(),
                (current - 60).to_string(),
                "n".into(),
                current.to_string(),
            ]);
            for (i, index) in (current - 60..=current).enumerate() {
                let share = n / 61 + u64::from((i as u64) < n % 61);
                args.extend([index.to_string(), share.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            server.cli(&args);
            let buckets_redis = usage(&key);
            server.cli(&["DEL", &key]);
            // Memory store: N single hits spread over the window, both representations.
            let memory = |precision: Precision| {
                let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
                let store = MemoryStore::new(clock.clone());
                let c = Counter {
                    key: CounterKey::new("sat", [("k", "v")], window),
                    precision,
                    ..counter("sat", "v", n, window, 1)
                };
                let step = window / u32::try_from(n).expect("n");
                for _ in 0..n {
                    assert!(store.decide_now(std::slice::from_ref(&c)).allowed);
                    clock.advance(step);
                }
                store.stats().heap_bytes
            };
            let (log_memory, buckets_memory) =
                (memory(Precision::Exact), memory(Precision::Buckets(width)));
            eprintln!(
                "| {n} per {unit} | {log_redis} | {buckets_redis} | {log_memory} | {buckets_memory} |"
            );
            assert!(
                buckets_redis <= 1024,
                "buckets in Redis: {buckets_redis} bytes"
            );
            assert!(
                buckets_memory <= 2048,
                "buckets in memory: {buckets_memory} bytes"
            );
        }
    }
}

async fn fill(store: &Arc<dyn Store>, counters: usize, per_counter: u64, w: Duration) {
    let domain = format!("mem{per_counter}");
    let mut tasks = Vec::new();
    for i in 0..counters {
        let store = store.clone();
        let c = counter(&domain, &i.to_string(), per_counter, w, 1);
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_counter {
                let d = store
                    .decide(std::slice::from_ref(&c))
                    .await
                    .expect("decide");
                assert!(d.allowed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("fill task");
    }
}
