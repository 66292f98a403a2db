//! Charged and returned hits ([`HitKind`]) on every store and both representations: a charge
//! lands over the limit and leaves a debt that denies until it leaves the window, a charge never
//! makes the request's other counters record, returned hits are taken back (newest first, never
//! below zero), and the Redis deny cache neither swallows a charge nor outlives a return.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{RedisCluster, RedisServer};
use proptest::prelude::*;
use slidegate::store::{
    Counter, CounterKey, Decision, HitKind, ManualClock, MemoryStore, Precision, RedisOptions,
    RedisStore, Store,
};

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

/// One store under test, with the servers behind it (kept alive) and its manual clock, if any.
pub(crate) struct Under {
    pub(crate) name: &'static str,
    pub(crate) store: Arc<dyn Store>,
    clock: Option<Arc<ManualClock>>,
    pub(crate) cached: bool,
    _redis: Option<RedisServer>,
    _cluster: Option<RedisCluster>,
}

fn options(url: String, cluster: Vec<String>, deny_cache: usize) -> RedisOptions {
    RedisOptions {
        url,
        cluster_nodes: cluster,
        prefix: "sgcharge:".into(),
        timeout: Duration::from_secs(3),
        deny_cache,
        ..RedisOptions::default()
    }
}

/// The memory store, a standalone Redis with and without the deny cache, and a Redis Cluster
/// with it (the Redis ones only where redis-server is installed).
pub(crate) async fn stores() -> Vec<Under> {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
    let mut all = vec![Under {
        name: "memory",
        store: Arc::new(MemoryStore::new(clock.clone())),
        clock: Some(clock),
        cached: false,
        _redis: None,
        _cluster: None,
    }];
    for (name, cache) in [("redis", 0), ("redis+cache", 1000)] {
        let Some(server) = RedisServer::start() else {
            return all;
        };
        let store = RedisStore::connect(&options(server.url(), Vec::new(), cache))
            .await
            .expect("connect");
        all.push(Under {
            name,
            store: Arc::new(store),
            clock: None,
            cached: cache > 0,
            _redis: Some(server),
            _cluster: None,
        });
    }
    if let Some(cluster) = RedisCluster::start() {
        let store = RedisStore::connect(&options(String::new(), cluster.urls(), 1000))
            .await
            .expect("connect");
        all.push(Under {
            name: "cluster+cache",
            store: Arc::new(store),
            clock: None,
            cached: true,
            _redis: None,
            _cluster: Some(cluster),
        });
    }
    all
}

impl Under {
    pub(crate) async fn decide(&self, counters: &[Counter]) -> Decision {
        let d = self
            .store
            .decide(counters)
            .await
            .unwrap_or_else(|e| panic!("[{}] {e}", self.name));
        assert_eq!(d.counters.len(), counters.len());
        d
    }

    pub(crate) async fn advance(&self, by: Duration) {
        match &self.clock {
            Some(clock) => clock.advance(by),
            None => tokio::time::sleep(by).await,
        }
    }
}

/// A counter of `name` (its own hash slot in a cluster), kept as `precision`.
pub(crate) fn counter(name: &str, limit: u64, window: Duration, precision: Precision) -> Counter {
    Counter {
        key: CounterKey::new("charges", [("k", name)], window),
        limit,
        window,
        hits: 1,
        shadow: false,
        precision,
        kind: HitKind::Admitted,
    }
}

pub(crate) fn with(c: &Counter, kind: HitKind, hits: u64) -> Counter {
    Counter {
        kind,
        hits,
        ..c.clone()
    }
}

