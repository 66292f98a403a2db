//! Hostile input: what a client (or a broken deploy) can throw at slidegate.
//!
//! - Property tests (proptest, bounded case counts so CI runs them in seconds) of every parser a
//!   client or an operator feeds: the YAML rule loader, the descriptor matcher, the `/json` body
//!   parser, the `/check` header parser, and the limiter behind them. They never panic, and every
//!   rejection is a clear, non-empty message.
//! - Abusive requests to the real binary: thousands of descriptors, huge values, deep entries,
//!   empty keys, bad percent-encoding, oversized gRPC messages and HTTP bodies, huge `hits_addend`.
//! - Key and label injection: descriptor values built to collide with other counters' Redis keys,
//!   and metric label values that would break the exposition format or its cardinality.
//! - Memory: a million client keys through the memory store, then idle.
//! - Secrets: Redis passwords never appear in logs, endpoints, metrics or error messages.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{
    RedisServer, Slidegate, call, descriptor, grpc_frame, http_status, promtool_check_metrics,
    raw_should_rate_limit, rss_kib, wait_until,
};
use arc_swap::ArcSwap;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use prost::Message as _;
use slidegate::config::{RuleSet, load_sources};
use slidegate::limiter::DecisionMetrics;
use slidegate::limiter::{LimitError, Options, RateLimiter, RequestLimits};
use slidegate::metrics::{MAX_RULE_LABELS, OVERFLOW_RULE};
use slidegate::service::{check, json};
use slidegate::store::{Counter, CounterKey, ManualClock, MemoryStore, Precision};
use tonic::transport::Channel;

/// Cases per property: enough to find shallow bugs on every CI run, fast in a debug build.
/// `PROPTEST_CASES=N` runs more (a longer fuzzing session).
const CASES: u32 = 256;

fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

/// The rules of the property tests and of the binary: exact values, wildcards, key-only nodes,
/// nesting, `detailed_metric`, `value_to_metric`, `share_threshold`, several windows.
fn fixture() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config/good/matching.yaml"),
    )
    .expect("fixture")
}

fn fixture_rules() -> RuleSet {
    load_sources(&[("matching.yaml".to_string(), fixture())]).expect("fixture loads")
}

/// Keys of the fixture and a few that match nothing.
const KEYS: &[&str] = &[
    "method",
    "path",
    "org",
    "user",
    "user_id",
    "tier",
    "remote_address",
    "client",
    "detailed",
    "route",
    "subject_id",
    "tenant",
    "shadow",
    "",
    "nope",
];

/// Values that hit exact nodes, wildcards, separators and oddities.
const VALUES: &[&str] = &[
    "GET",
    "/api/admin/x",
    "/api/",
    "a.png",
    "/users/1/avatar",
    "/shared/x",
    "/api/health",
    "team-a",
    "/login",
    "gold",
    "10.0.0.1",
    "acme-1",
    "",
    "*",
    "**",
    "a:b=c",
    "{x}",
    "%",
    "%zz",
    "\n",
    "\u{0}",
    "é",
];

fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => ".{0,12}",
    ]
}

fn value_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(VALUES).prop_map(str::to_string),
        2 => ".{0,24}",
        1 => "[*a-c/]{0,12}",
    ]
}

fn entries_strategy(max: usize) -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec((key_strategy(), value_strategy()), 0..max)
}

// ---------------------------------------------------------------------------------------------
// The YAML loader

fn assert_clear_errors(result: Result<RuleSet, slidegate::config::ConfigErrors>, file: &str) {
    if let Err(errors) = result {
        assert!(!errors.0.is_empty());
        for error in &errors.0 {
            assert_eq!(error.file, file);
            assert!(!error.message.trim().is_empty(), "{error:?}");
        }
    }
}

/// Arbitrary text and bytes (lossily decoded, as a file read would fail or decode them): the
/// loader returns rules or errors naming the file, never panics.
#[test]
fn yaml_loader_survives_arbitrary_text() {
    let strategy = prop_oneof![
        ".{0,400}".boxed(),
        prop::collection::vec(any::<u8>(), 0..400)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned())
            .boxed(),
        // YAML punctuation soup.
        "[-:{}\\[\\],&*!|>'\"%@` \n#a-z0-9]{0,300}".boxed(),
    ];
    runner()
        .run(&strategy, |text| {
            assert_clear_errors(load_sources(&[("f.yaml".into(), text)]), "f.yaml");
            Ok(())
        })
        .expect("property");
}

/// The fixture, damaged: truncated anywhere (a write caught half-way), a range deleted, bytes
/// inserted. Never a panic; errors name the file.
#[test]
fn yaml_loader_survives_damaged_rule_files() {
    let text = fixture();
    let len = text.len();
    let strategy = (0..=len, 0..=len, ".{0,8}", 0..3u8);
    runner()
        .run(&strategy, |(a, b, insert, how)| {
            let (lo, hi) = (a.min(b), a.max(b));
            let cut = |i: usize| {
                let mut i = i;
                while !text.is_char_boundary(i) {
                    i -= 1;
                }
                i
            };
            let damaged = match how {
                0 => text[..cut(hi)].to_string(),
                1 => format!("{}{}", &text[..cut(lo)], &text[cut(hi)..]),
                _ => format!("{}{insert}{}", &text[..cut(lo)], &text[cut(lo)..]),
            };
            assert_clear_errors(load_sources(&[("m.yaml".into(), damaged)]), "m.yaml");
            Ok(())
        })
        .expect("property");
}

/// Field names of the rule format (and near misses), for structured documents.
const FIELDS: &[&str] = &[
    "domain",
    "descriptors",
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "unit",
    "requests_per_unit",
    "unit_multiplier",
    "unlimited",
    "name",
    "replaces",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "quota_mode",
    "ratelimit",
];

fn yaml_value() -> impl Strategy<Value = serde_yaml::Value> {
    use serde_yaml::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|n| Value::Number(n.into())),
        prop::sample::select(
            &[
                "second",
                "minute",
                "HOUR",
                "day",
                "week",
                "month",
                "year",
                "fortnight",
                "*",
                "",
            ][..]
        )
        .prop_map(|s| Value::String(s.to_string())),
        value_strategy().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 96, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Sequence),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..7).prop_map(|fields| {
                Value::Mapping(
                    fields
                        .into_iter()
                        .map(|(k, v)| (Value::String(k.to_string()), v))
                        .collect(),
                )
            }),
        ]
    })
}

/// Documents shaped like rule files (a domain, descriptors of random fields with random values
/// and nesting), serialized to YAML: the loader gets deep into validation and never panics.
#[test]
fn yaml_loader_survives_structured_nonsense() {
    use serde_yaml::Value;
    let strategy = (value_strategy(), prop::collection::vec(yaml_value(), 0..5));
    runner()
        .run(&strategy, |(domain, descriptors)| {
            let mut doc = serde_yaml::Mapping::new();
            doc.insert("domain".into(), Value::String(domain));
            doc.insert("descriptors".into(), Value::Sequence(descriptors));
            let text = serde_yaml::to_string(&Value::Mapping(doc)).expect("serialize");
            assert_clear_errors(load_sources(&[("s.yaml".into(), text)]), "s.yaml");
            Ok(())
        })
        .expect("property");
}

