//! The stores against their specification, on real parts: one behaviour suite run on the memory
//! store, a standalone Redis (with and without the local deny cache) and a 3-master Redis Cluster,
//! and the helpers the other store test files share (counters, options, keys on two slots). The
//! suite's fixture is in `suite_fixture`.
//!
//! Redis servers are started by the tests on free ports (see `support`). The memory store runs on
//! a manual clock; Redis runs on real time with windows of 1-2 s and assertions bounded by the
//! measured time between calls, so they hold on a loaded machine without being vague.

use std::time::Duration;

use crate::suite_fixture::{Backend, Fixture, assert_within};
use redis::cluster_routing::Slot;
use slidegate::store::{Counter, CounterKey, Precision, RedisOptions};

pub(crate) const PREFIX: &str = "sgtest:";
/// Generous per-call timeout: tests share two cores with builds.
const TIMEOUT: Duration = Duration::from_secs(3);

pub(crate) fn counter(
    domain: &str,
    name: &str,
    limit: u64,
    window: Duration,
    hits: u64,
) -> Counter {
    Counter {
        key: CounterKey::new(domain, [("k", name)], window),
        limit,
        window,
        hits,
        shadow: false,
        precision: Precision::Exact,
        kind: slidegate::store::HitKind::Admitted,
    }
}

pub(crate) fn shadow(mut c: Counter) -> Counter {
    c.shadow = true;
    c
}

pub(crate) fn hits(mut c: Counter, hits: u64) -> Counter {
    c.hits = hits;
    c
}

pub(crate) fn redis_options(url: String) -> RedisOptions {
    RedisOptions {
        url,
        prefix: PREFIX.to_string(),
        timeout: TIMEOUT,
        deny_cache: 0,
        ..RedisOptions::default()
    }
}

/// Options for a cluster store with these seed URLs, otherwise as [`redis_options`].
pub(crate) fn cluster_options(seeds: Vec<String>) -> RedisOptions {
    RedisOptions {
        cluster_nodes: seeds,
        ..redis_options(String::new())
    }
}

/// `c` as a bucket counter of `width` (a new key: representations never share one).
pub(crate) fn bucketed(c: Counter, width: Duration) -> Counter {
    let precision = Precision::Buckets(width);
    let entries = [("k", c.key.as_str())];
    Counter {
        key: CounterKey::new("buckets", entries, c.window),
        precision,
        ..c
    }
}

// ---------------------------------------------------------------------------------------------
// The behaviour suite. Every behaviour uses its own domain, so they never share counters.

async fn run_suite(f: &Fixture) {
    eprintln!("[{}] limits", f.name);
    limits(f).await;
    for width in [None, Some(Duration::from_secs(1))] {
        eprintln!("[{}] hits_zero_and_many, buckets {width:?}", f.name);
        hits_zero_and_many(f, width).await;
        eprintln!("[{}] same_counter_twice, buckets {width:?}", f.name);
        same_counter_twice(f, width).await;
    }
    eprintln!("[{}] all_or_nothing", f.name);
    all_or_nothing(f).await;
    eprintln!("[{}] many_counters", f.name);
    many_counters(f).await;
    eprintln!("[{}] shadow_counters", f.name);
    shadow_counters(f).await;
    eprintln!("[{}] cross_slot", f.name);
    cross_slot(f).await;
    eprintln!("[{}] reset_after", f.name);
    reset_after(f).await;
    eprintln!("[{}] window_slides", f.name);
    window_slides(f).await;
    eprintln!("[{}] expiry", f.name);
    expiry(f).await;
    eprintln!("[{}] buckets", f.name);
    buckets(f).await;
    eprintln!("[{}] mixed_representations", f.name);
    mixed_representations(f).await;
    eprintln!("[{}] long_windows", f.name);
    long_windows(f).await;
}

