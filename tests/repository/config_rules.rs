//! Rule configuration through the library: every validation case (by fixture), the matching
//! table, metrics names, the default rules, precision, and a loader and matcher that never panic.
//! Also the fixtures the other `config_*` files share (the fixture directory, a one-limit line).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;
use slidegate::config::{Precision, RuleSet, Unit, load_path, load_sources};

pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

fn load_fixture(name: &str) -> RuleSet {
    let path = fixtures().join("good").join(name);
    load_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One limit of one request per second, as the first line under a top-level descriptor.
pub(crate) const RULE: &str = "    rate_limit: {unit: second, requests_per_unit: 1}\n";

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
