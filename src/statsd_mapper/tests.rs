//! The mapper against upstream's behaviour: the default and Envoy Gateway files, rule order,
//! the tree's quirks, escaping, refused files and Go's regex syntax.

use super::*;

const EG_FIXTURE: &str = include_str!("../../tests/fixtures/statsd/envoy_gateway_statsd_conf.yaml");
const DEFAULT_FIXTURE: &str = include_str!("../../tests/fixtures/statsd/default_mapper.yaml");

fn metric(name: &str, labels: &[(&str, &str)]) -> Mapped {
    metric_with(name, labels, None, None)
}

fn metric_with(
    name: &str,
    labels: &[(&str, &str)],
    scale: Option<f64>,
    observer_type: Option<&str>,
) -> Mapped {
    Mapped::Metric {
        name: name.to_owned(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        scale,
        observer_type: observer_type.map(str::to_owned),
    }
}

fn unmapped(name: &str) -> Mapped {
    Mapped::Unmapped {
        name: name.to_owned(),
    }
}

fn load(text: &str) -> Mapper {
    match Mapper::from_yaml(text) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    }
}

fn refused(text: &str) -> MapperError {
    match Mapper::from_yaml(text) {
        Ok(_) => panic!("loaded: {text}"),
        Err(e) => e,
    }
}

fn problem(text: &str) -> (usize, MappingProblem) {
    match refused(text) {
        MapperError::Mapping { index, problem, .. } => (index, problem),
        e => panic!("not a mapping error: {e}"),
    }
}

/// The names of the facts file's worked examples, through a mapper that should treat them
/// like envoyproxy/ratelimit's default.
fn check_ratelimit_names(m: &Mapper) {
    use MetricKind::*;
    let hist = Some("histogram");
    assert_eq!(
        m.map("ratelimit.service.rate_limit.d.a.total_hits", Counter),
        metric_with(
            "ratelimit_service_rate_limit_total_hits",
            &[("domain", "d"), ("key1", "a")],
            None,
            hist
        )
    );
    for stat in [
        "near_limit",
        "over_limit",
        "total_hits",
        "within_limit",
        "shadow_mode",
    ] {
        assert_eq!(
            m.map(
                &format!("ratelimit.service.rate_limit.d.a_v.b.{stat}"),
                Counter
            ),
            metric_with(
                &format!("ratelimit_service_rate_limit_{stat}"),
                &[("domain", "d"), ("key1", "a_v"), ("key2", "b")],
                None,
                hist
            )
        );
    }
    // Deeper levels are dropped: only key1 and key2 remain.
    assert_eq!(
        m.map(
            "ratelimit.service.rate_limit.d.k1_v1.k2_v2.k3_v3.total_hits",
            Counter
        ),
        metric_with(
            "ratelimit_service_rate_limit_total_hits",
            &[("domain", "d"), ("key1", "k1_v1"), ("key2", "k2_v2")],
            None,
            hist
        )
    );
    // A dotted value adds a component: `a_v1.2` is key1 `a_v1`, key2 `2`.
    assert_eq!(
        m.map(
            "ratelimit.service.rate_limit.d.a_v1.2.within_limit",
            Counter
        ),
        metric_with(
            "ratelimit_service_rate_limit_within_limit",
            &[("domain", "d"), ("key1", "a_v1"), ("key2", "2")],
            None,
            hist
        )
    );
    // Envoy Gateway's real key, as on its dashboard.
    let key1 = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example_httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example";
    assert_eq!(
        m.map(
            &format!(
                "ratelimit.service.rate_limit.default/eg/http.{key1}.rule-0-match-0_rule-0-match-0.over_limit"
            ),
            Counter
        ),
        metric_with(
            "ratelimit_service_rate_limit_over_limit",
            &[
                ("domain", "default/eg/http"),
                ("key1", key1),
                ("key2", "rule-0-match-0_rule-0-match-0")
            ],
            None,
            hist
        )
    );
    // The unanchored over_limit regex also takes over_limit_with_local_cache at depth 2.
    assert_eq!(
        m.map(
            "ratelimit.service.rate_limit.d.a.b.over_limit_with_local_cache",
            Counter
        ),
        metric_with(
            "ratelimit_service_rate_limit_over_limit",
            &[("domain", "d"), ("key1", "a"), ("key2", "b")],
            None,
            hist
        )
    );
    // ...but not at depth 1, where neither glob nor regex fits.
    assert_eq!(
        m.map(
            "ratelimit.service.rate_limit.d.a.over_limit_with_local_cache",
            Counter
        ),
        unmapped("ratelimit_service_rate_limit_d_a_over_limit_with_local_cache")
    );
    assert_eq!(
        m.map("ratelimit_server.ShouldRateLimit.total_requests", Counter),
        metric(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")]
        )
    );
    // match_metric_type: counter, so a gauge of that name is not mapped.
    assert_eq!(
        m.map("ratelimit_server.ShouldRateLimit.total_requests", Gauge),
        unmapped("ratelimit_server_ShouldRateLimit_total_requests")
    );
    assert_eq!(
        m.map(
            "ratelimit.service.call.should_rate_limit.redis_error",
            Counter
        ),
        metric(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "redis_error")]
        )
    );
    assert_eq!(
        m.map("ratelimit.service.config_load_success", Counter),
        metric("ratelimit_service_config_load_success", &[])
    );
    assert_eq!(
        m.map("ratelimit.service.config_load_error", Counter),
        metric("ratelimit_service_config_load_error", &[])
    );
    assert_eq!(
        m.map("ratelimit.service.global_shadow_mode", Counter),
        unmapped("ratelimit_service_global_shadow_mode")
    );
    assert_eq!(
        m.map(
            "ratelimit.service.rate_limit.default/eg/http.domain_not_found",
            Counter
        ),
        unmapped("ratelimit_service_rate_limit_default_eg_http_domain_not_found")
    );
    assert_eq!(
        m.map("ratelimit.go.heapAlloc", Gauge),
        unmapped("ratelimit_go_heapAlloc")
    );
    // EXTRA_TAGS suffixes stop the globs from matching.
    assert_eq!(
        m.map(
            "ratelimit.service.rate_limit.d.a.total_hits.__env=prod",
            Counter
        ),
        unmapped("ratelimit_service_rate_limit_d_a_total_hits___env_prod")
    );
}

