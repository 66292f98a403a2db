//! A reload that changes a counter's representation (the exact log, buckets of a width) keeps what
//! the counter holds: the key is the descriptor's entries and window, and the store carries the
//! hits over at the counter's next decision. Run on the memory store, a standalone Redis (with a
//! deny cache on a second replica) and a Redis Cluster, each decision as a reloaded rule would ask
//! it: the same key, another limit or precision.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{RedisCluster, RedisServer};
use slidegate::store::{
    Counter, CounterKey, ManualClock, MemoryStore, Precision, RedisOptions, RedisStore, Store,
};

const MINUTE: Duration = Duration::from_secs(60);

fn redis_options(url: String) -> RedisOptions {
    RedisOptions {
        url,
        prefix: "sgcarry:".to_string(),
        timeout: Duration::from_secs(3),
        deny_cache: 0,
        ..RedisOptions::default()
    }
}

/// The counter of descriptor `name` per minute as a rule of `limit` with `precision` asks for it.
fn rule(name: &str, limit: u64, precision: Precision, hits: u64) -> Counter {
    Counter {
        key: CounterKey::new("carry", [("k", name)], MINUTE),
        kind: slidegate::store::HitKind::Admitted,
        limit,
        window: MINUTE,
        hits,
        shadow: false,
        precision,
    }
}

/// As the rules choose it when they do not say.
fn auto(name: &str, limit: u64, hits: u64) -> Counter {
    rule(name, limit, Precision::automatic(limit, MINUTE), hits)
}

fn buckets(seconds: u64) -> Precision {
    Precision::Buckets(Duration::from_secs(seconds))
}

/// Requests of `c` admitted out of `n`.
async fn admitted(store: &dyn Store, c: &Counter, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let d = store.decide(std::slice::from_ref(c)).await.expect("decide");
        admitted += usize::from(d.allowed);
    }
    admitted
}

