#[path = "tests_charges.rs"]
mod charges;
#[path = "tests_envoy_stats.rs"]
mod envoy_stats;

use super::request::counted_value;
use super::response::ceil_secs;
use super::*;
use crate::config::Unit;
use crate::config::load_sources;
use crate::metrics::Metrics;
use crate::store::{CounterKey, ManualClock, MemoryStore};
use arc_swap::ArcSwap;
use std::time::Duration;

const START: Duration = Duration::from_secs(1_700_000_000);

const RULES: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: two
    rate_limits:
      - { unit: second, requests_per_unit: 2 }
      - { unit: minute, requests_per_unit: 5 }
  - key: shadow
    rate_limit: { unit: minute, requests_per_unit: 1 }
    shadow_mode: true
  - key: free
    rate_limit: { unlimited: true }
  - key: general
    rate_limit: { name: general, unit: minute, requests_per_unit: 1 }
  - key: specific
    rate_limit: { name: specific, unit: minute, requests_per_unit: 5, replaces: [{ name: general }] }
  - key: named
    rate_limits:
      - { name: per_second, unit: second, requests_per_unit: 2 }
      - { name: per_hour, unit: hour, requests_per_unit: 3, precision: 1m }
  - key: over_named
    rate_limit: { unit: minute, requests_per_unit: 100, replaces: [{ name: per_hour }] }
  - key: tokens
    rate_limit: { unit: minute, requests_per_unit: 100000, precision: 1s }
  - key: budget
    rate_limit: { unit: hour, requests_per_unit: 1000 }
  - key: budget_exact
    rate_limit: { unit: hour, requests_per_unit: 1000, precision: exact }
"#;

struct Fixture {
    clock: Arc<ManualClock>,
    limiter: RateLimiter,
    metrics: Arc<Metrics>,
}

fn fixture(options: Options) -> Fixture {
    let metrics = Arc::new(Metrics::new());
    let (limiter, clock) = limiter_over(RULES, options, DecisionMetrics::new(&metrics));
    Fixture {
        clock,
        limiter,
        metrics,
    }
}

/// A limiter over the rule file `rules` on the memory store, its clock at [`START`].
fn limiter_over(
    rules: &str,
    options: Options,
    decisions: DecisionMetrics,
) -> (RateLimiter, Arc<ManualClock>) {
    let rules = load_sources(&[("rules.yaml".to_string(), rules.to_string())])
        .unwrap_or_else(|e| panic!("test rules do not load: {e}"));
    let clock = Arc::new(ManualClock::new(START));
    let limiter = RateLimiter::new(
        Arc::new(ArcSwap::from_pointee(rules)),
        Arc::new(MemoryStore::new(clock.clone())),
        options,
        Arc::new(decisions),
    );
    (limiter, clock)
}

fn headers_on() -> Options {
    Options {
        response_headers: true,
        ..Options::default()
    }
}

fn request<'a>(descriptors: Vec<Descriptor<'a>>) -> Request<'a> {
    Request {
        domain: "api",
        descriptors: descriptors.into(),
        hits_addend: 0,
        costs_are_charges: false,
    }
}

fn desc<'a>(entries: &[(&'a str, &'a str)]) -> Descriptor<'a> {
    Descriptor {
        entries: entries.iter().copied().collect(),
        ..Descriptor::default()
    }
}

async fn call(f: &Fixture, request: &Request<'_>) -> Response {
    match f.limiter.should_rate_limit(request).await {
        Ok(response) => response,
        Err(error) => panic!("unexpected error: {error}"),
    }
}

#[tokio::test]
async fn counts_down_and_denies_with_headers() {
    let f = fixture(headers_on());
    let req = request(vec![desc(&[("user", "alice")])]);
    for remaining in [2, 1, 0] {
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, remaining);
        let limit = r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit);
        assert_eq!(limit, Some(3));
    }
    f.clock.advance(Duration::from_secs(10));
    let r = call(&f, &req).await;
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(
        r.statuses[0].duration_until_reset,
        Some(Duration::from_secs(50))
    );
    let h: std::collections::HashMap<_, _> = r.headers.iter().cloned().collect();
    assert_eq!(h["ratelimit-limit"], "3");
    assert_eq!(h["ratelimit-remaining"], "0");
    assert_eq!(h["ratelimit-reset"], "50");
    assert_eq!(h["ratelimit-policy"], "3;w=60");
    assert_eq!(h["retry-after"], "50");
    // The window slides: once the first hits leave it, requests fit again.
    f.clock.advance(Duration::from_secs(50));
    assert_eq!(call(&f, &req).await.overall, Code::Ok);
}

