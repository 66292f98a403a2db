//! Fault tests: Redis frozen (SIGSTOP). Calls time out within the store timeout with memory
//! flat, timed-out calls record no hit once Redis thaws, and a client's `grpc-timeout` ends a call
//! before the store timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::faults_fixture::{Answer, RULES, Rules, classify, healthy, load, metrics, request};
use crate::support::{
    RedisServer, Slidegate, grpc_frame, metric_value, raw_should_rate_limit, send_signal,
    wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use prost::Message as _;

/// Redis is frozen with SIGSTOP while 128 concurrent callers keep calling, for 5 s, then thawed.
///
/// Proves: every call returns within the store timeout plus a margin, as UNAVAILABLE "timed out"
/// (never hangs, whatever the client library's own retry policy); slidegate's resident memory
/// stays flat while thousands of calls hit the frozen Redis (no unbounded queue of waiting work);
/// health turns NOT_SERVING; after SIGCONT calls are decided by Redis again, and the calls that
/// timed out, which Redis then runs, record no hit (they reach Redis after their deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_frozen_calls_time_out_and_memory_stays_flat() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new(RULES);
    let timeout = Duration::from_millis(250);
    let server = Slidegate::start(
        &rules.dir(),
        &["--redis-url", &redis.url(), "--redis-timeout", "250ms"],
    );
    assert!(wait_until(Duration::from_secs(10), || healthy(&server)));

    // Warm up with the same concurrency, so allocator pools and connections exist before measuring.
    let req = request(&[("user", "frozen")]);
    let stop = Arc::new(AtomicBool::new(false));
    let warm = load(&server, req.clone(), 64, Duration::ZERO, Arc::clone(&stop)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let warm = warm.await.expect("warm-up");
    assert!(warm.iter().all(|s| s.answer == Answer::Store(Code::Ok)));

    let zcard = || redis.cli(&["ZCARD", "slidegate:{faults:user=frozen}60000"]);
    let hits_before: u64 = zcard().parse().expect("ZCARD");
    send_signal(redis.process.pid(), "STOP");
    let frozen_at = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let run = load(&server, req.clone(), 128, Duration::ZERO, Arc::clone(&stop)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rss_early = server.rss_kib();
    let mut rss_max = rss_early;
    while frozen_at.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        rss_max = rss_max.max(server.rss_kib());
    }
    let health_down = server.get("/healthcheck").0 == 503;
    stop.store(true, Ordering::SeqCst);
    let samples = run.await.expect("load");
    send_signal(redis.process.pid(), "CONT");

    for s in &samples {
        assert!(
            s.elapsed < timeout + Duration::from_millis(750),
            "a call took {:?} against a frozen Redis (timeout {timeout:?})",
            s.elapsed
        );
        match &s.answer {
            Answer::Error(tonic::Code::Unavailable, _) => {}
            other => panic!("unexpected answer against a frozen Redis: {other:?}"),
        }
    }
    // Clients get no internals: the kind of each failure is in the metrics.
    let timed_out = metric_value(
        &metrics(&server),
        r#"slidegate_store_errors_total{kind="timeout"}"#,
    ) as usize;
    eprintln!(
        "{} calls against a frozen Redis ({timed_out} timed out); RSS {rss_early} KiB after 1.5 s, \
         at most {rss_max} KiB",
        samples.len()
    );
    assert!(samples.len() >= 500, "only {} calls", samples.len());
    assert!(
        timed_out * 2 >= samples.len(),
        "{timed_out} of {}",
        samples.len()
    );
    assert!(
        rss_max < rss_early + 8 * 1024,
        "RSS grew from {rss_early} KiB to {rss_max} KiB while Redis was frozen"
    );
    assert!(health_down, "health stayed SERVING with a frozen Redis");

    // Thawed: decided by Redis again (the backlog it read meanwhile is processed first).
    let mut client = server.client().await;
    let back = Instant::now();
    loop {
        let answer = classify(client.should_rate_limit(req.clone()).await);
        if answer == Answer::Store(Code::Ok) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "not back 10 s after SIGCONT: {answer:?}\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("back {:?} after SIGCONT", back.elapsed());
    assert!(wait_until(Duration::from_secs(5), || healthy(&server)));
    // Calls that timed out were still in Redis's socket buffer: once thawed, Redis ran them, past
    // their deadline, so they recorded nothing (docs/operations.md, "A call that timed out").
    let hits_after: u64 = zcard().parse().expect("ZCARD");
    let recorded = hits_after.saturating_sub(hits_before + 1);
    let expired = metric_value(&metrics(&server), "slidegate_redis_deadline_expired_total");
    eprintln!("hits recorded by calls answered UNAVAILABLE: {recorded}; {expired} calls expired");
    assert_eq!(recorded, 0, "hits of timed-out calls were recorded");
    assert!(expired >= 1.0, "no expired call counted");
}

/// Envoy sends its call timeout as `grpc-timeout`. With Redis frozen and a long store timeout,
/// a call whose deadline passes first is answered `DEADLINE_EXCEEDED` at its deadline, not held
/// until the store gives up; a call without one waits for the store timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_deadline_ends_the_call_before_the_store_timeout() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new(RULES);
    let server = Slidegate::start(
        &rules.dir(),
        &["--redis-url", &redis.url(), "--redis-timeout", "3s"],
    );
    assert!(wait_until(Duration::from_secs(10), || healthy(&server)));
    let mut client = server.client().await;
    let req = request(&[("user", "deadline")]);
    let warm = classify(client.should_rate_limit(req.clone()).await);
    assert_eq!(warm, Answer::Store(Code::Ok));

    send_signal(redis.process.pid(), "STOP");
    // Written by hand: tonic's client would enforce the deadline itself and hide the server's.
    let started = Instant::now();
    let answer = raw_should_rate_limit(
        server.grpc_port,
        &[("grpc-timeout", "300m")],
        grpc_frame(&req.encode_to_vec()),
    )
    .await;
    let with_deadline = started.elapsed();
    let started = Instant::now();
    let without = classify(client.should_rate_limit(req.clone()).await);
    let without_deadline = started.elapsed();
    send_signal(redis.process.pid(), "CONT");

    // DEADLINE_EXCEEDED is 4.
    assert_eq!(answer.status.as_deref(), Some("4"), "{answer:?}");
    assert!(
        with_deadline >= Duration::from_millis(300) && with_deadline < Duration::from_millis(1500),
        "a 300 ms deadline answered after {with_deadline:?}"
    );
    assert!(
        matches!(without, Answer::Error(tonic::Code::Unavailable, _)),
        "{without:?}"
    );
    assert!(
        without_deadline >= Duration::from_millis(2500),
        "no deadline, 3 s store timeout, answered after {without_deadline:?}"
    );
}
