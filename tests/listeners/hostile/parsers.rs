//! Property tests of every parser a client or an operator feeds: the YAML rule loader, the
//! descriptor matcher, the `/json` body parser, the `/check` header parser, and the limiter
//! behind them. They never panic, and every rejection is a clear, non-empty message.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use proptest::prelude::*;
use slidegate::config::{RuleSet, load_sources};
use slidegate::limiter::DecisionMetrics;
use slidegate::limiter::{LimitError, Options, RateLimiter, RequestLimits};
use slidegate::service::{check, json};
use slidegate::store::{ManualClock, MemoryStore};

use super::runner;

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
