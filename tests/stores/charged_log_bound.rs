//! A log that charges keep filling. Charged hits land over the limit, one log entry each (one
//! sorted-set member in Redis), so a counter kept as the exact log would grow with the charged
//! traffic rather than with its limit: under `--record-over-limit`, or response costs, one hot key
//! held a log of every hit of its window. Past `log_held_max` (the limit or 4,096, and 4,096 more)
//! a charge carries the log into buckets, which keep every hit as a count: the counter stays small
//! and its whole debt still denies. On the memory store and a standalone Redis.

use std::sync::Arc;
use std::time::Duration;

use crate::charges::{counter, with};
use crate::support::RedisServer;
use slidegate::store::{
    Counter, HitKind, ManualClock, MemoryStore, Precision, RedisOptions, RedisStore, Store,
};

const MINUTE: Duration = Duration::from_secs(60);

/// The limit of the counter charged; charges of this many hits stay in its log (more would be
/// recorded in buckets at once), and 512 of them fill it to exactly [`HELD_MAX`].
const LIMIT: u64 = 16;

/// What a log of [`LIMIT`] holds at most: `max(LIMIT, 4096) + 4096`.
const HELD_MAX: u64 = 8192;

/// Charges `c` `LIMIT` hits at a time from `held` until it holds `upto`, calling `advance` before
/// each; returns the last decision's count.
async fn charge_until(
    store: &dyn Store,
    c: &Counter,
    held: u64,
    upto: u64,
    advance: &dyn Fn(),
) -> u64 {
    let mut count = held;
    for _ in (held..upto).step_by(LIMIT as usize) {
        advance();
        let d = store
            .decide(&[with(c, HitKind::Charged, LIMIT)])
            .await
            .expect("decide");
        count = d.counters[0].count;
    }
    count
}

/// The checks both stores share: a log holding exactly [`HELD_MAX`] hits stays a log; the charge
/// that would take it past goes into buckets with every hit kept, and a request is still denied.
async fn bound_holds(
    store: &dyn Store,
    c: &Counter,
    name: &str,
    form: &dyn Fn() -> String,
    step: &dyn Fn(),
) {
    assert_eq!(charge_until(store, c, 0, HELD_MAX, step).await, HELD_MAX);
    assert_eq!(form(), "log", "[{name}] {HELD_MAX} hits still in the log");
    let count = charge_until(store, c, HELD_MAX, HELD_MAX + 3 * LIMIT, step).await;
    assert_eq!(count, HELD_MAX + 3 * LIMIT, "[{name}] every hit kept");
    assert_eq!(form(), "buckets", "[{name}] past the bound");
    let d = store.decide(std::slice::from_ref(c)).await.expect("decide");
    assert!(!d.allowed, "[{name}] the debt denies: {d:?}");
    assert_eq!(d.counters[0].count, HELD_MAX + 3 * LIMIT, "[{name}] {d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_bounds_a_charged_log() {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
    let store = MemoryStore::new(clock.clone());
    let c = counter("memory-bound", LIMIT, MINUTE, Precision::Exact);
    // A millisecond between charges: each is a run of its own in the log.
    let step = || clock.advance(Duration::from_millis(1));
    let form = || {
        // A log holds a run per charge; the buckets of a minute, at most 61.
        if store.stats().runs > 61 {
            "log"
        } else {
            "buckets"
        }
        .to_string()
    };
    bound_holds(&store, &c, "memory", &form, &step).await;
    assert!(store.stats().runs <= 61, "{:?}", store.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bounds_a_charged_log() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let options = RedisOptions {
        url: server.url(),
        prefix: "sgbound:".into(),
        timeout: Duration::from_secs(3),
        deny_cache: 0,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&options).await.expect("connect");
    let c = counter("redis-bound", LIMIT, MINUTE, Precision::Exact);
    let key = format!("sgbound:{}", c.key.as_str());
    let form = || match server.cli(&["TYPE", &key]).as_str() {
        "zset" => "log".to_string(),
        "hash" => "buckets".to_string(),
        other => other.to_string(),
    };
    bound_holds(&store, &c, "redis", &form, &|| {}).await;
    let fields: usize = server.cli(&["HLEN", &key]).parse().expect("HLEN");
    assert!(fields <= 61 + 4, "{fields} fields");
}