#[test]
fn default_mapper_maps_the_worked_examples() {
    let m = Mapper::ratelimit_default();
    check_ratelimit_names(&m);
    assert_eq!(
        m.map(
            "ratelimit_server.ShouldRateLimit.response_time",
            MetricKind::Observer
        ),
        metric_with(
            "ratelimit_service_response_time_seconds",
            &[("grpc_method", "ShouldRateLimit")],
            Some(0.001),
            Some("histogram")
        )
    );
}

#[test]
fn envoy_gateway_file_maps_the_same_names_without_the_scale() {
    assert_eq!(
        EG_FIXTURE,
        RATELIMIT_DEFAULT_MAPPER_YAML.replacen(RESPONSE_TIME_SCALE_LINE, "", 1)
    );
    for m in [load(EG_FIXTURE), Mapper::ratelimit_default_milliseconds()] {
        check_ratelimit_names(&m);
        assert_eq!(
            m.map(
                "ratelimit_server.ShouldRateLimit.response_time",
                MetricKind::Observer
            ),
            metric_with(
                "ratelimit_service_response_time_seconds",
                &[("grpc_method", "ShouldRateLimit")],
                None,
                Some("histogram")
            )
        );
    }
}

#[test]
fn the_embedded_default_is_the_fixture() {
    assert_eq!(RATELIMIT_DEFAULT_MAPPER_YAML, DEFAULT_FIXTURE);
    check_ratelimit_names(&load(DEFAULT_FIXTURE));
}

#[test]
fn drop_rules_drop() {
    let m = load(
        r#"
mappings:
  - match: "noisy.*"
    name: dropped
    action: drop
  - match: "\\.debug$"
    match_type: regex
    name: dropped
    action: drop
  - match: "noisy.*.x"
    name: kept_$1
"#,
    );
    assert_eq!(m.map("noisy.a", MetricKind::Counter), Mapped::Drop);
    assert_eq!(m.map("x.y.debug", MetricKind::Gauge), Mapped::Drop);
    assert_eq!(
        m.map("noisy.a.x", MetricKind::Counter),
        metric("kept_a", &[])
    );
}

#[test]
fn regex_rules_match_a_substring_in_file_order() {
    let m = load(
        r#"
mappings:
  - match: "b\\.(\\w+)\\.c"
    match_type: regex
    name: "first_${1}"
    labels:
      whole: "$0"
      missing: "$7"
      named: "$word"
  - match: "(?P<word>[a-z]+)"
    match_type: regex
    name: "second"
    labels:
      named: "$word"
      dollar: "$$1"
"#,
    );
    assert_eq!(
        m.map("a.b.xy.c.d", MetricKind::Counter),
        metric(
            "first_xy",
            &[("missing", ""), ("named", ""), ("whole", "b.xy.c")]
        )
    );
    assert_eq!(
        m.map("9.abc.", MetricKind::Counter),
        metric("second", &[("dollar", "$1"), ("named", "abc")])
    );
    // Go's \w is ASCII: the é ends the group, so the first rule does not match.
    assert_eq!(
        m.map("b.xé.c", MetricKind::Counter),
        metric("second", &[("dollar", "$1"), ("named", "b")])
    );
}

