//! A script call sends each distinct shape of its requests once (limits, windows, hits, flags,
//! precisions, and whether a request is a cross-slot part), and each request names its own: the
//! requests of one call that ask differently are each decided by what they asked.

use std::time::Duration;

use crate::store::{counter, redis_options};
use crate::support::RedisServer;
use slidegate::store::{Counter, Precision, RedisStore, Store, StoreError};

const MINUTE: Duration = Duration::from_secs(60);

/// The shared fixture's counter of `name` per minute, with its shadow flag and precision.
fn shaped(name: &str, limit: u64, hits: u64, shadow: bool, precision: Precision) -> Counter {
    Counter {
        shadow,
        precision,
        ..counter("shapes", name, limit, MINUTE, hits)
    }
}

/// Four shapes, interleaved in calls of many requests each, on one key (or two) per shape:
/// each key admits what its own shape allows, whatever the other requests of its call asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_different_shapes_in_one_call_each_get_their_own() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&redis_options(server.url()))
        .await
        .expect("connect");
    let seconds = Precision::Buckets(Duration::from_secs(1));
    // Shape 0: 2 hits of 1 on the log. Shape 1: 5 in buckets, 2 hits a request (two fit).
    // Shape 2: shape 0 in shadow (always allowed, records while it fits). Shape 3: two counters,
    // 10 and 1 (the second denies all but the first request).
    let shapes = [
        vec![shaped("log", 2, 1, false, Precision::Exact)],
        vec![shaped("buckets", 5, 2, false, seconds)],
        vec![shaped("shadow", 2, 1, true, Precision::Exact)],
        vec![
            shaped("wide", 10, 1, false, Precision::Exact),
            shaped("narrow", 1, 1, false, Precision::Exact),
        ],
    ];
    // Loads the script, so that the calls below are all in flight at once.
    store
        .decide(&[shaped("warm", 1, 1, false, Precision::Exact)])
        .await
        .expect("warm-up");
    let before = server.command_calls("evalsha");
    let calls = (0..32).map(|i| {
        let store = &store;
        let counters = &shapes[i % 4];
        async move { (i % 4, store.decide(counters).await) }
    });
    let answers: Vec<(usize, Result<_, StoreError>)> = futures::future::join_all(calls).await;
    let script_calls = server.command_calls("evalsha") - before;
    assert!(
        script_calls < 16,
        "the requests shared script calls: {script_calls} calls for 32"
    );
    let mut allowed = [0; 4];
    for (shape, answer) in answers {
        let decision = answer.expect("decided");
        assert_eq!(
            decision.counters.len(),
            shapes[shape].len(),
            "shape {shape}"
        );
        for (result, asked) in decision.counters.iter().zip(&shapes[shape]) {
            assert!(result.count <= asked.limit, "shape {shape}: {result:?}");
            assert_eq!(
                result.remaining,
                asked.limit - result.count,
                "shape {shape}"
            );
        }
        allowed[shape] += usize::from(decision.allowed);
    }
    assert_eq!(allowed, [2, 2, 8, 1], "requests allowed per shape");
    // What each key holds after the calls: its own shape's admissions.
    let held = |name: &str, precision: Precision| {
        let check = shaped(name, 1_000, 0, false, precision);
        let store = &store;
        async move { store.decide(&[check]).await.expect("check").counters[0].count }
    };
    assert_eq!(held("log", Precision::Exact).await, 2);
    assert_eq!(held("buckets", seconds).await, 4);
    assert_eq!(held("shadow", Precision::Exact).await, 2);
    assert_eq!(held("wide", Precision::Exact).await, 1);
    assert_eq!(held("narrow", Precision::Exact).await, 1);
}
