//! Charges (costs recorded even over the limit) and returned hits (`is_negative_hits`).

use super::*;

/// A descriptor of `key` with its own `hits_addend`.
fn costing<'a>(key: &'a str, value: &'a str, hits: u64) -> Descriptor<'a> {
    Descriptor {
        hits_addend: Some(hits),
        ..desc(&[(key, value)])
    }
}

fn grpc(descriptors: Vec<Descriptor<'_>>) -> Request<'_> {
    Request {
        costs_are_charges: true,
        ..request(descriptors)
    }
}

/// Envoy's `apply_on_stream_done`: a check of 0 hits before each request, the response's cost
/// after it. With 1000 an hour and 800 per response, the second charge lands over the limit and
/// the third request is denied, on the buckets automatic precision gives and on the exact log.
#[tokio::test]
async fn response_costs_over_grpc_land_and_the_budget_bites() {
    for key in ["budget", "budget_exact"] {
        let f = fixture(Options::default());
        let mut codes = Vec::new();
        for _ in 0..4 {
            let check = call(&f, &grpc(vec![costing(key, "tenant", 0)])).await;
            codes.push(check.overall);
            if check.overall == Code::Ok {
                call(&f, &grpc(vec![costing(key, "tenant", 800)])).await;
            }
            f.clock.advance(Duration::from_secs(60));
        }
        assert_eq!(
            codes,
            [Code::Ok, Code::Ok, Code::OverLimit, Code::OverLimit],
            "{key}"
        );
        // The debt is paid once the charges leave the window.
        f.clock.advance(Duration::from_secs(3600));
        let check = call(&f, &grpc(vec![costing(key, "tenant", 0)])).await;
        assert_eq!(check.overall, Code::Ok, "{key}");
        assert_eq!(check.statuses[0].limit_remaining, 1000, "{key}");
    }
}

/// The same costs over `/check` or `/json` (no charges): a cost that does not fit is refused and
/// records nothing, as every ordinary request.
#[tokio::test]
async fn costs_over_http_are_admitted_or_refused() {
    let f = fixture(Options::default());
    let first = call(&f, &request(vec![costing("budget", "t", 800)])).await;
    assert_eq!(first.overall, Code::Ok);
    let second = call(&f, &request(vec![costing("budget", "t", 800)])).await;
    assert_eq!(second.overall, Code::OverLimit);
    let check = call(&f, &request(vec![costing("budget", "t", 0)])).await;
    assert_eq!(check.overall, Code::Ok);
    assert_eq!(
        check.statuses[0].limit_remaining, 200,
        "the refused cost left nothing"
    );
}

/// A charge that does not fit denies its request (the answer is truthful) and lands; the
/// request's admitted descriptors record nothing. Without a descriptor cost gRPC is all or
/// nothing as before.
#[tokio::test]
async fn a_charge_over_the_limit_lands_alone() {
    let f = fixture(Options::default());
    let r = call(
        &f,
        &grpc(vec![costing("user", "a", 5), desc(&[("user", "b")])]),
    )
    .await;
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(r.statuses[1].code, Code::Ok);
    // "a" holds the charge (4 hits: a charge past its limit is kept as limit + 1), "b" nothing.
    let r = call(
        &f,
        &grpc(vec![costing("user", "a", 0), costing("user", "b", 0)]),
    )
    .await;
    assert_eq!(r.statuses[0].code, Code::OverLimit, "a is in debt");
    assert_eq!(r.statuses[1].limit_remaining, 3, "b recorded nothing");
    // Ordinary gRPC hits (no descriptor cost) still record nothing when they do not fit.
    let full = grpc(vec![desc(&[("user", "c")])]);
    for _ in 0..3 {
        assert_eq!(call(&f, &full).await.overall, Code::Ok);
    }
    assert_eq!(call(&f, &full).await.overall, Code::OverLimit);
    f.clock.advance(Duration::from_secs(60));
    assert_eq!(call(&f, &full).await.statuses[0].limit_remaining, 2);
}

/// `--record-over-limit` (envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`):
/// every hit is recorded, also those of a denied request.
#[tokio::test]
async fn record_over_limit_records_denied_requests() {
    let f = fixture(Options {
        record_over_limit: true,
        ..Options::default()
    });
    for _ in 0..3 {
        call(&f, &request(vec![desc(&[("user", "full")])])).await;
    }
    let r = call(
        &f,
        &request(vec![desc(&[("user", "full")]), desc(&[("user", "x")])]),
    )
    .await;
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(
        r.statuses[1].limit_remaining, 2,
        "the denied request recorded x"
    );
    let check = call(&f, &request(vec![costing("user", "full", 0)])).await;
    assert_eq!(
        check.overall,
        Code::OverLimit,
        "4 hits recorded on a limit of 3"
    );
}

/// `is_negative_hits`: the hits are taken back, never below zero, on logs and buckets.
#[tokio::test]
async fn negative_hits_are_taken_back() {
    for (key, hits) in [("user", 1), ("tokens", 25_000)] {
        let f = fixture(Options::default());
        let limit = if key == "user" { 3 } else { 100_000 };
        let take = Descriptor {
            negative_hits: true,
            ..costing(key, "n", 2 * hits)
        };
        let add = costing(key, "n", hits);
        for _ in 0..limit / hits {
            assert_eq!(
                call(&f, &request(vec![add.clone()])).await.overall,
                Code::Ok
            );
        }
        assert_eq!(
            call(&f, &request(vec![add.clone()])).await.overall,
            Code::OverLimit
        );
        let r = call(&f, &grpc(vec![take.clone()])).await;
        assert_eq!(r.overall, Code::Ok, "{key}: a return is never over limit");
        assert_eq!(u64::from(r.statuses[0].limit_remaining), 2 * hits, "{key}");
        // Never below zero: a large return empties the counter, which then holds the limit.
        let all = Descriptor {
            hits_addend: Some(10 * limit),
            ..take.clone()
        };
        call(&f, &request(vec![all])).await;
        for _ in 0..limit / hits {
            assert_eq!(
                call(&f, &request(vec![add.clone()])).await.overall,
                Code::Ok,
                "{key}"
            );
        }
        assert_eq!(
            call(&f, &request(vec![add.clone()])).await.overall,
            Code::OverLimit
        );
        // Hits given back are not counted as hits taken: two fills and two denied requests.
        let text = f.metrics.render();
        let counted: u64 = text
            .lines()
            .filter(|l| l.starts_with("slidegate_hits_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        assert_eq!(counted, 2 * limit + 2 * hits, "{key}: {text}");
    }
}

/// A charge lands whatever the budget: a charge larger than its log is recorded in buckets, and
/// where even those do not fit in the budget, in one bucket of the window (2 of the budget).
#[tokio::test]
async fn charges_are_within_the_hit_budget() {
    let f = fixture(Options {
        limits: RequestLimits {
            max_hits: 4,
            ..RequestLimits::default()
        },
        ..Options::default()
    });
    let r = call(&f, &grpc(vec![costing("user", "big", 1_000_000)])).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    let check = call(&f, &grpc(vec![costing("user", "big", 0)])).await;
    assert_eq!(check.overall, Code::OverLimit, "the charge landed");
    // On a 1000-per-hour exact log a charge of 900 fits the limit but not the budget as a log.
    let r = call(&f, &grpc(vec![costing("budget_exact", "big", 900)])).await;
    assert_eq!(r.statuses[0].code, Code::Ok);
    let check = call(&f, &grpc(vec![costing("budget_exact", "big", 0)])).await;
    assert_eq!(check.statuses[0].limit_remaining, 100, "the charge landed");
    // On a limit kept as buckets (1000 an hour: 61 of the budget in every form) too; a check
    // there is over the budget of 4, so a second charge shows that the first landed.
    let r = call(&f, &grpc(vec![costing("budget", "big", 900)])).await;
    assert_eq!(r.statuses[0].code, Code::Ok);
    let r = call(&f, &grpc(vec![costing("budget", "big", 200)])).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit, "900 + 200 over 1000");
    // Admitted hits that do not fit the budget are over limit, and record nothing.
    let r = call(&f, &request(vec![costing("budget_exact", "other", 5)])).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    let check = call(&f, &grpc(vec![costing("budget_exact", "other", 0)])).await;
    assert_eq!(
        check.statuses[0].limit_remaining, 1000,
        "refused by the budget"
    );
}