/// Pathological YAML: an alias bomb ("billion laughs"), 10 000 nested brackets, 2 000 nested
/// descriptor levels, one huge line. Each is answered (an error or rules) within 30 s even on a loaded machine, without
/// a stack overflow or memory blow-up. (The YAML parser takes time quadratic in the nesting depth
/// of flow collections: 10 000 brackets take about 0.7 s in a debug build, 100 000 about 50 s;
/// see docs/operations.md. A reload runs off the serving path and keeps the old rules meanwhile.)
#[test]
fn yaml_loader_survives_bombs_and_depth() {
    // Nine levels of nine aliases of the level below: 9^9 descriptors if expanded.
    let mut bomb = String::from("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &l0 [");
    bomb.push_str(&["{key: x, rate_limit: {unit: second, requests_per_unit: 1}}"; 9].join(", "));
    bomb.push_str("]\n");
    for level in 1..9 {
        let prev = level - 1;
        bomb.push_str(&format!("  - key: l{level}\n    descriptors: &l{level} ["));
        bomb.push_str(&vec![format!("{{key: y, descriptors: *l{prev}}}"); 9].join(", "));
        bomb.push_str("]\n");
    }
    let brackets = format!("domain: d\ndescriptors: {}", "[".repeat(10_000));
    let mut deep = String::from("domain: d\ndescriptors:\n");
    for level in 0..2_000 {
        let pad = "  ".repeat(level);
        deep.push_str(&format!("{pad}- key: k{level}\n{pad}  descriptors:\n"));
    }
    let long_line = format!(
        "domain: d\ndescriptors:\n  - key: {}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n",
        "k".repeat(4 << 20)
    );
    for (what, text) in [
        ("alias bomb", bomb),
        ("nested brackets", brackets),
        ("deep descriptors", deep),
        ("4 MiB key", long_line),
    ] {
        // On a thread with the default 2 MiB stack, like the reload task.
        let started = Instant::now();
        let result = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                load_sources(&[("bomb.yaml".into(), text)])
                    .map(|r| r.rule_count())
                    .map_err(|e| e.to_string())
            })
            .expect("thread")
            .join()
            .expect("no panic");
        eprintln!(
            "{what}: {:?} in {:?}",
            result.as_ref().map_err(|e| &e[..e.len().min(200)]),
            started.elapsed()
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{what}");
        if let Err(message) = result {
            assert!(message.starts_with("bomb.yaml: "), "{what}: {message}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The descriptor matcher

/// Random descriptors against the fixture's rule tree: no panic; a match names a rule of the
/// domain, its counter has one entry per request entry, and its metric name is not empty.
#[test]
fn matcher_survives_arbitrary_descriptors() {
    let rules = fixture_rules();
    let domain = rules.domain("matching").expect("domain");
    runner()
        .run(&entries_strategy(6), |entries| {
            let borrowed: Vec<(&str, &str)> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if let Some(m) = domain.match_entries(&borrowed) {
                assert_eq!(m.rule.domain, "matching");
                assert_eq!(m.counter_entries.len(), borrowed.len());
                assert!(!m.stats_name.is_empty());
                for ((k, _), (ck, _)) in borrowed.iter().zip(m.counter_entries.iter()) {
                    assert_eq!(k, ck);
                }
            }
            Ok(())
        })
        .expect("property");
}

/// A reference glob: `*` matches any run of characters, anything else itself.
fn glob(pattern: &[char], value: &[char]) -> bool {
    let mut ok = vec![vec![false; value.len() + 1]; pattern.len() + 1];
    ok[0][0] = true;
    for i in 1..=pattern.len() {
        for j in 0..=value.len() {
            ok[i][j] = if pattern[i - 1] == '*' {
                ok[i - 1][j] || (j > 0 && ok[i][j - 1])
            } else {
                j > 0 && ok[i - 1][j - 1] && pattern[i - 1] == value[j - 1]
            };
        }
    }
    ok[pattern.len()][value.len()]
}

/// A rule's `value` with `*` anywhere matches exactly what a reference glob matches (the
/// matcher's greedy algorithm is linear, so a hostile value cannot make it backtrack).
#[test]
fn wildcards_match_like_a_reference_glob() {
    let strategy = ("[ab*]{1,8}", "[ab]{0,12}");
    runner()
        .run(&strategy, |(pattern, value)| {
            let text = format!(
                "domain: w\ndescriptors:\n  - key: k\n    value: \"{pattern}\"\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            );
            let rules = load_sources(&[("w.yaml".into(), text)]).expect("pattern rule loads");
            let matched = rules
                .domain("w")
                .expect("domain")
                .match_entries(&[("k", &value)])
                .is_some();
            let p: Vec<char> = pattern.chars().collect();
            let v: Vec<char> = value.chars().collect();
            prop_assert_eq!(matched, glob(&p, &v), "pattern {:?} value {:?}", pattern, value);
            Ok(())
        })
        .expect("property");
    // A value built to make a backtracking matcher explode is matched in linear time.
    let text = "domain: w\ndescriptors:\n  - key: k\n    value: \"*a*a*a*a*a*a*a*a*a*a*b\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let rules = load_sources(&[("w.yaml".into(), text.into())]).expect("loads");
    let value = "a".repeat(4096);
    let started = Instant::now();
    for _ in 0..1000 {
        assert!(
            rules
                .domain("w")
                .expect("d")
                .match_entries(&[("k", &value)])
                .is_none()
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// /json and /check parsers, and the limiter behind them

/// An in-process limiter on the fixture's rules with a memory store, as the binary wires it.
fn limiter() -> RateLimiter {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
    RateLimiter::new(
        Arc::new(ArcSwap::from_pointee(fixture_rules())),
        Arc::new(MemoryStore::new(clock)),
        Options {
            response_headers: true,
            ..Options::default()
        },
        Arc::new(DecisionMetrics::default()),
    )
}

/// Decides a request: OK/OVER_LIMIT or INVALID_ARGUMENT with a message; never a panic, never
/// UNAVAILABLE (the memory store cannot fail).
fn decide(limiter: &RateLimiter, request: &slidegate::service::OwnedRequest) {
    match futures::executor::block_on(limiter.should_rate_limit(&request.as_request())) {
        Ok(response) => assert_eq!(response.statuses.len(), request.descriptors.len()),
        Err(LimitError::InvalidArgument(message)) => assert!(!message.is_empty()),
        Err(other) => panic!("{other:?}"),
    }
}

/// Arbitrary bytes as a `/json` body: a request or a non-empty message (400), never a panic.
#[test]
fn json_parser_survives_arbitrary_bytes() {
    let limiter = limiter();
    let strategy = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300).boxed(),
        "[\\[\\]{}\":,0-9a-z \\\\]{0,200}"
            .prop_map(String::into_bytes)
            .boxed(),
    ];
    runner()
        .run(&strategy, |body| {
            match json::parse_request(&body, &RequestLimits::default()) {
                Ok(request) => decide(&limiter, &request),
                Err(message) => assert!(!message.is_empty()),
            }
            Ok(())
        })
        .expect("property");
}

/// Field names of the JSON request (both spellings) and near misses.
const JSON_FIELDS: &[&str] = &[
    "domain",
    "descriptors",
    "entries",
    "key",
    "value",
    "hitsAddend",
    "hits_addend",
    "limit",
    "requestsPerUnit",
    "requests_per_unit",
    "unit",
    "isNegativeHits",
    "is_negative_hits",
    "extra",
];

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(
            &[
                "SECOND",
                "MINUTE",
                "HOUR",
                "UNKNOWN",
                "WEEK",
                "1",
                "-1",
                "4294967296",
                "18446744073709551616"
            ][..]
        )
        .prop_map(|s| Value::String(s.to_string())),
        value_strategy().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(JSON_FIELDS), inner), 0..6).prop_map(
                |fields| {
                    Value::Object(
                        fields
                            .into_iter()
                            .map(|(k, v)| (k.to_string(), v))
                            .collect(),
                    )
                }
            ),
        ]
    })
}

/// Request-shaped JSON with random fields, types and nesting: parsed or rejected with a message,
/// and whatever parses is decided or rejected by the limiter; never a panic.
#[test]
fn json_parser_survives_structured_nonsense() {
    let limiter = limiter();
    let strategy = (
        prop::option::of(value_strategy()),
        prop::collection::vec(json_value(), 0..4),
        json_value(),
    );
    runner()
        .run(&strategy, |(domain, descriptors, hits)| {
            let mut object = serde_json::Map::new();
            if let Some(domain) = domain {
                object.insert("domain".into(), domain.into());
            }
            object.insert("descriptors".into(), descriptors.into());
            object.insert("hitsAddend".into(), hits);
            let body = serde_json::to_vec(&object).expect("serialize");
            match json::parse_request(&body, &RequestLimits::default()) {
                Ok(request) => decide(&limiter, &request),
                Err(message) => assert!(!message.is_empty()),
            }
            Ok(())
        })
        .expect("property");
}

/// Arbitrary header values (any bytes a header may carry) for the `/check` headers: a request or a
/// message for a 400, never a panic.
#[test]
fn check_parser_survives_arbitrary_headers() {
    let limiter = limiter();
    let header_bytes = || {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..60).boxed(),
            "[a-z_=,&%0-9A-F +*:{}]{0,40}"
                .prop_map(String::into_bytes)
                .boxed(),
        ]
    };
    let strategy = (
        prop::option::of(header_bytes()),
        prop::collection::vec(header_bytes(), 0..5),
        prop::option::of(header_bytes()),
        prop::option::of(header_bytes()),
        prop::option::of(value_strategy()),
    );
    runner()
        .run(&strategy, |(domain, descriptors, hits, deny, default)| {
            let mut headers = HeaderMap::new();
            let mut put = |name: &'static str, bytes: Vec<u8>| {
                // Only what HTTP can carry: a proxy never forwards a header with a newline.
                if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                    headers.append(HeaderName::from_static(name), value);
                }
            };
            if let Some(d) = domain {
                put(check::DOMAIN_HEADER, d);
            }
            for d in descriptors {
                put(check::DESCRIPTOR_HEADER, d);
            }
            if let Some(h) = hits {
                put(check::HITS_HEADER, h);
            }
            if let Some(d) = deny {
                put(check::DENY_STATUS_HEADER, d);
            }
            match check::parse(&headers, default.as_deref(), &RequestLimits::default()) {
                Ok(parsed) => decide(&limiter, &parsed.request),
                Err(message) => assert!(!message.is_empty()),
            }
            Ok(())
        })
        .expect("property");
}

/// Any key and value, percent-encoded by the client, arrive exactly: the decoding is lossless
/// (commas, `=`, `&`, `%`, spaces, newlines and non-ASCII in values included).
#[test]
fn check_percent_encoding_round_trips() {
    let strategy = prop::collection::vec(("\\PC{1,12}", "\\PC{0,12}|[\n\r\t ,&=%]{0,4}"), 1..5);
    runner()
        .run(&strategy, |entries| {
            let header = entries
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}={}",
                        utf8_percent_encode(k, NON_ALPHANUMERIC),
                        utf8_percent_encode(v, NON_ALPHANUMERIC)
                    )
                })
                .collect::<Vec<_>>()
                .join(",");
            let mut headers = HeaderMap::new();
            headers.insert(
                check::DESCRIPTOR_HEADER,
                HeaderValue::from_str(&header).expect("encoded header"),
            );
            let parsed =
                check::parse(&headers, Some("d"), &RequestLimits::default()).expect("parses");
            prop_assert_eq!(&parsed.request.descriptors[0].entries, &entries);
            Ok(())
        })
        .expect("property");
}

// ---------------------------------------------------------------------------------------------
// The binary under abusive requests

const RULES: &str = r#"
domain: hostile
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 2 }
    descriptors:
      - key: k2
        rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: plain
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: detailed
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: big
    rate_limit: { unit: hour, requests_per_unit: 1000000000, precision: exact }
  - key: window
    rate_limit: { unit: second, requests_per_unit: 1000 }
