//! Rule configuration: every validation case (by fixture), the matching table, metrics names,
//! the default rules, reloads on file changes and SIGHUP, and `slidegate check-config`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use proptest::prelude::*;
use slidegate::config::reload::{ConfigStatus, ReloadHook, ReloadOutcome, Reloader};
use slidegate::config::{LiveRules, Precision, RuleSet, Unit, load_path, load_sources};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

fn load_fixture(name: &str) -> RuleSet {
    let path = fixtures().join("good").join(name);
    load_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Each `bad/NAME.expected` holds a substring of the error that `bad/NAME.yaml` (or the directory
/// `bad/NAME/`) must produce.
#[test]
fn every_bad_fixture_fails_with_its_message() {
    let dir = fixtures().join("bad");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixture directory")
        .map(|e| e.expect("fixture entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "expected"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 40, "only {} bad fixtures found", cases.len());

    let mut failures = Vec::new();
    for expected_file in &cases {
        let name = expected_file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("name");
        let expected = std::fs::read_to_string(expected_file).expect("expected file");
        let expected = expected.trim();
        let file = dir.join(format!("{name}.yaml"));
        let path = if file.exists() { file } else { dir.join(name) };
        match load_path(&path) {
            Ok(_) => failures.push(format!(
                "{name}: loaded, expected an error with {expected:?}"
            )),
            Err(errors) => {
                let text = errors.to_string();
                if !text.contains(expected) {
                    failures.push(format!("{name}: expected {expected:?} in:\n{text}"));
                }
                for error in &errors.0 {
                    if !error.file.contains(name) {
                        failures.push(format!("{name}: error does not name the file: {error}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn yaml_syntax_errors_give_the_line() {
    let errors = load_path(&fixtures().join("bad/syntax.yaml")).expect_err("bad yaml");
    let text = errors.to_string();
    assert!(text.contains("syntax.yaml: "), "{text}");
    assert!(text.contains("line 5"), "{text}");
}

// ---- through the binary: check-config and serving ----

/// `slidegate check-config PATH`.
fn check_config(path: &Path) -> Output {
    crate::support::slidegate_command()
        .arg("check-config")
        .arg(path)
        .output()
        .expect("run slidegate check-config")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `needle` is in `haystack`, or a list of the missing ones.
fn assert_contains_all(haystack: &str, needles: &[&str]) {
    let missing: Vec<&&str> = needles.iter().filter(|n| !haystack.contains(**n)).collect();
    assert!(missing.is_empty(), "missing {missing:#?} in:\n{haystack}");
}

/// A one-descriptor request with `hits` hits (0: check without counting) on /json: the status's
/// code and its limit as `N UNIT` (`none` without one).
async fn decide(
    server: &crate::support::Slidegate,
    domain: &str,
    entries: &[(&str, &str)],
    hits: u64,
) -> (String, String) {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|(key, value)| serde_json::json!({"key": key, "value": value}))
        .collect();
    let body = serde_json::json!({
        "domain": domain,
        "descriptors": [{"entries": entries, "hitsAddend": hits}],
    });
    let answer = server.post_json(&body.to_string()).await;
    let status = &answer["statuses"][0];
    let limit = &status["currentLimit"];
    let limit = if limit.is_null() {
        "none".to_owned()
    } else {
        format!(
            "{} {}",
            limit["requestsPerUnit"],
            limit["unit"].as_str().unwrap_or("?")
        )
    };
    let code = status["code"].as_str().unwrap_or("?").to_owned();
    (code, limit)
}

/// YAML that envoyproxy/ratelimit's parser (yaml.v2, YAML 1.1) reads means the same here:
/// `check-config` accepts it and names each difference from a strict reading, and a server
/// applies the limits as envoyproxy/ratelimit would.
#[tokio::test]
async fn yaml_1_1_is_read_as_envoy_ratelimit_reads_it() {
    let file = fixtures().join("good/yaml11.yaml");
    let out = check_config(&file);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("OK: 7 rules in 1 domains"), "{out:?}");
    assert_contains_all(
        &stderr(&out),
        &[
            "warning: ",
            "yaml11.yaml: descriptors[0].rate_limit.requests_per_unit: `010` read as 8",
            "descriptors[1].rate_limit.<<: merge key",
            "descriptors[1].rate_limit.requests_per_unit: `1_000` read as 1000",
            "descriptors[2].shadow_mode: `yes` read as true",
            "descriptors[3].rate_limit: duplicate key: the last one is used",
            "descriptors[4].detailed_metric: `off` read as false",
            "descriptors[5].rate_limit.<<: merge key",
            "descriptors[6].rate_limit.requests_per_unit: set before `<<` and replaced",
            "more than one document",
        ],
    );

    let server = crate::support::Slidegate::start(&file, &[]);
    let limit = |key: &'static str| {
        let server = &server;
        async move { decide(server, "yaml11", &[(key, "x")], 0).await.1 }
    };
    assert_eq!(limit("octal").await, "8 MINUTE");
    assert_eq!(limit("merged").await, "1000 MINUTE");
    assert_eq!(limit("duplicated").await, "3 HOUR");
    assert_eq!(limit("first_merge_wins").await, "8 MINUTE");
    assert_eq!(limit("before_merge").await, "8 MINUTE");
    // Shadow mode: two hits against a limit of one are still allowed.
    let (code, _) = decide(&server, "yaml11", &[("shadowed", "x")], 2).await;
    assert_eq!(code, "OK");
    // The second document is not read: its domain is unknown.
    let (code, limit) = decide(&server, "second_document", &[("k", "x")], 2).await;
    assert_eq!((code.as_str(), limit.as_str()), ("OK", "none"));
    // The server logs the same warnings.
    let log = server.log();
    assert!(log.contains("`yes` read as true"), "{log}");
}

/// A file with several independent errors reports each of them in one run, not only the first.
#[test]
fn check_config_reports_every_error_of_a_file() {
    let out = check_config(&fixtures().join("bad/every_error.yaml"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_contains_all(
        &stderr(&out),
        &[
            "every_error.yaml: descriptors[0].rate_limit.requests_per_unit: missing \
             `requests_per_unit`",
            "every_error.yaml: descriptors[1].rate_limit.unit: unknown unit \"fortnight\"",
            "every_error.yaml: descriptors[2]: unknown field `ratelimit`",
        ],
    );
}

/// Which directory entries are read, as envoyproxy/ratelimit's loader reads them (every file,
/// dotfiles skipped), and a word for each one that is not: a subdirectory, a hidden file.
#[tokio::test]
async fn every_directory_entry_is_read_or_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rule = |domain: &str| format!("domain: {domain}\ndescriptors:\n  - key: k\n{RULE}");
    std::fs::write(dir.path().join("a.yaml"), rule("a")).expect("write");
    std::fs::write(dir.path().join("b.conf"), rule("b")).expect("write");
    std::fs::write(dir.path().join("d"), rule("d")).expect("write");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    std::fs::write(dir.path().join("sub/c.yaml"), rule("c")).expect("write");
    std::fs::write(dir.path().join(".e.yaml"), rule("e")).expect("write");
    std::fs::write(dir.path().join(".a.yaml.swp"), "garbage: [").expect("write");

    let out = check_config(dir.path());
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("OK: 3 rules in 3 domains"), "{out:?}");
    assert_contains_all(
        &stderr(&out),
        &[
            "sub: not read: a subdirectory",
            ".e.yaml: not read: the name starts with `.`",
            ".a.yaml.swp: not read",
        ],
    );

    let server = crate::support::Slidegate::start(dir.path(), &[]);
    for domain in ["a", "b", "d"] {
        let (code, limit) = decide(&server, domain, &[("k", "x")], 2).await;
        assert_eq!((code.as_str(), limit.as_str()), ("OVER_LIMIT", "1 SECOND"));
    }
    let (code, limit) = decide(&server, "c", &[("k", "x")], 2).await;
    assert_eq!((code.as_str(), limit.as_str()), ("OK", "none"));
    let log = server.log();
    assert!(log.contains("not read: a subdirectory"), "{log}");
}

/// An empty rule directory starts a server that answers OK to everything, as
/// envoyproxy/ratelimit does, and says so in its health check; rules that appear later apply.
#[tokio::test]
async fn an_empty_rule_directory_serves_without_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = check_config(dir.path());
    assert!(out.status.success(), "{out:?}");
    assert!(stderr(&out).contains("no rule files"), "{out:?}");

    let server = crate::support::Slidegate::start(dir.path(), &[]);
    let healthy = crate::support::wait_until(Duration::from_secs(10), || {
        server.get("/healthcheck") == (200, "OK: no rules loaded\n".to_owned())
    });
    assert!(
        healthy,
        "{:?}\n{}",
        server.get("/healthcheck"),
        server.log()
    );
    let (code, limit) = decide(&server, "late", &[("k", "x")], 2).await;
    assert_eq!((code.as_str(), limit.as_str()), ("OK", "none"));

    let rules = format!("domain: late\ndescriptors:\n  - key: k\n{RULE}");
    std::fs::write(dir.path().join("late.yaml"), rules).expect("write");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _) = decide(&server, "late", &[("k", "x")], 2).await;
        if code == "OVER_LIMIT" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rules never applied:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.get("/healthcheck"), (200, "OK\n".to_owned()));
}

/// Rules where envoyproxy/ratelimit's `key_value` joined matching and slidegate's separate
/// matching differ load, with a warning for each.
#[test]
fn check_config_warns_where_joined_matching_differs() {
    let out = check_config(&fixtures().join("good/joined_keys.yaml"));
    assert!(out.status.success(), "{out:?}");
    assert_contains_all(
        &stderr(&out),
        &[
            "joined_keys.yaml: descriptors[1]: key `user_id` is key `user` (at descriptors[0]) \
             plus `_id`",
            "joined_keys.yaml: descriptors[2].key: `*` in a key is a plain character here",
        ],
    );
    let out = check_config(&fixtures().join("good/matching.yaml"));
    assert!(out.status.success(), "{out:?}");
    assert!(!stderr(&out).contains("warning"), "{out:?}");
}

/// Flags on a descriptor without a limit act on nothing, and envoyproxy/ratelimit accepts them
/// (Envoy Gateway sets `shadow_mode` on every descriptor of a shadow rule's chain): they load,
/// with a warning, and the limits below them keep their own flags.
#[test]
fn check_config_warns_about_flags_without_a_limit() {
    let file = fixtures().join("good/flags_without_limit.yaml");
    let out = check_config(&file);
    assert!(out.status.success(), "{out:?}");
    let mut expected = Vec::new();
    for field in ["shadow_mode", "quota_mode", "detailed_metric"] {
        expected.push(format!(
            "flags_without_limit.yaml: descriptors[0].{field}: has no effect without `rate_limit`"
        ));
    }
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    assert_contains_all(&stderr(&out), &expected);
    let mut rules: Vec<String> = load_path(&file)
        .expect("loads")
        .rules()
        .iter()
        .map(|rule| rule.to_string())
        .collect();
    rules.sort();
    let file = file.display();
    assert_eq!(
        rules,
        [
            format!(
                "edge route_route.plan: 3 per MONTH (window 30days, exact) quota_mode [{file}]"
            ),
            format!("edge route_route.user: 2 per MINUTE (window 1m, exact) shadow_mode [{file}]"),
            format!("edge team: 1 per MONTH (window 30days, exact) quota_mode [{file}]"),
        ]
    );
}

/// Quota descriptors from a file: a request passes while any of its quota descriptors has room.
#[tokio::test]
async fn quota_descriptors_from_a_file_deny_when_every_one_is_over() {
    let file = fixtures().join("good/flags_without_limit.yaml");
    let server = crate::support::Slidegate::start(&file, &[]);
    let body = serde_json::json!({
        "domain": "edge",
        "descriptors": [
            {"entries": [{"key": "route", "value": "route"}, {"key": "plan", "value": "free"}]},
            {"entries": [{"key": "team", "value": "a"}]},
        ],
    });
    let mut seen = Vec::new();
    for _ in 0..4 {
        let answer = server.post_json(&body.to_string()).await;
        let codes = [
            &answer["overallCode"],
            &answer["statuses"][0]["code"],
            &answer["statuses"][1]["code"],
        ];
        seen.push(
            codes
                .map(|c| c.as_str().unwrap_or("?").to_owned())
                .join(" "),
        );
    }
    // `team` (1 per month) is over from the second request on, `plan` (3) from the fourth.
    assert_eq!(
        seen,
        [
            "OK OK OK",
            "OK OK OVER_LIMIT",
            "OK OK OVER_LIMIT",
            "OVER_LIMIT OVER_LIMIT OVER_LIMIT",
        ]
    );
}

/// Global quota mode (`--quota-mode`, envoyproxy/ratelimit's `QUOTA_MODE`) makes every limited
/// descriptor a quota descriptor: one over its limit reports OVER_LIMIT, the request still passes.
#[tokio::test]
async fn global_quota_mode_denies_only_when_every_descriptor_is_over() {
    let file = fixtures().join("good/matching.yaml");
    let body = serde_json::json!({
        "domain": "matching",
        "descriptors": [
            {"entries": [{"key": "path", "value": "/api/admin/x"}]},
            {"entries": [{"key": "method", "value": "POST"}]},
        ],
    })
    .to_string();
    let second_answer = |server: crate::support::Slidegate| {
        let body = body.clone();
        async move {
            server.post_json(&body).await;
            let a = server.post_json(&body).await;
            [
                &a["overallCode"],
                &a["statuses"][0]["code"],
                &a["statuses"][1]["code"],
            ]
            .map(|c| c.as_str().unwrap_or("?").to_owned())
            .join(" ")
        }
    };
    // `path` (1 per minute) is over on the second request, `method` (5 per second) is not.
    let plain = crate::support::Slidegate::start(&file, &[]);
    assert_eq!(second_answer(plain).await, "OVER_LIMIT OVER_LIMIT OK");
    let flag = crate::support::Slidegate::start(&file, &["--quota-mode"]);
    assert_eq!(second_answer(flag).await, "OK OVER_LIMIT OK");
    let env = crate::support::Slidegate::start_with_env(&file, &[], &[("QUOTA_MODE", "true")]);
    assert_eq!(second_answer(env).await, "OK OVER_LIMIT OK");
}

/// `WEEK` in a limit override, as a number on gRPC (7, the response's WEEK) and by name on /json.
#[tokio::test]
async fn week_in_limit_overrides() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;

    let server = crate::support::Slidegate::start(&fixtures().join("good/matching.yaml"), &[]);
    let mut descriptor = crate::support::descriptor(&[("method", "GET")]);
    descriptor.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: 7,
    });
    let request = crate::support::request("matching", vec![descriptor]);
    let response = server
        .client()
        .await
        .should_rate_limit(request)
        .await
        .expect("WEEK is a valid override unit")
        .into_inner();
    let limit = response.statuses[0].current_limit.clone().expect("a limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, ProtoUnit::Week as i32)
    );

    let body = serde_json::json!({
        "domain": "matching",
        "descriptors": [{
            "entries": [{"key": "method", "value": "GET"}],
            "limit": {"requestsPerUnit": 4, "unit": "WEEK"},
        }],
    });
    let answer = server.post_json(&body.to_string()).await;
    assert_eq!(
        answer["statuses"][0]["currentLimit"],
        serde_json::json!({"requestsPerUnit": 4, "unit": "WEEK"}),
        "{answer}"
    );
}

/// With `share_threshold`, `value_to_metric` and `detailed_metric` name the metric by the
/// pattern, as envoyproxy/ratelimit does: request values never become `rule` labels.
#[tokio::test]
async fn shared_wildcards_name_metrics_by_their_pattern() {
    let server = crate::support::Slidegate::start(&fixtures().join("good/matching.yaml"), &[]);
    for value in ["api/v1", "api/v2"] {
        let entries = [("shared_route", value), ("method", "GET")];
        decide(&server, "matching", &entries, 1).await;
    }
    for value in ["x1", "x2"] {
        decide(&server, "matching", &[("shared_detail", value)], 1).await;
    }
    let (status, metrics) = server.get("/metrics");
    assert_eq!(status, 200);
    assert_contains_all(
        &metrics,
        &[
            "rule=\"shared_route_api/*.method\"",
            "rule=\"shared_detail_x*\"",
        ],
    );
    for value in ["api/v1", "api/v2", "x1", "x2"] {
        assert!(!metrics.contains(value), "{value} in a label:\n{metrics}");
    }
}

#[test]
fn collects_every_error_of_every_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let two_errors = "domain: a\ndescriptors:\n  - key: ''\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
    std::fs::write(dir.path().join("a.yaml"), two_errors).expect("write");
    std::fs::write(
        dir.path().join("b.yml"),
        two_errors.replace("domain: a", "domain: b"),
    )
    .expect("write");
    std::fs::write(dir.path().join("c.yaml"), "domain: c\nfoo: 1\n").expect("write");
    let errors = load_path(dir.path()).expect_err("bad files").0;
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert_eq!(
        errors.iter().filter(|e| e.file.ends_with("a.yaml")).count(),
        2
    );
    assert_eq!(
        errors.iter().filter(|e| e.file.ends_with("b.yml")).count(),
        2
    );
    assert_eq!(
        errors.iter().filter(|e| e.file.ends_with("c.yaml")).count(),
        1
    );
}

#[test]
fn empty_directory_is_no_rules_and_missing_paths_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = load_path(dir.path()).expect("an empty directory loads");
    assert_eq!(rules.rule_count(), 0);
    assert!(rules.domain_names().is_empty());

    let missing = dir.path().join("nope.yaml");
    let text = load_path(&missing).expect_err("missing").to_string();
    assert!(text.contains("nope.yaml: cannot read"), "{text}");

    assert_eq!(load_sources(&[]).expect("no sources").rule_count(), 0);
}

#[test]
fn envoy_ratelimit_files_load_unchanged() {
    let rules = load_fixture("envoy_ratelimit.yaml");
    let domain = rules.domain("mongo_cps").expect("domain");
    // A numeric value in YAML is a string value, as in envoyproxy/ratelimit.
    let m = domain
        .match_entries(&[("to_number", "2061111111"), ("message_type", "x")])
        .expect("match");
    assert!(m.rule.unlimited);
    let m = domain
        .match_entries(&[("remote_address", "1.2.3.4")])
        .expect("match");
    assert_eq!(m.rule.limits[0].unit, Unit::Hour);
    assert_eq!(rules.rule_count(), 7);
}

/// The request's entries, or the counter entries of a match.
type Entries = &'static [(&'static str, &'static str)];

/// What a row must match: the rule's stats name (name or path), the counter entries, and the
/// windows in seconds.
type Expected = (&'static str, Entries, &'static [u64]);

/// One row of the matching table: the request's entries and what must match (`None`: no rule).
struct Row {
    entries: Entries,
    expect: Option<Expected>,
}

const fn row(entries: Entries, expect: Option<Expected>) -> Row {
    Row { entries, expect }
}

#[test]
fn matching_table() {
    let rules = load_fixture("matching.yaml");
    let domain = rules.domain("matching").expect("domain");
    let table = [
        // Exact value, and the key-only default for any other value.
        row(
            &[("method", "GET")],
            Some(("method_GET", &[("method", "GET")], &[1])),
        ),
        row(
            &[("method", "POST")],
            Some(("method", &[("method", "POST")], &[1])),
        ),
        row(&[("method", "")], Some(("method", &[("method", "")], &[1]))),
        // Wildcards: prefix, first match wins, suffix, middle, exact beats wildcard.
        row(
            &[("path", "/api/users")],
            Some(("path_/api/*", &[("path", "/api/users")], &[60])),
        ),
        row(
            &[("path", "/api/")],
            Some(("path_/api/*", &[("path", "/api/")], &[60])),
        ),
        row(
            &[("path", "/api/admin/x")],
            Some(("path_/api/admin/*", &[("path", "/api/admin/x")], &[60])),
        ),
        row(
            &[("path", "/img/a.png")],
            Some(("path_*.png", &[("path", "/img/a.png")], &[60])),
        ),
        row(
            &[("path", "/api/a.png")],
            Some(("path_/api/*", &[("path", "/api/a.png")], &[60])),
        ),
        row(
            &[("path", "/users/42/avatar")],
            Some((
                "path_/users/*/avatar",
                &[("path", "/users/42/avatar")],
                &[60],
            )),
        ),
        row(&[("path", "/users/42/avatar/x")], None),
        row(
            &[("path", "/api/health")],
            Some(("path_/api/health", &[("path", "/api/health")], &[])),
        ),
        row(&[("path", "/other")], None),
        // share_threshold: every matching value counts into one counter, named by the pattern.
        row(
            &[("path", "/shared/a")],
            Some(("path_/shared/*", &[("path", "/shared/*")], &[3600])),
        ),
        row(
            &[("path", "/shared/b")],
            Some(("path_/shared/*", &[("path", "/shared/*")], &[3600])),
        ),
        row(
            &[("org", "team-red"), ("user", "bob")],
            Some((
                "org_team-*.user",
                &[("org", "team-*"), ("user", "bob")],
                &[60],
            )),
        ),
        row(&[("org", "other"), ("user", "bob")], None),
        // Depth must match exactly.
        row(&[("user_id", "bob")], None),
        row(
            &[("user_id", "bob"), ("path", "/login")],
            Some((
                "login_per_user",
                &[("user_id", "bob"), ("path", "/login")],
                &[60],
            )),
        ),
        row(
            &[("user_id", "bob"), ("path", "/cart")],
            Some((
                "per_user_path",
                &[("user_id", "bob"), ("path", "/cart")],
                &[30],
            )),
        ),
        row(
            &[("user_id", "bob"), ("path", "/cart"), ("method", "GET")],
            None,
        ),
        row(&[("remote_address", "1.2.3.4"), ("path", "/cart")], None),
        row(&[("path", "/cart"), ("user_id", "bob")], None),
        // unlimited for one value, a limit for the others.
        row(
            &[("remote_address", "10.0.0.1")],
            Some((
                "remote_address_10.0.0.1",
                &[("remote_address", "10.0.0.1")],
                &[],
            )),
        ),
        row(
            &[("remote_address", "10.0.0.2")],
            Some(("remote_address", &[("remote_address", "10.0.0.2")], &[60])),
        ),
        // Several limits on one descriptor.
        row(
            &[("client", "c1")],
            Some(("client_burst_and_sustained", &[("client", "c1")], &[1, 300])),
        ),
        // Unknown keys and empty descriptors match nothing.
        row(&[("nope", "x")], None),
        row(&[], None),
    ];
    let mut failures = Vec::new();
    for (i, row) in table.iter().enumerate() {
        let got = domain.match_entries(row.entries).map(|m| {
            let windows: Vec<u64> = m.rule.limits.iter().map(|l| l.window().as_secs()).collect();
            (
                m.rule.stats_name().to_owned(),
                m.counter_entries.to_vec(),
                windows,
            )
        });
        let want = row
            .expect
            .map(|(name, counter, windows)| (name.to_owned(), counter.to_vec(), windows.to_vec()));
        if got != want {
            failures.push(format!(
                "row {i} {:?}: got {got:?}, want {want:?}",
                row.entries
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unknown_domain_is_none() {
    let rules = load_fixture("matching.yaml");
    assert!(rules.domain("other").is_none());
    assert!(rules.domain("").is_none());
}

#[test]
fn rule_flags_are_exposed() {
    let rules = load_fixture("matching.yaml");
    let domain = rules.domain("matching").expect("domain");
    let gold = domain.match_entries(&[("tier", "gold")]).expect("gold");
    assert_eq!(gold.rule.name.as_deref(), Some("gold"));
    assert_eq!(gold.rule.replaces, ["per_user_path"]);
    let per_user = domain
        .match_entries(&[("user_id", "u"), ("path", "/x")])
        .expect("per_user_path");
    assert_eq!(per_user.rule.name.as_deref(), Some("per_user_path"));
    assert_eq!(per_user.rule.limits[0].unit, Unit::Second);
    assert_eq!(per_user.rule.limits[0].unit_multiplier, 30);
    assert_eq!(per_user.rule.limits[0].requests_per_unit, 2);
    let shadow = domain.match_entries(&[("shadow", "s")]).expect("shadow");
    assert!(shadow.rule.shadow_mode);
    assert_eq!(
        shadow.rule.limits[0].window(),
        Duration::from_secs(7 * 86_400)
    );
    assert!(!per_user.rule.shadow_mode);
    let unlimited = domain
        .match_entries(&[("remote_address", "10.0.0.1")])
        .expect("unlimited");
    assert!(unlimited.rule.unlimited && unlimited.rule.limits.is_empty());
    assert!(unlimited.rule.source.ends_with("matching.yaml"));
}

#[test]
fn stats_names() {
    let rules = load_fixture("matching.yaml");
    let domain = rules.domain("matching").expect("domain");
    let name = |entries: &[(&str, &str)]| {
        domain
            .match_entries(entries)
            .map(|m| m.stats_name.into_owned())
            .unwrap_or_else(|| panic!("no match for {entries:?}"))
    };
    // Plain: the static path, without runtime values.
    assert_eq!(name(&[("method", "GET")]), "method_GET");
    assert_eq!(name(&[("method", "DELETE")]), "method");
    assert_eq!(name(&[("path", "/api/users/7")]), "path_/api/*");
    // Named.
    assert_eq!(
        name(&[("user_id", "bob"), ("path", "/login")]),
        "login_per_user"
    );
    // detailed_metric: the request's entries.
    assert_eq!(name(&[("detailed", "abc")]), "detailed_abc");
    // value_to_metric: runtime values where asked, static parts elsewhere.
    assert_eq!(
        name(&[
            ("route", "api/v1"),
            ("method", "GET"),
            ("subject_id", "123")
        ]),
        "route_api/v1.method_GET.subject_id"
    );
    assert_eq!(name(&[("tenant", "acme-corp")]), "tenant_acme-corp");
    // share_threshold: the pattern, never the request's value.
    assert_eq!(
        name(&[("shared_route", "api/v1"), ("method", "GET")]),
        "shared_route_api/*.method"
    );
    assert_eq!(name(&[("shared_detail", "xyz")]), "shared_detail_x*");
}

#[test]
fn rule_lines_for_rlconfig() {
    let rules = load_fixture("matching.yaml");
    let lines: Vec<String> = rules.rules().iter().map(|r| r.to_string()).collect();
    assert_eq!(lines.len(), rules.rule_count());
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted, "rules() is sorted by domain then path");
    let find = |prefix: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in {lines:#?}"))
            .clone()
    };
    let line = find("matching user_id.path: ");
    assert!(
        line.contains("2 per 30 SECOND (window 30s, exact)"),
        "{line}"
    );
    assert!(line.contains("name=per_user_path"), "{line}");
    assert!(line.contains("matching.yaml]"), "{line}");
    let line = find("matching client: ");
    assert!(
        line.contains(
            "5 per SECOND (window 1s, exact), \
             100 per 5 MINUTE (window 5m, exact, name=client_burst_and_sustained)"
        ),
        "{line}"
    );
    assert!(find("matching tier_gold: ").contains("replaces=per_user_path"));
    assert!(find("matching shadow: ").contains(" shadow_mode"));
    assert!(find("matching remote_address_10.0.0.1: ").contains("unlimited"));
}

/// The default rules that `cargo run` serves, and that the examples are written against.
#[test]
fn default_config_directory_loads() {
    let rules = load_path(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config"))
        .unwrap_or_else(|e| panic!("config/: {e}"));
    assert_eq!(rules.domain_names(), ["edge"]);
    assert_eq!(rules.rule_count(), 6);
    let edge = rules.domain("edge").expect("edge");
    let check = |entries: &[(&str, &str)], stats: &str, windows: &[(u64, u64)]| {
        let m = edge
            .match_entries(entries)
            .unwrap_or_else(|| panic!("no match for {entries:?}"));
        assert_eq!(m.stats_name, stats, "{entries:?}");
        let got: Vec<(u64, u64)> = m
            .rule
            .limits
            .iter()
            .map(|l| (l.requests_per_unit, l.window().as_secs()))
            .collect();
        assert_eq!(got, windows, "{entries:?}");
        m.rule.shadow_mode
    };
    assert!(!check(
        &[("remote_address", "10.1.2.3")],
        "remote_address",
        &[(1000, 60)]
    ));
    assert!(!check(
        &[("user_id", "u1"), ("path", "/login")],
        "login_per_user",
        &[(100, 60)]
    ));
    assert!(!check(
        &[("user_id", "u1"), ("path", "/cart")],
        "per_user_path",
        &[(2, 30)]
    ));
    assert!(!check(
        &[("path", "/api/orders")],
        "path_/api/*",
        &[(50, 1), (1000, 300)]
    ));
    assert!(check(&[("plan", "free")], "plan_free", &[(10, 60)]));
    assert!(!check(
        &[("api_key", "k1")],
        "api_key_per_second",
        &[(100, 1), (1_000_000, 86_400)]
    ));
    assert!(edge.match_entries(&[("plan", "pro")]).is_none());
    assert!(edge.match_entries(&[("user_id", "u1")]).is_none());
}

/// `slidegate check-config` (main.rs) on the default rules and on a bad fixture.
#[test]
fn check_config_command() {
    let bin = env!("CARGO_BIN_EXE_slidegate");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(bin)
        .args(["check-config", "config/"])
        .current_dir(root)
        .output()
        .expect("run slidegate");
    assert!(out.status.success(), "{out:?}");
    // Every limit with its representation, as chosen when `precision` is not given.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("edge remote_address: 1000 per MINUTE (window 1m, buckets of 1s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("100 per MINUTE (window 1m, exact) name=login_per_user"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1000000 per DAY (window 1day, buckets of 24m, name=api_key_per_day)"),
        "{stdout}"
    );

    let out = Command::new(bin)
        .arg("check-config")
        .arg(fixtures().join("bad/unknown_key_ratelimit.yaml"))
        .output()
        .expect("run slidegate");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown_key_ratelimit.yaml: descriptors[0]: unknown field `ratelimit`"),
        "{stderr}"
    );
}

// ---- precision ----

/// The precisions of the limits of the only rule of `yaml`.
fn precisions(yaml: &str) -> Vec<Precision> {
    let set = load_sources(&[("p.yaml".to_owned(), yaml.to_owned())]).expect("loads");
    let rules = set.rules();
    assert_eq!(rules.len(), 1);
    rules[0].limits.iter().map(|l| l.precision).collect()
}

/// `precision: exact` or a bucket width; without it the log for small limits (up to 128 hits per
/// window) and sixtieths (fiftieths for windows a sixtieth cannot split) above.
#[test]
fn precision_is_given_or_chosen_per_limit() {
    let given = precisions(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n\
         \x20     - {unit: minute, requests_per_unit: 100000, precision: exact}\n\
         \x20     - {unit: day, requests_per_unit: 10, precision: 1h}\n\
         \x20     - {unit: second, unit_multiplier: 30, requests_per_unit: 5, precision: 500ms}\n",
    );
    let secs = Duration::from_secs;
    assert_eq!(
        given,
        [
            Precision::Exact,
            Precision::Buckets(secs(3600)),
            Precision::Buckets(Duration::from_millis(500)),
        ]
    );
    let chosen = precisions(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n\
         \x20     - {unit: minute, requests_per_unit: 100}\n\
         \x20     - {unit: hour, requests_per_unit: 128}\n\
         \x20     - {unit: hour, unit_multiplier: 2, requests_per_unit: 129}\n\
         \x20     - {unit: day, requests_per_unit: 10000000}\n\
         \x20     - {unit: second, requests_per_unit: 1000}\n",
    );
    assert_eq!(
        chosen,
        [
            Precision::Exact,
            Precision::Exact,
            Precision::Buckets(secs(120)),
            Precision::Buckets(secs(1440)),
            Precision::Buckets(Duration::from_millis(20)),
        ]
    );
}

/// `precision` is a field of the YAML reader like any other: taken from a merge key (`<<`), and
/// overridden by the map that merges it.
#[test]
fn precision_merges_like_any_limit_field() {
    let merged = precisions(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n\
         \x20     - &day {unit: day, requests_per_unit: 1000, precision: 1h}\n\
         \x20     - {<<: *day, unit: hour, precision: 1m}\n\
         \x20     - {<<: *day, unit: minute, precision: exact}\n",
    );
    let secs = Duration::from_secs;
    assert_eq!(
        merged,
        [
            Precision::Buckets(secs(3600)),
            Precision::Buckets(secs(60)),
            Precision::Exact,
        ]
    );
    let inherited = precisions(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n\
         \x20     - &day {unit: day, requests_per_unit: 1000, precision: 1h}\n\
         \x20     - {<<: *day, unit: week}\n",
    );
    assert_eq!(
        inherited,
        [
            Precision::Buckets(secs(3600)),
            Precision::Buckets(secs(3600))
        ]
    );
}

// ---- reloads ----

/// Reload tests install SIGHUP handlers and one sends SIGHUP to this process: run them one at
/// a time, so that a forced reload never lands in another test's count.
static RELOAD_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const RULE: &str = "    rate_limit: {unit: second, requests_per_unit: 1}\n";

fn domain_file(domain: &str, keys: &[&str]) -> String {
    let mut text = format!("domain: {domain}\ndescriptors:\n");
    for key in keys {
        text.push_str(&format!("  - key: {key}\n{RULE}"));
    }
    text
}

/// Records every reload attempt.
#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<Vec<ReloadOutcome>>>);

impl Attempts {
    fn hook(&self) -> ReloadHook {
        let attempts = self.0.clone();
        Arc::new(move |outcome: &ReloadOutcome, _: &ConfigStatus| {
            attempts.lock().expect("lock").push(outcome.clone());
        })
    }

    fn len(&self) -> usize {
        self.0.lock().expect("lock").len()
    }

    fn failures(&self) -> Vec<String> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .filter_map(|o| match o {
                ReloadOutcome::Failed(e) => Some(e.to_string()),
                ReloadOutcome::Loaded { .. } => None,
            })
            .collect()
    }
}

/// Polls `condition` every 20 ms for up to 10 s (tolerant of slow machines; passes as soon as
/// the condition holds).
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The SIGHUP stream a reloader listens to.
fn hangup() -> tokio::signal::unix::Signal {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).expect("SIGHUP handler")
}

fn live_from(path: &Path) -> LiveRules {
    Arc::new(ArcSwap::from_pointee(
        load_path(path).expect("initial rules"),
    ))
}

#[tokio::test]
async fn watched_directory_reloads_good_changes_and_keeps_rules_on_bad_ones() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    std::fs::write(&a, domain_file("one", &["k1"])).expect("write");
    let live = live_from(dir.path());
    let attempts = Attempts::default();
    let reloader = Reloader::spawn(
        dir.path().to_owned(),
        live.clone(),
        attempts.hook(),
        hangup(),
    )
    .expect("spawn reloader");

    // A good change goes live.
    std::fs::write(&a, domain_file("one", &["k1", "k2"])).expect("write");
    wait_for("two rules", || live.load().rule_count() == 2).await;

    // A broken change is reported and the previous rules stay.
    std::fs::write(
        &a,
        "domain: one\ndescriptors:\n  - key: k1\n    ratelimit: {}\n",
    )
    .expect("write");
    let broken = "a.yaml: descriptors[0]: unknown field `ratelimit`";
    let reported = || {
        attempts
            .failures()
            .iter()
            .filter(|f| f.contains(broken))
            .count()
    };
    wait_for("a failed reload", || reported() >= 1).await;
    assert_eq!(live.load().rule_count(), 2);

    // All or nothing: a new good file does not go live while another file is broken.
    std::fs::write(dir.path().join("b.yaml"), domain_file("two", &["x"])).expect("write");
    wait_for("a second failed reload", || reported() >= 2).await;
    assert!(live.load().domain("two").is_none());
    assert!(matches!(
        reloader.reload_now().await,
        ReloadOutcome::Failed(_)
    ));
    assert_eq!(live.load().rule_count(), 2);

    // Fixing the broken file brings both in.
    std::fs::write(&a, domain_file("one", &["k1"])).expect("write");
    wait_for("both domains", || live.load().domain("two").is_some()).await;
    assert_eq!(live.load().rule_count(), 2);
    assert!(live.load().domain("one").is_some());

    // Dropping the reloader stops watching.
    drop(reloader);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = attempts.len();
    std::fs::write(&a, domain_file("one", &["k1", "k2", "k3"])).expect("write");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(attempts.len(), before);
    assert_eq!(live.load().rule_count(), 2);
}

#[tokio::test]
async fn watched_file_reloads_on_replace_by_rename_and_ignores_unrelated_files() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, domain_file("one", &["k1"])).expect("write");
    let live = live_from(&file);
    let attempts = Attempts::default();
    let _reloader = Reloader::spawn(file.clone(), live.clone(), attempts.hook(), hangup())
        .expect("spawn reloader");

    // Unrelated files next to the rule file do not cause reload attempts.
    std::fs::write(dir.path().join("other.txt"), "hello").expect("write");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(attempts.len(), 0);

    // An editor-style save: write a temporary file, rename it over the rule file.
    let tmp = dir.path().join(".rules.yaml.tmp");
    std::fs::write(&tmp, domain_file("one", &["k1", "k2", "k3"])).expect("write");
    std::fs::rename(&tmp, &file).expect("rename");
    wait_for("three rules", || live.load().rule_count() == 3).await;
    assert_eq!(attempts.len(), 1);
}

