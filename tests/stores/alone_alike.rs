//! Property: the Redis script's fast paths (`decide_log_alone`, `decide_buckets_alone` in
//! `src/store/sliding_window/5_decide.lua`), taken for a request of one admitted, non-shadow
//! counter on a standalone Redis, decide exactly as the script's general `decide` and as the
//! memory store (the reference semantics) do. Random sequences of requests go through both stores:
//! one counter (the exact log or buckets) with 0, 1, several or more hits than the limit, mixed on
//! the same keys with shadow counters and two-counter requests (which take `decide`), and every
//! answer must agree: allowed or denied, and per counter the count and whether it is over.
//!
//! Windows are an hour, so no hit leaves the window during a case and the real time Redis runs on
//! cannot change an outcome; reset times depend on the clock and are only checked to lie within
//! the window (and a bucket width, for buckets).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::store::redis_options;
use crate::support::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use slidegate::store::{
    Counter, CounterKey, HitKind, ManualClock, MemoryStore, Precision, RedisStore, Store,
};

const HOUR: Duration = Duration::from_secs(3600);

/// The keys of a case, each kept in one form: two exact logs and buckets of two widths.
const FORMS: [Precision; 4] = [
    Precision::Exact,
    Precision::Exact,
    Precision::Buckets(Duration::from_secs(60)),
    Precision::Buckets(Duration::from_secs(300)),
];

/// One request of a sequence: `key` indexes [`FORMS`] (and the case's limits).
#[derive(Clone, Debug)]
enum Request {
    /// One admitted, non-shadow counter: a fast path.
    Alone { key: usize, hits: u64 },
    /// One shadow counter: `decide`.
    Shadow { key: usize, hits: u64 },
    /// Two counters (possibly the same key twice), the second one shadow or not: `decide`.
    Two {
        keys: (usize, usize),
        hits: u64,
        shadow: bool,
    },
}

/// A check (0), one hit, several, or more than any limit.
fn hits() -> impl Strategy<Value = u64> {
    prop_oneof![2 => Just(0u64), 4 => Just(1u64), 2 => 2u64..=4, 1 => 6u64..=9]
}

fn request() -> impl Strategy<Value = Request> {
    let key = 0..FORMS.len();
    prop_oneof![
        8 => (key.clone(), hits()).prop_map(|(key, hits)| Request::Alone { key, hits }),
        1 => (key.clone(), hits()).prop_map(|(key, hits)| Request::Shadow { key, hits }),
        2 => ((key.clone(), key), hits(), any::<bool>())
            .prop_map(|(keys, hits, shadow)| Request::Two { keys, hits, shadow }),
    ]
}

/// The counter of key `key` in case `case` (its own Redis key), with `limit` and `hits`.
fn counter(case: u64, key: usize, limit: u64, hits: u64, shadow: bool) -> Counter {
    let name = format!("{case}-{key}");
    Counter {
        key: CounterKey::new("alone-alike", [("k", name.as_str())], HOUR),
        limit,
        window: HOUR,
        hits,
        shadow,
        precision: FORMS[key],
        kind: HitKind::Admitted,
    }
}

#[test]
fn fast_paths_decide_as_decide_and_the_memory_store() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // No deny cache: every request reaches the script.
    let redis = runtime
        .block_on(RedisStore::connect(&redis_options(server.url())))
        .expect("connect");
    assert_eq!(redis.kind(), "redis", "standalone: the fast paths apply");
    let cases = AtomicU64::new(0);
    let strategy = (
        prop::array::uniform4(1u64..=5),
        prop::collection::vec(request(), 1..60),
    );
    let mut runner = TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(128)
    });
    let result = runner.run(&strategy, |(limits, requests)| {
        // Fresh keys in Redis and a fresh memory store: cases never share counters.
        let case = cases.fetch_add(1, Ordering::Relaxed);
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let memory = MemoryStore::new(clock);
        for (i, request) in requests.iter().enumerate() {
            let c =
                |key: usize, hits: u64, shadow: bool| counter(case, key, limits[key], hits, shadow);
            let counters = match *request {
                Request::Alone { key, hits } => vec![c(key, hits, false)],
                Request::Shadow { key, hits } => vec![c(key, hits, true)],
                Request::Two {
                    keys: (a, b),
                    hits,
                    shadow,
                } => vec![c(a, hits, false), c(b, hits, shadow)],
            };
            let expected = memory.decide_now(&counters);
            let got = runtime
                .block_on(redis.decide(&counters))
                .map_err(|e| TestCaseError::fail(format!("request {i} {request:?}: {e}")))?;
            prop_assert_eq!(
                got.allowed,
                expected.allowed,
                "request {} {:?}: Redis {:?}, memory {:?}",
                i,
                request,
                got,
                expected
            );
            prop_assert_eq!(got.counters.len(), counters.len());
            for (j, (r, m)) in got.counters.iter().zip(&expected.counters).enumerate() {
                // A bucket counter's oldest bucket counts whole: it may leave up to a width late.
                let latest = HOUR + counters[j].precision.bucket_width().unwrap_or_default();
                prop_assert_eq!(
                    (r.over_limit, r.count, r.remaining),
                    (m.over_limit, m.count, m.remaining),
                    "request {} {:?}, counter {}: Redis {:?}, memory {:?}",
                    i,
                    request,
                    j,
                    got,
                    expected
                );
                prop_assert!(
                    r.reset_after <= latest && m.reset_after <= latest,
                    "request {} {:?}: Redis {:?}, memory {:?}",
                    i,
                    request,
                    got,
                    expected
                );
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("Redis decided unlike the memory store (limits per key, requests): {e}");
    }
}
