//! The guarantee under charges and overrides, through the binary over gRPC, on the memory store
//! and on Redis: a huge charge never wraps a counter into a refund, a request that names one
//! counter in two representations (a rule and a limit override on the same entries) is decided
//! like any other on both stores, a charge's whole debt survives a reload that raises the limit,
//! and a charge larger than `--max-hits` still lands.

use std::time::Duration;

use crate::support::{RedisServer, Slidegate, descriptor, request, wait_until};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;

const RULES: &str = r#"
domain: guarantee
descriptors:
  - key: wrap
    rate_limit: { unit: second, unit_multiplier: 10, requests_per_unit: 10, precision: 1s }
  - key: shared
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: debt
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: big
    rate_limit: { unit: minute, requests_per_unit: 5000, precision: exact }
"#;

/// OK and OVER_LIMIT in the response's `Code`.
const OK: i32 = 1;
const OVER: i32 = 2;

/// The memory store and, where redis-server runs, a Redis: the flags of each, and the server
/// kept alive.
fn stores() -> (Option<RedisServer>, Vec<(&'static str, Vec<String>)>) {
    let redis = RedisServer::start();
    let mut stores = vec![("memory", Vec::new())];
    if let Some(redis) = &redis {
        stores.push(("redis", vec!["--redis-url".to_string(), redis.url()]));
    }
    (redis, stores)
}

fn rules_dir(rules: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), rules).expect("write rules");
    dir
}

fn with_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..descriptor(entries)
    }
}

fn one(d: RateLimitDescriptor) -> RateLimitRequest {
    request("guarantee", vec![d])
}

/// The call's overall code and first descriptor's remaining; a gRPC error fails the test.
async fn call(server: &Slidegate, store: &str, req: RateLimitRequest) -> (i32, u32) {
    let mut client = server.client().await;
    match client.should_rate_limit(req).await {
        Ok(answer) => {
            let answer = answer.into_inner();
            (answer.overall_code, answer.statuses[0].limit_remaining)
        }
        Err(status) => panic!(
            "[{store}] ShouldRateLimit failed: {status:?}\n{}",
            server.log()
        ),
    }
}

async fn admitted(server: &Slidegate, store: &str, req: &RateLimitRequest, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(call(server, store, req.clone()).await.0 == OK);
    }
    ok
}

/// A charge of `2^64 - 10` (and of `u64::MAX`) on a full bucket counter: answered over limit,
/// and no later request is admitted within the window (the counter used to wrap into a refund
/// and admit 10 more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_charge_never_wraps_a_counter_into_a_refund() {
    let rules = rules_dir(RULES);
    let (_redis, stores) = stores();
    for (store, args) in stores {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Slidegate::start(rules.path(), &args);
        let plain = one(descriptor(&[("wrap", "w")]));
        assert_eq!(admitted(&server, store, &plain, 11).await, 10, "[{store}]");
        for huge in [u64::MAX - 9, u64::MAX, 1 << 60] {
            let charge = one(with_hits(&[("wrap", "w")], huge));
            assert_eq!(call(&server, store, charge).await, (OVER, 0), "[{store}]");
        }
        assert_eq!(
            admitted(&server, store, &plain, 15).await,
            0,
            "[{store}] admitted after huge charges under 10 per 10 s"
        );
    }
}

/// A rule (5 a minute, the exact log) and, in the same request, a limit override of 1000 a
/// minute (buckets) on the same entries: one counter named twice in two representations. Every
/// call is answered (Redis used to fail each with WRONGTYPE), the same on both stores, and at
/// most 5 hits are admitted under the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_named_in_two_representations_is_decided_on_both_stores_alike() {
    let rules = rules_dir(RULES);
    let (_redis, stores) = stores();
    let both = request(
        "guarantee",
        vec![
            descriptor(&[("shared", "s")]),
            RateLimitDescriptor {
                limit: Some(RateLimitOverride {
                    requests_per_unit: 1000,
                    unit: 2, // MINUTE
                }),
                ..descriptor(&[("shared", "s")])
            },
        ],
    );
    let mut seen = Vec::new();
    for (store, args) in stores {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--failure-mode", "allow"]);
        let server = Slidegate::start(rules.path(), &args);
        let mut codes = Vec::new();
        for _ in 0..20 {
            codes.push(call(&server, store, both.clone()).await.0);
        }
        // Each admitted request adds a hit for the rule and one for the override to the one
        // counter: the rule's 5 admit 3 requests.
        let ok = codes.iter().filter(|&&c| c == OK).count();
        assert_eq!(ok, 3, "[{store}] admitted under 5 a minute: {codes:?}");
        assert!(
            !server.log().contains("WRONGTYPE"),
            "[{store}] {}",
            server.log()
        );
        eprintln!("[{store}] {ok} of 20 admitted: {codes:?}");
        seen.push((store, codes));
    }
    if let [(_, memory), (_, redis)] = &seen[..] {
        assert_eq!(memory, redis, "memory and Redis decide alike");
    }
}

/// A charge of 1000 on 10 a minute, then a reload to 100 a minute: the whole debt still denies
/// (it used to be kept as 11 hits, and 89 of the next requests were admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charges_debt_survives_a_reload_that_raises_the_limit() {
    let (_redis, stores) = stores();
    for (store, args) in stores {
        let rules = rules_dir(RULES);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Slidegate::start(rules.path(), &args);
        let charge = one(with_hits(&[("debt", "d")], 1000));
        assert_eq!(call(&server, store, charge).await.0, OVER, "[{store}]");
        let raised = RULES.replace(
            "{ unit: minute, requests_per_unit: 10 }",
            "{ unit: minute, requests_per_unit: 100 }",
        );
        std::fs::write(rules.path().join("rules.yaml"), raised).expect("rewrite rules");
        server.signal("HUP");
        let reloaded = wait_until(Duration::from_secs(10), || {
            server.get("/rlconfig").1.contains("100 per MINUTE")
        });
        assert!(reloaded, "[{store}] no reload:\n{}", server.log());
        let plain = one(descriptor(&[("debt", "d")]));
        assert_eq!(
            admitted(&server, store, &plain, 120).await,
            0,
            "[{store}] admitted under a debt of 1000 after raising the limit to 100"
        );
    }
}

/// A charge of 4097 (over `--max-hits`' 4096) on an exact log of 5000 a minute lands: a check
/// then shows 903 remaining, not 5000. And one larger than the limit denies what follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_over_max_hits_lands() {
    let rules = rules_dir(RULES);
    let (_redis, stores) = stores();
    for (store, args) in stores {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Slidegate::start(rules.path(), &args);
        let charge = one(with_hits(&[("big", "b")], 4097));
        assert_eq!(call(&server, store, charge).await.0, OK, "[{store}]");
        let check = one(with_hits(&[("big", "b")], 0));
        assert_eq!(
            call(&server, store, check.clone()).await,
            (OK, 903),
            "[{store}]"
        );
        let charge = one(with_hits(&[("big", "b")], 10_000));
        assert_eq!(call(&server, store, charge).await.0, OVER, "[{store}]");
        assert_eq!(
            call(&server, store, check).await.0,
            OVER,
            "[{store}] the debt denies"
        );
        let plain = one(descriptor(&[("big", "b")]));
        assert_eq!(admitted(&server, store, &plain, 5).await, 0, "[{store}]");
    }
}
