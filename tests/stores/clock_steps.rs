//! A counter written under a clock ahead of the store's (an NTP step back, a failover to a Redis
//! node whose clock is behind): the store treats "now" as at least the counter's newest hit, so it
//! never errors, trims what left the window as of that hit, and records after it. The Redis tests
//! plant the state a counter has when written under a clock 0.5 s ahead (what the script itself
//! would have left there), then decide on it; the memory tests step the manual clock back.

use std::sync::Arc;
use std::time::Duration;

use crate::support::RedisServer;
use slidegate::store::{
    Counter, CounterKey, Decision, ManualClock, MemoryStore, Precision, RedisOptions, RedisStore,
    Store,
};

const PREFIX: &str = "sgclock:";
const W: Duration = Duration::from_secs(1);
/// How far ahead the clock that wrote the planted counters was.
const AHEAD: u64 = 500_000;
/// The automatic bucket width of a 1 s window (a fiftieth).
const G: u64 = 20_000;
const SPAN: u64 = 50;

fn counter(name: &str, limit: u64, precision: Precision, hits: u64) -> Counter {
    Counter {
        key: CounterKey::new("clock", [("k", name)], W),
        kind: slidegate::store::HitKind::Admitted,
        limit,
        window: W,
        hits,
        shadow: false,
        precision,
    }
}

fn buckets() -> Precision {
    Precision::Buckets(Duration::from_micros(G))
}

/// One request of the one counter `c`.
async fn decide(store: &RedisStore, c: &Counter) -> Decision {
    store.decide(std::slice::from_ref(c)).await.expect("decide")
}

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&RedisOptions {
        url: server.url(),
        prefix: PREFIX.to_string(),
        timeout: Duration::from_secs(3),
        deny_cache: 0,
        ..RedisOptions::default()
    })
    .await
    .expect("connect")
}

/// Redis's `TIME` in microseconds.
fn redis_now(server: &RedisServer) -> u64 {
    let time = server.cli(&["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().expect("TIME"));
    let (secs, micros) = (parts.next().expect("secs"), parts.next().expect("micros"));
    secs * 1_000_000 + micros
}

fn redis_key(c: &Counter) -> String {
    format!("{PREFIX}{}", c.key.as_str())
}

/// The node's clock key (see `CLOCK_KEY` in `store/redis/script.rs`): the latest "now" decided.
const CLOCK: &str = "sgclock:clock";

/// A log written 0.5 s ahead, with the node's clock as that clock left it (a failover to a node
/// whose clock is behind: the clock key is replicated with the counters).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_log_written_under_a_clock_ahead() {
    redis_log_ahead(true).await;
}

/// The same log without the node's clock (written before there was one, or evicted): each log
/// still looks for its newest hit, and the clock then keeps the latest "now".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_log_written_under_a_clock_ahead_without_the_nodes_clock() {
    redis_log_ahead(false).await;
}

/// A log written 0.5 s ahead: a hit that had left its window there (1.2 s before its newest),
/// one 0.6 s before it, and the newest. Trimmed as of the newest hit, the first is gone: the
/// counter holds 2 of its 3 and takes one more, recorded after the newest; the node's clock is
/// then at least that hit's time, so the next call looks again.
async fn redis_log_ahead(with_clock: bool) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server).await;
    let c = counter("log", 3, Precision::Exact, 1);
    let key = redis_key(&c);
    let ahead = redis_now(&server) + AHEAD;
    for (member, score) in [("gone", ahead - 1_200_000), ("kept", ahead - 600_000)] {
        server.cli(&["ZADD", &key, &score.to_string(), member]);
    }
    server.cli(&["ZADD", &key, &ahead.to_string(), "newest"]);
    server.cli(&["PEXPIRE", &key, "1500"]);
    if with_clock {
        server.cli(&["SET", CLOCK, &ahead.to_string()]);
    }

    let d = decide(&store, &c).await;
    assert!(
        d.allowed,
        "the hit that left as of the newest is gone: {d:?}"
    );
    assert_eq!(d.counters[0].count, 3, "{d:?}");
    assert_eq!(server.cli(&["ZCARD", &key]), "3");
    assert_eq!(server.cli(&["ZSCORE", &key, "gone"]), "", "trimmed");
    let recorded: Vec<String> = server
        .cli(&["ZRANGE", &key, "-1", "-1", "WITHSCORES"])
        .lines()
        .map(str::to_string)
        .collect();
    let score: u64 = recorded[1].parse().expect("a score");
    assert!(
        score >= ahead,
        "recorded after the newest hit: {recorded:?}"
    );
    let pttl: u64 = server.cli(&["PTTL", &key]).parse().expect("PTTL");
    assert!(pttl > 1_200, "kept until its hits leave: PTTL {pttl}");
    let clock: u64 = server
        .cli(&["GET", CLOCK])
        .parse()
        .expect("the node's clock");
    assert!(
        clock >= score,
        "the node's clock {clock} is not behind the hit recorded at {score}"
    );

    let d = decide(&store, &c).await;
    assert!(!d.allowed && d.counters[0].count == 3, "full: {d:?}");
    // The oldest held hit leaves 0.4 s after the newest's time, 0.9 s from now in this clock.
    let reset = d.counters[0].reset_after;
    assert!(
        reset > Duration::from_millis(700) && reset <= Duration::from_millis(900),
        "{reset:?}"
    );
}