#[tokio::test]
async fn most_restrictive_limit_of_a_descriptor_is_reported() {
    let f = fixture(headers_on());
    let req = request(vec![desc(&[("two", "x")])]);
    let r = call(&f, &req).await;
    // 2/second leaves 1, 5/minute leaves 4: the per-second limit is reported.
    let status = &r.statuses[0];
    assert_eq!(status.limit_remaining, 1);
    assert_eq!(
        status.current_limit.as_ref().map(|l| l.unit),
        Some(Unit::Second)
    );
    let policy = r.headers.iter().find(|(k, _)| *k == "ratelimit-policy");
    assert_eq!(policy.map(|(_, v)| v.as_str()), Some("2;w=1, 5;w=60"));
    call(&f, &req).await;
    // Third hit within the second: over the per-second limit.
    let r = call(&f, &req).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().map(|l| l.unit),
        Some(Unit::Second)
    );
    // After the second passes, the minute limit is the tighter one: 5 - 2 - 1 = 2 left.
    f.clock.advance(Duration::from_secs(1));
    let r = call(&f, &req).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    f.clock.advance(Duration::from_secs(1));
    let r = call(&f, &req).await;
    assert_eq!(
        r.statuses[0].current_limit.as_ref().map(|l| l.unit),
        Some(Unit::Minute)
    );
    assert_eq!(r.statuses[0].limit_remaining, 1);
}

#[test]
fn counter_keys_keep_their_encoding() {
    let f = fixture(Options::default());
    let mut limited = desc(&[("user", "o:1")]);
    limited.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Some(Unit::Hour),
    });
    let req = request(vec![desc(&[("two", "a b")]), limited]);
    let rules = f.limiter.rules().load_full();
    let domain = rules.domain("api").expect("domain api");
    let (_, counters) = f.limiter.plan(&req, domain);
    let keys: Vec<&str> = counters.iter().map(|c| c.key.as_str()).collect();
    // One tag for both windows of `two`; the override is escaped from scratch.
    assert_eq!(
        keys,
        [
            "{api:two=a%20b}1000",
            "{api:two=a%20b}60000",
            "{api:user=o%3A1}3600000"
        ]
    );
    let expected = CounterKey::new("api", [("two", "a b")], Duration::from_secs(60));
    assert_eq!(counters[1].key, expected);
}

#[test]
fn choice_prefers_over_limit_then_fewest_remaining() {
    let r = |over, remaining, secs| CounterResult {
        over_limit: over,
        count: 0,
        remaining,
        reset_after: Duration::from_secs(secs),
    };
    assert_eq!(most_restrictive(&[r(false, 1, 1), r(true, 0, 5)]), 1);
    assert_eq!(most_restrictive(&[r(true, 0, 5), r(true, 0, 9)]), 1);
    assert_eq!(most_restrictive(&[r(false, 3, 1), r(false, 2, 1)]), 1);
    assert_eq!(most_restrictive(&[r(false, 2, 9), r(false, 2, 1)]), 0);
}