async fn limits(f: &Fixture) {
    let c = counter("limits", "a", 3, Duration::from_secs(60), 1);
    for n in 1..=3 {
        let d = f.decide(std::slice::from_ref(&c)).await;
        assert!(d.allowed, "[{}] hit {n}", f.name);
        let r = &d.counters[0];
        assert!(!r.over_limit);
        assert_eq!((r.count, r.remaining), (n, 3 - n), "[{}] hit {n}", f.name);
    }
    for _ in 0..3 {
        let d = f.decide(std::slice::from_ref(&c)).await;
        assert!(!d.allowed, "[{}] over the limit", f.name);
        let r = &d.counters[0];
        assert!(r.over_limit);
        assert_eq!((r.count, r.remaining), (3, 0));
        assert!(r.reset_after > Duration::from_secs(50), "{r:?}");
    }
    // Another counter is independent.
    let other = counter("limits", "b", 3, Duration::from_secs(60), 1);
    assert!(f.decide(&[other]).await.allowed);
    // An empty request is allowed and touches nothing.
    let d = f.decide(&[]).await;
    assert!(d.allowed && d.counters.is_empty());
}

/// `c` as the exact log (`None`) or as buckets of `width`: the suites that must hold for both.
fn kept_as(c: Counter, width: Option<Duration>) -> Counter {
    match width {
        Some(width) => bucketed(c, width),
        None => c,
    }
}

async fn hits_zero_and_many(f: &Fixture, width: Option<Duration>) {
    let w = Duration::from_secs(60);
    let c = kept_as(counter("hits", "a", 5, w, 1), width);
    // hits 0 on an empty counter: a check, nothing recorded.
    let d = f.decide(&[hits(c.clone(), 0)]).await;
    assert!(d.allowed);
    let r = &d.counters[0];
    assert_eq!((r.over_limit, r.count, r.remaining), (false, 0, 5));
    assert_eq!(r.reset_after, Duration::ZERO, "empty window");
    let d = f.decide(&[hits(c.clone(), 3)]).await;
    assert!(d.allowed);
    assert_eq!((d.counters[0].count, d.counters[0].remaining), (3, 2));
    let d = f.decide(&[hits(c.clone(), 0)]).await;
    assert_eq!(
        (d.allowed, d.counters[0].count),
        (true, 3),
        "checks record nothing"
    );
    // 3 more do not fit: denied, nothing recorded.
    let d = f.decide(&[hits(c.clone(), 3)]).await;
    assert!(!d.allowed && d.counters[0].over_limit);
    assert_eq!((d.counters[0].count, d.counters[0].remaining), (3, 2));
    // Exactly filling up is allowed.
    let d = f.decide(&[hits(c.clone(), 2)]).await;
    assert!(d.allowed);
    assert_eq!((d.counters[0].count, d.counters[0].remaining), (5, 0));
    // hits 0 on the full counter: 0 hits fit, so the check is allowed (as in
    // envoyproxy/ratelimit), and it reports the counter full.
    let d = f.decide(&[hits(c.clone(), 0)]).await;
    assert!(
        d.allowed,
        "[{}] a check of 0 hits fits a full counter",
        f.name
    );
    let r = &d.counters[0];
    assert_eq!(
        (r.over_limit, r.count, r.remaining),
        (false, 5, 0),
        "[{}]",
        f.name
    );
    // One hit does not fit, and a check with a limit below what the window holds (a reload
    // lowered it) is over.
    assert!(!f.decide(std::slice::from_ref(&c)).await.allowed);
    let lowered = Counter {
        limit: 4,
        ..hits(c.clone(), 0)
    };
    let d = f.decide(&[lowered]).await;
    assert!(!d.allowed && d.counters[0].over_limit, "[{}]", f.name);
    // hits > limit: always denied, even on an empty counter; the wait is the whole window.
    let big = kept_as(counter("hits", "big", 5, w, 6), width);
    let d = f.decide(std::slice::from_ref(&big)).await;
    assert!(!d.allowed && d.counters[0].over_limit);
    assert_eq!(d.counters[0].count, 0);
    assert_eq!(d.counters[0].reset_after, w);
    let d = f.decide(&[hits(big.clone(), 5)]).await;
    assert!(d.allowed, "the denied big request consumed nothing");
}