#[tokio::test]
async fn sighup_forces_a_reload() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), domain_file("one", &["k1"])).expect("write");
    let live = live_from(dir.path());
    let before = live.load_full();
    let attempts = Attempts::default();
    let _reloader = Reloader::spawn(
        dir.path().to_owned(),
        live.clone(),
        attempts.hook(),
        hangup(),
    )
    .expect("spawn reloader");

    // The files are unchanged, so only SIGHUP can cause this reload. The Reloader's handler is
    // installed, so the signal does not terminate the test process.
    let status = Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    wait_for("a reload after SIGHUP", || attempts.len() == 1).await;
    assert!(attempts.failures().is_empty());
    assert!(
        !Arc::ptr_eq(&before, &live.load_full()),
        "a new rule set is live"
    );
}

#[tokio::test]
async fn reload_now_reports_the_outcome() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), domain_file("one", &["k1", "k2"])).expect("write");
    let live = live_from(dir.path());
    let before = live.load_full();
    let hooked = Arc::new(AtomicUsize::new(0));
    let counter = hooked.clone();
    let hook: ReloadHook = Arc::new(move |_: &ReloadOutcome, status: &ConfigStatus| {
        assert!(!status.is_stale());
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let reloader =
        Reloader::spawn(dir.path().to_owned(), live.clone(), hook, hangup()).expect("spawn");
    assert!(matches!(
        reloader.reload_now().await,
        ReloadOutcome::Loaded { rules: 2 }
    ));
    assert!(!Arc::ptr_eq(&before, &live.load_full()));
    assert_eq!(hooked.load(Ordering::SeqCst), 1);
    assert_eq!(reloader.path(), dir.path());
    assert_eq!(reloader.status().load().served, live.load().checksum());
}

// ---- never panic ----

/// Fragments that look like rule files, so random inputs get past the YAML parser and reach the
/// validation code, not only its syntax errors.
fn yamlish() -> impl Strategy<Value = String> {
    let fragment = prop::sample::select(vec![
        "domain: d",
        "domain: ''",
        "descriptors:",
        "- key: k",
        "  - key: k",
        "    - key: path",
        "  value: '/a/*'",
        "    value: x",
        "    value: '*'",
        "  share_threshold: true",
        "    shadow_mode: true",
        "  detailed_metric: true",
        "  value_to_metric: true",
        "  rate_limit:",
        "    rate_limit: {unit: second, requests_per_unit: 1}",
        "  rate_limits: [{unit: minute, requests_per_unit: 2}, {unit: hour, requests_per_unit: 3}]",
        "    unit: SeCoNd",
        "      unit: fortnight",
        "    requests_per_unit: -1",
        "      requests_per_unit: 18446744073709551615",
        "    unit_multiplier: 0",
        "      unit_multiplier: 99999999999",
        "    unlimited: true",
        "    name: n",
        "    replaces: [{name: n}]",
        "      replaces: [{name: ''}]",
        "  descriptors:",
        "  descriptors: []",
        "? [a]",
        ": b",
        "&a x: *a",
        "---",
        "[",
        "\t",
        "",
    ]);
    prop::collection::vec(fragment, 0..24).prop_map(|lines| lines.join("\n"))
}

proptest! {
    #[test]
    fn loader_never_panics_on_random_text(text in "\\PC{0,200}") {
        let _ = load_sources(&[("random.yaml".to_owned(), text)]);
    }

    #[test]
    fn loader_never_panics_on_yamlish_text(text in yamlish()) {
        match load_sources(&[("random.yaml".to_owned(), text)]) {
            Ok(rules) => {
                for rule in rules.rules() {
                    let _ = rule.to_string();
                }
            }
            Err(errors) => {
                prop_assert!(!errors.0.is_empty());
                prop_assert!(errors.0.iter().all(|e| e.file == "random.yaml"));
            }
        }
    }

    #[test]
    fn matcher_never_panics_and_keeps_keys(
        entries in prop::collection::vec(
            (
                prop::sample::select(vec!["method", "path", "user_id", "org", "user", "route",
                    "subject_id", "tenant", "detailed", "client", "x", ""]),
                prop_oneof![
                    prop::sample::select(vec!["GET", "/api/", "/api/admin/x", "/shared/q",
                        "team-1", "acme-", "/users/1/avatar", "a.png", "*", "", "/login"])
                        .prop_map(str::to_owned),
                    "\\PC{0,12}",
                ],
            ),
            0..5,
        )
    ) {
        static RULES: OnceLock<RuleSet> = OnceLock::new();
        let rules = RULES.get_or_init(|| load_fixture("matching.yaml"));
        let domain = rules.domain("matching").expect("domain");
        let entries: Vec<(&str, &str)> =
            entries.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if let Some(m) = domain.match_entries(&entries) {
            prop_assert_eq!(m.counter_entries.len(), entries.len());
            for (counter, request) in m.counter_entries.iter().zip(&entries) {
                prop_assert_eq!(counter.0, request.0);
            }
            prop_assert!(!m.stats_name.is_empty());
        }
    }
}

// ---- the bundled protos ----

/// The protos under `proto/` (served by gRPC reflection) against envoy-types, Envoy's current API:
/// every enum value by name and number both ways, and every field of the RateLimitService
/// messages: a message with every field set, encoded by envoy-types, decodes with the bundled
/// descriptors without an unknown field and encodes back to the same message.
#[test]
fn bundled_protos_match_envoy_types() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        Code, RateLimit, rate_limit::Unit,
    };
    use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
    use prost::Message;
    use prost_reflect::{DescriptorPool, DynamicMessage};

    let pool = DescriptorPool::decode(slidegate::service::rls::FILE_DESCRIPTOR_SET)
        .expect("the reflection descriptor set");
    let check_enum = |name: &str, by_name: &dyn Fn(&str) -> Option<i32>, names: &[(i32, &str)]| {
        let bundled = pool
            .get_enum_by_name(name)
            .unwrap_or_else(|| panic!("no {name} in proto/"));
        for value in bundled.values() {
            assert_eq!(
                by_name(value.name()),
                Some(value.number()),
                "{name}.{}",
                value.name()
            );
        }
        for (number, envoy_name) in names {
            let value = bundled.get_value(*number);
            assert_eq!(
                value.map(|v| v.name().to_owned()).as_deref(),
                Some(*envoy_name),
                "{name} {number}"
            );
        }
        assert_eq!(bundled.values().count(), names.len(), "{name}: values");
    };
    let every = |f: &dyn Fn(i32) -> Option<&'static str>| -> Vec<(i32, &'static str)> {
        (0..64).filter_map(|n| f(n).map(|name| (n, name))).collect()
    };
    check_enum(
        "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
        &|s| Unit::from_str_name(s).map(|u| u as i32),
        &every(&|n| Unit::try_from(n).ok().map(|u| u.as_str_name())),
    );
    check_enum(
        "envoy.service.ratelimit.v3.RateLimitResponse.Code",
        &|s| Code::from_str_name(s).map(|c| c as i32),
        &every(&|n| Code::try_from(n).ok().map(|c| c.as_str_name())),
    );
    check_enum(
        "envoy.type.v3.RateLimitUnit",
        &|s| RateLimitUnit::from_str_name(s).map(|u| u as i32),
        &every(&|n| RateLimitUnit::try_from(n).ok().map(|u| u.as_str_name())),
    );

    fn no_unknown_fields(message: &DynamicMessage, at: &str) {
        assert_eq!(
            message.unknown_fields().count(),
            0,
            "unknown fields in {at}"
        );
        for (field, value) in message.fields() {
            let at = format!("{at}.{}", field.name());
            match value {
                prost_reflect::Value::Message(inner) => no_unknown_fields(inner, &at),
                prost_reflect::Value::List(items) => {
                    for item in items {
                        if let prost_reflect::Value::Message(inner) = item {
                            no_unknown_fields(inner, &at);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(
        pool: &DescriptorPool,
        name: &str,
        message: &M,
    ) {
        let descriptor = pool
            .get_message_by_name(name)
            .unwrap_or_else(|| panic!("no {name} in proto/"));
        let dynamic =
            DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice()).expect(name);
        no_unknown_fields(&dynamic, name);
        let back = M::decode(dynamic.encode_to_vec().as_slice()).expect(name);
        assert_eq!(&back, message, "{name} through proto/");
    }

    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus, Quota, quota::ExpirationSpecifier,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use envoy_types::pb::google::protobuf::{
        Duration as ProtoDuration, Struct, Timestamp, UInt64Value, Value, value::Kind,
    };

    let request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            limit: Some(RateLimitOverride {
                requests_per_unit: 5,
                unit: RateLimitUnit::Year as i32,
            }),
            hits_addend: Some(UInt64Value { value: 2 }),
            is_negative_hits: true,
        }],
        hits_addend: 3,
    };
    round_trip(
        &pool,
        "envoy.service.ratelimit.v3.RateLimitRequest",
        &request,
    );
    let quota = Quota {
        requests: 7,
        id: "q".into(),
        expiration_specifier: Some(ExpirationSpecifier::ValidUntil(Timestamp {
            seconds: 9,
            nanos: 1,
        })),
    };
    let header = HeaderValue {
        key: "k".into(),
        value: "v".into(),
        raw_value: b"raw".to_vec(),
    };
    let response = RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                name: "n".into(),
                requests_per_unit: 4,
                unit: Unit::Week as i32,
            }),
            limit_remaining: 3,
            duration_until_reset: Some(ProtoDuration {
                seconds: 2,
                nanos: 5,
            }),
            quota: Some(quota.clone()),
        }],
        response_headers_to_add: vec![header.clone()],
        request_headers_to_add: vec![header],
        raw_body: b"body".to_vec(),
        dynamic_metadata: Some(Struct {
            fields: [(
                "f".to_string(),
                Value {
                    kind: Some(Kind::StringValue("s".into())),
                },
            )]
            .into_iter()
            .collect(),
        }),
        quota: Some(quota),
    };
    round_trip(
        &pool,
        "envoy.service.ratelimit.v3.RateLimitResponse",
        &response,
    );
}
