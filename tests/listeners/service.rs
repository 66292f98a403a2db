//! The service layer end to end: the real `slidegate` binary on free ports, called over gRPC
//! (Envoy's RateLimitService v3 client from envoy-types, gRPC health, reflection) and HTTP
//! (`/json`, `/check`, `/healthcheck`, `/rlconfig`, `/metrics`), with the memory store and with a
//! real redis-server.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{
    RedisServer, Slidegate, bench_command, call, descriptor, free_port, metric_sum, metric_value,
    promtool_check_metrics, request, run_ok, slidegate_command, wait_until,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

const RULES: &str = r#"
domain: test
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 3 }
  - key: window
    rate_limit: { unit: second, unit_multiplier: 30, requests_per_unit: 10 }
  - key: free
    rate_limit: { unlimited: true }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: general
    rate_limit: { name: general, unit: minute, requests_per_unit: 1 }
  - key: specific
    rate_limit:
      name: specific
      unit: minute
      requests_per_unit: 5
      replaces: [{ name: general }]
  - key: two
    rate_limits:
      - { unit: second, requests_per_unit: 2 }
      - { unit: minute, requests_per_unit: 5 }
"#;
const RULE_COUNT: usize = 7;

// ---------------------------------------------------------------------------------------------
// Harness

/// A running slidegate on free ports, killed on drop.
struct Server {
    slidegate: Slidegate,
    rules: tempfile::TempDir,
}

/// The process-level helpers (ports, log, signals, exit) are those of [`Slidegate`].
impl std::ops::Deref for Server {
    type Target = Slidegate;
    fn deref(&self) -> &Slidegate {
        &self.slidegate
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut Slidegate {
        &mut self.slidegate
    }
}

impl Server {
    fn start(args: &[&str]) -> Server {
        Server::start_with_rules(RULES, args)
    }

    fn start_with_rules(rules: &str, args: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
        std::fs::write(dir.path().join("rules/rules.yaml"), rules).expect("write rules");
        Server {
            slidegate: Slidegate::start(&dir.path().join("rules"), args),
            rules: dir,
        }
    }

    fn rules_file(&self) -> PathBuf {
        self.rules.path().join("rules/rules.yaml")
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        reqwest::get(self.url(path)).await.expect("GET")
    }

    async fn metrics(&self) -> Metrics {
        Metrics(
            self.get("/metrics")
                .await
                .text()
                .await
                .expect("metrics body"),
        )
    }
}

fn headers(response: &RateLimitResponse) -> HashMap<String, String> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.to_ascii_lowercase(), h.value.clone()))
        .collect()
}

fn limit(status: &DescriptorStatus) -> Option<(String, u32, Unit)> {
    status
        .current_limit
        .as_ref()
        .map(|l| (l.name.clone(), l.requests_per_unit, l.unit()))
}