async fn all_or_nothing(f: &Fixture) {
    let w = Duration::from_secs(60);
    let a = counter("aon", "a", 1, w, 1);
    let b = counter("aon", "b", 5, w, 1);
    let c = counter("aon-other", "c", 5, w, 1);
    let d = f.decide(&[a.clone(), b.clone(), c.clone()]).await;
    assert!(d.allowed);
    // Now a is full: the request is denied and neither b nor c records anything.
    for _ in 0..3 {
        let d = f.decide(&[b.clone(), a.clone(), c.clone()]).await;
        assert!(!d.allowed, "[{}]", f.name);
        assert!(!d.counters[0].over_limit && d.counters[1].over_limit);
        assert!(!d.counters[2].over_limit);
        if !f.cached {
            assert_eq!(d.counters[0].count, 1, "b reports what it holds");
            assert_eq!(d.counters[0].remaining, 4);
        }
    }
    let d = f.decide(&[hits(b.clone(), 0), hits(c.clone(), 0)]).await;
    assert_eq!(d.counters[0].count, 1, "[{}] b consumed nothing", f.name);
    assert_eq!(d.counters[1].count, 1, "[{}] c consumed nothing", f.name);
    // Without a, b and c still admit.
    let d = f.decide(&[b.clone(), c.clone()]).await;
    assert!(d.allowed);
    assert_eq!((d.counters[0].count, d.counters[1].count), (2, 2));
}

/// A request with more counters than one slice of the script's packed answer holds (1000
/// integers, 5 per counter): every counter is answered, in order.
async fn many_counters(f: &Fixture) {
    let w = Duration::from_secs(60);
    let counters: Vec<Counter> = (0..300)
        .map(|i| counter("many", &format!("c{i}"), 2 + i % 3, w, 1))
        .collect();
    for n in 1..=2 {
        let d = f.decide(&counters).await;
        assert!(d.allowed, "[{}] request {n}", f.name);
        assert_eq!(d.counters.len(), counters.len());
        for (c, r) in counters.iter().zip(&d.counters) {
            assert_eq!(
                (r.count, r.remaining),
                (n, c.limit - n),
                "[{}] {c:?}",
                f.name
            );
        }
    }
    // Every third counter (limit 2) is full now, the first and the last of them too.
    let d = f.decide(&counters).await;
    assert!(!d.allowed, "[{}]", f.name);
    for (i, r) in d.counters.iter().enumerate() {
        assert_eq!(r.over_limit, i % 3 == 0, "[{}] c{i}", f.name);
    }
}

async fn shadow_counters(f: &Fixture) {
    let w = Duration::from_secs(60);
    let enforced = counter("shadow", "enforced", 3, w, 1);
    let s = shadow(counter("shadow", "shadowed", 1, w, 1));
    let d = f.decide(&[enforced.clone(), s.clone()]).await;
    assert!(d.allowed);
    assert_eq!(d.counters[1].count, 1);
    // The shadow counter is over: reported, never denies, and records nothing while over.
    let d = f.decide(&[enforced.clone(), s.clone()]).await;
    assert!(d.allowed, "[{}] shadow never denies", f.name);
    assert!(!d.counters[0].over_limit && d.counters[1].over_limit);
    assert_eq!((d.counters[0].count, d.counters[1].count), (2, 1));
    assert_eq!(d.counters[1].remaining, 0);
    // A denied request records nothing on shadow counters either.
    let roomy = shadow(counter("shadow", "roomy", 10, w, 1));
    assert!(f.decide(&[enforced.clone(), roomy.clone()]).await.allowed);
    let d = f.decide(&[enforced.clone(), roomy.clone()]).await;
    assert!(!d.allowed);
    let d = f.decide(&[hits(roomy.clone(), 0)]).await;
    assert_eq!(
        d.counters[0].count, 1,
        "[{}] denied request left roomy alone",
        f.name
    );
    // Shadow alone over its limit: still allowed.
    let d = f.decide(std::slice::from_ref(&s)).await;
    assert!(d.allowed && d.counters[0].over_limit);
}