"#;

struct Rules {
    dir: tempfile::TempDir,
}

impl Rules {
    fn new() -> Rules {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
        Rules { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.to_string(),
        value: value.to_string(),
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    crate::support::request("hostile", descriptors)
}

/// gRPC abuse: thousands of descriptors, thousands of entries, megabyte values and domains, empty
/// keys, a message over tonic's 4 MiB decoding limit, huge `hits_addend` on a limit the client
/// chooses. What only a proxy's configuration decides is refused with INVALID_ARGUMENT (or, for
/// the oversized message, OUT_OF_RANGE); what a client can choose (a megabyte value, huge hits) is
/// decided. Each in well under a second; slidegate's memory stays bounded; it keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_grpc_requests_are_refused_quickly() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let mut client = server.client().await;
    call(&mut client, request(vec![descriptor(&[("plain", "warm")])])).await;
    let rss_before = server.rss_kib();

    let huge = "v".repeat(1 << 20);
    let many_descriptors: Vec<RateLimitDescriptor> = (0..20_000)
        .map(|i| descriptor(&[("plain", &i.to_string())]))
        .collect();
    let many_entries = RateLimitDescriptor {
        entries: (0..50_000).map(|i| entry("k", &i.to_string())).collect(),
        ..RateLimitDescriptor::default()
    };
    let over_4mib = RateLimitDescriptor {
        entries: vec![entry("plain", &"x".repeat(5 << 20))],
        ..RateLimitDescriptor::default()
    };
    // The client picks the limit (Envoy's RateLimitOverride) and the hits: a sliding log stores
    // every hit, so this would be 2^32 hits recorded by one request.
    let hits_bomb = |i: usize| RateLimitDescriptor {
        entries: vec![entry("anything", &format!("bomb{i}"))],
        limit: Some(RateLimitOverride {
            requests_per_unit: u32::MAX,
            unit: 6, // YEAR
        }),
        hits_addend: Some(UInt64Value {
            value: u64::from(u32::MAX),
        }),
        ..RateLimitDescriptor::default()
    };
    let mut big_request_hits = request(vec![descriptor(&[("big", "x")])]);
    big_request_hits.hits_addend = u32::MAX;
    let cases: Vec<(&str, RateLimitRequest, tonic::Code, &str)> = vec![
        (
            "20 000 descriptors",
            request(many_descriptors),
            tonic::Code::InvalidArgument,
            "too many descriptors",
        ),
        (
            "50 000 entries",
            request(vec![many_entries]),
            tonic::Code::InvalidArgument,
            "too many entries",
        ),
        (
            "a 1 MiB key",
            request(vec![descriptor(&[(&huge, "v")])]),
            tonic::Code::InvalidArgument,
            "key is 1048576 bytes",
        ),
        (
            "a 1 MiB domain",
            RateLimitRequest {
                domain: huge.clone(),
                ..request(vec![descriptor(&[("plain", "v")])])
            },
            tonic::Code::InvalidArgument,
            "domain is 1048576 bytes",
        ),
        (
            "an empty key",
            request(vec![descriptor(&[("plain", "v"), ("", "v")])]),
            tonic::Code::InvalidArgument,
            "key must not be empty",
        ),
        (
            "a 5 MiB message",
            request(vec![over_4mib]),
            tonic::Code::OutOfRange,
            "message length too large",
        ),
    ];
    for (what, req, code, message) in cases {
        let started = Instant::now();
        let result = client.should_rate_limit(req).await;
        let elapsed = started.elapsed();
        match result {
            Err(status) => {
                assert_eq!(status.code(), code, "{what}: {status:?}");
                assert!(
                    status.message().contains(message),
                    "{what}: {:?} lacks {message:?}",
                    status.message()
                );
            }
            Ok(r) => panic!("{what}: accepted: {:?}", r.into_inner().overall_code()),
        }
        assert!(elapsed < Duration::from_secs(1), "{what} took {elapsed:?}");
        eprintln!("{what}: refused in {elapsed:?}");
    }
    // What a client can choose (values, hits) is decided, never refused: a refusal would let
    // the request through uncounted behind Envoy. A long value is counted under its digest;
    // hits over --max-hits on an exact log are a deny that records nothing. Client-chosen limits
    // of 2^32 - 1 per year are kept as buckets (the automatic choice), where any number of hits
    // is one count: 2^32 - 1 hits on 64 of them fit.
    let decided: Vec<(&str, RateLimitRequest, Code)> = vec![
        (
            "a 1 MiB value",
            request(vec![descriptor(&[("plain", &huge)])]),
            Code::Ok,
        ),
        (
            "2^32 hits on 64 client-chosen limits",
            request((0..64).map(hits_bomb).collect()),
            Code::Ok,
        ),
        (
            "2^32 request hits on a configured limit of 10^9",
            big_request_hits,
            Code::OverLimit,
        ),
    ];
    for (what, req, code) in decided {
        let started = Instant::now();
        let r = call(&mut client, req).await;
        let elapsed = started.elapsed();
        assert_eq!(r.overall_code(), code, "{what}");
        assert!(elapsed < Duration::from_secs(1), "{what} took {elapsed:?}");
        eprintln!("{what}: decided in {elapsed:?}");
    }
    // 20 KiB of metadata, over the 16 KiB of headers HTTP/2 allows here: that call is refused
    // (431, stream refused) and the connection goes on serving.
    let mut oversized = tonic::Request::new(request(vec![descriptor(&[("plain", "v")])]));
    let padding = "p".repeat(20 << 10).parse().expect("ASCII metadata");
    oversized.metadata_mut().insert("x-padding", padding);
    let started = Instant::now();
    let refused = client.should_rate_limit(oversized).await;
    assert!(refused.is_err(), "20 KiB of headers accepted");
    assert!(started.elapsed() < Duration::from_secs(1));

    // Bodies no gRPC library would send, written by hand: a clear status each, never a hang.
    let valid = request(vec![descriptor(&[("plain", "raw")])]).encode_to_vec();
    let mut two = grpc_frame(&valid);
    two.extend_from_slice(&grpc_frame(&valid));
    let mut compressed = grpc_frame(&valid);
    compressed[0] = 1;
    let mut truncated = grpc_frame(&valid);
    truncated.pop();
    let raw_cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("no message", Vec::new(), "3", "no message"),
        ("half a prefix", vec![0, 0], "3", "no message"),
        ("a truncated message", truncated, "3", "ends inside"),
        ("two messages", two, "3", "one message"),
        (
            "bytes that are not protobuf",
            grpc_frame(&[0xff; 16]),
            "3",
            "cannot decode",
        ),
        (
            "a message flagged compressed",
            compressed,
            "13",
            "compressed",
        ),
    ];
    for (what, body, status, message) in raw_cases {
        let started = Instant::now();
        let answer = raw_should_rate_limit(server.grpc_port, &[], body).await;
        assert_eq!(answer.status.as_deref(), Some(status), "{what}: {answer:?}");
        let text = answer.message.unwrap_or_default();
        assert!(text.contains(message), "{what}: {text:?} lacks {message:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "{what}");
    }
    let rss_after = server.rss_kib();
    eprintln!("RSS {rss_before} KiB before, {rss_after} KiB after");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "after")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

/// Request bodies of arbitrary bytes, written by hand over HTTP/2 (random bytes, a valid 5-byte
/// prefix on random bytes, prefixes that lie about the length or the compression): every one
/// gets a gRPC status from the set a bad request may get, within a second, and the server keeps
/// answering.
#[test]
fn grpc_bodies_of_arbitrary_bytes_get_a_status() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..600),
        proptest::collection::vec(any::<u8>(), 0..600).prop_map(|m| grpc_frame(&m)),
        (
            any::<u8>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(flag, length, rest)| {
                let mut body = vec![flag % 3];
                body.extend_from_slice(&length.to_be_bytes());
                body.extend_from_slice(&rest);
                body
            }),
    ];
    runner()
        .run(&body, |body| {
            let started = Instant::now();
            let call = raw_should_rate_limit(server.grpc_port, &[], body);
            let answer = runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(2), call).await })
                .map_err(|_| TestCaseError::fail("no answer within 2 s"))?;
            // OK (bytes that happen to decode as a request), INVALID_ARGUMENT, OUT_OF_RANGE,
            // INTERNAL (the compressed flag without grpc-encoding).
            let status = answer.status.as_deref().unwrap_or("none");
            prop_assert!(["0", "3", "11", "13"].contains(&status), "{answer:?}");
            prop_assert!(started.elapsed() < Duration::from_secs(1));
            Ok(())
        })
        .expect("every body gets a status");
    let mut client = runtime.block_on(server.client());
    let r = runtime.block_on(call(
        &mut client,
        request(vec![descriptor(&[("plain", "v")])]),
    ));
    assert_eq!(r.overall_code(), Code::Ok);
}