#[tokio::test]
async fn descriptor_statuses_for_no_rule_unlimited_and_unknown_domain() {
    let f = fixture(Options::default());
    let req = request(vec![
        desc(&[("nothing", "x")]),
        desc(&[("free", "x")]),
        desc(&[("user", "bob")]),
    ]);
    let r = call(&f, &req).await;
    assert_eq!(r.statuses[0], NO_LIMIT);
    assert_eq!(r.statuses[1], UNLIMITED);
    assert_eq!(r.statuses[2].limit_remaining, 2);
    assert!(r.headers.is_empty(), "headers are off");
    let unknown = Request {
        domain: "nope",
        ..request(vec![desc(&[("user", "bob")])])
    };
    let r = call(&f, &unknown).await;
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(r.statuses, vec![NO_LIMIT]);
    let text = f.metrics.render();
    assert!(
        text.contains("slidegate_unknown_domain_total{domain=\"nope\"} 1"),
        "{text}"
    );
    // Clients choose domains: 16 get a series of their own, the rest share one.
    for i in 0..20 {
        let other = Request {
            domain: &format!("d{i}"),
            ..request(vec![desc(&[("user", "bob")])])
        };
        call(&f, &other).await;
    }
    let text = f.metrics.render();
    let series = text
        .lines()
        .filter(|l| l.starts_with("slidegate_unknown_domain_total{"))
        .count();
    assert_eq!(series, 17, "{text}");
    assert!(
        text.contains("slidegate_unknown_domain_total{domain=\"overflow\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("slidegate_no_rule_total{domain=\"api\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn hits_resolution() {
    let f = fixture(Options::default());
    // Request-level hits apply to descriptors without their own.
    let mut req = request(vec![desc(&[("user", "a")])]);
    req.hits_addend = 2;
    assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 1);
    // A descriptor's own hits win, and 0 checks without counting.
    req.descriptors[0].hits_addend = Some(0);
    assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 1);
    assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 1);
    req.descriptors[0].hits_addend = Some(1);
    assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 0);
    // Request-level 0 means 1.
    let fresh = request(vec![desc(&[("user", "b")])]);
    assert_eq!(call(&f, &fresh).await.statuses[0].limit_remaining, 2);
    // More hits than the limit never fit.
    let mut big = request(vec![desc(&[("user", "c")])]);
    big.hits_addend = 4;
    assert_eq!(call(&f, &big).await.overall, Code::OverLimit);
}

#[tokio::test]
async fn replaces_skips_the_replaced_rule() {
    let f = fixture(Options::default());
    let req = request(vec![desc(&[("general", "x")]), desc(&[("specific", "x")])]);
    for _ in 0..3 {
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::Ok, "general (1/min) is replaced");
        assert_eq!(r.statuses[0], NO_LIMIT);
        assert!(r.statuses[1].current_limit.is_some());
    }
    // Alone, the general rule applies, and its counter was never touched.
    let alone = request(vec![desc(&[("general", "x")])]);
    assert_eq!(call(&f, &alone).await.statuses[0].limit_remaining, 0);
    assert_eq!(call(&f, &alone).await.overall, Code::OverLimit);
}

#[tokio::test]
async fn override_replaces_the_configured_limit() {
    let f = fixture(Options::default());
    let mut d = desc(&[("user", "o")]);
    d.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Some(Unit::Hour),
    });
    let req = request(vec![d.clone()]);
    let r = call(&f, &req).await;
    let limit = r.statuses[0].current_limit.clone();
    assert_eq!(
        limit.map(|l| (l.requests_per_unit, l.unit)),
        Some((1, Unit::Hour))
    );
    assert_eq!(call(&f, &req).await.overall, Code::OverLimit);
    // Also for a descriptor that matches no rule, as long as the domain exists.
    let mut none = desc(&[("nothing", "x")]);
    none.limit = d.limit;
    let r = call(&f, &request(vec![none.clone()])).await;
    assert!(r.statuses[0].current_limit.is_some());
    let unknown = Request {
        domain: "nope",
        ..request(vec![none])
    };
    assert_eq!(call(&f, &unknown).await.statuses[0], NO_LIMIT);
}

#[tokio::test]
async fn rule_shadow_mode_counts_but_passes() {
    let f = fixture(Options::default());
    let req = request(vec![desc(&[("shadow", "x")])]);
    assert_eq!(call(&f, &req).await.overall, Code::Ok);
    let r = call(&f, &req).await;
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::Ok);
    let text = f.metrics.render();
    assert!(
        text.contains(
            r#"slidegate_decisions_total{decision="shadow_denied",domain="api",rule="shadow"} 1"#
        ),
        "{text}"
    );
}

