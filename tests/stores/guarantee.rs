//! The guarantee under charges and overrides, on every store (memory, Redis with and without the
//! deny cache, Redis Cluster): charges up to `u64::MAX` and sums of them never wrap a counter, a
//! counter named twice in one request in two representations is decided alike everywhere, and a
//! request the Redis script fails on fails alone, never the others of its call.

use std::time::Duration;

use crate::charges::{counter, stores, with};
use crate::support::RedisServer;
use slidegate::store::{
    Counter, CounterKey, HitKind, MAX_HELD, Precision, RedisOptions, RedisStore, Store,
};

const MINUTE: Duration = Duration::from_secs(60);
const TEN_SECONDS: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_charges_and_their_sums_never_wrap() {
    for s in stores().await {
        let forms = [
            (Precision::Exact, "exact"),
            (Precision::Buckets(Duration::from_secs(1)), "buckets"),
        ];
        for (precision, kept) in forms {
            let what = format!("[{}, {kept}]", s.name);
            let c = counter(&format!("wrap-{kept}"), 10, TEN_SECONDS, precision);
            let one = with(&c, HitKind::Admitted, 1);
            for _ in 0..10 {
                assert!(s.decide(std::slice::from_ref(&one)).await.allowed, "{what}");
            }
            for huge in [u64::MAX - 9, u64::MAX, 1 << 50, 1 << 60, u64::MAX] {
                let d = s.decide(&[with(&c, HitKind::Charged, huge)]).await;
                assert!(!d.allowed, "{what} {d:?}");
                assert!(d.counters[0].count > 10, "{what}: wrapped {d:?}");
                assert!(d.counters[0].count <= MAX_HELD, "{what}: {d:?}");
            }
            // Two huge charges in one request on one counter.
            let both = [
                with(&c, HitKind::Charged, u64::MAX),
                with(&c, HitKind::Charged, u64::MAX),
            ];
            let d = s.decide(&both).await;
            assert!(d.counters.iter().all(|r| r.count > 10), "{what}: {d:?}");
            for _ in 0..15 {
                let d = s.decide(std::slice::from_ref(&one)).await;
                assert!(!d.allowed, "{what}: admitted under the debt {d:?}");
                assert_eq!(d.counters[0].remaining, 0, "{what}");
            }
        }
    }
}

/// A rule of 5 a minute and a limit override of 1000 a minute on one counter, in one request,
/// for every pair of forms (the exact log, buckets of 1 s, 10 s, and one bucket of the minute),
/// in both orders, with a charge and a return: decided without an error, and alike, on every
/// store (the counts where no deny cache answers: a request it denies reports only the counters
/// it knows to be full).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_named_in_two_representations_is_decided_alike_everywhere() {
    let forms = [
        Precision::Exact,
        Precision::Buckets(Duration::from_secs(1)),
        Precision::Buckets(Duration::from_secs(10)),
        Precision::Buckets(MINUTE),
    ];
    type Answers = Vec<(bool, Vec<u64>)>;
    let mut seen: Vec<(&str, Vec<Answers>)> = Vec::new();
    for s in stores().await {
        let mut all = Vec::new();
        for (a, rule_form) in forms.iter().enumerate() {
            for (b, override_form) in forms.iter().enumerate() {
                let rule = counter(&format!("twice-{a}-{b}"), 5, MINUTE, *rule_form);
                let over = Counter {
                    limit: 1000,
                    precision: *override_form,
                    ..rule.clone()
                };
                let requests = [
                    vec![rule.clone(), over.clone()],
                    vec![over.clone(), rule.clone()],
                    vec![with(&rule, HitKind::Charged, 2), over.clone()],
                    vec![rule.clone(), with(&over, HitKind::Returned, 1)],
                    vec![rule.clone(), over.clone()],
                    vec![rule.clone()],
                ];
                let mut answers = Vec::new();
                for request in requests {
                    let d = s.decide(&request).await;
                    let counts = match s.cached {
                        true => Vec::new(),
                        false => d.counters.iter().map(|c| c.count).collect(),
                    };
                    answers.push((d.allowed, counts));
                }
                all.push(answers);
            }
        }
        seen.push((s.name, all));
    }
    let (first, expected) = &seen[0];
    for answers in expected {
        let allowed: Vec<bool> = answers.iter().map(|a| a.0).collect();
        assert_eq!(
            allowed,
            [true, true, false, false, false, false],
            "{first}: {answers:?}"
        );
    }
    for (name, all) in &seen[1..] {
        for (answers, wanted) in all.iter().zip(expected) {
            for (answer, want) in answers.iter().zip(wanted) {
                assert_eq!(
                    answer.0, want.0,
                    "{name} and {first} decide alike: {answers:?}"
                );
                if !answer.1.is_empty() {
                    assert_eq!(
                        answer.1, want.1,
                        "{name} and {first} count alike: {answers:?}"
                    );
                }
            }
        }
    }
}