/// A client that opens calls and never finishes their bodies can hold at most 100 of them on one
/// connection: the server says so in its HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`, which clients
/// must honour (h2 refuses streams beyond it). With 99 such calls held open, the connection's
/// last call and other connections are still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_calls_are_bounded_per_connection() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let io = tokio::net::TcpStream::connect(("127.0.0.1", server.grpc_port))
        .await
        .expect("connect");
    let (sender, connection) = h2::client::handshake(io).await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let mut sender = sender.ready().await.expect("ready");
    // Let the server's SETTINGS arrive before counting streams.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sender.current_max_send_streams(), 100);
    let uri = format!(
        "http://127.0.0.1:{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.grpc_port
    );
    let mut half_sent = Vec::new();
    for _ in 0..100 {
        let call = http::Request::post(uri.as_str())
            .header("content-type", "application/grpc")
            .body(())
            .expect("request");
        sender = sender.ready().await.expect("ready");
        half_sent.push(sender.send_request(call, false).expect("open a call"));
    }
    // All 100 are open on the server (none refused): one of them still gets its answer.
    let (response, mut body) = half_sent.pop().expect("a call");
    let frame = grpc_frame(&request(vec![descriptor(&[("plain", "last")])]).encode_to_vec());
    body.send_data(bytes::Bytes::from(frame), true)
        .expect("send the body");
    let answer = tokio::time::timeout(Duration::from_secs(2), response)
        .await
        .expect("answered in time")
        .expect("answered");
    assert_eq!(answer.status(), 200);

    let mut client = server.client().await;
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "other")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
    drop(half_sent);
}

/// 4 MiB of empty descriptors (`12 00`, two bytes each) would take hundreds of MiB decoded in
/// full: descriptors are counted on the wire instead, and the message is refused at the 65th
/// (`--max-descriptors`) before anything is built. Four such calls at once leave the server's
/// memory within 64 MiB of where it was, and it keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_empty_descriptors_is_refused_before_it_is_built() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let mut client = server.client().await;
    call(&mut client, request(vec![descriptor(&[("plain", "warm")])])).await;
    let rss_before = server.rss_kib();
    let mut message = request(vec![]).encode_to_vec();
    message.extend([0x12, 0x00].repeat(((4 << 20) - 64) / 2));
    let calls = (0..4).map(|_| raw_should_rate_limit(server.grpc_port, &[], grpc_frame(&message)));
    for answer in futures::future::join_all(calls).await {
        assert_eq!(answer.status.as_deref(), Some("3"), "{answer:?}");
        let text = answer.message.unwrap_or_default();
        assert!(text.contains("too many descriptors"), "{text}");
    }
    let grown = server.rss_kib().saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "after")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

/// A sliding log stores every hit (one sorted-set member each in Redis), so `hits_addend` is the
/// one request field that multiplies work. Against a real Redis: 4097 hits on an exact log, or
/// two descriptors of 2049 hits each, are denied before Redis sees them (the budget is the
/// request's); the largest allowed (`--max-hits`, 4096 by default) is decided in one call and
/// records exactly that many members. Charges (a descriptor's own cost) land whatever the budget:
/// past it, in buckets. A client-chosen limit of 2^32 - 1 per year is kept as buckets: 10^7 hits
/// on it are one count in one hash field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_are_bounded_before_they_reach_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new();
    // A generous store timeout: 4096 members in one script call take milliseconds, more on a
    // loaded machine, and this test is about the bound, not the latency.
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &redis.url(), "--redis-timeout", "5s"],
    );
    assert!(wait_until(Duration::from_secs(10), || server
        .get("/healthcheck")
        .0
        == 200));
    let mut client = server.client().await;
    let with_hits = |hits: u64, limit: Option<RateLimitOverride>| {
        let mut d = descriptor(&[("big", "h")]);
        d.hits_addend = Some(UInt64Value { value: hits });
        d.limit = limit;
        request(vec![d])
    };
    let forever = RateLimitOverride {
        requests_per_unit: u32::MAX,
        unit: 6, // YEAR
    };
    let mut admitted = request(vec![descriptor(&[("big", "h")])]);
    admitted.hits_addend = 4097;
    let r = call(&mut client, admitted).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "4097 hits");
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
    // As a charge, 4097 on an exact log lands in buckets (one minute each for the hour).
    let r = call(&mut client, with_hits(4097, None)).await;
    assert_eq!(r.overall_code(), Code::Ok, "a charge of 4097");
    let hour = "slidegate:{hostile:big=h}3600000";
    assert_eq!(redis.cli(&["HGET", hour, "t"]), "4097");
    assert_eq!(redis.cli(&["HGET", hour, "w"]), "60000000");
    redis.cli(&["DEL", hour]);
    // The budget is the request's, not each descriptor's: two descriptors of 2049 hits on exact
    // logs are denied as a whole and record nothing.
    let pair: Vec<RateLimitDescriptor> = (0..2)
        .map(|i| descriptor(&[("big", &format!("pair{i}"))]))
        .collect();
    let mut both = request(pair.clone());
    both.hits_addend = 2049;
    let r = call(&mut client, both).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
    // As descriptor costs they are charges: the first fits the budget on its log, the second is
    // over what is left and lands in buckets.
    let charges = pair
        .into_iter()
        .map(|mut d| {
            d.hits_addend = Some(UInt64Value { value: 2049 });
            d
        })
        .collect();
    let r = call(&mut client, request(charges)).await;
    assert_eq!(r.overall_code(), Code::Ok);
    let pair_key = |i: u32| format!("slidegate:{{hostile:big=pair{i}}}3600000");
    assert_eq!(redis.cli(&["ZCARD", &pair_key(0)]), "2049");
    assert_eq!(redis.cli(&["HGET", &pair_key(1), "t"]), "2049");
    redis.cli(&["DEL", &pair_key(0), &pair_key(1)]);
    let r = call(&mut client, with_hits(10_000_000, Some(forever))).await;
    assert_eq!(r.overall_code(), Code::Ok);
    let buckets = "slidegate:{hostile:big=h}31536000000";
    assert_eq!(redis.cli(&["HGET", buckets, "t"]), "10000000");
    assert_eq!(
        redis.cli(&["HLEN", buckets]),
        "5",
        "one bucket, its total, its oldest and newest index and its width"
    );
    redis.cli(&["DEL", buckets]);
    let started = Instant::now();
    let r = call(&mut client, with_hits(4096, None)).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        redis.cli(&["ZCARD", "slidegate:{hostile:big=h}3600000"]),
        "4096"
    );
}

/// Sends raw bytes as one HTTP/1.1 request and returns the status (0: connection closed without
/// an answer) and the time it took.
fn raw_http(port: u16, request: &[u8]) -> (u16, Duration) {
    use std::io::{Read, Write};
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // The server may answer (and close) before reading everything.
    let _ = stream.write_all(request);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    (
        http_status(&String::from_utf8_lossy(&raw)),
        started.elapsed(),
    )
}