/// Each limit of `rate_limits` reports and counts under its own name when it decides, and
/// `replaces` may name any of them. The hour is kept in buckets of a minute: its reset and
/// `Retry-After` come when the first hits' bucket leaves the hour, up to a minute late.
#[tokio::test]
async fn each_limit_reports_and_counts_under_its_own_name() {
    let f = fixture(headers_on());
    let req = request(vec![desc(&[("named", "a")])]);
    let name = |r: &Response| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .and_then(|l| l.name.clone())
    };
    for _ in 0..2 {
        assert_eq!(call(&f, &req).await.overall, Code::Ok);
    }
    let r = call(&f, &req).await;
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(name(&r).as_deref(), Some("per_second"));
    f.clock.advance(Duration::from_secs(1));
    let r = call(&f, &req).await;
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(
        name(&r).as_deref(),
        Some("per_hour"),
        "the hour is now fuller"
    );
    f.clock.advance(Duration::from_secs(1));
    let r = call(&f, &req).await;
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(name(&r).as_deref(), Some("per_hour"));
    let reset = r.statuses[0].duration_until_reset.unwrap_or_default();
    let hour = Duration::from_secs(3600);
    assert!(reset > hour - Duration::from_secs(2), "{reset:?}");
    assert!(reset <= hour + Duration::from_secs(60), "{reset:?}");
    let retry: Option<u64> = r
        .headers
        .iter()
        .find(|(name, _)| *name == "retry-after")
        .and_then(|(_, value)| value.parse().ok());
    assert_eq!(retry, Some(ceil_secs(reset)), "{:?}", r.headers);
    let text = f.metrics.render();
    for line in [
        r#"slidegate_decisions_total{decision="denied",domain="api",rule="per_second"} 1"#,
        r#"slidegate_decisions_total{decision="denied",domain="api",rule="per_hour"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    // `replaces` names the second limit: the whole rule is skipped.
    let both = request(vec![desc(&[("named", "b")]), desc(&[("over_named", "b")])]);
    let r = call(&f, &both).await;
    assert_eq!(r.statuses[0], NO_LIMIT);
    assert_eq!(r.statuses[1].limit_remaining, 99);
}

#[tokio::test]
async fn global_shadow_mode_never_denies() {
    let f = fixture(Options {
        shadow_mode: true,
        response_headers: true,
        ..Options::default()
    });
    let req = request(vec![desc(&[("user", "g")])]);
    for _ in 0..3 {
        assert_eq!(call(&f, &req).await.overall, Code::Ok);
    }
    let r = call(&f, &req).await;
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(r.statuses[0].code, Code::OverLimit, "reported truthfully");
    assert!(!r.headers.iter().any(|(k, _)| *k == "retry-after"));
}

#[tokio::test]
async fn validation_errors() {
    let f = fixture(Options {
        limits: RequestLimits {
            max_descriptors: 2,
            max_entries: 2,
            max_value_bytes: 8,
            ..RequestLimits::default()
        },
        ..Options::default()
    });
    let long = "x".repeat(9);
    let mut bad_unit = desc(&[("k", "v")]);
    bad_unit.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: None,
    });
    let cases: Vec<(Request<'_>, &str)> = vec![
        (
            Request {
                domain: "",
                ..request(vec![desc(&[("k", "v")])])
            },
            "domain must not be empty",
        ),
        (request(vec![]), "descriptor list must not be empty"),
        (
            request(vec![desc(&[("k", "v")]); 3]),
            "too many descriptors",
        ),
        (request(vec![desc(&[])]), "descriptors[0] has no entries"),
        (
            request(vec![desc(&[("a", "1"), ("b", "2"), ("c", "3")])]),
            "too many entries",
        ),
        (
            request(vec![desc(&[("k", "v")]), desc(&[("", "v")])]),
            "descriptors[1].entries[0].key must not be empty",
        ),
        (
            request(vec![desc(&[(&long, "v")])]),
            "entries[0].key is 9 bytes",
        ),
        (
            Request {
                domain: &long,
                ..request(vec![desc(&[("k", "v")])])
            },
            "domain is 9 bytes",
        ),
    ];
    for (req, expected) in cases {
        match f.limiter.should_rate_limit(&req).await {
            Err(LimitError::InvalidArgument(message)) => {
                assert!(message.contains(expected), "{message:?} lacks {expected:?}")
            }
            other => panic!("expected InvalidArgument({expected}), got {other:?}"),
        }
    }
    // An override's unit can come from metadata a client shaped: decided, never refused.
    let decided = f.limiter.should_rate_limit(&request(vec![bad_unit])).await;
    assert!(
        decided.is_ok_and(|r| r.overall == Code::OverLimit),
        "an unknown unit is a limit of 0"
    );
}