fn reset_secs(status: &DescriptorStatus) -> f64 {
    let d = status.duration_until_reset.expect("duration_until_reset");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// The Prometheus text of `/metrics`, with a lookup by series.
struct Metrics(String);

impl Metrics {
    /// The value of one series, e.g. `slidegate_unknown_domain_total` or
    /// `slidegate_no_rule_total{domain="test"}` (labels in the order the encoder writes them:
    /// alphabetical). Missing series are 0.
    fn get(&self, series: &str) -> f64 {
        metric_value(&self.0, series)
    }

    /// The sum of a family's series that carry `label`, whatever their other labels.
    fn sum(&self, family: &str, label: &str) -> f64 {
        metric_sum(&self.0, family, label)
    }
}

// ---------------------------------------------------------------------------------------------
// gRPC ShouldRateLimit

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_statuses_follow_envoy_semantics() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request(
        "test",
        vec![
            descriptor(&[("nothing", "x")]),
            descriptor(&[("free", "x")]),
            descriptor(&[("user", "alice")]),
            descriptor(&[("window", "w")]),
        ],
    );
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses.len(), 4);
    // No rule: OK, no limit, nothing remaining, no reset.
    let none = &r.statuses[0];
    assert_eq!(none.code(), Code::Ok);
    assert_eq!(none.current_limit, None);
    assert_eq!(none.limit_remaining, 0);
    assert_eq!(none.duration_until_reset, None);
    // Unlimited: OK, remaining u32::MAX.
    let free = &r.statuses[1];
    assert_eq!(free.code(), Code::Ok);
    assert_eq!(free.current_limit, None);
    assert_eq!(free.limit_remaining, u32::MAX);
    // Limited: the configured limit with its name, hits left, time until the hit leaves.
    let user = &r.statuses[2];
    assert_eq!(user.code(), Code::Ok);
    assert_eq!(limit(user), Some(("per_user".into(), 3, Unit::Minute)));
    assert_eq!(user.limit_remaining, 2);
    assert!((59.0..=60.0).contains(&reset_secs(user)), "{user:?}");
    // A window of 30 seconds: reported as configured (10 per SECOND), the reset shows the window.
    let window = &r.statuses[3];
    assert_eq!(limit(window), Some((String::new(), 10, Unit::Second)));
    assert_eq!(window.limit_remaining, 9);
    assert!((29.0..=30.0).contains(&reset_secs(window)), "{window:?}");
    // Headers from the most restrictive descriptor (2 left of 3), with the true window.
    let h = headers(&r);
    assert_eq!(h.get("ratelimit-limit").map(String::as_str), Some("3"));
    assert_eq!(h.get("ratelimit-remaining").map(String::as_str), Some("2"));
    assert_eq!(
        h.get("ratelimit-policy").map(String::as_str),
        Some("3;w=60")
    );
    assert_eq!(h.get("ratelimit-reset").map(String::as_str), Some("60"));
    assert!(!h.contains_key("retry-after"));

    call(&mut client, req.clone()).await;
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[2].limit_remaining, 0);

    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(r.statuses[2].code(), Code::OverLimit);
    assert_eq!(r.statuses[2].limit_remaining, 0);
    assert!(reset_secs(&r.statuses[2]) > 55.0);
    for i in [0, 1, 3] {
        assert_eq!(r.statuses[i].code(), Code::Ok, "descriptor {i}");
    }
    // The denied request recorded nothing: 3 hits on the window counter, not 4.
    assert_eq!(r.statuses[3].limit_remaining, 7);
    let h = headers(&r);
    assert_eq!(h.get("ratelimit-remaining").map(String::as_str), Some("0"));
    let retry: u64 = h
        .get("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!((56..=60).contains(&retry), "{retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_most_restrictive_of_several_limits() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("two", "t")])]);
    let r = call(&mut client, req.clone()).await;
    // 2 per second leaves 1, 5 per minute leaves 4.
    assert_eq!(
        limit(&r.statuses[0]),
        Some((String::new(), 2, Unit::Second))
    );
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(
        headers(&r).get("ratelimit-policy").map(String::as_str),
        Some("2;w=1, 5;w=60")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_hits_addend_variants() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    // Request-level hits.
    let mut req = request("test", vec![descriptor(&[("user", "h1")])]);
    req.hits_addend = 2;
    assert_eq!(
        call(&mut client, req.clone()).await.statuses[0].limit_remaining,
        1
    );
    // Per-descriptor 0: check only, nothing counted (twice).
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..2 {
        let r = call(&mut client, req.clone()).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 1);
    }
    // Per-descriptor hits win over the request's (5 would not fit).
    req.hits_addend = 5;
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // Request-level 0 means 1.
    let fresh = request("test", vec![descriptor(&[("user", "h2")])]);
    assert_eq!(
        call(&mut client, fresh).await.statuses[0].limit_remaining,
        2
    );
    // Mixed: one descriptor inherits 2, the other counts its own 3 (over its limit of 3? no: fits).
    let mut mixed = request(
        "test",
        vec![
            descriptor(&[("user", "h3")]),
            descriptor(&[("window", "h3")]),
        ],
    );
    mixed.hits_addend = 2;
    mixed.descriptors[1].hits_addend = Some(UInt64Value { value: 3 });
    let r = call(&mut client, mixed).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 7);
    // More hits than the limit never fit.
    let mut big = request("test", vec![descriptor(&[("user", "h4")])]);
    big.hits_addend = 4;
    assert_eq!(call(&mut client, big).await.overall_code(), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_shadow_mode_per_rule_and_global() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("shadow", "s")])]);
    for _ in 0..3 {
        let r = call(&mut client, req.clone()).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(r.statuses[0].code(), Code::Ok);
    }
    let m = server.metrics().await;
    let series = |d: &str| {
        format!(r#"slidegate_decisions_total{{decision="{d}",domain="test",rule="shadow"}}"#)
    };
    assert_eq!(m.get(&series("allowed")), 1.0);
    assert_eq!(m.get(&series("shadow_denied")), 2.0);
    assert_eq!(m.get(&series("denied")), 0.0);

    let global = Server::start(&["--shadow-mode"]);
    let mut client = global.client().await;
    let req = request("test", vec![descriptor(&[("user", "g")])]);
    for _ in 0..3 {
        assert_eq!(
            call(&mut client, req.clone()).await.overall_code(),
            Code::Ok
        );
    }
    let r = call(&mut client, req.clone()).await;
    assert_eq!(
        r.overall_code(),
        Code::Ok,
        "global shadow mode never denies"
    );
    assert_eq!(
        r.statuses[0].code(),
        Code::OverLimit,
        "but reports the truth"
    );
    assert!(
        !headers(&r).contains_key("ratelimit-remaining"),
        "nothing is enforced, so no RateLimit headers: {:?}",
        headers(&r)
    );
    let m = global.metrics().await;
    assert_eq!(
        m.get(
            r#"slidegate_decisions_total{decision="shadow_denied",domain="test",rule="per_user"}"#
        ),
        1.0
    );
}

