//! `--response-metadata`: the decision in every `ShouldRateLimit` answer's dynamic metadata, which
//! Envoy keeps under `envoy.filters.http.ratelimit` for its access log, through the binary: the
//! overall code, the rule that decided (by name, or by path when unnamed) with its limit, window,
//! remaining and shadow flag, and each descriptor's; none without the flag. Under
//! envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA=true`, the fields it sends too: `domain`,
//! `descriptors[].entries`, `hitsAddend` and the YAML `metadata` of the descriptors that passed.

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

fn strings(fields: &Struct, name: &str) -> Vec<String> {
    match field(fields, name) {
        Some(Kind::ListValue(list)) => list
            .values
            .iter()
            .map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => s.clone(),
                other => panic!("{name}: {other:?}"),
            })
            .collect(),
        other => panic!("{name}: {other:?}"),
    }
}

/// The `descriptors` list, one map per descriptor of the request.
fn descriptors(metadata: &Struct) -> Vec<&Struct> {
    let Some(Kind::ListValue(list)) = field(metadata, "descriptors") else {
        panic!("descriptors: {metadata:?}");
    };
    list.values
        .iter()
        .map(|v| match &v.kind {
            Some(Kind::StructValue(s)) => s,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn structure<'a>(fields: &'a Struct, name: &str) -> &'a Struct {
    match field(fields, name) {
        Some(Kind::StructValue(s)) => s,
        other => panic!("{name}: {other:?} in {fields:?}"),
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
    let each = descriptors(&metadata);
    assert_eq!(each.len(), 4);
    assert_eq!(
        text(each[0], "rule"),
        Some("path_/login"),
        "unnamed: its path"
    );
    assert_eq!(text(each[0], "code"), Some("OK"));
    // Denied as a whole, the third call recorded nothing: 2 of 10 used.
    assert_eq!(number(each[0], "remaining"), Some(8.0));
    assert_eq!(text(each[1], "code"), Some("OVER_LIMIT"));
    assert_eq!(text(each[2], "rule"), Some("probe"));
    assert_eq!(field(each[2], "shadow"), Some(&Kind::BoolValue(true)));
    assert_eq!(
        each[3].fields.keys().collect::<Vec<_>>(),
        ["entries"],
        "no limit, no decision: {:?}",
        each[3]
    );
    assert_eq!(strings(each[3], "entries"), ["nothing=here"]);

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

const WITH_METADATA: &str = "domain: meta
descriptors:
  - key: team
    rate_limit: { unit: minute, requests_per_unit: 100 }
    metadata:
      owner: payments
      runbook: { url: https://runbooks/payments, severity: 2 }
      tags: [a, b]
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 1 }
    metadata:
      owner: identity
      denied_only: yes
  - key: region
    rate_limit: { unit: minute, requests_per_unit: 100 }
    metadata:
      owner: infra
      runbook: { oncall: infra-team, severity: 1 }
";

/// envoyproxy/ratelimit's environment turns the metadata on, with its fields: `domain`, each
/// descriptor's `entries` and own `hitsAddend`, the request's `hitsAddend`, and `metadata` merged
/// from the rules of the descriptors that passed (the first value of a name wins; maps merge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_fields_and_the_yaml_metadata_of_passed_rules() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), WITH_METADATA).expect("write rules");
    let server = Slidegate::start_with_env(
        rules.path(),
        &[],
        &[
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("USE_STATSD", "false"),
        ],
    );
    let mut client = server.client().await;
    let call = |hits: u32| {
        let mut user = descriptor(&[("user", "alice")]);
        user.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 });
        let mut request = request(
            "meta",
            vec![
                descriptor(&[("team", "pay")]),
                user,
                descriptor(&[("region", "eu")]),
                descriptor(&[("region", "eu"), ("zone", "a")]),
            ],
        );
        request.hits_addend = hits;
        request
    };
    let first = client
        .should_rate_limit(call(0))
        .await
        .expect("answer")
        .into_inner();
    let metadata = first.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text(&metadata, "domain"), Some("meta"), "{metadata:?}");
    assert_eq!(field(&metadata, "hitsAddend"), None, "0 is left out");
    let merged = structure(&metadata, "metadata");
    // All three passed: the first rule's owner wins, the runbook maps merge.
    assert_eq!(text(merged, "owner"), Some("payments"), "{merged:?}");
    assert_eq!(strings(merged, "tags"), ["a", "b"]);
    assert_eq!(text(merged, "denied_only"), Some("yes"));
    let runbook = structure(merged, "runbook");
    assert_eq!(text(runbook, "url"), Some("https://runbooks/payments"));
    assert_eq!(number(runbook, "severity"), Some(2.0), "first wins");
    assert_eq!(text(runbook, "oncall"), Some("infra-team"), "merged in");
    let each = descriptors(&metadata);
    assert_eq!(strings(each[0], "entries"), ["team=pay"]);
    assert_eq!(field(each[0], "hitsAddend"), None);
    assert_eq!(number(each[1], "hitsAddend"), Some(1.0));
    assert_eq!(strings(each[3], "entries"), ["region=eu", "zone=a"]);
    assert_eq!(field(each[3], "rule"), None, "no rule below `region`");

    // The second call is over per_user: its rule's metadata is not among the passed ones.
    let second = client
        .should_rate_limit(call(1))
        .await
        .expect("answer")
        .into_inner();
    let metadata = second.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(text(&metadata, "code"), Some("OVER_LIMIT"));
    assert_eq!(text(&metadata, "rule"), Some("per_user"));
    assert_eq!(number(&metadata, "hitsAddend"), Some(1.0));
    let merged = structure(&metadata, "metadata");
    assert_eq!(text(merged, "owner"), Some("payments"));
    assert_eq!(field(merged, "denied_only"), None, "{merged:?}");
}

/// Values come from clients: each is echoed in `entries` cut to 256 bytes, and an answer echoes
/// at most 16 KiB of entries, however long and many the request's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_entries_are_bounded() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &["--response-metadata"]);
    let long = "é".repeat(3000);
    let sent = (0..64)
        .map(|_| descriptor(&[("user", &long), ("b", &long)]))
        .collect();
    let answer = server
        .client()
        .await
        .should_rate_limit(request("meta", sent))
        .await
        .expect("answer")
        .into_inner();
    let metadata = answer.dynamic_metadata.expect("dynamic metadata");
    let each = descriptors(&metadata);
    assert_eq!(each.len(), 64, "every descriptor is listed");
    let mut echoed = 0;
    for descriptor in &each {
        for entry in strings(descriptor, "entries") {
            assert!(entry.len() <= "user=".len() + 256, "{} bytes", entry.len());
            echoed += entry.len();
        }
    }
    let first = &strings(each[0], "entries")[0];
    assert_eq!(
        first,
        &format!("user={}", "é".repeat(128)),
        "cut at a character"
    );
    assert!(echoed <= 16 * 1024, "{echoed} bytes echoed");
    assert!(echoed > 8 * 1024, "up to the bound: {echoed}");
}
