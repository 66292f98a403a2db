//! A bucket counter in its steady state, across bucket boundaries. The Redis script decides one
//! hit that fits such a counter from the fields it reads first (`decide_buckets_alone` in
//! `src/store/sliding_window/5_decide.lua`): it records into the newest bucket or a new one, and
//! reads the oldest bucket for the wait when that is not the current one; the first hit, a trim
//! and a full counter go the general way. The same sequence runs on the memory store (the
//! reference semantics, on a manual clock) and on a standalone Redis (real time, bounds from the
//! measured time between calls): the decisions, the counts, the waits, and on Redis the fields
//! the script keeps.

use std::time::Duration;

use crate::store::{bucketed, counter};
use crate::suite_fixture::{Fixture, assert_within};
use slidegate::store::Counter;

const WINDOW: Duration = Duration::from_secs(3);
const WIDTH: Duration = Duration::from_millis(200);
const LIMIT: u64 = 6;

/// One hit, admitted with `count` hits in the window, and waiting for the bucket of a hit made
/// between `first.0` and `first.1` to leave (between that hit + WINDOW and + WINDOW + WIDTH);
/// returns when the call was made.
async fn admitted(
    f: &Fixture,
    c: &Counter,
    count: u64,
    first: (Duration, Duration),
    what: &str,
) -> (Duration, Duration) {
    let (d, lo, hi) = f.timed(std::slice::from_ref(c)).await;
    assert!(d.allowed, "[{}] {what}: {d:?}", f.name);
    assert_eq!(d.counters[0].count, count, "[{}] {what}", f.name);
    let earliest = (first.0 + WINDOW).saturating_sub(hi);
    let latest = (first.1 + WINDOW + WIDTH).saturating_sub(lo);
    assert_within(what, d.counters[0].reset_after, earliest, latest);
    (lo, hi)
}

/// A full counter: denied, nothing recorded.
async fn full(f: &Fixture, c: &Counter, what: &str) {
    let d = f.decide(std::slice::from_ref(c)).await;
    assert!(!d.allowed, "[{}] {what}: {d:?}", f.name);
    assert_eq!(d.counters[0].count, LIMIT, "[{}] {what}", f.name);
    assert!(
        d.counters[0].reset_after <= WINDOW + WIDTH,
        "[{}] {what}: {d:?}",
        f.name
    );
}

async fn steady(f: &Fixture) {
    let c = bucketed(counter("steady", "a", LIMIT, WINDOW, 1), WIDTH);
    // A: the counter's first hit, the general way. A2 right after (most likely the same bucket)
    // waits for A's bucket.
    let (d, a_lo, a_hi) = f.timed(std::slice::from_ref(&c)).await;
    assert!(d.allowed, "[{}] A: {d:?}", f.name);
    assert_eq!(d.counters[0].count, 1, "[{}] A", f.name);
    let (_, a2_hi) = admitted(f, &c, 2, (a_lo, a_hi), "A2").await;

    // B to E 1.5 s later, in later buckets than A's (which stays until at least A + WINDOW):
    // each waits for A's bucket.
    f.sleep(Duration::from_millis(1500)).await;
    let b = admitted(f, &c, 3, (a_lo, a_hi), "B").await;
    for count in 4..=LIMIT {
        admitted(f, &c, count, (a_lo, a_hi), "C-E").await;
    }
    full(f, &c, "full").await;
    // The key lives until its newest bucket leaves: at most WINDOW + WIDTH from now, and at
    // least WINDOW from the second burst.
    if let Some(ttl) = f.cli(&["PTTL"], &c) {
        let ttl = Duration::from_millis(ttl.trim().parse().expect("PTTL"));
        let since_b = f.now().saturating_sub(b.0);
        assert_within(
            "the key's expiry",
            ttl,
            WINDOW.saturating_sub(since_b),
            WINDOW + WIDTH,
        );
    }
    if let Some(fields) = f.cli(&["HGETALL"], &c) {
        let fields: Vec<&str> = fields.lines().collect();
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|pair| pair[0] == name)
                .map(|pair| pair[1])
        };
        assert_eq!(field("t"), Some("6"), "[{}] total: {fields:?}", f.name);
        assert_eq!(field("w"), Some("200000"), "[{}] width: {fields:?}", f.name);
        let (oldest, newest) = (field("o"), field("n"));
        assert!(
            oldest.is_some() && newest.is_some() && oldest != newest,
            "[{}] the oldest and the newest bucket: {fields:?}",
            f.name
        );
        let newest = newest.and_then(field).and_then(|n| n.parse::<u64>().ok());
        assert!(
            newest.is_some_and(|n| n >= 1),
            "[{}] the newest bucket holds hits: {fields:?}",
            f.name
        );
    }

    // G once A's and A2's buckets have left (B's stays until at least B + WINDOW): trimmed, the
    // general way. Then H in the same state, B's bucket the oldest, read for the wait.
    let gone = a2_hi + WINDOW + WIDTH + Duration::from_millis(50);
    let now = f.now();
    if gone > now {
        f.sleep(gone - now).await;
    }
    let (d, _, g_hi) = f.timed(std::slice::from_ref(&c)).await;
    assert!(
        g_hi < b.0 + WINDOW,
        "[{}] the machine stalled past the second burst's window: the test cannot conclude",
        f.name
    );
    assert!(d.allowed, "[{}] G: {d:?}", f.name);
    assert_eq!(
        d.counters[0].count,
        LIMIT - 1,
        "[{}] G: A and A2 left",
        f.name
    );
    admitted(f, &c, LIMIT, b, "H").await;
    full(f, &c, "full again").await;
}

#[tokio::test]
async fn a_bucket_counter_in_its_steady_state_on_the_memory_store() {
    steady(&Fixture::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_counter_in_its_steady_state_on_redis() {
    let Some(f) = Fixture::redis(false).await else {
        return;
    };
    steady(&f).await;
}
