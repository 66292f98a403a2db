//! docs/benchmarks.md, "Redis's time per call by precision": Redis's own time per script call
//! (`INFO commandstats`, `usec_per_call` of `evalsha`) for one counter of 1000 per second under a
//! rolling load (a request of 2 hits every millisecond, twice the limit, so the oldest bucket leaves the
//! window on most calls), as the exact log, in automatic buckets (20 ms) and in the finest buckets
//! validation allows (1 ms, 1000 per window). A benchmark, not a test of behaviour: run it with
//! `cargo test --test stores -- --ignored bucket_cost --nocapture`.

use std::time::{Duration, Instant};

use crate::support::RedisServer;
use slidegate::store::{Counter, CounterKey, Precision, RedisOptions, RedisStore, Store};

/// `usec_per_call` of `cmdstat_evalsha` in `INFO commandstats`.
fn usec_per_call(server: &RedisServer) -> f64 {
    let info = server.cli(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.trim().strip_prefix("cmdstat_evalsha:"))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|f| f.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: prints docs/benchmarks.md's Redis time per call by precision"]
async fn bucket_cost() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(&RedisOptions {
        url: server.url(),
        prefix: "sgcost:".to_string(),
        timeout: Duration::from_secs(3),
        deny_cache: 0,
        ..RedisOptions::default()
    })
    .await
    .expect("connect");
    let window = Duration::from_secs(1);
    let rows = [
        ("exact log", Precision::Exact),
        (
            "automatic buckets (20 ms, 50)",
            Precision::automatic(1000, window),
        ),
        (
            "finest buckets (1 ms, 1000)",
            Precision::Buckets(Duration::from_millis(1)),
        ),
    ];
    println!(
        "| counter, 1000 per 1 s, requests of 2 hits every 1 ms for 3 s | calls | admitted | Redis µs per call |"
    );
    println!("|---|---|---|---|");
    for (name, precision) in rows {
        let c = Counter {
            key: CounterKey::new("cost", [("k", name)], window),
            kind: slidegate::store::HitKind::Admitted,
            limit: 1000,
            window,
            hits: 2,
            shadow: false,
            precision,
        };
        // Fill the window first, so that every measured call meets a full, rolling counter.
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        while started.elapsed() < window + Duration::from_millis(100) {
            tick.tick().await;
            store
                .decide(std::slice::from_ref(&c))
                .await
                .expect("decide");
        }
        server.cli(&["CONFIG", "RESETSTAT"]);
        let (mut calls, mut admitted) = (0, 0);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) {
            tick.tick().await;
            let d = store
                .decide(std::slice::from_ref(&c))
                .await
                .expect("decide");
            calls += 1;
            admitted += u32::from(d.allowed);
        }
        let usec = usec_per_call(&server);
        println!("| {name} | {calls} | {admitted} | {usec:.1} |");
    }
}