async fn same_counter_twice(f: &Fixture, width: Option<Duration>) {
    let c = kept_as(counter("twice", "a", 3, Duration::from_secs(60), 2), width);
    let d = f.decide(&[c.clone(), c.clone()]).await;
    assert!(
        !d.allowed,
        "[{}] 2 + 2 hits of one counter exceed 3",
        f.name
    );
    let one = hits(c.clone(), 1);
    let d = f.decide(&[one.clone(), one.clone()]).await;
    assert!(d.allowed);
    let d = f.decide(&[hits(c.clone(), 0)]).await;
    assert_eq!(d.counters[0].count, 2);

    // Denied because the second occurrence sees the first's hit: nothing is recorded, and nothing
    // (a cached deny included) may say otherwise afterwards.
    let w = Duration::from_secs(60);
    let once = kept_as(counter("twice", "once", 1, w, 1), width);
    let d = f.decide(&[once.clone(), once.clone()]).await;
    assert!(!d.allowed && d.counters[1].over_limit, "[{}]", f.name);
    if let Some(exists) = f.cli(&["EXISTS"], &once) {
        assert_eq!(exists, "0", "[{}]", f.name);
    }
    let d = f.decide(std::slice::from_ref(&once)).await;
    assert!(
        d.allowed,
        "[{}] the denied request left the counter empty",
        f.name
    );

    // Denied by another counter (on another slot, in a cluster): both occurrences report what
    // the counter holds, not the hits of a request that was not recorded.
    let (full, v) = two_slots("twice-denied", 1, 3, w);
    let (full, v) = (kept_as(full, width), kept_as(v, width));
    assert!(f.decide(std::slice::from_ref(&full)).await.allowed);
    let d = f.decide(&[v.clone(), v.clone(), full.clone()]).await;
    assert!(!d.allowed && d.counters[2].over_limit, "[{}]", f.name);
    for r in &d.counters[..2] {
        assert!(!r.over_limit, "[{}] {r:?}", f.name);
        assert_eq!(
            (r.count, r.remaining),
            (0, 3),
            "[{}] {:?}",
            f.name,
            d.counters
        );
    }
    let d = f.decide(&[hits(v.clone(), 0)]).await;
    assert_eq!(d.counters[0].count, 0, "[{}]", f.name);
}

/// Windows up to the longest that rules may configure (100 years) are held as configured.
async fn long_windows(f: &Fixture) {
    for years in [50, 100] {
        let w = Duration::from_secs(years * 365 * 86_400);
        let c = counter("long", &format!("y{years}"), 1, w, 1);
        let d = f.decide(std::slice::from_ref(&c)).await;
        assert!(d.allowed);
        assert_eq!(d.counters[0].reset_after, w, "[{}] {years} years", f.name);
        let d = f.decide(std::slice::from_ref(&c)).await;
        assert!(!d.allowed);
        assert_within(
            &format!("[{}] {years} years, denied", f.name),
            d.counters[0].reset_after,
            w - Duration::from_secs(5),
            w,
        );
    }
}

/// Two counters on different cluster slots (for the other stores just two counters): a deny by one
/// leaves nothing behind on the other (the cluster store's compensation).
async fn cross_slot(f: &Fixture) {
    let w = Duration::from_secs(60);
    let (a, b) = two_slots("xslot", 1, 3, w);
    assert!(f.decide(std::slice::from_ref(&a)).await.allowed);
    for _ in 0..3 {
        let d = f.decide(&[b.clone(), a.clone()]).await;
        assert!(!d.allowed, "[{}]", f.name);
        assert!(!d.counters[0].over_limit && d.counters[1].over_limit);
        if !f.cached {
            assert_eq!(
                d.counters[0].count, 0,
                "[{}] b's hit was taken back",
                f.name
            );
            assert_eq!(d.counters[0].remaining, 3);
        }
    }
    let log = format!("{PREFIX}{}p", b.key.as_str());
    for card in [f.cli(&["ZCARD"], &b), f.cli_key(&["ZCARD"], &log)]
        .into_iter()
        .flatten()
    {
        assert_eq!(
            card, "0",
            "[{}] no member of a denied request remains, in the counter or its provisional log",
            f.name
        );
    }
    let d = f.decide(&[hits(b.clone(), 0)]).await;
    assert_eq!(d.counters[0].count, 0);

    // Denied by the other slot's counter; the first slot recorded and gives back.
    let (c, e) = two_slots("xslot2", 5, 1, w);
    assert!(f.decide(std::slice::from_ref(&e)).await.allowed);
    let d = f.decide(&[c.clone(), e.clone()]).await;
    assert!(!d.allowed && d.counters[1].over_limit);
    let d = f.decide(&[hits(c.clone(), 0)]).await;
    assert_eq!(d.counters[0].count, 0, "[{}]", f.name);

    // A shadow counter over its limit on one slot does not stop the other.
    let d = f.decide(&[shadow(a.clone()), b.clone()]).await;
    assert!(d.allowed && d.counters[0].over_limit && !d.counters[1].over_limit);
    assert_eq!(d.counters[1].count, 1);
}