#[test]
fn globs_win_over_regexes_and_the_earliest_glob_wins() {
    let m = load(
        r#"
defaults:
  match_type: regex
mappings:
  - match: "a\\.b"
    name: regex_rule
  - match: "a.*"
    match_type: glob
    name: star_$1
  - match: "*.b"
    match_type: glob
    name: later_$1
"#,
    );
    assert_eq!(m.map("a.b", MetricKind::Counter), metric("star_b", &[]));
    assert_eq!(m.map("x.b", MetricKind::Counter), metric("later_x", &[]));
    assert_eq!(
        m.map("zz.a.b.zz", MetricKind::Counter),
        metric("regex_rule", &[])
    );
}

#[test]
fn globs_need_the_same_number_of_parts_and_star_takes_an_empty_part() {
    let m = load(
        "mappings:\n  - match: \"a.*.c\"\n    name: \"n\"\n    labels: {xx: \"$1\", yy: \"${1}z\", ww: \"$1_total\"}\n",
    );
    assert_eq!(
        m.map("a..c", MetricKind::Counter),
        metric("n", &[("ww", ""), ("xx", ""), ("yy", "z")])
    );
    assert_eq!(
        m.map("a.b/c=d.c", MetricKind::Counter),
        metric("n", &[("ww", ""), ("xx", "b/c=d"), ("yy", "b/c=dz")])
    );
    assert_eq!(m.map("a.b.c.d", MetricKind::Counter), unmapped("a_b_c_d"));
    assert_eq!(m.map("a.c", MetricKind::Counter), unmapped("a_c"));
}

#[test]
fn upstream_tree_quirks_are_kept() {
    // `a.b` ends at a state `a.b.c` created: upstream never gives it a result.
    let m = load(
        "mappings:\n  - match: a.b.c\n    name: long\n    match_metric_type: counter\n  - match: a.b\n    name: short\n",
    );
    assert_eq!(m.map("a.b", MetricKind::Counter), unmapped("a_b"));
    assert_eq!(m.map("a.b", MetricKind::Gauge), metric("short", &[]));
    // A repeated pattern keeps the first rule but the position of the last.
    let m = load(
        "mappings:\n  - match: a.*\n    name: first\n  - match: \"*.b\"\n    name: second\n  - match: a.*\n    name: third\n",
    );
    assert_eq!(m.map("a.b", MetricKind::Counter), metric("second", &[]));
    assert_eq!(m.map("a.c", MetricKind::Counter), metric("first", &[]));
    // A part that is literally `*` goes down the exact transition first, which captures
    // nothing, and that path is kept: `$1` is empty.
    let m = load("mappings:\n  - match: a.*.c\n    name: n\n    labels: {part: \"$1\"}\n");
    assert_eq!(
        m.map("a.*.c", MetricKind::Counter),
        metric("n", &[("part", "")])
    );
    assert_eq!(
        m.map("a.b.c", MetricKind::Counter),
        metric("n", &[("part", "b")])
    );
}

#[test]
fn names_are_escaped_like_upstream() {
    for (name, escaped) in [
        ("clean", "clean"),
        ("0starts_with_digit", "_0starts_with_digit"),
        ("with--doubledash", "with_doubledash"),
        ("with---multiple-dashes", "with_multiple_dashes"),
        ("with.dot", "with_dot"),
        ("with😱emoji", "with_emoji"),
        ("with.*.multiple", "with___multiple"),
        ("test.web-server.foo.bar", "test_web_server_foo_bar"),
        ("", ""),
    ] {
        assert_eq!(escape_metric_name(name), escaped, "{name}");
    }
    let m = load(
        "mappings:\n  - match: \"*.x\"\n    name: \"$1_x\"\n  - match: \"*.y\"\n    name: \"${1}_y\"\n",
    );
    // `$1_x` is the reference `1_x`, which is empty: the name is empty, so dropped.
    assert_eq!(m.map("a.x", MetricKind::Counter), Mapped::Drop);
    assert_eq!(m.map("9-a.y", MetricKind::Counter), metric("_9_a_y", &[]));
}

#[test]
fn observer_type_and_scale_are_kept() {
    let m = load(
        r#"
defaults:
  observer_type: summary
  ttl: 10s
  buckets: [1, 2]
mappings:
  - match: a.*
    name: a
    timer_type: histogram
    scale: 2.5
    help: "A's help"
    ttl: 1m
    buckets: [0.1]
  - match: b.*
    name: b
    timer_type: histogram
    observer_type: summary
  - match: c.*
    name: c
    match_metric_type: timer
"#,
    );
    assert_eq!(
        m.map("a.x", MetricKind::Observer),
        metric_with("a", &[], Some(2.5), Some("histogram"))
    );
    assert_eq!(
        m.map("b.x", MetricKind::Observer),
        metric_with("b", &[], None, Some("summary"))
    );
    assert_eq!(
        m.map("c.x", MetricKind::Observer),
        metric_with("c", &[], None, Some("summary"))
    );
    assert_eq!(m.map("c.x", MetricKind::Counter), unmapped("c_x"));
}