#[tokio::test]
async fn a_long_value_is_counted_under_its_digest() {
    let f = fixture(Options {
        limits: RequestLimits {
            max_value_bytes: 8,
            ..RequestLimits::default()
        },
        ..Options::default()
    });
    let long = "x".repeat(5000);
    let other = "y".repeat(5000);
    // The long value is decided and counted, like any other: 3 per minute.
    let req = request(vec![desc(&[("user", &long)])]);
    for remaining in [2, 1, 0] {
        assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, remaining);
    }
    assert_eq!(call(&f, &req).await.overall, Code::OverLimit);
    // Another long value has its own counter.
    let fresh = request(vec![desc(&[("user", &other)])]);
    assert_eq!(call(&f, &fresh).await.statuses[0].limit_remaining, 2);
    // An over-limit request stays denied when a long value rides along (issue 24).
    let both = request(vec![desc(&[("user", &long)]), desc(&[("two", &other)])]);
    assert_eq!(call(&f, &both).await.overall, Code::OverLimit);

    let rules = f.limiter.rules().load_full();
    let domain = rules.domain("api").expect("domain api");
    let (_, counters) = f.limiter.plan(&req, domain);
    let key = counters[0].key.as_str();
    assert!(key.len() < 100, "{key}");
    assert!(key.starts_with("{api:user=%00sha256%3A"), "{key}");
    // The digest's own text is counted under a digest too: no short value names its counter.
    let digest = counted_value(&long, 8);
    let spoof = request(vec![desc(&[("user", &digest)])]);
    let (_, spoofed) = f.limiter.plan(&spoof, domain);
    assert_ne!(spoofed[0].key, counters[0].key);
    // Values within the bound keep their text, as before.
    let short = request(vec![desc(&[("user", "alice")])]);
    assert_eq!(
        f.limiter.plan(&short, domain).1[0].key.as_str(),
        "{api:user=alice}60000"
    );
}

#[tokio::test]
async fn hits_over_the_budget_deny_and_record_nothing() {
    let f = fixture(Options {
        limits: RequestLimits {
            max_hits: 4,
            ..RequestLimits::default()
        },
        ..Options::default()
    });
    // `two` has two limits: 2 hits cost 4, the whole budget.
    let mut two = desc(&[("two", "b")]);
    two.hits_addend = Some(2);
    let mut user = desc(&[("user", "b")]);
    user.hits_addend = Some(1);
    let r = call(&f, &request(vec![two.clone(), user.clone()])).await;
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(r.statuses[1].code, Code::OverLimit, "past the budget");
    assert_eq!(r.statuses[1].limit_remaining, 0);
    // The denied request recorded nothing: both counters are still empty.
    for (d, remaining) in [(&user, 3), (&two, 2)] {
        let mut d = d.clone();
        d.hits_addend = Some(0);
        let r = call(&f, &request(vec![d])).await;
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    // One descriptor over the budget alone: denied, not refused.
    let mut many = desc(&[("user", "c")]);
    many.hits_addend = Some(5);
    let r = call(&f, &request(vec![many])).await;
    assert_eq!(r.statuses[0].code, Code::OverLimit);
    // A shadow rule over the budget reports OK and denies nothing.
    let mut shadow = desc(&[("shadow", "s")]);
    shadow.hits_addend = Some(5);
    let r = call(&f, &request(vec![shadow, user.clone()])).await;
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(r.statuses[1].limit_remaining, 2);
    // Descriptors without a limit cost nothing.
    let mut free = desc(&[("nothing", "x")]);
    free.hits_addend = Some(1000);
    assert_eq!(call(&f, &request(vec![free])).await.overall, Code::Ok);
}

#[tokio::test]
async fn bucket_hits_are_free_of_the_budget() {
    let f = fixture(Options {
        limits: RequestLimits {
            max_hits: 64,
            ..RequestLimits::default()
        },
        ..Options::default()
    });
    // 50,000 hits on a bucket counter of 60 buckets cost 61, so 3 more on an exact log fit the
    // budget of 64.
    let mut tokens = desc(&[("tokens", "t")]);
    tokens.hits_addend = Some(50_000);
    let mut user = desc(&[("user", "t")]);
    user.hits_addend = Some(3);
    let r = call(&f, &request(vec![tokens.clone(), user.clone()])).await;
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 50_000);
    assert_eq!(r.statuses[1].limit_remaining, 0);
    // The bucket counter still counts 61 of the budget: with 4 hits on the log, the request is
    // over it, denied, and records nothing on either.
    let mut other = desc(&[("user", "u")]);
    other.hits_addend = Some(4);
    let r = call(&f, &request(vec![tokens.clone(), other])).await;
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(r.statuses[1].code, Code::OverLimit, "past the budget");
    tokens.hits_addend = Some(0);
    let r = call(&f, &request(vec![tokens])).await;
    assert_eq!(r.statuses[0].limit_remaining, 50_000);
}