/// Counters `a` (limit `la`) and `b` (limit `lb`) whose Redis keys fall on different slots.
pub(crate) fn two_slots(domain: &str, la: u64, lb: u64, w: Duration) -> (Counter, Counter) {
    let a = counter(domain, "a", la, w, 1);
    let slot_a = Slot::for_key(format!("{PREFIX}{}", a.key.as_str()));
    for i in 0.. {
        let b = counter(domain, &format!("b{i}"), lb, w, 1);
        if Slot::for_key(format!("{PREFIX}{}", b.key.as_str())) != slot_a {
            return (a, b);
        }
    }
    unreachable!()
}

async fn reset_after(f: &Fixture) {
    let w = Duration::from_secs(2);
    let c = counter("reset", "a", 2, w, 1);
    let (d, t1_lo, t1_hi) = f.timed(std::slice::from_ref(&c)).await;
    assert!(d.allowed);
    // The oldest hit (this one) leaves in a whole window.
    assert_eq!(d.counters[0].reset_after, w, "[{}] first hit", f.name);
    f.sleep(Duration::from_millis(500)).await;
    let (d, t2_lo, t2_hi) = f.timed(std::slice::from_ref(&c)).await;
    assert!(d.allowed);
    // Until the first hit leaves: w - (t2 - t1).
    assert_within(
        "allowed: oldest leaves",
        d.counters[0].reset_after,
        w - (t2_hi - t1_lo),
        w - (t2_lo - t1_hi),
    );
    let (d, t3_lo, t3_hi) = f.timed(std::slice::from_ref(&c)).await;
    assert!(!d.allowed);
    // A deny cache answers this one locally from the second call's answer, timed from when that
    // call was sent: early by at most the second call's duration, never late.
    assert_within(
        "denied 1 hit: first leaves",
        d.counters[0].reset_after,
        (w - (t3_hi - t1_lo)).saturating_sub(t2_hi - t2_lo),
        w - (t3_lo - t1_hi),
    );
    // Two hits need both gone: the second leaves at t2 + w.
    let (d, t4_lo, t4_hi) = f.timed(&[hits(c.clone(), 2)]).await;
    assert!(!d.allowed);
    assert_within(
        "denied 2 hits: second leaves",
        d.counters[0].reset_after,
        w - (t4_hi - t2_lo),
        w - (t4_lo - t2_hi),
    );
    // More than the limit never fits: the whole window.
    let d = f.decide(&[hits(c.clone(), 3)]).await;
    assert_eq!(d.counters[0].reset_after, w);
    // A check on an empty counter: zero.
    let d = f.decide(&[counter("reset", "empty", 2, w, 0)]).await;
    assert_eq!(d.counters[0].reset_after, Duration::ZERO);
}

async fn window_slides(f: &Fixture) {
    let w = Duration::from_secs(1);
    let c = counter("slide", "a", 2, w, 1);
    assert!(f.decide(std::slice::from_ref(&c)).await.allowed); // A
    f.sleep(w / 2).await;
    assert!(f.decide(std::slice::from_ref(&c)).await.allowed); // B
    let d = f.decide(std::slice::from_ref(&c)).await;
    assert!(!d.allowed);
    let wait = d.counters[0].reset_after;
    assert!(wait <= w / 2 && wait > Duration::ZERO, "{wait:?}");
    if f.real_time() {
        // Just before A leaves: still denied.
        f.sleep(wait.saturating_sub(Duration::from_millis(250)))
            .await;
        assert!(!f.decide(std::slice::from_ref(&c)).await.allowed);
        f.sleep(Duration::from_millis(300)).await;
    } else {
        // Exact boundaries: the window is (t - w, t].
        f.sleep(wait - Duration::from_micros(1)).await;
        assert!(!f.decide(std::slice::from_ref(&c)).await.allowed);
        f.sleep(Duration::from_micros(1)).await;
    }
    // A left, B is still in the window: exactly one more fits (a fixed window would give two).
    let d = f.decide(std::slice::from_ref(&c)).await;
    assert!(d.allowed, "[{}] A left the window", f.name);
    assert_eq!(d.counters[0].count, 2);
    assert!(
        !f.decide(std::slice::from_ref(&c)).await.allowed,
        "[{}] B still in",
        f.name
    );
    // After a whole quiet window the full limit is back.
    f.sleep(w + Duration::from_millis(50)).await;
    let d = f.decide(&[hits(c.clone(), 2)]).await;
    assert!(d.allowed, "[{}] full limit after a quiet window", f.name);
}