#[test]
fn empty_files_are_empty_mappers() {
    for text in ["", "# nothing\n", "mappings:\n", "mappings: []\n"] {
        assert_eq!(load(text).map("a.b", MetricKind::Gauge), unmapped("a_b"));
    }
}

#[test]
fn invalid_mappings_are_refused_by_index() {
    let two = |second: &str| format!("mappings:\n  - match: ok.*\n    name: ok\n{second}");
    let cases = [
        (
            "  - match: \"foo*.bar\"\n    name: x\n",
            MappingProblem::InvalidGlob,
        ),
        (
            "  - match: \"1a.b\"\n    name: x\n",
            MappingProblem::InvalidGlob,
        ),
        (
            "  - match: \"a.b\"\n    name: x\n    labels: {k: v}\n",
            MappingProblem::InvalidLabelName("k".into()),
        ),
        ("  - match: \"a.b\"\n", MappingProblem::MissingName),
        (
            "  - match: \"a.b\"\n    name: \"x.y\"\n",
            MappingProblem::InvalidName("x.y".into()),
        ),
        (
            "  - match: \"a.b\"\n    name: x\n    match_type: fuzzy\n",
            MappingProblem::UnknownMatchType("fuzzy".into()),
        ),
        (
            "  - match: \"a.b\"\n    name: x\n    action: keep\n",
            MappingProblem::UnknownAction("keep".into()),
        ),
        (
            "  - match: \"a.b\"\n    name: x\n    match_metric_type: histo\n",
            MappingProblem::UnknownMetricType("histo".into()),
        ),
        (
            "  - match: \"a.b\"\n    name: x\n    timer_type: bars\n",
            MappingProblem::UnknownObserverType("bars".into()),
        ),
        (
            "  - match: \"a.b\"\n    name: x\n    observer_type: histogram\n    summary_options: {}\n",
            MappingProblem::Conflict("a histogram observer cannot have summary_options"),
        ),
    ];
    for (second, want) in cases {
        assert_eq!(problem(&two(second)), (1, want), "{second}");
    }
    let (index, p) = problem(&two(
        "  - match: \"a(b\"\n    match_type: regex\n    name: x\n",
    ));
    assert_eq!(index, 1);
    assert!(matches!(p, MappingProblem::InvalidRegex(_)), "{p:?}");
    let text = refused(&two("  - match: \"foo*\"\n    name: x\n")).to_string();
    assert!(
        text.contains("mapping 1") && text.contains("\"foo*\""),
        "{text}"
    );
    assert!(text.contains("invalid glob"), "{text}");
}

#[test]
fn yaml_and_defaults_errors() {
    let e = refused("mappings:\n  - match: a.b\n    name: x\n    lables: {}\n");
    assert!(matches!(e, MapperError::Yaml(_)), "{e}");
    assert!(e.to_string().contains("lables"), "{e}");
    let e = refused("mappings: [");
    assert!(matches!(e, MapperError::Yaml(_)), "{e}");
    let e = refused("mappings:\n  - match: a.b\n    name: x\n    scale: lots\n");
    assert!(matches!(e, MapperError::Yaml(_)), "{e}");
    let e = refused("defaults:\n  match_type: fuzzy\n");
    assert!(matches!(e, MapperError::Defaults(_)), "{e}");
    let e = refused("defaults:\n  glob_disable_ordering: true\n");
    assert!(matches!(e, MapperError::Defaults(_)), "{e}");
}

#[test]
fn go_regex_syntax_is_rewritten() {
    assert_eq!(
        go_regex_to_rust(r"a\d[\w-]\s"),
        r"a[0-9][0-9A-Za-z_-][\t\n\f\r ]"
    );
    assert_eq!(go_regex_to_rust(r"[]a[b&&c]"), r"[\]a\[b\&\&c]");
    assert_eq!(go_regex_to_rust(r"[[:alpha:]\D]"), r"[[:alpha:][^0-9]]");
    assert_eq!(go_regex_to_rust(r"\Qa.b\E.c"), r"a\.b.c");
    for p in [r"\bx\B", r"[^\S]", r"\pL\p{Greek}", r"(?i)x"] {
        assert!(Regex::new(&go_regex_to_rust(p)).is_ok(), "{p}");
    }
}