/// HTTP abuse on `/json` and `/check`: oversized bodies (with and without a Content-Length),
/// thousands of descriptors, 100 000 nested brackets, invalid UTF-8, bad percent-encoding,
/// thousands of descriptor headers and a 1 MiB header. Each gets 400, 413 or 431 quickly (what a
/// client may choose, bytes that are not UTF-8 and hits, is decided instead);
/// memory stays bounded; the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_http_requests_are_refused_quickly() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &["--max-body-bytes", "65536"]);
    let port = server.http_port;
    let rss_before = server.rss_kib();

    let json_post = |body: &[u8], chunked: bool| -> Vec<u8> {
        let mut out = Vec::new();
        if chunked {
            out.extend_from_slice(
                b"POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            for chunk in body.chunks(8192) {
                out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                out.extend_from_slice(chunk);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
        } else {
            out.extend_from_slice(
                format!(
                    "POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(body);
        }
        out
    };
    let check = |headers: &str| -> Vec<u8> {
        format!(
            "GET /check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-ratelimit-domain: hostile\r\n{headers}\r\n"
        )
        .into_bytes()
    };
    let descriptors = (0..1000)
        .map(|i| format!(r#"{{"entries":[{{"key":"plain","value":"{i}"}}]}}"#))
        .collect::<Vec<_>>()
        .join(",");
    let many = format!(r#"{{"domain":"hostile","descriptors":[{descriptors}]}}"#);
    let big_body = vec![b' '; 4 << 20];
    let deep = "[".repeat(60_000);
    let many_headers: String = (0..5000)
        .map(|i| format!("x-ratelimit-descriptor: plain={i}\r\n"))
        .collect();
    let many_entries = format!(
        "x-ratelimit-descriptor: {}\r\n",
        (0..5000)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let huge_header = format!("x-ratelimit-descriptor: plain={}\r\n", "v".repeat(1 << 20));

    let cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        ("/json 4 MiB body", json_post(&big_body, false), &[413]),
        ("/json 4 MiB chunked body", json_post(&big_body, true), &[413]),
        ("/json 1000 descriptors", json_post(many.as_bytes(), false), &[400]),
        ("/json 60 000 nested brackets", json_post(deep.as_bytes(), false), &[400]),
        ("/json invalid UTF-8", json_post(b"{\"domain\":\"\xff\xfe\"}", false), &[400]),
        ("/json empty key", json_post(br#"{"domain":"hostile","descriptors":[{"entries":[{"key":"","value":"v"}]}]}"#, false), &[400]),
        ("/check invalid percent-encoding", check("x-ratelimit-descriptor: plain=%zz\r\n"), &[400]),
        // Not UTF-8: counted under an escape of the bytes (decided, not refused).
        ("/check percent-encoded invalid UTF-8", check("x-ratelimit-descriptor: plain=%ff%fe\r\n"), &[200]),
        ("/check raw non-ASCII", b"GET /check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-ratelimit-domain: hostile\r\nx-ratelimit-descriptor: plain=\xff\r\n\r\n".to_vec(), &[200]),
        ("/check empty key", check("x-ratelimit-descriptor: =v\r\n"), &[400]),
        ("/check 5000 entries", check(&many_entries), &[400, 431]),
        ("/check 5000 descriptor headers", check(&many_headers), &[400, 431]),
        ("/check a 1 MiB header", check(&huge_header), &[400, 431]),
        ("/check hits 2^64", check("x-ratelimit-descriptor: plain=v\r\nx-ratelimit-hits: 18446744073709551616\r\n"), &[400]),
        // Over --max-hits: a deny, never a refusal a proxy would pass.
        ("/check hits 2^32 on a limit of 10^9", check("x-ratelimit-descriptor: big=v\r\nx-ratelimit-hits: 4294967295\r\n"), &[429]),
    ];
    for (what, bytes, expected) in cases {
        let (status, elapsed) = raw_http(port, &bytes);
        eprintln!("{what}: {status} in {elapsed:?}");
        assert!(
            expected.contains(&status),
            "{what}: got {status}, expected {expected:?}"
        );
        assert!(elapsed < Duration::from_secs(1), "{what} took {elapsed:?}");
    }
    let rss_after = server.rss_kib();
    eprintln!("RSS {rss_before} KiB before, {rss_after} KiB after");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS {rss_before} -> {rss_after} KiB"
    );
    assert_eq!(server.get("/healthcheck").0, 200);
    let (status, _) = raw_http(port, &check("x-ratelimit-descriptor: plain=ok\r\n"));
    assert_eq!(status, 200);
}

// ---------------------------------------------------------------------------------------------
// Key injection

/// Descriptor values built to collide with another counter's Redis key (the separators `:` `=`
/// `%`, hash-tag braces, newlines, glob characters, the prefix itself), against a real Redis.
///
/// Proves: every descriptor gets its own counter (each allows exactly its limit of 2, then
/// denies), Redis holds exactly one key per descriptor under the prefix, each with its own 2 hits,
/// and every key's hash tag is intact (one `{`, one `}`, nothing raw from the values).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_values_cannot_reach_another_counter() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new();
    let server = Slidegate::start(
        rules.path(),
        &[
            "--redis-url",
            &redis.url(),
            "--redis-prefix",
            "sg:",
            "--redis-timeout",
            "2s",
        ],
    );
    assert!(wait_until(Duration::from_secs(10), || server
        .get("/healthcheck")
        .0
        == 200));
    let sets: Vec<Vec<(&str, &str)>> = vec![
        vec![("k", "a:k2=b")],
        vec![("k", "a"), ("k2", "b")],
        vec![("k", "a"), ("k2", "b:k3=c")],
        vec![("k", "a=b")],
        vec![("k", "a"), ("k2", "=b")],
        vec![("k", "a}60000")],
        vec![("k", "a}60000{")],
        vec![("k", "{hostile:k=x}")],
        vec![("k", "x")],
        vec![("k", "x}60000")],
        vec![("k", "sg:{hostile:k=x}60000")],
        vec![("k", "%3A")],
        vec![("k", ":")],
        vec![("k", "%")],
        vec![("k", "%25")],
        vec![("k", "a\nb")],
        vec![("k", "a\r\nb")],
        vec![("k", "a b")],
        vec![("k", "a\u{0}b")],
        vec![("k", "*")],
        vec![("k", "?")],
        vec![("k", "[a]")],
        vec![("k", "ü")],
        vec![("k", "%C3%BC")],
        vec![("k", "")],
    ];
    let mut client = server.client().await;
    for round in 0..3 {
        for set in &sets {
            let r = call(&mut client, request(vec![descriptor(set)])).await;
            let status = &r.statuses[0];
            if round < 2 {
                assert_eq!(
                    r.overall_code(),
                    Code::Ok,
                    "{set:?} round {round}: shares a counter"
                );
                assert_eq!(status.limit_remaining, 1 - round, "{set:?}");
            } else {
                assert_eq!(r.overall_code(), Code::OverLimit, "{set:?}");
            }
        }
    }
    // Counter keys: not the notice board where the server posts who it denies (`GET /limited`).
    let keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", "*"])
        .lines()
        .filter(|key| !key.starts_with("sg:board:"))
        .map(str::to_string)
        .collect();
    let unique: BTreeSet<&String> = keys.iter().collect();
    assert_eq!(unique.len(), sets.len(), "{keys:#?}");
    for key in &unique {
        assert!(key.starts_with("sg:{hostile:k="), "{key:?}");
        assert_eq!(key.matches('{').count(), 1, "{key:?}");
        assert_eq!(key.matches('}').count(), 1, "{key:?}");
        assert!(!key.contains(['\n', '\r', ' ', '\0']), "{key:?}");
        assert_eq!(redis.cli(&["ZCARD", key]), "2", "{key:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Metric labels

/// Values end up in metric labels only for `detailed_metric` rules. Values with `"`, `\`,
/// newlines, braces and non-ASCII still give a valid exposition (`promtool check metrics`); 2 000
/// distinct values on a plain rule give one label set; 10 100 distinct values on a detailed rule
/// are capped at MAX_RULE_LABELS label sets, the rest counted under `rule="overflow"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_labels_are_escaped_and_bounded() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let mut client = server.client().await;
    let nasty = [
        "a\"b",
        "c\\d",
        "e\nf",
        "g}h",
        "i{j",
        "k=l,m",
        "ü",
        "\u{7f}",
        "sp ace",
        "\\n",
        "\"",
        "",
        "# HELP x",
        "x 1\nfake_metric 2",
    ];
    for value in nasty {
        call(
            &mut client,
            request(vec![descriptor(&[("detailed", value)])]),
        )
        .await;
        call(&mut client, request(vec![descriptor(&[("plain", value)])])).await;
    }
    let (_, text) = server.get("/metrics");
    assert!(!text.contains("\nfake_metric"), "a value injected a line");
    promtool_check_metrics(server.dir.path(), &text);
    let labels_before = text
        .lines()
        .filter(|l| l.starts_with("slidegate_near_limit_total{"))
        .count();

    for batch in 0..(2000 / 50) {
        let descriptors = (0..50)
            .map(|i| descriptor(&[("plain", &format!("p{batch}-{i}"))]))
            .collect();
        call(&mut client, request(descriptors)).await;
    }
    for batch in 0..(10_100 / 50) {
        let descriptors = (0..50)
            .map(|i| descriptor(&[("detailed", &format!("d{batch}-{i}"))]))
            .collect();
        call(&mut client, request(descriptors)).await;
    }
    let (_, text) = server.get("/metrics");
    let rules_of = |family: &str| -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for line in text.lines().filter(|l| l.starts_with(family)) {
            if let Some(rule) = line
                .split("rule=\"")
                .nth(1)
                .and_then(|r| r.split("\"}").next())
            {
                *out.entry(rule.to_string()).or_default() += 1;
            }
        }
        out
    };
    let decisions = rules_of("slidegate_decisions_total{");
    assert_eq!(
        decisions.get("plain"),
        Some(&3),
        "one label set (3 decisions) for the plain rule"
    );
    assert!(
        !decisions.keys().any(|r| r.starts_with("p0-")),
        "a plain value leaked into a label"
    );
    let detailed = decisions
        .keys()
        .filter(|r| r.starts_with("detailed"))
        .count();
    eprintln!("{} rule labels; {detailed} detailed", decisions.len());
    assert!(
        decisions.len() <= MAX_RULE_LABELS + 1,
        "{}",
        decisions.len()
    );
    assert!(decisions.contains_key(OVERFLOW_RULE));
    let overflow = text
        .lines()
        .find(|l| l.starts_with(&format!(r#"slidegate_decisions_total{{decision="allowed",domain="hostile",rule="{OVERFLOW_RULE}"}}"#)))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    // Every (domain, rule) pair seen before the cap keeps its series; the rest share one.
    assert_eq!(
        overflow,
        (10_100 + labels_before - MAX_RULE_LABELS) as f64,
        "{labels_before} label sets before"
    );
    promtool_check_metrics(server.dir.path(), &text);
}

// ---------------------------------------------------------------------------------------------
// Memory

/// A million distinct client keys through the memory store (driven in-process with a manual
/// clock: a million gRPC calls would take minutes in a debug build), a 1 s window. While their
/// windows last the store holds them all; once the clock passes the window, the sweeper task the
/// binary runs (here every 20 ms) brings the store back to its empty size: idle memory returns to
/// the baseline, measured by the store's own accounting.
#[test]
fn a_million_client_keys_are_swept_once_idle() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let empty = store.stats();
    let window = Duration::from_secs(1);
    let started = Instant::now();
    for i in 0..1_000_000u32 {
        let counter = Counter {
            key: CounterKey::new("hostile", [("client", i.to_string().as_str())], window),
            limit: 10,
            window,
            hits: 1,
            shadow: false,
            precision: Precision::Exact,
            kind: slidegate::store::HitKind::Admitted,
        };
        assert!(store.decide_now(&[counter]).allowed);
        if i % 1000 == 0 {
            clock.advance(Duration::from_micros(100));
        }
    }
    let full = store.stats();
    eprintln!(
        "1 000 000 keys in {:?}: {full:?} ({} bytes per key); process RSS {:?} KiB",
        started.elapsed(),
        full.heap_bytes / 1_000_000,
        rss_kib(std::process::id())
    );
    assert_eq!(full.counters, 1_000_000);
    assert!(full.heap_bytes > 50_000_000);

    clock.advance(window);
    let _sweeper = {
        let _guard = runtime.enter();
        store.spawn_sweeper(Duration::from_millis(20))
    };
    let swept = wait_until(Duration::from_secs(30), || store.stats().counters == 0);
    let idle = store.stats();
    eprintln!(
        "idle: {idle:?} (empty store: {empty:?}); process RSS {:?} KiB",
        rss_kib(std::process::id())
    );
    assert!(swept, "{idle:?}");
    assert_eq!(idle.hits, 0);
    assert!(
        idle.heap_bytes <= empty.heap_bytes + 64 * 1024,
        "idle {idle:?} vs empty {empty:?}"
    );
}

/// Over the wire: two waves of 100 000 distinct keys each (50 descriptors per call) on a rule with
/// a 1 s window, separated by an idle period in which the binary's sweeper (every 30 s) drops the
/// expired counters.
///
/// Proves: the first wave's counters are released when idle: the second wave of new keys reuses
/// that memory instead of adding to it (without the sweep it would add as much again). The
/// allocator (mimalloc) keeps freed pages for reuse, so resident memory need not fall to the
/// baseline (with `MIMALLOC_PURGE_DELAY=0` about half the growth went back to the OS); the memory
/// store's own accounting returning to empty is shown in-process above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_over_the_wire_are_released_when_idle() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let started = Instant::now();
    let mut client = server.client().await;
    call(
        &mut client,
        request(vec![descriptor(&[("window", "warm")])]),
    )
    .await;
    let baseline = server.rss_kib();
    let keys = 100_000;
    let wave = |client: RateLimitServiceClient<Channel>, name: &'static str| async move {
        let mut client = client;
        for batch in 0..keys / 50 {
            let descriptors = (0..50)
                .map(|i| descriptor(&[("window", &format!("{name}-{batch}-{i}"))]))
                .collect();
            call(&mut client, request(descriptors)).await;
        }
        client
    };
    let client = wave(client, "first").await;
    let peak = server.rss_kib();
    let grew = peak.saturating_sub(baseline);
    eprintln!("RSS {baseline} KiB at start, {peak} KiB after {keys} keys");
    assert!(grew > 5 * 1024, "{keys} keys took only {grew} KiB");
    // The sweeper's first tick comes 30 s after start; the windows ended long before.
    let tick = Duration::from_secs(32);
    if started.elapsed() < tick {
        tokio::time::sleep(tick - started.elapsed()).await;
    }
    let idle = server.rss_kib();
    let _client = wave(client, "second").await;
    let second = server.rss_kib();
    eprintln!("RSS {idle} KiB when idle, {second} KiB after {keys} new keys");
    assert!(
        second < peak + grew / 3,
        "the second wave added to the first: {second} KiB (first peak {peak} KiB, growth {grew} KiB)"
    );
}

// ---------------------------------------------------------------------------------------------
// Secrets

/// A Redis password (`--requirepass`), given in the URL, and a wrong one: neither appears in
/// slidegate's stderr at debug level (text and JSON logs), in `/rlconfig`, in `/metrics`, or in the
/// errors returned to clients over gRPC, `/json` and `/check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_passwords_never_leak() {
    let Some(redis) = RedisServer::start_with(&["--requirepass", "s3cret-pw"]) else {
        return;
    };
    let rules = Rules::new();
    let right = format!("redis://:s3cret-pw@127.0.0.1:{}", redis.port);
    let wrong = format!("redis://:wr0ng-pw-zz@127.0.0.1:{}", redis.port);
    let secrets = ["s3cret-pw", "wr0ng-pw-zz"];
    let good = Slidegate::start(
        rules.path(),
        &[
            "--redis-url",
            &right,
            "--log-level",
            "debug",
            "--redis-timeout",
            "2s",
        ],
    );
    let bad = Slidegate::start(
        rules.path(),
        &[
            "--redis-url",
            &wrong,
            "--log-level",
            "debug",
            "--log-format",
            "json",
        ],
    );
    let bad_cluster = Slidegate::start(
        rules.path(),
        &["--redis-cluster", &wrong, "--log-level", "trace"],
    );
    assert!(
        wait_until(Duration::from_secs(10), || good.get("/healthcheck").0
            == 200),
        "{}",
        good.log()
    );
    let mut c = good.client().await;
    let r = call(&mut c, request(vec![descriptor(&[("plain", "s")])])).await;
    assert_eq!(r.statuses[0].limit_remaining, 999, "served from Redis");

    let http = reqwest::Client::new();
    let mut seen = String::new();
    for server in [&bad, &bad_cluster] {
        let mut c = server.client().await;
        let status = c
            .should_rate_limit(request(vec![descriptor(&[("plain", "s")])]))
            .await
            .expect_err("wrong password");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        seen.push_str(status.message());
        let json = http
            .post(server.url("/json"))
            .body(
                r#"{"domain":"hostile","descriptors":[{"entries":[{"key":"plain","value":"s"}]}]}"#,
            )
            .send()
            .await
            .expect("json");
        assert_eq!(json.status(), 503);
        seen.push_str(&json.text().await.expect("body"));
        let check = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "hostile")
            .header("x-ratelimit-descriptor", "plain=s")
            .send()
            .await
            .expect("check");
        assert_eq!(check.status(), 503);
        seen.push_str(&check.text().await.expect("body"));
    }
    eprintln!("errors returned to clients: {seen}");
    assert!(seen.contains("store"), "{seen}");
    // Give the health checkers time to log their failures too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for server in [&good, &bad, &bad_cluster] {
        for path in ["/rlconfig", "/metrics", "/healthcheck"] {
            seen.push_str(&server.get(path).1);
        }
        seen.push_str(&server.log());
    }
    assert!(
        bad.log().contains("WARN") || bad.log().contains("\"level\":\"WARN\""),
        "{}",
        bad.log()
    );
    for secret in secrets {
        assert!(!seen.contains(secret), "{secret} leaked:\n{seen}");
    }
    assert!(
        good.log().contains("redis://:***@127.0.0.1"),
        "{}",
        good.log()
    );

    // Settings refused at startup (a URL that does not parse; cluster seeds with different
    // passwords): the error hides the passwords too.
    for redis_args in [
        vec!["--redis-url", "redis://:s3cret-pw@[::1"],
        vec![
            "--redis-cluster",
            "redis://:s3cret-pw@127.0.0.1:1,redis://:wr0ng-pw-zz@127.0.0.1:2",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(["serve", "--config"])
            .arg(rules.path())
            .args(&redis_args)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(["--log-level", "trace"])
            .env_remove("RUST_LOG")
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("***"), "{stderr}");
        for secret in secrets {
            assert!(!stderr.contains(secret), "{stderr}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One client must not exhaust the server (issue 25). Each attack runs for seconds against the
// real binary with one worker (so that the attacker and a normal client share it), while the
// normal client calls `ShouldRateLimit` every 10 ms on a connection of its own. The limits are
// set through SLIDEGATE_* variables, which a binary without them ignores, so each test can be run
// against an older build to see it fail. The runner in `attack.rs` keeps these attacks going
// against a running server for `bench/scripts/bench-attacks`, with the helpers below.

/// The bound on every call of the normal client during an attack (a debug build on a shared
/// machine: the calls take well under a millisecond when nothing else runs).
const NORMAL_CALL_BOUND: Duration = Duration::from_secs(1);

/// Calls of the normal client: how long each took, and how many got no answer in time.
#[derive(Debug, Default)]
struct NormalCalls {
    latencies: Vec<Duration>,
    failed: usize,
}

impl NormalCalls {
    fn p99(&self) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        sorted
            .get(sorted.len().saturating_sub(1) * 99 / 100)
            .copied()
            .unwrap_or_default()
    }

    /// Every call answered within [`NORMAL_CALL_BOUND`], and enough of them to mean something.
    fn assert_served(&self, attack: &str) {
        let slowest = self.latencies.iter().max().copied().unwrap_or_default();
        assert!(
            self.failed == 0 && self.latencies.len() >= 20 && slowest <= NORMAL_CALL_BOUND,
            "during {attack}: {} calls answered, {} failed, p99 {:?}, slowest {slowest:?}",
            self.latencies.len(),
            self.failed,
            self.p99()
        );
    }
}

/// A normal client's calls, one every 10 ms, until `until`.
async fn normal_client(mut client: RateLimitServiceClient<Channel>, until: Instant) -> NormalCalls {
    let mut calls = NormalCalls::default();
    while Instant::now() < until {
        let started = Instant::now();
        let call = client.should_rate_limit(request(vec![descriptor(&[("plain", "normal")])]));
        match tokio::time::timeout(NORMAL_CALL_BOUND * 5, call).await {
            Ok(Ok(_)) => calls.latencies.push(started.elapsed()),
            _ => calls.failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    calls
}

/// The highest RSS of `pid` (KiB), sampled every 50 ms until `until`.
async fn peak_rss(pid: u32, until: Instant) -> u64 {
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(rss_kib(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak
}

pub(super) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// An HTTP/2 connection to the gRPC port (the h2 client, with `builder`'s settings).
pub(super) async fn h2_connection(
    port: u16,
    builder: h2::client::Builder,
) -> h2::client::SendRequest<bytes::Bytes> {
    let io = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (sender, connection) = builder.handshake(io).await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    sender.ready().await.expect("ready")
}

pub(super) fn grpc_request(port: u16, path: &str) -> http::Request<()> {
    http::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

/// Sends `bytes` on `stream` as fast as the server's flow-control window lets it (never more:
/// the attacker's own memory stays small), then holds the stream open without ending it.
pub(super) async fn send_as_window_allows(
    mut stream: h2::SendStream<bytes::Bytes>,
    bytes: bytes::Bytes,
) {
    let mut left = bytes;
    while !left.is_empty() {
        stream.reserve_capacity(left.len());
        match std::future::poll_fn(|cx| stream.poll_capacity(cx)).await {
            Some(Ok(granted)) if granted > 0 => {
                let n = granted.min(left.len());
                if stream.send_data(left.split_to(n), false).is_err() {
                    return;
                }
            }
            Some(Ok(_)) => {}
            _ => return,
        }
    }
    std::future::pending::<()>().await;
}

/// Item 2. Four connections each open 64 calls that announce a 4 MiB message and send all of it
/// but the last byte, as fast as the server lets them, for 3 s (before the budgets: 1 GiB the
/// server would take in). With a process budget of 16 MiB the server's RSS grows by less than
/// 96 MiB; the body timeout (2 s) answers the half-sent calls DEADLINE_EXCEEDED; the normal
/// client's calls are each answered within [`NORMAL_CALL_BOUND`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_bodies_stay_within_the_buffer_budgets() {
    let rules = Rules::new();
    let server = Slidegate::start_with_env(
        rules.path(),
        &[],
        &[
            ("SLIDEGATE_WORKERS", "1"),
            ("SLIDEGATE_MAX_BUFFERED_BYTES", "16777216"),
            ("SLIDEGATE_BODY_TIMEOUT", "2s"),
        ],
    );
    let client = server.client().await;
    let rss_before = server.rss_kib();
    let until = Instant::now() + Duration::from_secs(3);
    let normal = tokio::spawn(normal_client(client, until));
    let peak = tokio::spawn(peak_rss(server.pid(), until));

    let message_length = 4 << 20;
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message_length).expect("4 MiB").to_be_bytes());
    body.resize(5 + message_length - 1, 0);
    let body = bytes::Bytes::from(body);
    let mut attack = tokio::task::JoinSet::new();
    let mut responses = Vec::new();
    for _ in 0..4 {
        let mut sender = h2_connection(server.grpc_port, h2::client::Builder::new()).await;
        for _ in 0..64 {
            sender = sender.ready().await.expect("ready");
            let request = grpc_request(server.grpc_port, SHOULD_RATE_LIMIT);
            let (response, stream) = sender.send_request(request, false).expect("open a call");
            responses.push(response);
            attack.spawn(send_as_window_allows(stream, body.clone()));
        }
    }
    let first = responses.swap_remove(0);
    let answered = tokio::time::timeout(Duration::from_secs(4), first).await;
    let peak = peak.await.expect("RSS sampler");
    normal
        .await
        .expect("normal client")
        .assert_served("half-sent 4 MiB bodies");
    attack.abort_all();
    assert!(
        peak < rss_before + 96 * 1024,
        "RSS grew from {rss_before} KiB to {peak} KiB"
    );
    let status = answered
        .ok()
        .and_then(Result::ok)
        .and_then(|r| r.headers().get("grpc-status").cloned());
    assert_eq!(
        status.as_ref().map(|s| s.as_bytes()),
        Some(&b"4"[..]),
        "a half-sent call is answered DEADLINE_EXCEEDED after the body timeout"
    );
}

/// Item 3. A client that opens no flow-control window (initial window 0) and sends reflection
/// `file_containing_symbol` requests on one stream for 3 s: the server queues what one stream
/// may (64 KiB) and stops reading the stream, instead of queueing every reply (before: 5 KiB per
/// request without bound). RSS grows by less than 32 MiB; the normal client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_wait_for_the_clients_window() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

    let rules = Rules::new();
    let server = Slidegate::start_with_env(rules.path(), &[], &[("SLIDEGATE_WORKERS", "1")]);
    let client = server.client().await;
    let rss_before = server.rss_kib();
    let until = Instant::now() + Duration::from_secs(3);
    let normal = tokio::spawn(normal_client(client, until));
    let peak = tokio::spawn(peak_rss(server.pid(), until));

    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    let mut sender = h2_connection(server.grpc_port, builder).await;
    let request = grpc_request(
        server.grpc_port,
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    );
    sender = sender.ready().await.expect("ready");
    let (_response, stream) = sender
        .send_request(request, false)
        .expect("open the stream");
    let one = grpc_frame(
        &ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "envoy.service.ratelimit.v3.RateLimitService".to_string(),
            )),
        }
        .encode_to_vec(),
    );
    let requests = bytes::Bytes::from(one.repeat(18_000));
    let attack = tokio::spawn(send_as_window_allows(stream, requests));
    let peak = peak.await.expect("RSS sampler");
    normal
        .await
        .expect("normal client")
        .assert_served("a reflection stream with window 0");
    attack.abort();
    assert!(
        peak < rss_before + 32 * 1024,
        "RSS grew from {rss_before} KiB to {peak} KiB"
    );
}

/// Whether the server closes `stream` within `within`: a read sees the end or an error. Bytes
/// the server sends first (a 408, a GOAWAY) are read and skipped.
pub(super) async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// Writes `chunks` one every `pause` (stopping at the first error: the server closed).
async fn trickle(stream: &mut tokio::net::TcpStream, chunks: &[&[u8]], pause: Duration) {
    use tokio::io::AsyncWriteExt as _;
    for chunk in chunks {
        if stream.write_all(chunk).await.is_err() {
            return;
        }
        tokio::time::sleep(pause).await;
    }
}

/// Item 4. With a 1 s handshake timeout, 2 s idle and body timeouts and a cap of 200 connections
/// per peer: of 300 connections that never send the HTTP/2 preface, 100 are refused at once
/// (and counted in `slidegate_connections_refused_total`) and the rest closed within 3 s; an
/// HTTP request trickling a header line every 300 ms, an idle HTTP/1.1 keep-alive connection, a
/// body trickling a byte every 300 ms, an HTTP connection that sends nothing, an idle gRPC
/// connection and an idle HTTP/2 connection to the HTTP port (one request, then only the
/// keepalive PINGs it answers) are all closed within 4 s (before: all stayed open). The normal client, connected first, is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_closed_and_capped() {
    use tokio::io::AsyncWriteExt as _;
    let rules = Rules::new();
    let server = Slidegate::start_with_env(
        rules.path(),
        &[],
        &[
            ("SLIDEGATE_WORKERS", "1"),
            ("SLIDEGATE_HANDSHAKE_TIMEOUT", "1s"),
            ("SLIDEGATE_IDLE_TIMEOUT", "2s"),
            ("SLIDEGATE_BODY_TIMEOUT", "2s"),
            ("SLIDEGATE_MAX_CONNECTIONS_PER_PEER", "200"),
        ],
    );
    let client = server.client().await;
    let until = Instant::now() + Duration::from_secs(4);
    let normal = tokio::spawn(normal_client(client, until));

    let connect = |port: u16| async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect")
    };
    // The slow HTTP clients and the idle gRPC connection first, within the cap.
    let mut headers = connect(server.http_port).await;
    let slow_headers = async {
        let lines: &[&[u8]] = &[
            b"GET /healthcheck HTTP/1.1\r\n",
            b"Host: x\r\n",
            b"X-A: 1\r\n",
        ];
        let lines: Vec<&[u8]> = lines.iter().copied().cycle().take(20).collect();
        tokio::select! {
            () = trickle(&mut headers, &lines, Duration::from_millis(300)) => {}
            _ = tokio::time::sleep(Duration::from_secs(4)) => {}
        }
        closed_within(&mut headers, Duration::from_millis(100)).await
    };
    let mut keep_alive = connect(server.http_port).await;
    let idle_keep_alive = async {
        keep_alive
            .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("request");
        closed_within(&mut keep_alive, Duration::from_secs(4)).await
    };
    let mut body = connect(server.http_port).await;
    let slow_body = async {
        body.write_all(
            b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        )
        .await
        .expect("headers");
        let bytes: Vec<&[u8]> = std::iter::repeat_n(&b" "[..], 20).collect();
        tokio::select! {
            () = trickle(&mut body, &bytes, Duration::from_millis(300)) => {}
            _ = tokio::time::sleep(Duration::from_secs(4)) => {}
        }
        closed_within(&mut body, Duration::from_millis(100)).await
    };
    let mut silent_http = connect(server.http_port).await;
    let silent_http = closed_within(&mut silent_http, Duration::from_secs(4));
    // Connected before the flood below fills the cap, so the server's own goodbye (GOAWAY, a
    // clean end) is what closes them, not a refusal at accept.
    let grpc_io = connect(server.grpc_port).await;
    let http2_io = connect(server.http_port).await;
    // Spawned at once: their prefaces must not wait for the 300 connections below (a loaded
    // machine took longer than the 1 s handshake timeout to open them).
    let idle_grpc = tokio::spawn(async move {
        let (_sender, connection) = h2::client::handshake(grpc_io).await.expect("handshake");
        let ended = tokio::time::timeout(Duration::from_secs(4), connection).await;
        matches!(ended, Ok(Ok(())))
    });
    let idle_http2 = tokio::spawn(async move {
        let (sender, connection) = h2::client::handshake(http2_io).await.expect("handshake");
        let mut connection = std::pin::pin!(connection);
        // The client keeps a handle: h2 closes a client connection whose handles are all gone.
        let _keep = sender.clone();
        let request = async {
            let mut sender = sender.ready().await.expect("ready");
            let get = http::Request::get("http://x/healthcheck")
                .body(())
                .expect("request");
            let (response, _) = sender.send_request(get, true).expect("send");
            response.await.expect("response").status()
        };
        let status = tokio::select! {
            status = request => status,
            ended = connection.as_mut() => panic!("closed before the request was answered: {ended:?}"),
        };
        assert_eq!(status, 200, "GET /healthcheck over HTTP/2");
        let ended = tokio::time::timeout(Duration::from_secs(4), connection).await;
        matches!(ended, Ok(Ok(())))
    });
    // Then 300 connections that never send the preface.
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(connect(server.grpc_port).await);
    }
    let all_silent_closed = async {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut closed = 0;
        for stream in &mut silent {
            let left = deadline.saturating_duration_since(Instant::now());
            closed += usize::from(closed_within(stream, left).await);
        }
        closed
    };
    let (
        slow_headers,
        idle_keep_alive,
        slow_body,
        silent_http,
        (idle_grpc, idle_http2),
        silent_closed,
    ) = tokio::join!(
        slow_headers,
        idle_keep_alive,
        slow_body,
        silent_http,
        async {
            let (grpc, http2) = tokio::join!(idle_grpc, idle_http2);
            (
                grpc.expect("idle gRPC task"),
                http2.expect("idle HTTP/2 task"),
            )
        },
        all_silent_closed
    );
    normal
        .await
        .expect("normal client")
        .assert_served("slow and idle connections");
    assert_eq!(
        silent_closed, 300,
        "connections without a preface are closed"
    );
    assert!(slow_headers, "a request whose headers trickle is closed");
    assert!(idle_keep_alive, "an idle keep-alive connection is closed");
    assert!(slow_body, "a request whose body trickles is closed");
    assert!(
        silent_http,
        "an HTTP connection that sends nothing is closed"
    );
    assert!(idle_grpc, "an idle gRPC connection is closed");
    assert!(
        idle_http2,
        "an idle HTTP/2 connection to the HTTP port is closed"
    );
    let (_, metrics) = server.get("/metrics");
    let refused = crate::support::metric_value(
        &metrics,
        "slidegate_connections_refused_total{listener=\"grpc\",reason=\"max_connections_per_peer\"}",
    );
    assert!(refused >= 90.0, "refusals counted: {refused}\n{metrics}");
}

/// An HTTP/2 frame header and payload.
pub(super) fn h2_frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("small").to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    frame
}

