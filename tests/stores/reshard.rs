//! Live resharding of a Redis Cluster under load, against the real `slidegate` binary: while
//! clients hammer counters, `redis-cli --cluster reshard` moves the slots of those counters from
//! one master to another and back, so the store's calls meet every answer a slot migration
//! gives: `MOVED` (the slot has moved), `ASK` (its keys have, the slot not yet) and `TRYAGAIN`
//! (the script's keys are split between the two nodes, or missing on the importing one, for as
//! long as the slot is migrating: see docs/operations.md, "Redis Cluster").
//!
//! Exactness is checked with a known arrival pattern: bursts of more concurrent calls than the
//! limit, each on a fresh counter of a moving slot, whose window outlasts the test.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::reshard::{
    error_replies, fill_slot, lands_on, masters, reshard, values_on_slots,
};
use crate::support::{RedisCluster, Slidegate, descriptor, metric_value, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use futures::future::join_all;
use slidegate::store::CounterKey;
use tonic::transport::Channel;

/// Limit of a burst counter, per minute: nothing leaves its window while the test runs.
const N: u64 = 5;
/// Concurrent calls of one burst: more than the limit.
const BURST: usize = 4 * N as usize;
/// How many of the first master's lowest slots move (`redis-cli` takes a master's lowest).
const SLOTS: u16 = 4;
/// Reshards, alternating direction, so the slots end where they started.
const MOVES: usize = 10;
/// Clients hammering the hot counter, each with one call in flight.
const HAMMERS: usize = 16;
/// Other keys on the hot counter's slot: `redis-cli` migrates 10 per `MIGRATE`, so the slot
/// stays migrating (every script call on it answered `TRYAGAIN`) for a while, not a moment.
const FILL: usize = 1000;

/// What calls got, counted by answer.
#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    denied: AtomicU64,
    failed: AtomicU64,
}

impl Tally {
    fn count(&self, answer: &Result<Code, tonic::Status>) {
        let which = match answer {
            Ok(Code::Ok) => &self.admitted,
            Ok(_) => &self.denied,
            Err(status) => {
                eprintln!("failed call: {status:?}");
                &self.failed
            }
        };
        which.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64, u64) {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        (load(&self.admitted), load(&self.denied), load(&self.failed))
    }
}

async fn decide(
    mut client: RateLimitServiceClient<Channel>,
    domain: &str,
    key: &str,
    value: &str,
) -> Result<Code, tonic::Status> {
    let req = request(domain, vec![descriptor(&[(key, value)])]);
    let response = client.should_rate_limit(req).await?.into_inner();
    Ok(response.overall_code())
}

/// `BURST` concurrent calls on `value`'s burst counter: (admitted, failed).
async fn burst(client: &RateLimitServiceClient<Channel>, domain: &str, value: &str) -> (u64, u64) {
    let tally = Tally::default();
    let calls = (0..BURST).map(|_| decide(client.clone(), domain, "burst", value));
    for answer in join_all(calls).await {
        tally.count(&answer);
    }
    let (admitted, _, failed) = tally.get();
    (admitted, failed)
}