/// A bucket hash written 0.5 s ahead, as the script leaves it where the node has no clock (a
/// cluster; `n` the newest bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_buckets_written_under_a_clock_ahead() {
    redis_buckets_ahead(false).await;
}

/// The same with the node's clock at the newest hit's time, and `n` behind the newest bucket: the
/// node's clock, not `n`, is every counter's "now" there, and the record moves `n` on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_buckets_written_under_a_clock_ahead_with_the_nodes_clock() {
    redis_buckets_ahead(true).await;
}

/// A bucket hash written 0.5 s ahead (`t` the total, `o` the oldest bucket, `n` a newest one): a
/// bucket that had left the window there, one 10 buckets before the newest, and the newest.
/// Trimmed as of the newest bucket, the first is gone.
async fn redis_buckets_ahead(with_clock: bool) {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server).await;
    let c = counter("buckets", 5, buckets(), 1);
    let key = redis_key(&c);
    let ahead = redis_now(&server) + AHEAD;
    let newest = ahead / G;
    let (gone, kept) = (newest - SPAN - 2, newest - 10);
    let field = |i: u64| i.to_string();
    let n = if with_clock { kept } else { newest };
    server.cli(&[
        "HSET",
        &key,
        &field(gone),
        "2",
        &field(kept),
        "2",
        &field(newest),
        "1",
        "t",
        "5",
        "o",
        &field(gone),
        "n",
        &field(n),
    ]);
    if with_clock {
        server.cli(&["SET", CLOCK, &ahead.to_string()]);
    }
    server.cli(&["PEXPIRE", &key, "1600"]);

    let d = decide(&store, &c).await;
    assert!(
        d.allowed,
        "the bucket that left as of the newest is gone: {d:?}"
    );
    assert_eq!(d.counters[0].count, 4, "{d:?}");
    assert_eq!(server.cli(&["HGET", &key, &field(gone)]), "", "trimmed");
    assert_eq!(
        server.cli(&["HGET", &key, &field(newest)]),
        "2",
        "recorded in the newest"
    );
    assert_eq!(server.cli(&["HGET", &key, "t"]), "4");
    assert_eq!(server.cli(&["HGET", &key, "o"]), field(kept));
    assert_eq!(server.cli(&["HGET", &key, "n"]), field(newest));
    let pttl: u64 = server.cli(&["PTTL", &key]).parse().expect("PTTL");
    assert!(
        pttl > 1_200,
        "kept until the newest bucket leaves: PTTL {pttl}"
    );
}

/// Every bucket of a counter ahead of the clock (the oldest too): a request whose hits need more
/// than the oldest bucket frees reads the buckets from the oldest on, which must not be an empty
/// range (an error that failed every request batched into the call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_buckets_all_ahead_never_error() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server).await;
    let c = counter("ahead", 5, buckets(), 2);
    let other = counter("other", 5, Precision::Exact, 1);
    let key = redis_key(&c);
    let newest = (redis_now(&server) + AHEAD) / G;
    let oldest = newest - 10;
    let field = |i: u64| i.to_string();
    server.cli(&[
        "HSET",
        &key,
        &field(oldest),
        "1",
        &field(newest),
        "4",
        "t",
        "5",
        "o",
        &field(oldest),
        "n",
        &field(newest),
    ]);
    server.cli(&["PEXPIRE", &key, "1600"]);

    // Two requests started together share one script call: the other's answer depends on it.
    let (a, b) = tokio::join!(
        store.decide(std::slice::from_ref(&c)),
        store.decide(std::slice::from_ref(&other))
    );
    let d = a.expect("a counter ahead of the clock is decided");
    assert!(b.expect("the request beside it too").allowed);
    assert!(!d.allowed && d.counters[0].count == 5, "{d:?}");
    // Both hits need the newest bucket to leave: 51 buckets after its start, ~0.5 s ahead.
    let reset = d.counters[0].reset_after;
    assert!(
        reset > W && reset <= W + Duration::from_millis(600),
        "{reset:?}"
    );
    let check = store
        .decide(&[counter("ahead", 5, buckets(), 0)])
        .await
        .expect("a check");
    assert!(check.allowed && check.counters[0].count == 5, "{check:?}");
}