/// Floods `frame` (after the preface and an empty SETTINGS) as fast as the connection takes it,
/// reading whatever comes back, for up to `within`: whether the server closed the connection.
pub(super) async fn flood(port: u16, frame: &[u8], within: Duration) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (mut read, mut write) = stream.into_split();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    start.extend(h2_frame(4, 0, &[]));
    let batch = frame.repeat(1000);
    let writer = async {
        if write.write_all(&start).await.is_err() {
            return;
        }
        while write.write_all(&batch).await.is_ok() {}
    };
    let closed = tokio::select! {
        () = writer => true,
        _ = reader => true,
        _ = tokio::time::sleep(within) => false,
    };
    closed
}

/// Item 5. A client that sends PINGs as fast as it can (reading the answers), and one that does
/// the same with SETTINGS, each for up to 3 s: each connection is closed within that time
/// (before: served without end, at the cost of the worker), and the normal client on the same
/// worker is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_frame_floods_close_the_connection() {
    let rules = Rules::new();
    let server = Slidegate::start_with_env(rules.path(), &[], &[("SLIDEGATE_WORKERS", "1")]);
    let client = server.client().await;
    let until = Instant::now() + Duration::from_secs(4);
    let normal = tokio::spawn(normal_client(client, until));
    let ping = h2_frame(6, 0, &[7; 8]);
    let settings = h2_frame(4, 0, &[0, 3, 0, 0, 0, 100]);
    let (pings, settings) = tokio::join!(
        flood(server.grpc_port, &ping, Duration::from_secs(3)),
        flood(server.grpc_port, &settings, Duration::from_secs(3)),
    );
    let http_pings = flood(server.http_port, &ping, Duration::from_secs(3)).await;
    normal
        .await
        .expect("normal client")
        .assert_served("PING and SETTINGS floods");
    assert!(pings, "a PING flood on the gRPC port is closed");
    assert!(settings, "a SETTINGS flood on the gRPC port is closed");
    assert!(http_pings, "a PING flood on the HTTP port is closed");
}

