//! envoyproxy/ratelimit's per-rule stats as the limiter counts them: the hits a counter held
//! before a request, for an admitted request, one another descriptor denied, and a charge.

use super::super::*;
use super::limiter_over;
use crate::metrics::Metrics;

const RULES: &str = r#"
domain: api
descriptors:
  - key: wide
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: tight
    rate_limit: { unit: minute, requests_per_unit: 1 }
"#;

fn limiter(options: Options) -> RateLimiter {
    let decisions = DecisionMetrics::new(&Metrics::new()).with_envoy_stats(0.8);
    limiter_over(RULES, options, decisions).0
}

fn descriptor<'a>(key: &'a str, hits: u64) -> Descriptor<'a> {
    Descriptor {
        entries: [(key, "v")].into_iter().collect(),
        hits_addend: Some(hits),
        ..Descriptor::default()
    }
}

async fn call(limiter: &RateLimiter, descriptors: Vec<Descriptor<'_>>) {
    let request = Request {
        domain: "api",
        descriptors: descriptors.into(),
        hits_addend: 0,
        costs_are_charges: false,
    };
    limiter.should_rate_limit(&request).await.expect("decided");
}

fn stats(limiter: &RateLimiter, key: &str) -> [u64; 5] {
    let stats = limiter.metrics().envoy_stats().expect("on");
    stats
        .snapshot()
        .into_iter()
        .find(|(k, _)| k == &format!("api.{key}"))
        .map_or([0; 5], |(_, v)| v)
}

#[tokio::test]
async fn a_descriptor_another_one_denied_counts_from_what_its_window_held() {
    let limiter = limiter(Options::default());
    call(
        &limiter,
        vec![descriptor("wide", 8), descriptor("tight", 1)],
    )
    .await;
    // 8 held of 10 (near limit from 8); `tight` is full, so the next request is denied whole.
    call(
        &limiter,
        vec![descriptor("wide", 1), descriptor("tight", 1)],
    )
    .await;
    // total 9, within 9, near 1 (the ninth hit is past 8): as if admitted, from 8 held.
    assert_eq!(stats(&limiter, "wide"), [9, 0, 1, 9, 0]);
    // A limit of 1 is near from 0 hits: its first hit is near too.
    assert_eq!(stats(&limiter, "tight"), [2, 1, 1, 1, 0]);
}

#[tokio::test]
async fn a_charge_that_crosses_the_limit_counts_its_near_part() {
    let limiter = limiter(Options {
        record_over_limit: true,
        ..Options::default()
    });
    call(&limiter, vec![descriptor("wide", 7)]).await;
    // 7 held, 5 more: over by 2, near 2 (from 8 to 10), nothing within.
    call(&limiter, vec![descriptor("wide", 5)]).await;
    assert_eq!(stats(&limiter, "wide"), [12, 2, 2, 7, 0]);
}