/// A debt of 5000 hits and a later one of 11, 8 of it refunded (all kept as buckets: more than a
/// log of 10 takes), then, once the first has left the window, a request naming the counter twice
/// as the exact log: the first naming finds 5003 hits in buckets and decides in them, and the
/// second keeps that form (trimmed, the buckets hold 3, which made Redis rewrite the key as a log
/// between the two namings and fail the request in pass two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_named_twice_keeps_one_form_after_its_debt_leaves() {
    let second = Duration::from_secs(1);
    for s in stores().await {
        let c = counter("debt-leaves", 10, second, Precision::Exact);
        let d = s.decide(&[with(&c, HitKind::Charged, 5000)]).await;
        assert!(!d.allowed, "[{}] {d:?}", s.name);
        s.advance(Duration::from_millis(500)).await;
        let d = s.decide(&[with(&c, HitKind::Charged, 11)]).await;
        assert_eq!(d.counters[0].count, 5011, "[{}] {d:?}", s.name);
        let d = s.decide(&[with(&c, HitKind::Returned, 8)]).await;
        assert_eq!(d.counters[0].count, 5003, "[{}] {d:?}", s.name);
        s.advance(Duration::from_millis(650)).await;
        let d = s.decide(&[c.clone(), c.clone()]).await;
        assert!(d.allowed, "[{}] 3 held, 2 more fit 10: {d:?}", s.name);
        let counts: Vec<u64> = d.counters.iter().map(|r| r.count).collect();
        assert_eq!(counts, [4, 5], "[{}] {d:?}", s.name);
    }
}

/// Redis: a request whose counter key holds something no decision writes (a string under the
/// prefix) fails alone. The other requests of the same script calls are decided, and the failed
/// request's other counter records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_request_fails_alone_in_its_batch() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let prefix = "sgbatch:";
    let store = RedisStore::connect(&RedisOptions {
        url: server.url(),
        prefix: prefix.into(),
        timeout: Duration::from_secs(5),
        deny_cache: 0,
        ..RedisOptions::default()
    })
    .await
    .expect("connect");
    let c = |name: &str| Counter {
        key: CounterKey::new("batch", [("k", name)], MINUTE),
        limit: 100,
        window: MINUTE,
        hits: 1,
        shadow: false,
        precision: Precision::Exact,
        kind: HitKind::Admitted,
    };
    let poisoned = c("poisoned");
    server.cli(&["SET", &format!("{prefix}{}", poisoned.key.as_str()), "x"]);
    // Loads the script, so that the calls below are all in flight at once.
    store.decide(&[c("warm")]).await.expect("warm-up");
    let before = server.command_calls("evalsha");
    let calls = (0..64).map(|i| {
        let store = &store;
        let counters = match i % 16 {
            0 => vec![c(&format!("beside{i}")), poisoned.clone()],
            _ => vec![c(&format!("innocent{i}"))],
        };
        async move { (i, store.decide(&counters).await) }
    });
    let answers = futures::future::join_all(calls).await;
    let script_calls = server.command_calls("evalsha") - before;
    assert!(
        script_calls < 64,
        "the requests were batched: {script_calls} calls"
    );
    for (i, answer) in answers {
        match (i % 16, answer) {
            (0, Err(e)) => assert!(e.to_string().contains("this request"), "{e}"),
            (0, Ok(d)) => panic!("request {i} names a string key: {d:?}"),
            (_, Ok(d)) => assert!(d.allowed && d.counters[0].count == 1, "{i}: {d:?}"),
            (_, Err(e)) => panic!("innocent request {i} failed: {e}"),
        }
    }
    for i in (0..64).step_by(16) {
        let d = store
            .decide(&[with(&c(&format!("beside{i}")), HitKind::Admitted, 0)])
            .await
            .expect("a check");
        assert_eq!(
            d.counters[0].count, 0,
            "the failed request recorded nothing"
        );
    }
}