/// A call written by hand: method, content-type, extra headers and body as given. The HTTP
/// status, `grpc-status` and `grpc-accept-encoding` of the answer.
async fn raw_call(
    port: u16,
    method: &str,
    content_type: &str,
    extra: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, Option<String>, Option<String>) {
    let mut sender = h2_connection(port, h2::client::Builder::new()).await;
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{SHOULD_RATE_LIMIT}"))
        .header("content-type", content_type);
    for (name, value) in extra {
        builder = builder.header(*name, *value);
    }
    sender = sender.ready().await.expect("ready");
    let (response, mut stream) = sender
        .send_request(builder.body(()).expect("request"), false)
        .expect("send");
    let _ = stream.send_data(bytes::Bytes::from(body), true);
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("answered in time")
        .expect("answered");
    let (head, mut received) = response.into_parts();
    let text = |h: &http::HeaderMap, name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let mut status = text(&head.headers, "grpc-status");
    let accept = text(&head.headers, "grpc-accept-encoding");
    while let Some(Ok(_)) = received.data().await {}
    if let Ok(Some(trailers)) = received.trailers().await {
        status = status.or(text(&trailers, "grpc-status"));
    }
    (head.status.as_u16(), status, accept)
}

/// Item 6. As the gRPC spec has it: a content-type that is not gRPC gets HTTP 415, another
/// method 405, `application/grpc+json` UNIMPLEMENTED, a message flagged compressed without
/// `grpc-encoding` INTERNAL, and an unsupported `grpc-encoding` UNIMPLEMENTED with
/// `grpc-accept-encoding` (before: all answered as protobuf, or UNIMPLEMENTED alone). And 1,000
/// connections reset as soon as they are open write at most 2 warnings, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_checked_as_the_grpc_spec_says() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let port = server.grpc_port;
    let message = grpc_frame(&request(vec![descriptor(&[("plain", "spec")])]).encode_to_vec());
    let grpc = "application/grpc";
    assert_eq!(
        raw_call(port, "POST", "text/plain", &[], message.clone())
            .await
            .0,
        415
    );
    assert_eq!(
        raw_call(port, "GET", grpc, &[], message.clone()).await.0,
        405
    );
    let json = raw_call(port, "POST", "application/grpc+json", &[], message.clone()).await;
    assert_eq!(json.1.as_deref(), Some("12"), "{json:?}");
    let proto = raw_call(port, "POST", "application/grpc+proto", &[], message.clone()).await;
    assert_eq!(proto.1.as_deref(), Some("0"), "{proto:?}");
    let mut compressed = message.clone();
    compressed[0] = 1;
    let flagged = raw_call(port, "POST", grpc, &[], compressed.clone()).await;
    assert_eq!(flagged.1.as_deref(), Some("13"), "{flagged:?}");
    let gzip = raw_call(port, "POST", grpc, &[("grpc-encoding", "gzip")], compressed).await;
    assert_eq!(gzip.1.as_deref(), Some("12"), "{gzip:?}");
    assert_eq!(gzip.2.as_deref(), Some("identity"), "{gzip:?}");

    for port in [server.grpc_port, server.http_port] {
        for _ in 0..500 {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
            stream.set_zero_linger().expect("linger 0");
            drop(stream); // RST
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = server.log();
    let warnings = log.matches("cannot take over a connection").count();
    assert!(warnings <= 2, "{warnings} warnings for reset connections");
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "after")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

/// Item 6, shutdown. With a gRPC connection that never reads (so never answers the PING of a
/// graceful GOAWAY), an HTTP connection with half-sent headers and a call whose message never
/// ends: on SIGTERM with a 2 s drain timeout, the call is answered UNAVAILABLE before the drain
/// ends, the process exits 0 within 3 s, and it does not warn of calls still in flight (before:
/// the call's connection was dropped without a status, and the drain waited its full time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_answers_open_calls_and_is_not_held_by_idle_connections() {
    use tokio::io::AsyncWriteExt as _;
    let rules = Rules::new();
    let mut server = Slidegate::start_with_env(
        rules.path(),
        &["--drain-timeout", "2s"],
        &[("SLIDEGATE_BODY_TIMEOUT", "30s")],
    );
    let mut deaf = tokio::net::TcpStream::connect(("127.0.0.1", server.grpc_port))
        .await
        .expect("connect");
    let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    start.extend(h2_frame(4, 0, &[]));
    deaf.write_all(&start).await.expect("preface");
    let mut half_headers = tokio::net::TcpStream::connect(("127.0.0.1", server.http_port))
        .await
        .expect("connect");
    half_headers
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("half the headers");
    let mut sender = h2_connection(server.grpc_port, h2::client::Builder::new()).await;
    sender = sender.ready().await.expect("ready");
    let (response, mut stream) = sender
        .send_request(grpc_request(server.grpc_port, SHOULD_RATE_LIMIT), false)
        .expect("open a call");
    stream
        .send_data(bytes::Bytes::from_static(&[0, 0, 0, 1, 0]), false)
        .expect("half a message");
    tokio::time::sleep(Duration::from_millis(200)).await;

    server.signal("TERM");
    let answer = tokio::time::timeout(Duration::from_secs(3), response).await;
    let status = answer
        .ok()
        .and_then(Result::ok)
        .and_then(|r| r.headers().get("grpc-status").cloned());
    assert_eq!(
        status.as_ref().map(|s| s.as_bytes()),
        Some(&b"14"[..]),
        "the open call is answered UNAVAILABLE"
    );
    server.expect_clean_exit(Duration::from_secs(3));
    let log = server.log();
    assert!(!log.contains("still in flight"), "{log}");
    drop((deaf, half_headers, stream));
}