async fn expiry(f: &Fixture) {
    let w = Duration::from_secs(1);
    let c = counter("expiry", "a", 5, w, 2);
    assert!(f.decide(std::slice::from_ref(&c)).await.allowed);
    if let Some(pttl) = f.cli(&["PTTL"], &c) {
        let pttl: i64 = pttl.parse().expect("PTTL");
        assert!(
            pttl > 0 && pttl <= 1000,
            "[{}] PTTL {pttl} within the window",
            f.name
        );
        // A denied request does not extend the key's life.
        assert!(!f.decide(&[hits(c.clone(), 4)]).await.allowed);
        let again: i64 = f
            .cli(&["PTTL"], &c)
            .and_then(|p| p.parse().ok())
            .unwrap_or(-3);
        assert!(again <= pttl, "[{}] {again} > {pttl}", f.name);
    }
    f.sleep(w + Duration::from_millis(100)).await;
    if let Some(exists) = f.cli(&["EXISTS"], &c) {
        assert_eq!(exists, "0", "[{}] the key expired with its window", f.name);
    }
    let d = f.decide(&[hits(c.clone(), 5)]).await;
    assert!(d.allowed);
}

/// A bucket counter: the oldest overlapping bucket counts whole, so capacity comes back when the
/// bucket of the oldest hit leaves the window, between W and W + g after the hit; the store
/// reports that time; checks record nothing; Redis keeps a hash that expires with the newest
/// bucket.
async fn buckets(f: &Fixture) {
    let (w, g) = (Duration::from_secs(2), Duration::from_millis(500));
    let margin = if f.real_time() {
        Duration::from_millis(150)
    } else {
        Duration::from_micros(1)
    };
    // Hits early in their bucket, so that the bucket stays well past W (2 margins): try counters
    // until one's hits land so.
    let mut attempt = 0;
    let (c, leaves, lo) = loop {
        attempt += 1;
        assert!(attempt < 20, "[{}] never early in a bucket", f.name);
        let c = bucketed(counter("buckets", &format!("a{attempt}"), 3, w, 1), g);
        let d = f.decide(&[hits(c.clone(), 0)]).await;
        assert!(d.allowed && d.counters[0].count == 0, "[{}] {d:?}", f.name);
        assert_eq!(d.counters[0].reset_after, Duration::ZERO);
        let (d, lo, _) = f.timed(&[hits(c.clone(), 3)]).await;
        assert!(d.allowed, "[{}]", f.name);
        let r = &d.counters[0];
        assert_eq!((r.count, r.remaining), (3, 0));
        // The hits' bucket leaves the window between W and W + g from now.
        assert_within("bucket leaves", r.reset_after, w, w + g);
        if r.reset_after > w + 2 * margin {
            break (c, r.reset_after, lo);
        }
        f.sleep(g / 3).await;
    };
    if let Some(kind) = f.cli(&["TYPE"], &c) {
        assert_eq!(kind, "hash", "[{}] buckets, not a log", f.name);
        let pttl: u128 = f
            .cli(&["PTTL"], &c)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        assert!(
            pttl > (w + margin).as_millis() && pttl <= (w + g).as_millis(),
            "[{}] PTTL {pttl}: until the bucket leaves",
            f.name
        );
    }
    let d = f.decide(std::slice::from_ref(&c)).await;
    assert!(!d.allowed && d.counters[0].over_limit, "[{}]", f.name);
    assert_eq!((d.counters[0].count, d.counters[0].remaining), (3, 0));
    assert!(d.counters[0].reset_after <= leaves, "[{}] {d:?}", f.name);
    let d = f.decide(&[hits(c.clone(), 4)]).await;
    assert_eq!(
        d.counters[0].reset_after, w,
        "more than the limit never fits"
    );
    // Past W, where the exact log would admit again, but before the bucket leaves: denied.
    f.sleep((w + margin).saturating_sub(f.now() - lo)).await;
    let d = f.decide(std::slice::from_ref(&c)).await;
    assert!(
        !d.allowed,
        "[{}] the oldest bucket still counts whole",
        f.name
    );
    f.sleep((leaves + margin).saturating_sub(f.now() - lo))
        .await;
    let d = f.decide(&[hits(c.clone(), 3)]).await;
    assert!(
        d.allowed,
        "[{}] the bucket left: all three fit again",
        f.name
    );
    assert_eq!(d.counters[0].count, 3);
    if f.real_time() {
        f.sleep(w + g + Duration::from_millis(100)).await;
        assert_eq!(
            f.cli(&["EXISTS"], &c).as_deref(),
            Some("0"),
            "[{}] the key expired with its newest bucket",
            f.name
        );
    }
}