/// The reproductions, on one store.
async fn reloads_keep_what_was_counted(store: &dyn Store, name: &str) {
    // 1000/min (buckets of 1 s) full, cut to 100/min (the exact log): nothing more.
    let big = auto(&format!("{name}-cut"), 1000, 10);
    assert_eq!(big.precision, buckets(1));
    assert_eq!(admitted(store, &big, 100).await, 100, "[{name}]");
    let cut = auto(&format!("{name}-cut"), 100, 1);
    assert_eq!(cut.precision, Precision::Exact);
    assert_eq!(
        admitted(store, &cut, 20).await,
        0,
        "[{name}] the cut limit is full"
    );
    let check = Counter { hits: 0, ..cut };
    let d = store.decide(&[check]).await.expect("a check");
    assert!(
        d.counters[0].over_limit && d.counters[0].count > 100,
        "[{name}] above the lowered limit: {d:?}"
    );

    // 100/min (the log) full, raised to 200/min (buckets): 100 more, no more.
    let small = auto(&format!("{name}-raise"), 100, 1);
    assert_eq!(admitted(store, &small, 110).await, 100, "[{name}]");
    let raised = auto(&format!("{name}-raise"), 200, 1);
    assert_eq!(raised.precision, buckets(1));
    assert_eq!(admitted(store, &raised, 120).await, 100, "[{name}] raised");
    // And back: still full.
    assert_eq!(
        admitted(store, &small, 5).await,
        0,
        "[{name}] back to the log"
    );

    // Only the width changes, 1 s to 2 s and back: the count stays.
    let narrow = rule(&format!("{name}-width"), 1000, buckets(1), 100);
    assert_eq!(admitted(store, &narrow, 10).await, 10, "[{name}]");
    let wide = rule(&format!("{name}-width"), 1000, buckets(2), 1);
    assert_eq!(admitted(store, &wide, 5).await, 0, "[{name}] 2 s buckets");
    assert_eq!(admitted(store, &narrow, 1).await, 0, "[{name}] 1 s again");
    let check = rule(&format!("{name}-width"), 1000, buckets(1), 0);
    let d = store.decide(&[check]).await.expect("a check");
    assert_eq!(d.counters[0].count, 1000, "[{name}] {d:?}");

    // A limit override of another precision on the same descriptor shares its counter.
    let rule_limit = auto(&format!("{name}-override"), 100, 60);
    assert!(admitted(store, &rule_limit, 1).await == 1);
    let override_limit = auto(&format!("{name}-override"), 150, 100);
    assert_ne!(override_limit.precision, rule_limit.precision);
    let d = store
        .decide(std::slice::from_ref(&override_limit))
        .await
        .expect("decide");
    assert!(!d.allowed && d.counters[0].count == 60, "[{name}] {d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_carries_counts_across_reloads() {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
    let store = MemoryStore::new(clock);
    reloads_keep_what_was_counted(&store, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_carries_counts_across_reloads() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&redis_options(server.url()))
        .await
        .expect("connect");
    reloads_keep_what_was_counted(&store, "redis").await;
    // Carried once: the counter is a hash or a log as last asked, never both.
    let key = format!("sgcarry:{}", auto("redis-raise", 100, 1).key.as_str());
    assert_eq!(server.cli(&["TYPE", &key]), "zset");
    assert_eq!(server.cli(&["ZCARD", &key]), "200", "every hit carried");

    // Buckets holding more than a request may write into a log go on as buckets.
    let quota = rule("redis-big", 10_000, buckets(1), 5_000);
    assert_eq!(admitted(&store, &quota, 1).await, 1);
    let exact = rule("redis-big", 10_000, Precision::Exact, 5_001);
    assert_eq!(admitted(&store, &exact, 1).await, 0, "5000 + 5001 > 10000");
    let key = format!("sgcarry:{}", exact.key.as_str());
    assert_eq!(server.cli(&["TYPE", &key]), "hash", "left as buckets");
    assert_eq!(
        admitted(
            &store,
            &Counter {
                hits: 5_000,
                ..exact
            },
            1
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_carries_counts_across_reloads() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let store = RedisStore::connect(&RedisOptions {
        cluster_nodes: cluster.urls(),
        ..redis_options(String::new())
    })
    .await
    .expect("connect");
    reloads_keep_what_was_counted(&store, "cluster").await;
}

/// Two replicas with deny caches on one Redis, reloaded one after the other: the first, full under
/// 100/min, has the deny cached; once it runs the raised limit it asks Redis (a cached deny is
/// kept per limit), and the counter carried over by the other replica admits exactly the rest.
/// With only the precision changed the cached deny stays right: the carried hits leave no earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_deny_caches_follow_the_carried_counter() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let connect = || async {
        RedisStore::connect(&RedisOptions {
            deny_cache: 1000,
            ..redis_options(server.url())
        })
        .await
        .expect("connect")
    };
    let (a, b) = (connect().await, connect().await);
    let small = auto("replicas", 100, 1);
    assert_eq!(admitted(&a, &small, 101).await, 100);
    assert!(
        a.deny_cache()
            .and_then(|c| c.denied_for(&small.key, 100, std::time::Instant::now()))
            .is_some()
    );
    let raised = auto("replicas", 200, 1);
    assert_eq!(
        admitted(&b, &raised, 60).await,
        60,
        "b carried the log over"
    );
    assert_eq!(
        admitted(&a, &raised, 60).await,
        40,
        "a asked Redis, not its cache"
    );
    assert_eq!(admitted(&b, &raised, 5).await, 0);
    // Same limit, another width: still full, whoever asks.
    let wider = rule("replicas", 200, buckets(2), 1);
    assert_eq!(admitted(&a, &wider, 3).await, 0);
    assert_eq!(admitted(&b, &wider, 3).await, 0);
}

/// The reproductions through the limiter, as a reload does them: the rules swapped under it, the
/// counter keys derived from the rules.
mod through_the_limiter {
    use super::*;
    use arc_swap::ArcSwap;
    use slidegate::config::{RuleSet, load_sources};
    use slidegate::limiter::{Code, DecisionMetrics, Descriptor, Options, RateLimiter, Request};
    use slidegate::metrics::Metrics;

    fn rules(limit: &str) -> Arc<RuleSet> {
        let yaml = format!(
            "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, {limit} }}\n"
        );
        Arc::new(load_sources(&[("rules.yaml".to_string(), yaml)]).expect("rules"))
    }

    /// Requests of `hits` admitted out of `n`.
    async fn admitted(limiter: &RateLimiter, hits: u64, n: usize) -> usize {
        let mut admitted = 0;
        for _ in 0..n {
            let request = Request {
                domain: "api",
                descriptors: vec![Descriptor {
                    entries: [("user", "alice")].into_iter().collect(),
                    ..Descriptor::default()
                }]
                .into(),
                hits_addend: hits,
                costs_are_charges: false,
            };
            let response = limiter.should_rate_limit(&request).await.expect("decided");
            admitted += usize::from(response.overall == Code::Ok);
        }
        admitted
    }

    async fn reproductions(store: Arc<dyn Store>) {
        let live = Arc::new(ArcSwap::new(rules("requests_per_unit: 1000")));
        let metrics = Metrics::new();
        let limiter = RateLimiter::new(
            live.clone(),
            store,
            Options::default(),
            Arc::new(DecisionMetrics::new(&metrics)),
        );
        assert_eq!(admitted(&limiter, 10, 100).await, 100, "1000 admitted");
        live.store(rules("requests_per_unit: 100"));
        assert_eq!(
            admitted(&limiter, 1, 10).await,
            0,
            "cut to 100/min: none more"
        );
        live.store(rules("requests_per_unit: 2000, precision: 1s"));
        assert_eq!(
            admitted(&limiter, 100, 12).await,
            10,
            "raised to 2000: 1000 more"
        );
        live.store(rules("requests_per_unit: 2000, precision: 2s"));
        assert_eq!(
            admitted(&limiter, 1, 5).await,
            0,
            "width 1s to 2s keeps the count"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_store() {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        reproductions(Arc::new(MemoryStore::new(clock))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let store = RedisStore::connect(&redis_options(server.url()))
            .await
            .expect("connect");
        reproductions(Arc::new(store)).await;
    }
}

/// Buckets carried into the log place each bucket's hits at its end or at the counter's "now",
/// whichever is earlier: placed ahead, the newest would move the log's "now" on and free hits
/// that are still in the window. Here a hit late in bucket `j` and one early in bucket `j + 2`
/// (buckets of half the window: `j` still counts whole) are 0.6 s apart when the log is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_carries_buckets_into_the_log_without_moving_its_clock() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&redis_options(server.url()))
        .await
        .expect("connect");
    let (w, g) = (Duration::from_secs(1), Duration::from_millis(500));
    let c = |precision, hits| Counter {
        key: CounterKey::new("carry", [("k", "clock")], w),
        kind: slidegate::store::HitKind::Admitted,
        limit: 2,
        window: w,
        hits,
        shadow: false,
        precision,
    };
    let redis_micros = || {
        let time = server.cli(&["TIME"]);
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().expect("TIME"));
        parts.next().expect("secs") * 1_000_000 + parts.next().expect("micros")
    };
    let g_us = g.as_micros() as u64;
    // Late in a bucket: 450 ms into it.
    let into = redis_micros() % g_us;
    let wait = (450_000 + g_us - into) % g_us;
    tokio::time::sleep(Duration::from_micros(wait)).await;
    let buckets = Precision::Buckets(g);
    assert!(
        store
            .decide(&[c(buckets, 1)])
            .await
            .expect("decide")
            .allowed
    );
    // Early in the bucket after next.
    let into = redis_micros() % g_us;
    tokio::time::sleep(Duration::from_micros(g_us - into + g_us + 20_000)).await;
    assert!(
        store
            .decide(&[c(buckets, 1)])
            .await
            .expect("decide")
            .allowed
    );
    let d = store
        .decide(&[c(Precision::Exact, 1)])
        .await
        .expect("decide");
    assert!(
        !d.allowed && d.counters[0].count == 2,
        "both hits are in the window: {d:?}"
    );
}