/// The exact log and the buckets automatic precision gives an hour (one minute each).
fn representations() -> [(Precision, &'static str); 2] {
    [
        (Precision::Exact, "exact"),
        (Precision::Buckets(MINUTE), "buckets"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_land_over_the_limit_and_leave_a_debt() {
    for s in stores().await {
        for (precision, kept) in representations() {
            let name = format!("debt-{kept}");
            let c = counter(&name, 1000, HOUR, precision);
            let check = with(&c, HitKind::Admitted, 0);
            let charge = with(&c, HitKind::Charged, 800);
            let what = format!("[{}, {kept}]", s.name);
            // Round 1: check, +800.
            assert!(
                s.decide(std::slice::from_ref(&check)).await.allowed,
                "{what}"
            );
            let d = s.decide(std::slice::from_ref(&charge)).await;
            assert!(d.allowed && !d.counters[0].over_limit, "{what} {d:?}");
            assert_eq!(d.counters[0].count, 800, "{what}");
            // Round 2: the check passes (800 held), the charge does not fit and lands anyway.
            assert!(
                s.decide(std::slice::from_ref(&check)).await.allowed,
                "{what}"
            );
            let d = s.decide(std::slice::from_ref(&charge)).await;
            assert!(!d.allowed && d.counters[0].over_limit, "{what} {d:?}");
            assert_eq!(d.counters[0].count, 1600, "{what}: the charge landed");
            // Round 3: in debt, the check and any hit are denied.
            let d = s.decide(std::slice::from_ref(&check)).await;
            assert!(!d.allowed && d.counters[0].over_limit, "{what} {d:?}");
            assert_eq!((d.counters[0].count, d.counters[0].remaining), (1600, 0));
            assert!(!s.decide(std::slice::from_ref(&c)).await.allowed, "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_never_makes_the_other_counters_record() {
    for s in stores().await {
        for (precision, kept) in representations() {
            let what = format!("[{}, {kept}]", s.name);
            // A charge that does not fit denies the request; the other counter records nothing.
            let a = counter(&format!("alone-a-{kept}"), 3, HOUR, precision);
            let b = counter(&format!("alone-b-{kept}"), 3, HOUR, precision);
            let d = s.decide(&[with(&a, HitKind::Charged, 5), b.clone()]).await;
            assert!(!d.allowed && d.counters[0].over_limit, "{what} {d:?}");
            let d = s
                .decide(&[
                    with(&a, HitKind::Admitted, 0),
                    with(&b, HitKind::Admitted, 0),
                ])
                .await;
            assert_eq!(d.counters[0].count, 5, "{what}: the charge landed");
            assert_eq!(
                d.counters[1].count, 0,
                "{what}: the denied request left nothing"
            );
            // A charge that fits in a request another counter denies lands too.
            let full = counter(&format!("alone-full-{kept}"), 1, HOUR, precision);
            assert!(s.decide(std::slice::from_ref(&full)).await.allowed);
            let fits = counter(&format!("alone-fits-{kept}"), 10, HOUR, precision);
            let d = s
                .decide(&[with(&fits, HitKind::Charged, 2), full.clone()])
                .await;
            assert!(!d.allowed && !d.counters[0].over_limit, "{what} {d:?}");
            let d = s.decide(&[with(&fits, HitKind::Admitted, 0)]).await;
            assert_eq!(d.counters[0].count, 2, "{what}: never taken back");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_hits_are_taken_back_never_below_zero() {
    for s in stores().await {
        for (precision, kept) in representations() {
            let what = format!("[{}, {kept}]", s.name);
            let c = counter(&format!("back-{kept}"), 5, HOUR, precision);
            let d = s.decide(&[with(&c, HitKind::Admitted, 3)]).await;
            assert_eq!(d.counters[0].count, 3, "{what}");
            let d = s.decide(&[with(&c, HitKind::Returned, 2)]).await;
            assert!(d.allowed && !d.counters[0].over_limit, "{what} {d:?}");
            assert_eq!(
                (d.counters[0].count, d.counters[0].remaining),
                (1, 4),
                "{what}"
            );
            let d = s.decide(&[with(&c, HitKind::Returned, 10)]).await;
            assert_eq!(d.counters[0].count, 0, "{what}: never below zero");
            // The whole limit fits again, and no more.
            assert!(
                s.decide(&[with(&c, HitKind::Admitted, 5)]).await.allowed,
                "{what}"
            );
            assert!(!s.decide(std::slice::from_ref(&c)).await.allowed, "{what}");
            // A full counter (a deny cache now holds it) gets room back at once.
            let d = s.decide(&[with(&c, HitKind::Returned, 1)]).await;
            assert_eq!(d.counters[0].count, 4, "{what}");
            let d = s.decide(std::slice::from_ref(&c)).await;
            assert!(
                d.allowed,
                "[{}, {kept}] the return freed one hit: {d:?}",
                s.name
            );
        }
    }
}

/// The newest hits go back first: the oldest keep their time in the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_hits_go_back_first() {
    for s in stores().await {
        let what = s.name;
        let c = counter("newest", 5, MINUTE, Precision::Exact);
        assert!(s.decide(std::slice::from_ref(&c)).await.allowed);
        s.advance(Duration::from_millis(1500)).await;
        assert!(s.decide(&[with(&c, HitKind::Admitted, 2)]).await.allowed);
        let d = s.decide(&[with(&c, HitKind::Returned, 2)]).await;
        assert_eq!(d.counters[0].count, 1, "{what}");
        // The hit left is the first one: it leaves the window 1.5 s earlier than the others.
        assert!(
            d.counters[0].reset_after <= MINUTE - Duration::from_millis(1500),
            "[{what}] {d:?}"
        );
    }
}

/// The deny cache answers a full counter locally; a charge on it must still reach the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_deny_never_swallows_a_charge() {
    for s in stores().await.into_iter().filter(|s| s.cached) {
        let c = counter("cached", 2, HOUR, Precision::Exact);
        for _ in 0..2 {
            assert!(s.decide(std::slice::from_ref(&c)).await.allowed);
        }
        for _ in 0..2 {
            assert!(!s.decide(std::slice::from_ref(&c)).await.allowed);
        }
        let d = s.decide(&[with(&c, HitKind::Charged, 1)]).await;
        assert_eq!(d.counters[0].count, 3, "[{}] {d:?}", s.name);
        let d = s.decide(&[with(&c, HitKind::Returned, 2)]).await;
        assert_eq!(d.counters[0].count, 1, "[{}] {d:?}", s.name);
    }
}

/// One step of [`charges_match_the_model`]: wait, then decide one counter.
#[derive(Clone, Debug)]
struct Step {
    wait_ms: u64,
    kind: HitKind,
    hits: u64,
}

fn step() -> impl Strategy<Value = Step> {
    let kind = prop_oneof![
        3 => Just(HitKind::Admitted),
        1 => Just(HitKind::Charged),
        1 => Just(HitKind::Returned),
    ];
    // A charge stays in the log up to the limit (6); a larger one goes to buckets (`store::form`),
    // whose debt `interleavings.rs` checks.
    (0u64..400, kind, 0u64..8).prop_map(|(wait_ms, kind, hits)| Step {
        wait_ms,
        kind,
        hits: match kind {
            HitKind::Charged => hits.min(6),
            _ => hits,
        },
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The memory store's exact log against a reference: admitted hits only where they fit,
    /// charges always, returns from the newest hits and never below zero. The admitted hits a
    /// window holds (less those returned) stay within the limit whatever the charges.
    #[test]
    fn charges_match_the_model(steps in proptest::collection::vec(step(), 1..60)) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let store = MemoryStore::new(clock.clone());
        let (limit, window) = (6u64, 1000u64);
        let c = Counter {
            limit,
            ..counter("model", limit, Duration::from_millis(window), Precision::Exact)
        };
        // (time ms, hits, admitted) of what the log holds, oldest first.
        let mut log: Vec<(u64, u64, bool)> = Vec::new();
        let mut now = 0u64;
        for s in steps {
            now += s.wait_ms;
            clock.advance(Duration::from_millis(s.wait_ms));
            log.retain(|&(t, _, _)| t + window > now);
            let held: u64 = log.iter().map(|&(_, h, _)| h).sum();
            let over = s.kind != HitKind::Returned && (s.hits > limit || held + s.hits > limit);
            let d = store.decide_now(&[with(&c, s.kind, s.hits)]);
            prop_assert_eq!(d.allowed, !over, "{:?} at {} holding {}", s, now, held);
            let count = match s.kind {
                HitKind::Admitted if !over => {
                    log.push((now, s.hits, true));
                    held + s.hits
                }
                HitKind::Admitted => held,
                HitKind::Charged => {
                    log.push((now, s.hits, false));
                    held + s.hits
                }
                HitKind::Returned => {
                    let mut left = s.hits;
                    while left > 0 {
                        let Some(last) = log.last_mut() else { break };
                        let take = left.min(last.1);
                        last.1 -= take;
                        left -= take;
                        if last.1 == 0 {
                            log.pop();
                        }
                    }
                    held - (s.hits - left)
                }
            };
            prop_assert_eq!(d.counters[0].count, count, "{:?} at {}", s, now);
            let in_window: u64 = log.iter().filter(|e| e.2).map(|e| e.1).sum();
            prop_assert!(in_window <= limit, "{} admitted in a window", in_window);
        }
    }
}