/// A log counter and a bucket counter in one request (on different cluster slots): all or nothing
/// whichever of them denies, and a shadow bucket counter never denies.
async fn mixed_representations(f: &Fixture) {
    let w = Duration::from_secs(60);
    let log = counter("mixed", "log", 1, w, 1);
    let bucket = bucketed(counter("mixed", "bucket", 3, w, 1), Duration::from_secs(1));
    let d = f.decide(&[log.clone(), bucket.clone()]).await;
    assert!(d.allowed, "[{}]", f.name);
    // The log is full: the bucket counter records nothing.
    for _ in 0..2 {
        let d = f.decide(&[bucket.clone(), log.clone()]).await;
        assert!(!d.allowed && d.counters[1].over_limit, "[{}]", f.name);
    }
    let d = f.decide(&[hits(bucket.clone(), 0)]).await;
    assert_eq!(
        d.counters[0].count, 1,
        "[{}] denied requests left buckets alone",
        f.name
    );
    if matches!(f.backend, Backend::Cluster(_)) {
        // The provisional hash counts per bucket, not per request: the admitted request's hit.
        let log = format!("{PREFIX}{}p", bucket.key.as_str());
        assert_eq!(
            f.cli_key(&["HVALS"], &log).as_deref(),
            Some("1"),
            "[{}] taken back from the provisional hash too",
            f.name
        );
    }
    // The bucket counter denies: a roomy log records nothing.
    let roomy = counter("mixed", "roomy", 10, w, 1);
    assert!(f.decide(&[hits(bucket.clone(), 2)]).await.allowed);
    let d = f.decide(&[roomy.clone(), bucket.clone()]).await;
    assert!(!d.allowed && d.counters[1].over_limit, "[{}]", f.name);
    let d = f.decide(&[hits(roomy.clone(), 0)]).await;
    assert_eq!(
        d.counters[0].count, 0,
        "[{}] denied request left the log alone",
        f.name
    );
    // Shadow buckets over their limit: reported, never deny, record nothing.
    let d = f.decide(&[roomy.clone(), shadow(bucket.clone())]).await;
    assert!(d.allowed && d.counters[1].over_limit, "[{}]", f.name);
    assert_eq!((d.counters[0].count, d.counters[1].count), (1, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_memory() {
    run_suite(&Fixture::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_redis() {
    let Some(f) = Fixture::redis(false).await else {
        return;
    };
    run_suite(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_redis_with_deny_cache() {
    let Some(f) = Fixture::redis(true).await else {
        return;
    };
    run_suite(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_redis_cluster() {
    let Some(f) = Fixture::cluster(false).await else {
        return;
    };
    run_suite(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_redis_cluster_with_deny_cache() {
    let Some(f) = Fixture::cluster(true).await else {
        return;
    };
    run_suite(&f).await;
}