/// A store that always fails, for the failure modes.
struct Broken;

#[async_trait::async_trait]
impl Store for Broken {
    fn decide<'a>(&'a self, _: &'a [Counter]) -> crate::store::Decided<'a> {
        crate::store::Decided::Now(Some(Err(StoreError::Connection("refused".into()))))
    }
    async fn clear(&self, _: &[crate::store::CounterKey]) -> Result<Vec<bool>, StoreError> {
        Err(StoreError::Connection("refused".into()))
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Err(StoreError::Connection("refused".into()))
    }
    fn kind(&self) -> &'static str {
        "broken"
    }
}

#[tokio::test]
async fn failure_modes() {
    let rules = load_sources(&[("rules.yaml".to_string(), RULES.to_string())])
        .unwrap_or_else(|e| panic!("{e}"));
    let live: LiveRules = Arc::new(ArcSwap::from_pointee(rules));
    let req = request(vec![desc(&[("user", "x")]), desc(&[("nothing", "x")])]);
    for (mode, expected) in [
        (FailureMode::Error, None),
        (FailureMode::Allow, Some(Code::Ok)),
        (FailureMode::Deny, Some(Code::OverLimit)),
    ] {
        let metrics = Metrics::new();
        let options = Options {
            failure_mode: mode,
            ..Options::default()
        };
        let decisions = Arc::new(DecisionMetrics::new(&metrics));
        let limiter = RateLimiter::new(live.clone(), Arc::new(Broken), options, decisions);
        let result = limiter.should_rate_limit(&req).await;
        match (expected, result) {
            (None, Err(LimitError::Unavailable(_))) => {}
            (Some(code), Ok(r)) => {
                assert_eq!(r.overall, code);
                assert_eq!(r.statuses[0].code, code);
                assert_eq!(r.statuses[1], NO_LIMIT);
            }
            (expected, got) => panic!("{mode}: expected {expected:?}, got {got:?}"),
        }
        let text = metrics.render();
        let line = format!("slidegate_failure_mode_total{{mode=\"{mode}\"}} 1");
        assert!(text.contains(&line), "{text}");
        assert!(text.contains("slidegate_store_errors_total{kind=\"connection\"} 1"));
    }
}

#[tokio::test]
async fn a_reload_between_requests_is_seen() {
    let f = fixture(Options::default());
    let req = request(vec![desc(&[("user", "r")])]);
    assert!(call(&f, &req).await.statuses[0].current_limit.is_some());
    f.limiter.rules().store(Arc::new(RuleSet::default()));
    assert_eq!(call(&f, &req).await.statuses[0], NO_LIMIT);
}