/// A shadow rule changes nothing a client sees: the RateLimit headers come from enforced limits
/// only, even when a shadow limit is the most restrictive of the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_headers_come_from_enforced_limits_only() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let shadow_only = request("test", vec![descriptor(&[("shadow", "q")])]);
    let r = call(&mut client, shadow_only.clone()).await;
    assert!(
        !headers(&r).contains_key("ratelimit-limit"),
        "{:?}",
        headers(&r)
    );
    let both = request(
        "test",
        vec![descriptor(&[("shadow", "q")]), descriptor(&[("user", "z")])],
    );
    let r = call(&mut client, both).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0, "the shadow rule is full");
    let h = headers(&r);
    assert_eq!(
        h.get("ratelimit-limit").map(String::as_str),
        Some("3"),
        "{h:?}"
    );
    assert_eq!(h.get("ratelimit-remaining").map(String::as_str), Some("2"));
    assert_eq!(
        h.get("ratelimit-policy").map(String::as_str),
        Some("3;w=60")
    );
    let r = call(&mut client, shadow_only).await;
    assert!(
        !headers(&r).contains_key("ratelimit-limit"),
        "{:?}",
        headers(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_override_and_replaces() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    // The override (1 per HOUR) replaces the configured 3 per minute.
    let mut d = descriptor(&[("user", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, // HOUR in envoy.type.v3.RateLimitUnit
    });
    let req = request("test", vec![d.clone()]);
    let r = call(&mut client, req.clone()).await;
    assert_eq!(limit(&r.statuses[0]), Some((String::new(), 1, Unit::Hour)));
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(reset_secs(&r.statuses[0]) > 3590.0);
    assert_eq!(call(&mut client, req).await.overall_code(), Code::OverLimit);
    // It applies to a descriptor without a rule too, when the domain exists...
    let mut none = descriptor(&[("nothing", "o")]);
    none.limit = d.limit;
    let r = call(&mut client, request("test", vec![none.clone()])).await;
    assert_eq!(limit(&r.statuses[0]), Some((String::new(), 1, Unit::Hour)));
    // ...but not in an unknown domain.
    let r = call(&mut client, request("elsewhere", vec![none])).await;
    assert_eq!(r.statuses[0].current_limit, None);

    // `specific` replaces `general` when both match: general (1 per minute) is not applied.
    let both = request(
        "test",
        vec![
            descriptor(&[("general", "r")]),
            descriptor(&[("specific", "r")]),
        ],
    );
    for remaining in [4, 3, 2] {
        let r = call(&mut client, both.clone()).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        assert_eq!(
            limit(&r.statuses[1]),
            Some(("specific".into(), 5, Unit::Minute))
        );
        assert_eq!(r.statuses[1].limit_remaining, remaining);
    }
    // Alone, general applies, and its counter was untouched.
    let alone = request("test", vec![descriptor(&[("general", "r")])]);
    assert_eq!(
        call(&mut client, alone.clone()).await.statuses[0].limit_remaining,
        0
    );
    assert_eq!(
        call(&mut client, alone).await.overall_code(),
        Code::OverLimit
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_invalid_arguments() {
    let server = Server::start(&[
        "--max-descriptors",
        "3",
        "--max-entries",
        "2",
        "--max-value-bytes",
        "16",
    ]);
    let mut client = server.client().await;
    let ok = || descriptor(&[("user", "v")]);
    let long = "x".repeat(17);
    let mut bad_unit = ok();
    bad_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let cases = vec![
        (request("", vec![ok()]), "domain must not be empty"),
        (request("test", vec![]), "descriptor list must not be empty"),
        (
            request("test", vec![ok(), ok(), ok(), ok()]),
            "too many descriptors: 4",
        ),
        (
            request("test", vec![ok(), descriptor(&[])]),
            "descriptors[1] has no entries",
        ),
        (
            request(
                "test",
                vec![descriptor(&[("a", "1"), ("b", "2"), ("c", "3")])],
            ),
            "too many entries: 3",
        ),
        (
            request("test", vec![descriptor(&[("", "v")])]),
            "entries[0].key must not be empty",
        ),
        (
            request("test", vec![descriptor(&[(&long, "v")])]),
            "entries[0].key is 17 bytes",
        ),
        (request(&long, vec![ok()]), "domain is 17 bytes"),
    ];
    for (req, expected) in cases {
        match client.should_rate_limit(req.clone()).await {
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{req:?}");
                assert!(
                    status.message().contains(expected),
                    "{:?} lacks {expected:?}",
                    status.message()
                );
            }
            Ok(r) => panic!("accepted {req:?}: {r:?}"),
        }
    }
    // The server is still fine.
    let r = call(&mut client, request("test", vec![ok()])).await;
    assert_eq!(r.overall_code(), Code::Ok);
    // An override's unit can come from metadata a client shaped: decided (a limit of 0), never
    // refused, since Envoy passes a refused request uncounted.
    let r = call(&mut client, request("test", vec![bad_unit])).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    // A value over --max-value-bytes, which a client can choose, is decided (counted under its
    // digest), not refused.
    let r = call(
        &mut client,
        request("test", vec![descriptor(&[("user", &long)])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

// ---------------------------------------------------------------------------------------------
// HTTP /json and /check

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_endpoint_status_codes_and_body() {
    let server = Server::start(&["--max-body-bytes", "1024"]);
    let http = reqwest::Client::new();
    let post = |body: String| http.post(server.url("/json")).body(body).send();
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}]}],"hitsAddend":1}"#;
    let r = post(body.into()).await.expect("POST /json");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["ratelimit-remaining"], "2");
    let v: serde_json::Value = r.json().await.expect("json body");
    assert_eq!(v["overallCode"], "OK");
    let s = &v["statuses"][0];
    assert_eq!(s["code"], "OK");
    assert_eq!(s["currentLimit"]["requestsPerUnit"], 3);
    assert_eq!(s["currentLimit"]["unit"], "MINUTE");
    assert_eq!(s["currentLimit"]["name"], "per_user");
    assert_eq!(s["limitRemaining"], 2);
    let reset = s["durationUntilReset"].as_str().expect("duration string");
    assert!(
        reset.ends_with('s') && reset.trim_end_matches('s').parse::<f64>().is_ok(),
        "{reset}"
    );
    assert!(v["responseHeadersToAdd"].is_array());

    // snake_case field names, integers as strings, hits over the rest of the limit: 429.
    let snake = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"j"}],"hits_addend":"3"}]}"#;
    let r = post(snake.into()).await.expect("POST /json");
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: serde_json::Value = r.json().await.expect("json body");
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");

    // Bad bodies and bad requests: 400 with a message.
    for (body, expected) in [
        ("{", "invalid JSON"),
        (
            r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","valeu":"j"}]}]}"#,
            "unknown field",
        ),
        (
            r#"{"domain":"","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}"#,
            "domain must not be empty",
        ),
        (
            r#"{"domain":"test","descriptors":[]}"#,
            "descriptor list must not be empty",
        ),
    ] {
        let r = post(body.into()).await.expect("POST /json");
        assert_eq!(r.status(), 400, "{body}");
        let text = r.text().await.unwrap_or_default();
        assert!(text.contains(expected), "{text:?} lacks {expected:?}");
    }
    // Over --max-body-bytes: 413.
    let big = format!(
        r#"{{"domain":"test","descriptors":[{{"entries":[{{"key":"user","value":"{}"}}]}}]}}"#,
        "x".repeat(2000)
    );
    assert_eq!(post(big).await.expect("POST /json").status(), 413);
    // Only POST.
    assert_eq!(server.get("/json").await.status(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_endpoint_allows_and_denies_in_both_forms() {
    let server = Server::start(&[]);
    let http = reqwest::Client::new();
    let check = |descriptor: &str, deny: Option<&str>| {
        let mut r = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test")
            .header("x-ratelimit-descriptor", descriptor);
        if let Some(status) = deny {
            r = r.header("x-ratelimit-deny-status", status);
        }
        r.send()
    };
    for remaining in ["2", "1", "0"] {
        let r = check("user=c", None).await.expect("check");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["ratelimit-limit"], "3");
        assert_eq!(r.headers()["ratelimit-remaining"], remaining);
        assert_eq!(r.headers()["ratelimit-policy"], "3;w=60");
        assert!(!r.headers().contains_key("retry-after"));
    }
    let r = check("user=c", None).await.expect("check");
    assert_eq!(r.status(), 429);
    assert!(
        r.headers()["retry-after"]
            .to_str()
            .is_ok_and(|v| v.parse::<u64>().is_ok_and(|s| s > 0))
    );
    assert!(!r.headers().contains_key("x-ratelimit-over"));
    let r = check("user=c", Some("403")).await.expect("check");
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-ratelimit-over"], "1");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["ratelimit-remaining"], "0");

    // Any method; several descriptors as repeated headers; percent-decoding. The counter of the
    // value "a,b=c" is the same one /json sees.
    let r = http
        .post(server.url("/check"))
        .header("x-ratelimit-domain", "test")
        .header("x-ratelimit-descriptor", "user=a%2Cb%3Dc")
        .header("x-ratelimit-descriptor", "window=w")
        .header("x-ratelimit-hits", "2")
        .send()
        .await
        .expect("check");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["ratelimit-remaining"], "1");
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"a,b=c"}],"hitsAddend":0}]}"#;
    let v: serde_json::Value = http
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("json")
        .json()
        .await
        .expect("json body");
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);

    // Bad headers: 400 with a message.
    for (name, value, expected) in [
        (
            "x-ratelimit-descriptor",
            "user=%zz",
            "invalid percent-encoding",
        ),
        ("x-ratelimit-descriptor", "user", "not key=value"),
        ("x-ratelimit-hits", "many", "x-ratelimit-hits"),
        ("x-ratelimit-deny-status", "418", "must be 429 or 403"),
    ] {
        let mut r = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test");
        if name != "x-ratelimit-descriptor" {
            r = r.header("x-ratelimit-descriptor", "user=z");
        }
        let r = r.header(name, value).send().await.expect("check");
        assert_eq!(r.status(), 400, "{name}: {value}");
        let text = r.text().await.unwrap_or_default();
        assert!(text.contains(expected), "{text:?} lacks {expected:?}");
    }
    let no_domain = http
        .get(server.url("/check"))
        .header("x-ratelimit-descriptor", "user=z")
        .send()
        .await
        .expect("check");
    assert_eq!(no_domain.status(), 400);
    let no_descriptor = http
        .get(server.url("/check"))
        .header("x-ratelimit-domain", "test")
        .send()
        .await
        .expect("check");
    assert_eq!(no_descriptor.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_domain_flag_is_the_default_domain() {
    let server = Server::start(&["--check-domain", "test", "--response-headers=false"]);
    let r = reqwest::Client::new()
        .get(server.url("/check"))
        .header("x-ratelimit-descriptor", "user=d")
        .send()
        .await
        .expect("check");
    assert_eq!(r.status(), 200);
    assert!(
        !r.headers().contains_key("ratelimit-limit"),
        "headers are off"
    );
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request("test", vec![descriptor(&[("user", "d")])]),
    )
    .await;
    assert_eq!(
        r.statuses[0].limit_remaining, 1,
        "the check counted in domain test"
    );
    assert!(r.response_headers_to_add.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Health, shutdown, reflection, /rlconfig, metrics, reloads

async fn health_status(channel: Channel, service: &str) -> Result<ServingStatus, tonic::Status> {
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await?;
    Ok(response.into_inner().status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flips_on_sigterm_and_the_process_exits_cleanly() {
    let mut server = Server::start(&[]);
    assert_eq!(server.get("/healthcheck").await.status(), 200);
    let channel = server.channel().await;
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        let status = health_status(channel.clone(), service)
            .await
            .expect("health check");
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
    let unknown = health_status(channel.clone(), "nope").await;
    assert_eq!(unknown.map_err(|s| s.code()), Err(tonic::Code::NotFound));

    // A watcher sees the flip: the stream stays open through the drain.
    let mut watch = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let first: Option<HealthCheckResponse> = watch.message().await.expect("first status");
    assert_eq!(first.map(|r| r.status()), Some(ServingStatus::Serving));

    server.signal("TERM");
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("a status after SIGTERM");
    assert_eq!(
        next.ok().flatten().map(|r| r.status()),
        Some(ServingStatus::NotServing)
    );
    drop(watch);
    drop(channel);
    server.expect_clean_exit(Duration::from_secs(10));
    // Stopped accepting.
    assert!(std::net::TcpStream::connect(("127.0.0.1", server.http_port)).is_err());
    assert!(server.log().contains("SIGTERM"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_also_drains_and_exits_zero() {
    let mut server = Server::start(&["--drain-timeout", "2s"]);
    assert_eq!(server.get("/healthcheck").await.status(), 200);
    server.signal("INT");
    server.expect_clean_exit(Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_and_describes_the_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha;

    let server = Server::start(&[]);
    let channel = server.channel().await;
    let mut client = ServerReflectionClient::new(channel.clone());
    let ask = |message: MessageRequest| {
        tokio_stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(message),
        }])
    };
    let mut stream = client
        .server_reflection_info(ask(MessageRequest::ListServices(String::new())))
        .await
        .expect("reflection")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("a message");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reply {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }

    // The file defining the service, with what it imports, so a client can encode requests.
    let mut stream = client
        .server_reflection_info(ask(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".into(),
        )))
        .await
        .expect("reflection")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("a message");
    let Some(MessageResponse::FileDescriptorResponse(files)) = reply.message_response else {
        panic!("unexpected reply {reply:?}");
    };
    let all: Vec<u8> = files.file_descriptor_proto.concat();
    let text = String::from_utf8_lossy(&all);
    for expected in [
        "ShouldRateLimit",
        "RateLimitRequest",
        "hits_addend",
        "envoy/service/ratelimit/v3/rls.proto",
    ] {
        assert!(
            text.contains(expected),
            "{expected} missing from the descriptors"
        );
    }

    // The v1alpha service (older grpcurl versions) lists the same.
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = alpha
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("v1alpha reflection")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("a message");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected reply {reply:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "envoy.service.ratelimit.v3.RateLimitService")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlconfig_lists_every_rule() {
    let server = Server::start(&[]);
    let r = server.get("/rlconfig").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), RULE_COUNT, "{text}");
    // The header says the served files are the ones on disk.
    assert!(text.starts_with("# loaded_at: "), "{text}");
    assert!(text.contains("\n# stale: false\n"), "{text}");
    let line = |path: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("test {path}:")))
            .copied()
            .unwrap_or_else(|| panic!("no rule {path} in\n{text}"))
    };
    assert!(line("user").contains("3 per MINUTE") && line("user").contains("name=per_user"));
    assert!(line("window").contains("10 per 30 SECOND (window 30s, exact)"));
    assert!(line("free").contains("unlimited"));
    assert!(line("shadow").contains("shadow_mode"));
    assert!(line("specific").contains("replaces=general"));
    assert!(line("two").contains("2 per SECOND") && line("two").contains("5 per MINUTE"));
    assert!(
        line("user").contains("rules.yaml"),
        "the source file is shown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_calls_made() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("user", "m")])]);
    for _ in 0..4 {
        call(&mut client, req.clone()).await; // 3 allowed, 1 denied
    }
    call(
        &mut client,
        request("unknown", vec![descriptor(&[("user", "m")])]),
    )
    .await;
    call(
        &mut client,
        request("test", vec![descriptor(&[("nothing", "m")])]),
    )
    .await;
    let mut hits = request("test", vec![descriptor(&[("window", "m")])]);
    hits.hits_addend = 4;
    call(&mut client, hits).await;
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"free","value":"m"}]}]}"#;
    let http = reqwest::Client::new();
    let r = http
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("json");
    assert_eq!(r.status(), 200);
    for _ in 0..2 {
        let r = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test")
            .header("x-ratelimit-descriptor", "shadow=m")
            .send()
            .await
            .expect("check");
        assert_eq!(r.status(), 200);
    }

    let m = server.metrics().await;
    let d = |decision: &str, rule: &str| {
        m.get(&format!(
            r#"slidegate_decisions_total{{decision="{decision}",domain="test",rule="{rule}"}}"#
        ))
    };
    assert_eq!(d("allowed", "per_user"), 3.0);
    assert_eq!(d("denied", "per_user"), 1.0);
    assert_eq!(d("allowed", "window"), 1.0);
    assert_eq!(d("allowed", "free"), 1.0);
    assert_eq!(d("allowed", "shadow"), 1.0);
    assert_eq!(d("shadow_denied", "shadow"), 1.0);
    assert_eq!(
        m.get(r#"slidegate_hits_total{decision="allowed",domain="test",rule="window"}"#),
        4.0
    );
    assert_eq!(
        m.get(r#"slidegate_hits_total{decision="denied",domain="test",rule="per_user"}"#),
        1.0
    );
    // 3 of 3 used is over 80 %; 4 of 10 is not.
    assert_eq!(
        m.get(r#"slidegate_near_limit_total{domain="test",rule="per_user"}"#),
        1.0
    );
    assert_eq!(
        m.get(r#"slidegate_near_limit_total{domain="test",rule="window"}"#),
        0.0
    );
    assert_eq!(
        m.get(r#"slidegate_unknown_domain_total{domain="unknown"}"#),
        1.0
    );
    assert_eq!(m.get(r#"slidegate_no_rule_total{domain="test"}"#), 1.0);
    assert_eq!(
        m.sum(
            "slidegate_request_duration_seconds_count",
            r#"transport="grpc""#
        ),
        7.0
    );
    assert_eq!(
        m.sum(
            "slidegate_request_duration_seconds_count",
            r#"transport="json""#
        ),
        1.0
    );
    // By code: the fourth call on `user` was denied; nothing was malformed, the store never failed.
    let by_code = |code: &str| {
        m.sum(
            "slidegate_request_duration_seconds_count",
            &format!("code=\"{code}\""),
        )
    };
    assert_eq!(by_code("OVER_LIMIT"), 1.0);
    assert_eq!(by_code("OK"), 9.0);
    assert_eq!(by_code("INVALID_ARGUMENT") + by_code("UNAVAILABLE"), 0.0);
    assert_eq!(
        m.sum(
            "slidegate_request_duration_seconds_count",
            r#"transport="check""#
        ),
        2.0
    );
    // Store calls: 4 (user) + 1 (window) + 2 (shadow); none for unknown, no-rule and unlimited.
    assert_eq!(m.get("slidegate_store_duration_seconds_count"), 7.0);
    assert_eq!(
        m.get(r#"slidegate_store_errors_total{kind="timeout"}"#),
        0.0
    );
    assert_eq!(m.get(r#"slidegate_failure_mode_total{mode="error"}"#), 0.0);
    assert_eq!(m.get("slidegate_rules_loaded"), RULE_COUNT as f64);
    assert_eq!(
        m.get(r#"slidegate_config_reloads_total{result="success"}"#),
        0.0
    );
    assert_eq!(
        m.get(&format!(
            r#"slidegate_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        )),
        1.0
    );
    assert!(m.0.contains("# HELP slidegate_decisions_total"));
    assert!(m.0.contains("# TYPE slidegate_request_duration_seconds histogram"));

    promtool_check_metrics(server.dir.path(), &m.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_update_rules_and_metrics() {
    let server = Server::start(&[]);
    let extra =
        format!("{RULES}  - key: added\n    rate_limit: {{ unit: hour, requests_per_unit: 1 }}\n");
    std::fs::write(server.rules_file(), extra).expect("rewrite rules");
    let reloaded = wait_until(Duration::from_secs(10), || {
        let text = get_text_blocking(&server.url("/metrics"));
        text.contains("slidegate_config_reloads_total{result=\"success\"} 1")
    });
    assert!(reloaded, "no reload seen; log:\n{}", server.log());
    let m = server.metrics().await;
    assert_eq!(m.get("slidegate_rules_loaded"), (RULE_COUNT + 1) as f64);
    let text = server.get("/rlconfig").await.text().await.expect("body");
    assert!(text.contains("test added: 1 per HOUR"), "{text}");
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request("test", vec![descriptor(&[("added", "x")])]),
    )
    .await;
    assert_eq!(limit(&r.statuses[0]), Some((String::new(), 1, Unit::Hour)));

    // A bad file: counted as a failure, the previous rules stay.
    std::fs::write(server.rules_file(), "domain: test\ndescriptors: [{ key: x, rate_limit: { unit: fortnight, requests_per_unit: 1 } }]\n")
        .expect("rewrite rules");
    let failed = wait_until(Duration::from_secs(10), || {
        get_text_blocking(&server.url("/metrics"))
            .contains("slidegate_config_reloads_total{result=\"failure\"} 1")
    });
    assert!(failed, "no failed reload seen; log:\n{}", server.log());
    let m = server.metrics().await;
    assert_eq!(m.get("slidegate_rules_loaded"), (RULE_COUNT + 1) as f64);
    assert_eq!(server.get("/healthcheck").await.status(), 200);
}

/// A blocking GET for polling inside `wait_until`; the body, or "" on any error.
fn get_text_blocking(url: &str) -> String {
    let url = url.to_string();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async { reqwest::get(&url).await.ok()?.text().await.ok() })
    })
    .join()
    .ok()
    .flatten()
    .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// CLI

#[test]
fn check_config_reports_rules_or_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, RULES).expect("write");
    let out = slidegate_command()
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The summary, then every rule with its limits' windows and representations.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], format!("OK: {RULE_COUNT} rules in 1 domains"));
    assert_eq!(lines.len(), 1 + RULE_COUNT, "{stdout}");
    assert!(
        stdout.contains("\ntest window: 10 per 30 SECOND (window 30s, exact) ["),
        "{stdout}"
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: test\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n")
        .expect("write");
    let out = slidegate_command()
        .arg("check-config")
        .arg(&bad)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("fortnight"),
        "{stderr}"
    );

    // A rule deeper than --max-entries can never match: a warning, and the file still loads.
    let deep = dir.path().join("deep.yaml");
    std::fs::write(
        &deep,
        "domain: deep\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n            rate_limit: { unit: second, requests_per_unit: 1 }\n",
    )
    .expect("write");
    for (max_entries, warned) in [("2", true), ("3", false)] {
        let out = slidegate_command()
            .arg("check-config")
            .arg(&deep)
            .args(["--max-entries", max_entries])
            .output()
            .expect("run");
        assert!(out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.contains("warning:")
                && stderr.contains("a.b.c")
                && stderr.contains("3 levels deep"),
            warned,
            "--max-entries {max_entries}: {stderr}"
        );
    }
}

#[test]
fn serve_refuses_to_start_with_bad_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("bad.yaml"), "domain: [\n").expect("write");
    let out = slidegate_command()
        .arg("--config")
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml"), "{stderr}");
}

#[test]
fn every_flag_has_an_environment_variable() {
    let out = slidegate_command()
        .args(["serve", "--help"])
        .output()
        .expect("run");
    let help = String::from_utf8_lossy(&out.stdout);
    let flags = help
        .lines()
        .filter(|l| l.trim_start().starts_with("--") && !l.contains("--help"))
        .count();
    let envs = help.matches("[env: SLIDEGATE_").count();
    assert!(flags >= 20, "{help}");
    assert_eq!(flags, envs, "{help}");
    // Durations take units, and bad values are rejected with a clear error.
    let out = slidegate_command()
        .args(["serve", "--redis-timeout", "50"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--redis-timeout"));
}

// ---------------------------------------------------------------------------------------------
// Redis

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_is_shared_by_replicas() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let a = Server::start(&["--redis-url", &url, "--redis-prefix", "sg-test:"]);
    let b = Server::start(&["--redis-url", &url, "--redis-prefix", "sg-test:"]);
    assert!(wait_until(Duration::from_secs(10), || {
        get_text_blocking(&a.url("/healthcheck")).starts_with("OK")
    }));
    let req = request("test", vec![descriptor(&[("user", "r")])]);
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    assert_eq!(
        call(&mut ca, req.clone()).await.statuses[0].limit_remaining,
        2
    );
    assert_eq!(
        call(&mut cb, req.clone()).await.statuses[0].limit_remaining,
        1
    );
    let r = call(&mut ca, req.clone()).await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!((59.0..=60.0).contains(&reset_secs(&r.statuses[0])));
    let r = call(&mut cb, req.clone()).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert!(headers(&r).contains_key("retry-after"));
    let keys = redis.cli(&["--scan", "--pattern", "sg-test:*"]);
    assert!(keys.contains("sg-test:{test:user=r}60000"), "{keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failure_modes_and_health() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    let server = Server::start(&["--redis-url", &url, "--redis-timeout", "200ms"]);
    assert!(wait_until(Duration::from_secs(10), || {
        get_text_blocking(&server.url("/healthcheck")).starts_with("OK")
    }));
    let mut client = server.client().await;
    let req = request(
        "test",
        vec![
            descriptor(&[("user", "f")]),
            descriptor(&[("nothing", "f")]),
        ],
    );
    assert_eq!(
        call(&mut client, req.clone()).await.overall_code(),
        Code::Ok
    );

    drop(redis);
    // Failure mode error: UNAVAILABLE, and health goes down.
    let status = client
        .should_rate_limit(req.clone())
        .await
        .expect_err("store is down");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let down = wait_until(Duration::from_secs(10), || {
        get_text_blocking(&server.url("/healthcheck")).starts_with("NOT_SERVING")
    });
    assert!(down, "health did not flip; log:\n{}", server.log());
    let health = health_status(server.channel().await, "ratelimit").await;
    assert_eq!(health.ok(), Some(ServingStatus::NotServing));
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"f"}]}]}"#;
    let r = reqwest::Client::new()
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("json");
    assert_eq!(r.status(), 503);
    let m = server.metrics().await;
    assert!(m.get(r#"slidegate_failure_mode_total{mode="error"}"#) >= 2.0);
    let errors: f64 = ["timeout", "connection", "refused", "backend"]
        .iter()
        .map(|k| m.get(&format!(r#"slidegate_store_errors_total{{kind="{k}"}}"#)))
        .sum();
    assert!(errors >= 2.0, "{}", m.0);

    // allow and deny, against a port where nothing listens.
    let dead = format!("redis://127.0.0.1:{}", free_port());
    for (mode, code) in [("allow", Code::Ok), ("deny", Code::OverLimit)] {
        let server = Server::start(&[
            "--redis-url",
            &dead,
            "--redis-timeout",
            "100ms",
            "--failure-mode",
            mode,
        ]);
        let mut client = server.client().await;
        let r = call(&mut client, req.clone()).await;
        assert_eq!(r.overall_code(), code, "{mode}");
        assert_eq!(r.statuses[0].code(), code, "{mode}");
        assert_eq!(
            limit(&r.statuses[0]),
            Some(("per_user".into(), 3, Unit::Minute))
        );
        assert_eq!(r.statuses[1].code(), Code::Ok, "no rule stays OK");
        let m = server.metrics().await;
        assert_eq!(
            m.get(&format!(r#"slidegate_failure_mode_total{{mode="{mode}"}}"#)),
            1.0
        );
        let check = reqwest::Client::new()
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test")
            .header("x-ratelimit-descriptor", "user=f")
            .send()
            .await
            .expect("check");
        assert_eq!(check.status(), if mode == "allow" { 200 } else { 429 });
        // Readiness stays: under `allow` and `deny` the replica answers every request.
        assert_eq!(server.get("/healthcheck").await.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_calls_finish() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let mut server = Server::start(&["--redis-url", &redis.url(), "--redis-timeout", "1500ms"]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("user", "drain")])]);
    assert_eq!(
        call(&mut client, req.clone()).await.overall_code(),
        Code::Ok
    );

    // A frozen Redis holds the next call until the store's timeout.
    let freeze = |signal: &str| {
        let status = Command::new("kill")
            .args([signal, &redis.process.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    freeze("-STOP");
    let started = Instant::now();
    let in_flight = tokio::spawn(async move { client.should_rate_limit(req).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("TERM");
    let answer = in_flight.await.expect("task");
    freeze("-CONT");
    // The call got its answer (the store timed out: UNAVAILABLE), not a dropped connection.
    let status = answer.expect_err("the store timed out");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "rate-limit store unavailable");
    assert!(started.elapsed() >= Duration::from_millis(1400));
    assert!(
        server.log().contains("kind=\"timeout\""),
        "{}",
        server.log()
    );
    server.expect_clean_exit(Duration::from_secs(10));
}

/// `slidegate-bench` rides out a server restart: calls fail while nothing listens, then the
/// generator dials again and loads the new server on the same port. It still reports the run, and
/// exits 3 so that a script does not take the failed calls for a measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_dials_again_after_the_server_restarts() {
    let args = ["--duration", "4s", "--warmup", "0s", "--json"];
    let (output, second) = bench_across_a_restart(&args, 500.0).await;
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON report");
    let errors = report["errors"].as_u64().expect("errors");
    assert!(
        errors > 0,
        "no call failed while the server was down: {report}"
    );
    assert_eq!(output.status.code(), Some(3), "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{errors} of ")) && stderr.contains("calls failed"),
        "{stderr}"
    );
    let served = grpc_calls_served(&second);
    assert!(
        served > 100.0,
        "the restarted server served {served} calls: the generator did not dial again"
    );
}

/// The same during `--prefill`: the prefill goes on against the restarted server. The measured
/// phase is paced at 10 calls per second, so nearly all the calls the new server sees are the
/// prefill's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prefill_dials_again_after_the_server_restarts() {
    let args = ["--prefill", "20", "--keys", "500"];
    let paced = ["--duration", "200ms", "--rate", "10"];
    let (output, second) = bench_across_a_restart(&[&args[..], &paced[..]].concat(), 500.0).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("prefilled 500 keys x 20"),
        "the prefill ran into the restart: {stderr}"
    );
    let served = grpc_calls_served(&second);
    assert!(
        served > 1000.0,
        "the restarted server served {served} calls: the prefill did not dial again\n{stderr}"
    );
}

/// `slidegate-bench`'s exit code is an interface: 2 for arguments it refuses, 1 when there is
/// nothing to measure (no server listening), both with a message and no report. (3, a run with
/// failed calls, and 0 are checked by the restart test and the Redis baseline test.)
#[test]
fn bench_exit_codes_tell_bad_arguments_from_no_server() {
    let nothing_listens = format!("http://127.0.0.1:{}", free_port());
    let cases: [(&[&str], i32, &str); 3] = [
        (
            &["--descriptors", "0"],
            2,
            "--descriptors must be at least 1",
        ),
        (&["--concurrency", "nine"], 2, "--concurrency"),
        (&["--duration", "1s"], 1, "cannot connect"),
    ];
    for (args, code, message) in cases {
        let out = bench_command()
            .args(["--json", "--target", &nothing_listens])
            .args(args)
            .output()
            .expect("run slidegate-bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: a report without a run");
    }
}

/// `slidegate-bench --target redis://` is the baseline of a Redis-store run: slidegate's own store
/// called from the generator, no server in between. It must write the very counters a server with
/// `bench/scripts/bench`'s rule (100 per second) writes for the same requests, make at most one script
/// call per request, and count allowed and denied calls from the store's decisions.
#[test]
fn bench_calls_redis_directly_with_the_servers_counters() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // Every command goes to the slow log, with its arguments: the keys the scripts were run on,
    // which expire a second after their last hit.
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let keys_written = || {
        let log = redis.cli(&["SLOWLOG", "GET", "128"]);
        redis.cli(&["SLOWLOG", "RESET"]);
        let mut keys: Vec<String> = log
            .lines()
            // Counter keys: not the reset generation a server with a deny cache reads, nor the
            // node's clock every recording call moves.
            .filter(|line| line.starts_with("slidegate:"))
            .filter(|line| !["slidegate:resets", "slidegate:clock"].contains(line))
            .map(str::to_string)
            .collect();
        keys.dedup();
        keys
    };
    let bench = |target: &str| {
        let mut command = bench_command();
        command.args(["--target", target, "--json", "--keys", "1"]);
        command.args(["--duration", "1s", "--warmup", "0s", "--timeout", "2s"]);
        command.args(["--concurrency", "4", "--connections", "2"]);
        let out = run_ok(&mut command, "slidegate-bench");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        let count = |field: &str| report[field].as_u64().expect(field);
        let (requests, allowed) = (count("requests"), count("allowed"));
        assert_eq!(count("errors"), 0, "{report}");
        assert_eq!(allowed + count("denied"), requests, "{report}");
        // One key, 100 per sliding second, four workers flat out for one second: the first 100
        // are allowed, and at most 100 more as the window slides; the rest are denied.
        assert!((100..=200).contains(&allowed), "{report}");
        assert!(requests > allowed, "nothing was denied: {report}");
        requests
    };
    let key = "slidegate:{bench:client=0-0}1000";

    let requests = bench(&redis.url());
    let evalsha = redis.command_calls("evalsha");
    // Every request went to Redis (no deny cache), in script calls of one to four requests (the
    // calls a generator thread has in flight at once), plus one NOSCRIPT answer for each of the
    // (at most 4) calls sent before the script was loaded.
    assert!(
        (requests / 4..=requests + 4).contains(&evalsha),
        "{evalsha} EVALSHA for {requests} requests"
    );
    assert_eq!(keys_written(), [key]);

    // A server with the same rule, loaded the same way, runs the script on the same key.
    let rules = r#"
domain: bench
descriptors:
  - key: client
    rate_limit: { unit: second, requests_per_unit: 100 }
"#;
    let server = Server::start_with_rules(rules, &["--redis-url", &redis.url()]);
    bench(&server.grpc_uri());
    assert_eq!(keys_written(), [key]);
}

/// Runs `slidegate-bench` (8 workers on 2 connections, plus `args`) against a server that is
/// killed once it has answered `after_calls` calls (progress, not time, so that a faster machine
/// does not finish first) and started again on the same port; returns the generator's output,
/// once it has exited with a report (0, or 3 if calls failed), and the second server.
async fn bench_across_a_restart(
    args: &[&str],
    after_calls: f64,
) -> (std::process::Output, Slidegate) {
    let first = Server::start(&[]);
    let bench = bench_command()
        .args(["--target", &first.grpc_uri(), "--timeout", "500ms"])
        .args(["--concurrency", "8", "--connections", "2", "--threads", "1"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn slidegate-bench");
    let deadline = Instant::now() + Duration::from_secs(30);
    while grpc_calls_served(&first) < after_calls {
        assert!(Instant::now() < deadline, "the generator made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = restart(first).await;
    let output = tokio::task::spawn_blocking(move || bench.wait_with_output())
        .await
        .expect("join")
        .expect("bench output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "bench failed: {:?} {stderr}",
        output.status
    );
    (output, second)
}

/// Kills `server` (SIGKILL: its connections die with it) and starts a new one on the same port
/// with the same rules, 300 ms later.
async fn restart(server: Server) -> Slidegate {
    let port = server.grpc_port;
    let rules = server
        .rules_file()
        .parent()
        .expect("rules dir")
        .to_path_buf();
    let Server {
        slidegate,
        rules: kept,
    } = server;
    drop(slidegate);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = Slidegate::start_on(&rules, port, &[], &[]);
    drop(kept);
    second
}

/// gRPC calls a server has answered, from its metrics.
fn grpc_calls_served(server: &Slidegate) -> f64 {
    let (status, text) = server.get("/metrics");
    assert_eq!(status, 200, "GET /metrics: {text}");
    metric_sum(
        &text,
        "slidegate_request_duration_seconds_count",
        "transport=\"grpc\"",
    )
}

/// Connections are dealt out to the worker threads, and every worker decides on the same
/// counters: calls over eight connections to four workers admit exactly the limit, with the
/// memory store and with Redis (where each worker has a Redis connection of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_share_counters_across_connections() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let url = redis.url();
    // A long Redis timeout: four workers on a loaded two-core machine can stall a call past the
    // default 50 ms, and this test is about sharing counters, not about timeouts.
    let redis_store = ["--redis-url", url.as_str(), "--redis-timeout", "5s"];
    for store in [&[][..], &redis_store[..]] {
        let server = Server::start(&[&["--workers", "4"], store].concat());
        let workers = || {
            std::fs::read_dir(format!("/proc/{}/task", server.pid()))
                .expect("/proc")
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with("slidegate-worke"))
                .count()
        };
        // The listeners open before the worker threads start.
        wait_until(Duration::from_secs(10), || workers() == 4);
        assert_eq!(workers(), 4, "one thread per worker");

        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(server.client().await);
        }
        let req = request("test", vec![descriptor(&[("user", "workers")])]);
        let calls = clients.into_iter().map(|mut client| {
            let req = req.clone();
            tokio::spawn(async move {
                let mut allowed = 0;
                for _ in 0..5 {
                    if call(&mut client, req.clone()).await.overall_code() == Code::Ok {
                        allowed += 1;
                    }
                }
                allowed
            })
        });
        let mut allowed = 0;
        for handle in calls.collect::<Vec<_>>() {
            allowed += handle.await.expect("client task");
        }
        assert_eq!(
            allowed, 3,
            "limit 3 per minute over 40 calls, store {store:?}"
        );
        if !store.is_empty() {
            // Ours (CLIENT LIST), the main thread's and one per worker that took a connection.
            let clients = redis.cli(&["CLIENT", "LIST"]);
            assert!(
                clients.lines().count() > 3,
                "workers use Redis connections of their own:\n{clients}"
            );
        }
    }
}

/// A method the RateLimitService does not have is UNIMPLEMENTED, as gRPC servers answer; a
/// request larger than the codec's initial buffer is decoded all the same.
#[tokio::test]
async fn unknown_method_is_unimplemented_and_large_requests_decode() {
    let server = Server::start(&[]);
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod",
    );
    let status = grpc
        .unary::<RateLimitRequest, RateLimitResponse, _>(
            tonic::Request::new(RateLimitRequest::default()),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");

    let value = "v".repeat(2000);
    let descriptors = (0..8).map(|_| descriptor(&[("nothing", &value)])).collect();
    let response = call(&mut server.client().await, request("test", descriptors)).await;
    assert_eq!(response.statuses.len(), 8);
}

/// The rules and the metrics are served only on the operator listener (`--admin-addr`): a
/// client of the HTTP port reaches `/json`, `/check` and `/healthcheck`, and gets 404 for
/// `/metrics` and `/rlconfig`; the operator listener serves those (and `/healthcheck`) and
/// nothing that spends quota.
#[test]
fn the_operator_listener_keeps_metrics_and_rules_off_the_data_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let server = Slidegate::start(&rules, &[]);
    let admin = |path: &str| crate::support::http_get(server.admin_port, path);
    let data = |path: &str| crate::support::http_get(server.http_port, path);
    assert!(
        wait_until(Duration::from_secs(10), || admin("/healthcheck").0 == 200),
        "operator listener: {}",
        server.log()
    );
    let (status, metrics) = admin("/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("slidegate_build_info"), "{metrics}");
    assert_eq!(admin("/rlconfig").0, 200);
    assert_eq!(
        admin("/check").0,
        404,
        "the operator listener spends no quota"
    );
    assert_eq!(data("/metrics").0, 404, "metrics on the data port");
    assert_eq!(data("/rlconfig").0, 404, "rules on the data port");
    assert_eq!(data("/healthcheck").0, 200);
    assert_ne!(data("/check").0, 404, "/check on the data port");
}