/// The rules: the hammered `user` counter (never full) and the bursts' `burst` counters (`N` a
/// minute).
fn write_rules(dir: &std::path::Path, domain: &str) -> std::path::PathBuf {
    let rules = dir.join("rules.yaml");
    let text = format!(
        "domain: {domain}\ndescriptors:\n\
         \x20 - key: user\n    rate_limit: {{ unit: second, requests_per_unit: 1000000 }}\n\
         \x20 - key: burst\n    rate_limit: {{ unit: minute, requests_per_unit: {N} }}\n"
    );
    std::fs::write(&rules, text).expect("write rules");
    rules
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// While `redis-cli --cluster reshard` moves the slots of hot counters back and forth (the
/// load's counter and the bursts' fresh ones), `HAMMERS` clients call slidegate as fast as it
/// answers, and bursts of `BURST` concurrent calls hit fresh counters of limit `N`.
///
/// Bound stated and checked: **no failed call at all** (with `--failure-mode error` a store
/// failure is a gRPC error the clients see). A call that meets `TRYAGAIN` is retried by the
/// cluster client after 1 to a few milliseconds until the migration of its slot ends (tens of
/// milliseconds for the slot with `FILL` keys, a few for the others), within `--redis-timeout`;
/// `MOVED` and `ASK` are followed at once. With redis-rs's default retry wait (at least 1.28 s)
/// every `TRYAGAIN` became a timeout, and this test failed.
///
/// Exactness: every burst admits at most `N`, exactly `N` when none of its calls failed, and the
/// counter in Redis holds exactly the admitted hits (a retried call never records twice: Redis
/// runs nothing for a `MOVED`, `ASK` or `TRYAGAIN`). Every redirection the masters sent
/// (`INFO errorstats`) is counted in `slidegate_store_redirections_total`, and there were some
/// `MOVED` and `TRYAGAIN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_hot_counters_under_load_fails_no_call_and_admits_at_most_n() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let cluster = Arc::new(cluster);
    let hot = masters(&cluster)[0].lowest_slots(SLOTS);
    // A domain whose hammered counter (`user=0-0`) lands on the moving slots.
    let domain = (0..)
        .map(|i| format!("reshard{i}"))
        .find(|d| lands_on(d, "user", "0-0", &hot))
        .expect("some domain lands on the slots");
    let hammered = CounterKey::new(&domain, [("user", "0-0")], Duration::from_secs(1));
    fill_slot(&cluster, &format!("slidegate:{}", hammered.as_str()), FILL);
    let fresh = values_on_slots(&domain, "burst", "b", &hot, 150);
    // The last one is kept for after the moves.
    let (after, fresh) = fresh.split_last().expect("values");
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = write_rules(dir.path(), &domain);
    let seeds = cluster.urls().join(",");
    let server = Slidegate::start(
        &rules,
        &[
            "--redis-cluster",
            &seeds,
            "--failure-mode",
            "error",
            "--redis-timeout",
            "1s",
        ],
    );
    let client = RateLimitServiceClient::new(server.channel().await);

    let moving = Arc::new(AtomicBool::new(true));
    let load = Arc::new(Tally::default());
    let slowest = Arc::new(AtomicU64::new(0));
    let hammers: Vec<_> = (0..HAMMERS)
        .map(|_| {
            let (client, domain) = (client.clone(), domain.clone());
            let (moving, load) = (Arc::clone(&moving), Arc::clone(&load));
            let slowest = Arc::clone(&slowest);
            tokio::spawn(async move {
                while moving.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    load.count(&decide(client.clone(), &domain, "user", "0-0").await);
                    slowest.fetch_max(micros(started.elapsed()), Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Let the load run before the first move, so that every move meets calls in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mover = {
        let (cluster, moving) = (Arc::clone(&cluster), Arc::clone(&moving));
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            for i in 0..MOVES {
                let now = masters(&cluster);
                let (from, to) = if i % 2 == 0 {
                    (&now[0], &now[1])
                } else {
                    (&now[1], &now[0])
                };
                reshard(&cluster, from, to, SLOTS);
            }
            moving.store(false, Ordering::Relaxed);
            started.elapsed()
        })
    };
    let mut bursts = Vec::new();
    let mut values = fresh.iter();
    while moving.load(Ordering::Relaxed) {
        let Some(value) = values.next() else { break };
        bursts.push((value.clone(), burst(&client, &domain, value).await));
    }
    let took = mover.await.expect("resharding");
    moving.store(false, Ordering::Relaxed);
    for hammer in hammers {
        hammer.await.expect("hammer");
    }

    let (admitted, denied, failed) = load.get();
    eprintln!(
        "{MOVES} reshards of {SLOTS} slots in {took:?}: load {admitted} admitted, {denied} \
         denied, {failed} failed, slowest {} ms; {} bursts",
        slowest.load(Ordering::Relaxed) / 1000,
        bursts.len()
    );
    assert!(
        admitted > 0 && bursts.len() >= 2,
        "the load ran during the moves"
    );
    assert_eq!(failed, 0, "load calls failed during resharding");
    for (value, (admitted, failed)) in &bursts {
        assert_eq!(*failed, 0, "burst on {value} had failed calls");
        assert_eq!(
            *admitted, N,
            "burst on {value} admitted {admitted} of {BURST}"
        );
    }
    // The slots are home again: a fresh counter admits exactly N, and every counter holds
    // exactly the hits its bursts were told were admitted.
    assert_eq!(burst(&client, &domain, after).await, (N, 0));
    for value in bursts.iter().map(|(v, _)| v).chain([after]) {
        let counter = CounterKey::new(
            &domain,
            [("burst", value.as_str())],
            Duration::from_secs(60),
        );
        let key = format!("slidegate:{}", counter.as_str());
        let held = cluster.node_for(&key).cli(&["ZCARD", &key]);
        assert_eq!(held, N.to_string(), "hits recorded in {key}");
    }

    let (_, metrics) = server.get("/metrics");
    let seen = |kind: &str| {
        metric_value(
            &metrics,
            &format!("slidegate_store_redirections_total{{kind=\"{kind}\"}}"),
        ) as u64
    };
    let sent = |code: &str| error_replies(&cluster, code);
    eprintln!(
        "redirections seen / sent: moved {} / {}, ask {} / {}, tryagain {} / {}",
        seen("moved"),
        sent("MOVED"),
        seen("ask"),
        sent("ASK"),
        seen("tryagain"),
        sent("TRYAGAIN")
    );
    assert!(
        sent("MOVED") > 0 && sent("TRYAGAIN") > 0,
        "the moves redirected calls"
    );
    for (kind, code) in [("moved", "MOVED"), ("ask", "ASK"), ("tryagain", "TRYAGAIN")] {
        assert_eq!(seen(kind), sent(code), "{kind} replies counted");
    }
}
