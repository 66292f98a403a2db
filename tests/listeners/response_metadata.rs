//! `--response-metadata`: the decision in every `ShouldRateLimit` answer's dynamic metadata, which
//! Envoy keeps under `envoy.filters.http.ratelimit` for its access log, through the binary: the
//! overall code, the rule that decided (by name, or by path when unnamed) with its limit, window,
//! remaining and shadow flag, and each descriptor's; none without the flag.

use envoy_types::pb::google::protobuf::Struct;
use envoy_types::pb::google::protobuf::value::Kind;

use crate::support::{Slidegate, descriptor, request};

const RULES: &str = "domain: meta
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 2 }
  - key: path
    value: /login
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: probe
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 0 }
";

fn field<'a>(fields: &'a Struct, name: &str) -> Option<&'a Kind> {
    fields.fields.get(name).and_then(|v| v.kind.as_ref())
}

fn text<'a>(fields: &'a Struct, name: &str) -> Option<&'a str> {
    match field(fields, name) {
        Some(Kind::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn number(fields: &Struct, name: &str) -> Option<f64> {
    match field(fields, name) {
        Some(Kind::NumberValue(n)) => Some(*n),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_name_the_rule_that_decided() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &["--response-metadata"]);
    let mut client = server.client().await;
    let call = || {
        request(
            "meta",
            vec![
                descriptor(&[("path", "/login")]),
                descriptor(&[("user", "alice")]),
                descriptor(&[("probe", "x")]),
                descriptor(&[("nothing", "here")]),
            ],
        )
    };
    let mut last = None;
    for _ in 0..3 {
        last = Some(
            client
                .should_rate_limit(call())
                .await
                .expect("answer")
                .into_inner(),
        );
    }
    let answer = last.expect("three answers");
    let metadata = answer.dynamic_metadata.expect("dynamic metadata");
    // The third call is over per_user's 2 per minute: it decided.
    assert_eq!(text(&metadata, "code"), Some("OVER_LIMIT"), "{metadata:?}");
    assert_eq!(text(&metadata, "rule"), Some("per_user"));
    assert_eq!(number(&metadata, "limit"), Some(2.0));
    assert_eq!(text(&metadata, "window"), Some("1m"));
    assert_eq!(number(&metadata, "remaining"), Some(0.0));
    assert_eq!(field(&metadata, "shadow"), Some(&Kind::BoolValue(false)));
    let Some(Kind::ListValue(list)) = field(&metadata, "descriptors") else {
        panic!("descriptors: {metadata:?}");
    };
    let each: Vec<Struct> = list
        .values
        .iter()
        .map(|v| match &v.kind {
            Some(Kind::StructValue(s)) => s.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(each.len(), 4);
    assert_eq!(
        text(&each[0], "rule"),
        Some("path_/login"),
        "unnamed: its path"
    );
    assert_eq!(text(&each[0], "code"), Some("OK"));
    // Denied as a whole, the third call recorded nothing: 2 of 10 used.
    assert_eq!(number(&each[0], "remaining"), Some(8.0));
    assert_eq!(text(&each[1], "code"), Some("OVER_LIMIT"));
    assert_eq!(text(&each[2], "rule"), Some("probe"));
    assert_eq!(field(&each[2], "shadow"), Some(&Kind::BoolValue(true)));
    assert!(each[3].fields.is_empty(), "no limit, no fields");

    // Without the flag the answers carry none.
    let plain = Slidegate::start(rules.path(), &[]);
    let answer = plain
        .client()
        .await
        .should_rate_limit(call())
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(answer.dynamic_metadata, None);
}
