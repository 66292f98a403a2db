//! The stores against their specification, on real parts: one behaviour suite run on the memory
//! store, a standalone Redis (with and without the local deny cache) and a 3-master Redis Cluster,
//! plus exactness under concurrency, clock skew between replicas, TLS, authentication, memory per
//! tracked hit, and the deny cache's savings.
//!
//! Redis servers are started by the tests on free ports (see `support`). The memory store runs on
//! a manual clock; Redis runs on real time with windows of 1-2 s and assertions bounded by the
//! measured time between calls, so they hold on a loaded machine without being vague.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::{RedisCluster, RedisServer, TlsRedisCluster, TlsRedisServer};
use proptest::prelude::*;
use redis::cluster_routing::Slot;
use slidegate::store::{
    ClientCertFiles, Clock, Counter, CounterKey, Decision, ManualClock, MemoryStore, Precision,
    RedisOptions, RedisStore, Store, redact_url,
};

const PREFIX: &str = "sgtest:";
/// Generous per-call timeout: tests share two cores with builds.
const TIMEOUT: Duration = Duration::from_secs(3);

fn counter(domain: &str, name: &str, limit: u64, window: Duration, hits: u64) -> Counter {
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

fn shadow(mut c: Counter) -> Counter {
    c.shadow = true;
    c
}

fn hits(mut c: Counter, hits: u64) -> Counter {
    c.hits = hits;
    c
}

fn redis_options(url: String) -> RedisOptions {
    RedisOptions {
        url,
        prefix: PREFIX.to_string(),
        timeout: TIMEOUT,
        deny_cache: 0,
        ..RedisOptions::default()
    }
}

/// Options for a cluster store with these seed URLs, otherwise as [`redis_options`].
fn cluster_options(seeds: Vec<String>) -> RedisOptions {
    RedisOptions {
        cluster_nodes: seeds,
        ..redis_options(String::new())
    }
}

// ---------------------------------------------------------------------------------------------
// The fixture: one store plus what is needed to look behind it.

enum Backend {
    Memory(Arc<ManualClock>),
    Redis(RedisServer),
    Cluster(RedisCluster),
}

struct Fixture {
    name: &'static str,
    store: Arc<dyn Store>,
    backend: Backend,
    /// The store answers some denials from its local deny cache (other counters then unknown).
    cached: bool,
    started: Instant,
}

impl Fixture {
    fn memory() -> Fixture {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let store = Arc::new(MemoryStore::new(clock.clone()));
        Fixture {
            name: "memory",
            store,
            backend: Backend::Memory(clock),
            cached: false,
            started: Instant::now(),
        }
    }

    async fn redis(deny_cache: bool) -> Option<Fixture> {
        let server = RedisServer::start()?;
        let mut opts = redis_options(server.url());
        if deny_cache {
            opts.deny_cache = 1000;
        }
        let store = RedisStore::connect(&opts).await.expect("connect");
        assert_eq!(store.kind(), "redis");
        store.ping().await.expect("ping");
        assert_eq!(store.deny_cache().is_some(), deny_cache);
        Some(Fixture {
            name: if deny_cache { "redis+cache" } else { "redis" },
            store: Arc::new(store),
            backend: Backend::Redis(server),
            cached: deny_cache,
            started: Instant::now(),
        })
    }

    async fn cluster(deny_cache: bool) -> Option<Fixture> {
        let cluster = RedisCluster::start()?;
        let mut opts = cluster_options(cluster.urls());
        if deny_cache {
            opts.deny_cache = 1000;
        }
        let store = RedisStore::connect(&opts).await.expect("connect");
        assert_eq!(store.kind(), "redis-cluster");
        store.ping().await.expect("ping");
        assert_eq!(store.deny_cache().is_some(), deny_cache);
        Some(Fixture {
            name: if deny_cache {
                "cluster+cache"
            } else {
                "cluster"
            },
            store: Arc::new(store),
            backend: Backend::Cluster(cluster),
            cached: deny_cache,
            started: Instant::now(),
        })
    }

    /// The store's notion of elapsed time: the manual clock, or real time.
    fn now(&self) -> Duration {
        match &self.backend {
            Backend::Memory(clock) => clock.now(),
            _ => self.started.elapsed(),
        }
    }

    async fn sleep(&self, d: Duration) {
        match &self.backend {
            Backend::Memory(clock) => clock.advance(d),
            _ => tokio::time::sleep(d).await,
        }
    }

    async fn decide(&self, counters: &[Counter]) -> Decision {
        let d = self
            .store
            .decide(counters)
            .await
            .unwrap_or_else(|e| panic!("[{}] decide failed: {e}", self.name));
        assert_eq!(d.counters.len(), counters.len());
        d
    }

    /// Decides and returns the time bounds within which the store decided.
    async fn timed(&self, counters: &[Counter]) -> (Decision, Duration, Duration) {
        let before = self.now();
        let d = self.decide(counters).await;
        (d, before, self.now())
    }

    /// `redis-cli` on the node that holds `counter` (the key appended to `args`); `None` for memory.
    fn cli(&self, args: &[&str], counter: &Counter) -> Option<String> {
        self.cli_key(args, &format!("{PREFIX}{}", counter.key.as_str()))
    }

    /// `redis-cli` on the node that holds `key` (appended to `args`); `None` for memory.
    fn cli_key(&self, args: &[&str], key: &str) -> Option<String> {
        let mut all: Vec<&str> = args.to_vec();
        all.push(key);
        match &self.backend {
            Backend::Memory(..) => None,
            Backend::Redis(server) => Some(server.cli(&all)),
            Backend::Cluster(cluster) => Some(cluster.node_for(key).cli(&all)),
        }
    }

    fn real_time(&self) -> bool {
        !matches!(self.backend, Backend::Memory(..))
    }
}

/// `lo <= v <= hi` with a readable message.
#[track_caller]
fn assert_within(what: &str, v: Duration, lo: Duration, hi: Duration) {
    assert!(
        lo <= v && v <= hi,
        "{what}: {v:?} not within [{lo:?}, {hi:?}]"
    );
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
fn two_slots(domain: &str, la: u64, lb: u64, w: Duration) -> (Counter, Counter) {
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

// ---------------------------------------------------------------------------------------------
// Property: random arrival schedules against a reference sliding log (memory store, manual clock).

/// What a sliding log must answer, from the admitted hits alone: `(time µs, hits)`.
fn model_fits(admitted: &[(u64, u64)], now: u64, window: u64, limit: u64, hits: u64) -> bool {
    let in_window: u64 = admitted
        .iter()
        .filter(|(t, _)| t + window > now)
        .map(|(_, h)| h)
        .sum();
    hits <= limit && in_window + hits <= limit
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every decision equals the reference sliding log's: so no interval of length W ever admits
    /// more than N (checked directly too), and a request is denied only if it truly does not fit,
    /// which under saturation means exactly N per window.
    #[test]
    fn memory_store_is_an_exact_sliding_log(
        limit in 1u64..8,
        window_ms in 1u64..50,
        schedule in prop::collection::vec((0u64..20_000, 0u64..4), 1..300),
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let window = window_ms * 1000;
        let c = counter("prop", "a", limit, Duration::from_millis(window_ms), 1);
        let start = clock.now().as_micros() as u64;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, h) in schedule {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now().as_micros() as u64 - start;
            let expect = model_fits(&admitted, now, window, limit, h);
            let d = store.decide_now(&[hits(c.clone(), h)]);
            prop_assert_eq!(d.allowed, expect, "at {} µs, {} hits", now, h);
            if d.allowed && h > 0 {
                admitted.push((now, h));
            }
            let in_window: u64 = admitted.iter().filter(|(t, _)| t + window > now).map(|(_, h)| h).sum();
            prop_assert!(in_window <= limit);
            prop_assert_eq!(d.counters[0].count, in_window);
        }
        // Saturation: any interval of length W starting at an admission holds at most N hits.
        for (i, &(t, _)) in admitted.iter().enumerate() {
            let n: u64 = admitted[i..].iter().filter(|(u, _)| *u < t + window).map(|(_, h)| h).sum();
            prop_assert!(n <= limit);
        }
    }

    /// Two counters in every request, one of them sometimes shadow: all or nothing, checked
    /// against two reference logs.
    #[test]
    fn memory_store_is_all_or_nothing(
        schedule in prop::collection::vec((0u64..5_000, 0u64..3, any::<bool>(), any::<bool>()), 1..200),
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let (wa, wb) = (10_000u64, 25_000u64);
        let a = counter("prop2", "a", 3, Duration::from_micros(wa), 1);
        let b = counter("prop2", "b", 5, Duration::from_micros(wb), 1);
        let mut log_a: Vec<(u64, u64)> = Vec::new();
        let mut log_b: Vec<(u64, u64)> = Vec::new();
        let start = clock.now().as_micros() as u64;
        for (gap, h, b_shadow, only_b) in schedule {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now().as_micros() as u64 - start;
            let fits_b = model_fits(&log_b, now, wb, 5, h);
            let mut cb = hits(b.clone(), h);
            cb.shadow = b_shadow;
            let d = if only_b {
                store.decide_now(std::slice::from_ref(&cb))
            } else {
                store.decide_now(&[hits(a.clone(), h), cb])
            };
            let fits_a = only_b || model_fits(&log_a, now, wa, 3, h);
            let allowed = fits_a && (fits_b || b_shadow);
            prop_assert_eq!(d.allowed, allowed);
            if allowed && h > 0 {
                if !only_b {
                    log_a.push((now, h));
                }
                if fits_b {
                    log_b.push((now, h));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Property: bucket counters keep the sliding log's guarantee (memory store, manual clock).

/// `c` as a bucket counter of `width` (a new key: representations never share one).
fn bucketed(c: Counter, width: Duration) -> Counter {
    let precision = Precision::Buckets(width);
    let entries = [("k", c.key.as_str())];
    Counter {
        key: CounterKey::new("buckets", entries, c.window),
        precision,
        ..c
    }
}

/// What a bucket counter must answer from the admitted hits alone: every hit whose bucket
/// overlaps `(now - window, now]` counts, its whole bucket included; a check (0 hits) fits a full
/// counter, as with the log. Times in µs since the store's creation (where its buckets start).
fn buckets_fit(
    admitted: &[(u64, u64)],
    now: u64,
    width: u64,
    span: u64,
    limit: u64,
    hits: u64,
) -> bool {
    let current = now / width;
    let counted: u64 = admitted
        .iter()
        .filter(|(t, _)| t / width + span >= current)
        .map(|(_, h)| h)
        .sum();
    hits <= limit && counted + hits <= limit
}

/// Most admitted hits in any interval of length `len`, from the admissions `(time, hits)` in time
/// order: the busiest interval starts at an admission.
fn most_in_any(admitted: &[(u64, u64)], len: u64) -> u64 {
    (0..admitted.len())
        .map(|i| {
            let t = admitted[i].0;
            admitted[i..]
                .iter()
                .take_while(|(u, _)| *u < t + len)
                .map(|(_, h)| h)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Random arrivals and hit counts against random limits, windows and bucket widths: every
    /// decision is the bucket model's, and no interval of length W ever holds more than N
    /// admitted hits.
    #[test]
    fn buckets_never_admit_more_than_the_limit_in_any_window(
        limit in 1u64..20,
        span in 1u64..12,
        width_us in 1u64..4_000,
        schedule in prop::collection::vec((0u64..6_000, 0u64..5), 1..400),
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let window = span * width_us;
        let c = bucketed(
            counter("prop-b", "a", limit, Duration::from_micros(window), 1),
            Duration::from_micros(width_us),
        );
        let start = clock.now().as_micros() as u64;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, h) in schedule {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now().as_micros() as u64 - start;
            let expect = buckets_fit(&admitted, now, width_us, span, limit, h);
            let d = store.decide_now(&[hits(c.clone(), h)]);
            prop_assert_eq!(d.allowed, expect, "at {} µs, {} hits", now, h);
            if d.allowed && h > 0 {
                admitted.push((now, h));
            }
        }
        prop_assert!(most_in_any(&admitted, window) <= limit);
    }

    /// A steady over-limit stream of single hits: capacity is never late by more than one bucket
    /// width. Once the counter first fills, every interval of length W + g + one spacing holds at
    /// least N admitted hits (and still none of length W more than N).
    #[test]
    fn buckets_return_capacity_at_most_one_width_late(
        limit in 1u64..20,
        span in 1u64..12,
        width_us in 10u64..2_000,
        per_window in 2u64..6,
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let window = span * width_us;
        // Over the limit: `per_window` times as many requests as the limit allows.
        let spacing = (window / (limit * per_window)).max(1);
        let c = bucketed(
            counter("prop-s", "a", limit, Duration::from_micros(window), 1),
            Duration::from_micros(width_us),
        );
        let start = clock.now().as_micros() as u64;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut full_since = None;
        let end = 6 * (window + width_us);
        let mut now = 0;
        while now < end {
            let d = store.decide_now(std::slice::from_ref(&c));
            if d.allowed {
                admitted.push((now, 1));
            }
            if full_since.is_none() && d.counters[0].remaining == 0 {
                full_since = Some(now);
            }
            clock.advance(Duration::from_micros(spacing));
            now = clock.now().as_micros() as u64 - start;
        }
        prop_assert!(most_in_any(&admitted, window) <= limit);
        let full_since = full_since.expect("the stream fills the counter");
        let span_late = window + width_us + spacing;
        // The emptiest interval of that length starts just after an admission.
        for &(s, _) in admitted.iter().filter(|(s, _)| *s >= full_since) {
            if s + span_late >= now {
                break;
            }
            let n = admitted.iter().filter(|(u, _)| *u > s && *u <= s + span_late).count() as u64;
            prop_assert!(n >= limit, "only {} admitted in ({}, {}]", n, s, s + span_late);
        }
    }
}

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
            "store::skew_replica_process",
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

// ---------------------------------------------------------------------------------------------
// TLS and authentication.

fn probe() -> Counter {
    counter("probe", "a", 10, Duration::from_secs(10), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_and_a_password() {
    let Some(tls) = TlsRedisServer::start(&["--requirepass", "tls-s3cret"]) else {
        return;
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        ..redis_options(tls.url(Some("tls-s3cret")))
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    store.ping().await.expect("ping over TLS");
    let d = store.decide(&[probe()]).await.expect("decide over TLS");
    assert!(d.allowed && d.counters[0].count == 1);

    // Without trusting the CA the handshake fails: an error, no panic, no password.
    let untrusted = RedisStore::connect(&redis_options(tls.url(Some("tls-s3cret"))))
        .await
        .expect("options are fine");
    let err = untrusted.decide(&[probe()]).await.unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
    assert!(!err.to_string().contains("tls-s3cret"), "{err}");

    // Wrong password over TLS.
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        ..redis_options(tls.url(Some("wrong-pass")))
    };
    let wrong = RedisStore::connect(&opts).await.expect("options are fine");
    let err = wrong.decide(&[probe()]).await.unwrap_err();
    assert!(!err.to_string().contains("wrong-pass"), "{err}");
}

/// A server started with `tls-auth-clients yes`: with the client certificate the store decides;
/// without it every call fails with a connection error (no panic), and a key that does not
/// parse is refused when the store is built, naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    let Some(tls) = TlsRedisServer::start(&["--tls-auth-clients", "yes"]) else {
        return;
    };
    let client_cert = ClientCertFiles {
        cert: tls.client_cert_file.clone(),
        key: tls.client_key_file.clone(),
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        tls_client_cert: Some(client_cert.clone()),
        ..redis_options(tls.url(None))
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    store.ping().await.expect("ping with a client certificate");
    let d = store.decide(&[probe()]).await.expect("decide");
    assert!(d.allowed && d.counters[0].count == 1);

    let anonymous = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        ..redis_options(tls.url(None))
    };
    let store = RedisStore::connect(&anonymous)
        .await
        .expect("options are fine");
    for _ in 0..2 {
        let err = store.decide(&[probe()]).await.unwrap_err();
        assert!(err.is_unreachable(), "{err:?}");
    }
    assert!(store.ping().await.is_err());

    let unparsable = RedisOptions {
        tls_client_cert: Some(ClientCertFiles {
            key: tls.ca_file.clone(),
            ..client_cert.clone()
        }),
        ..opts.clone()
    };
    let err = RedisStore::connect(&unparsable)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("private key"), "{err}");
    let missing = RedisOptions {
        tls_client_cert: Some(ClientCertFiles {
            cert: "/nonexistent/client.pem".into(),
            ..client_cert
        }),
        ..opts
    };
    let err = RedisStore::connect(&missing).await.unwrap_err().to_string();
    assert!(err.contains("client certificate file"), "{err}");
}

/// A TLS cluster whose nodes require client certificates (`tls-auth-clients yes`): the
/// certificate is presented to every node the store reaches (seeds and those it learns from the
/// slot map); without it, an error and no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_with_a_client_certificate() {
    let Some(tls) = TlsRedisCluster::start(&["--tls-auth-clients", "yes"]) else {
        return;
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca.ca_file.clone()),
        tls_client_cert: Some(ClientCertFiles {
            cert: tls.ca.client_cert_file.clone(),
            key: tls.ca.client_key_file.clone(),
        }),
        ..cluster_options(tls.urls())
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    store.ping().await.expect("ping with a client certificate");
    let w = Duration::from_secs(60);
    let mut nodes = Vec::new();
    for i in 0.. {
        let c = counter("mtls", &format!("k{i}"), 3, w, 1);
        let key = format!("{PREFIX}{}", c.key.as_str());
        let port = tls.cluster.node_for(&key).port;
        if nodes.contains(&port) {
            continue;
        }
        nodes.push(port);
        assert!(store.decide(&[c]).await.expect("decide").allowed);
        assert_eq!(tls.cluster.node_for(&key).cli(&["ZCARD", &key]), "1");
        if nodes.len() == 3 {
            break;
        }
    }

    let anonymous = RedisOptions {
        tls_ca_file: Some(tls.ca.ca_file.clone()),
        ..cluster_options(tls.urls())
    };
    let failed = match RedisStore::connect(&anonymous).await {
        Err(_) => true,
        Ok(store) => store.decide(&[probe()]).await.is_err(),
    };
    assert!(
        failed,
        "a cluster requiring client certificates was used without one"
    );
}

/// Redis Cluster over TLS (`tls-cluster yes`, a private CA): seeds given as `rediss://` URLs,
/// every node reached over TLS, counters on different slots decided and stored on their nodes;
/// without trusting the CA, an error and no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_with_a_private_ca() {
    let Some(tls) = TlsRedisCluster::start(&[]) else {
        return;
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca.ca_file.clone()),
        ..cluster_options(tls.urls())
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    assert_eq!(store.kind(), "redis-cluster");
    store.ping().await.expect("ping over TLS");
    // One counter on each node. The store knows only the TLS seeds: a plain port in the slot
    // map, or a node it could not reach over TLS, would fail these calls.
    let w = Duration::from_secs(60);
    let mut by_node: Vec<(u16, Counter)> = Vec::new();
    for i in 0.. {
        let c = counter("tls", &format!("k{i}"), 3, w, 1);
        let node = tls.cluster.node_for(&format!("{PREFIX}{}", c.key.as_str()));
        if !by_node.iter().any(|(port, _)| *port == node.port) {
            by_node.push((node.port, c));
        }
        if by_node.len() == 3 {
            break;
        }
    }
    for (port, c) in &by_node {
        for _ in 0..3 {
            assert!(
                store
                    .decide(std::slice::from_ref(c))
                    .await
                    .expect("decide")
                    .allowed
            );
        }
        let d = store.decide(std::slice::from_ref(c)).await.expect("decide");
        assert!(!d.allowed, "a fourth hit on a limit of 3 (node {port})");
        let key = format!("{PREFIX}{}", c.key.as_str());
        assert_eq!(tls.cluster.node_for(&key).cli(&["ZCARD", &key]), "3");
    }
    // Counters on two slots in one request.
    let (a, b) = two_slots("tls-xslot", 3, 3, w);
    let d = store.decide(&[a, b]).await.expect("decide across slots");
    assert!(d.allowed);

    let untrusted = cluster_options(tls.urls());
    let failed = match RedisStore::connect(&untrusted).await {
        Err(_) => true,
        Ok(store) => store.decide(&[probe()]).await.is_err(),
    };
    assert!(
        failed,
        "a cluster over TLS was used without trusting its CA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_in_the_url_and_never_in_messages() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "hunter2-secret"]) else {
        return;
    };
    let url = format!("redis://:hunter2-secret@127.0.0.1:{}", server.port);
    let store = RedisStore::connect(&redis_options(url.clone()))
        .await
        .expect("connect");
    assert!(store.decide(&[probe()]).await.expect("decide").allowed);
    assert!(!format!("{store:?}").contains("hunter2"), "{store:?}");
    assert!(!format!("{:?}", redis_options(url.clone())).contains("hunter2"));
    assert!(!redact_url(&url).contains("hunter2"));

    let wrong_url = format!("redis://default:hunter3-wrong@127.0.0.1:{}/0", server.port);
    let wrong = RedisStore::connect(&redis_options(wrong_url))
        .await
        .expect("options are fine");
    for _ in 0..2 {
        let err = wrong.decide(&[probe()]).await.unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(!text.contains("hunter3"), "{text}");
        let ping = wrong.ping().await.unwrap_err();
        assert!(!format!("{ping} {ping:?}").contains("hunter3"));
    }
    assert!(!format!("{wrong:?}").contains("hunter3"));

    // Keys carry the prefix and the counter key; beside them the node's clock.
    let keys = server.cli(&["-a", "hunter2-secret", "--no-auth-warning", "KEYS", "*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            format!("{PREFIX}clock"),
            format!("{PREFIX}{{probe:k=a}}10000")
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_is_an_error_and_a_restarted_one_works_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let port = server.port;
    let opts = RedisOptions {
        timeout: Duration::from_millis(500),
        ..redis_options(server.url())
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    assert!(store.decide(&[probe()]).await.expect("decide").allowed);
    drop(server);
    let started = Instant::now();
    let err = store.decide(&[probe()]).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "bounded by the timeout"
    );
    assert!(err.is_unreachable(), "{err:?}");
    // A new server on the same port: the connection manager reconnects by itself.
    let _again = RedisServer::spawn(&["--port", &port.to_string()], port).expect("restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.decide(&[probe()]).await.is_err() {
        assert!(Instant::now() < deadline, "store did not reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

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
        // No bucket is later than the node's clock (`n`, the newest bucket where a node has no
        // clock, may stay behind where it has one).
        let clock: u64 = server
            .cli(&["GET", &format!("{PREFIX}clock")])
            .parse()
            .expect("the clock");
        assert!(
            buckets.iter().all(|&(i, _)| i <= clock / 50_000),
            "{what} n={newest:?} clock={clock}"
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
    // earlier left, and never much later either (the cache does not delay admissions). Redis
    // decided each somewhere between sending and answering.
    assert_eq!(admitted_at.len(), 15, "{admitted_at:?}");
    for i in 5..admitted_at.len() {
        let (sent, answered) = admitted_at[i];
        let (prev_sent, prev_answered) = admitted_at[i - 5];
        assert!(answered - prev_sent >= w, "too early: {admitted_at:?}");
        assert!(
            sent.saturating_sub(prev_answered) <= w + Duration::from_millis(100),
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