/// The memory store, the same two counters: written, the clock stepped back 0.5 s, decided.
#[test]
fn memory_counters_written_under_a_clock_ahead() {
    let start = Duration::from_secs(1_800_000_000);
    let clock = Arc::new(ManualClock::new(start));
    let store = MemoryStore::new(clock.clone());
    let log = counter("log", 3, Precision::Exact, 1);
    let at = |micros: u64| start + Duration::from_micros(micros);
    let ahead = 2_000_000;
    for t in [ahead - 1_200_000, ahead - 600_000, ahead] {
        clock.set(at(t));
        assert!(store.decide_now(std::slice::from_ref(&log)).allowed);
    }
    clock.set(at(ahead - AHEAD));
    let d = store.decide_now(std::slice::from_ref(&log));
    assert!(d.allowed && d.counters[0].count == 3, "{d:?}");
    assert!(!store.decide_now(std::slice::from_ref(&log)).allowed);

    let b = counter("buckets", 5, buckets(), 1);
    let (gone, kept, newest) = (10 * G, (SPAN + 2) * G, (SPAN + 12) * G);
    for (t, hits) in [(gone, 2), (kept, 2), (newest, 1)] {
        clock.set(at(t));
        let request = Counter { hits, ..b.clone() };
        assert!(store.decide_now(&[request]).allowed);
    }
    clock.set(at(newest - AHEAD));
    let d = store.decide_now(std::slice::from_ref(&b));
    assert!(d.allowed && d.counters[0].count == 4, "{d:?}");
}

/// A key of another type where the node's clock goes (not written by slidegate) fails no
/// decision and is left as it is: each log then looks for its newest hit itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clock_key_of_another_type_fails_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server).await;
    server.cli(&["HSET", CLOCK, "f", "v"]);
    let c = counter("foreign", 2, Precision::Exact, 1);
    for expected in [true, true, false] {
        let d = decide(&store, &c).await;
        assert_eq!(d.allowed, expected, "{d:?}");
    }
    assert_eq!(server.cli(&["HGET", CLOCK, "f"]), "v", "left as it was");
}

/// Decisions keep the node's clock at Redis's `TIME`: after a call it holds a time no earlier
/// than the hits the call recorded, a later call moves it on, and one that records nothing (a
/// check, a denial) writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_nodes_clock_follows_time() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server).await;
    let c = counter("follows", 10, Precision::Exact, 1);
    let key = redis_key(&c);
    let before = redis_now(&server);
    decide(&store, &c).await;
    let first: u64 = server
        .cli(&["GET", CLOCK])
        .parse()
        .expect("the node's clock");
    let recorded: Vec<String> = (server
        .cli(&["ZRANGE", &key, "-1", "-1", "WITHSCORES"])
        .lines())
    .map(str::to_string)
    .collect();
    let score: u64 = recorded[1].parse().expect("a score");
    assert!(
        first >= before && first >= score,
        "{first} {before} {score}"
    );
    std::thread::sleep(Duration::from_millis(5));
    decide(&store, &c).await;
    let second: u64 = server
        .cli(&["GET", CLOCK])
        .parse()
        .expect("the node's clock");
    assert!(second > first, "{second} after {first}");
    server.cli(&["DEL", CLOCK]);
    let check = counter("follows", 10, Precision::Exact, 0);
    let over = counter("follows", 10, Precision::Exact, 11);
    for c in [check, over] {
        decide(&store, &c).await;
    }
    assert_eq!(
        server.cli(&["EXISTS", CLOCK]),
        "0",
        "written by no recording"
    );
}

/// A bucket counter found empty (new, or every bucket gone) while the node's clock is ahead of
/// `TIME` records into the clock's bucket, not `TIME`'s: a bucket a window older than the clock
/// would be trimmed by the next call, which would then admit again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_empty_buckets_behind_the_nodes_clock_still_limit() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server).await;
    let window = Duration::from_millis(100);
    let c = Counter {
        key: CounterKey::new("clock", [("k", "empty")], window),
        window,
        precision: Precision::Buckets(Duration::from_millis(10)),
        ..counter("empty", 1, buckets(), 1)
    };
    // Half a second ahead: five windows, within what the clock is trusted for.
    server.cli(&["SET", CLOCK, &(redis_now(&server) + AHEAD).to_string()]);
    let first = decide(&store, &c).await;
    assert!(first.allowed, "{first:?}");
    let second = decide(&store, &c).await;
    assert!(!second.allowed, "the first hit still counts: {second:?}");
}

/// A clock key that cannot be the node's clock is not used and left as it is: text that is not a
/// number, or a time more than a second ahead of `TIME` (a step back by more than that: each
/// counter then finds its own "now", and the clock stays until `TIME` catches up with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clock_far_ahead_or_not_a_number_is_left_alone() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server).await;
    let far = (redis_now(&server) + 60_000_000).to_string();
    for (name, value) in [("text", "not a time"), ("far", far.as_str())] {
        server.cli(&["SET", CLOCK, value]);
        let c = counter(name, 1, Precision::Exact, 1);
        let d = decide(&store, &c).await;
        assert!(d.allowed && d.counters[0].count == 1, "{name}: {d:?}");
        // Decided as of TIME: the hit leaves a window from now, not a minute later.
        let reset = d.counters[0].reset_after;
        assert!(reset <= W, "{name}: {reset:?}");
        let d = decide(&store, &c).await;
        assert!(!d.allowed, "{name}: {d:?}");
        assert_eq!(server.cli(&["GET", CLOCK]), value, "{name}: left as it was");
    }
}
