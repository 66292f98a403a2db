//! `slidegate explain`: which rule a descriptor matches in rule files, through the binary, on the
//! repository's `config/` and on a file with wildcards, `share_threshold`, `replaces` and shadow.

use std::process::Output;

fn explain(path: &std::path::Path, args: &[&str]) -> Output {
    crate::support::slidegate_command()
        .arg("explain")
        .arg(path)
        .args(args)
        .output()
        .expect("run slidegate explain")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn config() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config")
}

const RULES: &str = "domain: api
descriptors:
  - key: route
    value: /v1/*
    share_threshold: true
    rate_limit: { name: v1_routes, unit: minute, requests_per_unit: 500 }
  - key: route
    value: /v1/health
    rate_limit: { unlimited: true }
  - key: plan
    value: free
    rate_limit: { name: free, unit: hour, requests_per_unit: 100 }
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit:
      name: trial
      unit: hour
      requests_per_unit: 10
      replaces: [{ name: free }]
  - key: q
    rate_limit: { unit: second, requests_per_unit: 1 }
";

#[test]
fn the_shipped_rules_explain_the_exact_value_before_the_key_only_level() {
    let login = stdout(&explain(
        &config(),
        &["edge", "user_id=alice", "path=/login"],
    ));
    assert!(
        login.contains("rule: edge user_id.path_/login: 100 per MINUTE")
            && login.contains("metrics name: login_per_user")
            && login.contains("counter entries: user_id=alice, path=/login")
            && login.contains("  user_id=alice: `user_id`, by its key (any value)\n  path=/login: `path_/login`, by its exact value\n"),
        "{login}"
    );
    let other = stdout(&explain(&config(), &["edge", "user_id=alice", "path=/x"]));
    assert!(other.contains("name=per_user_path"), "{other}");
    // One entry short of the rule's depth: no rule, which is an answer, not an error.
    let short = stdout(&explain(&config(), &["edge", "user_id=alice"]));
    assert!(
        short.contains("rule: none") && short.contains("the limits are deeper (more entries)"),
        "{short}"
    );
    let long = stdout(&explain(
        &config(),
        &["edge", "user_id=a", "path=/x", "extra=1"],
    ));
    assert!(
        long.contains("extra=1: no descriptor with key `extra`") && long.contains("rule: none"),
        "{long}"
    );
}

#[test]
fn wildcards_shared_counters_replaces_and_shadow_are_shown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("api.yaml");
    std::fs::write(&file, RULES).expect("write rules");
    let shared = stdout(&explain(&file, &["api", "route=/v1/users"]));
    assert!(
        shared.contains("name=v1_routes")
            && shared.contains("by the wildcard `/v1/*`")
            && shared.contains("counter entries: route=/v1/*"),
        "share_threshold counts under the pattern: {shared}"
    );
    let exact = stdout(&explain(&file, &["api", "route=/v1/health"]));
    assert!(
        exact.contains("unlimited") && exact.contains("counter: none (unlimited)"),
        "the exact value wins over the wildcard: {exact}"
    );
    let trial = stdout(&explain(&file, &["api", "plan=trial"]));
    assert!(
        trial.contains("shadow: counted and reported, never denies")
            && trial.contains("replaces: free"),
        "{trial}"
    );
    // A value may hold `=` and `,`: the key ends at the first `=`.
    let odd = stdout(&explain(&file, &["api", "q=a=b,c"]));
    assert!(odd.contains("counter entries: q=a=b,c"), "{odd}");
}

#[test]
fn bad_input_is_a_clear_error_and_exit_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("api.yaml");
    std::fs::write(&file, RULES).expect("write rules");
    for (args, message) in [
        (
            &["nope", "a=1"][..],
            "domain `nope` is not in the rules (domains: api)",
        ),
        (
            &["api", "novalue"][..],
            "entry `novalue` is not `key=value`",
        ),
        (&["api", "=1"][..], "entry `=1` is not `key=value`"),
    ] {
        let out = explain(&file, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    std::fs::write(&file, "domain: api\ndescriptors: [{ key: k, rate_limit: { unit: fortnight, requests_per_unit: 1 } }]\n")
        .expect("write rules");
    let out = explain(&file, &["api", "k=1"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown unit"),
        "{out:?}"
    );
}

#[test]
fn a_json_body_explains_every_descriptor() {
    let body = r#"{"domain": "edge", "descriptors": [
        {"entries": [{"key": "user_id", "value": "alice"}, {"key": "path", "value": "/login"}]},
        {"entries": [{"key": "nothing", "value": "here"}]}]}"#;
    let text = stdout(&explain(&config(), &["--json", body]));
    let second = text.find("descriptors[1]:").expect("both descriptors");
    assert!(text[..second].contains("name=login_per_user"), "{text}");
    assert!(text[second..].contains("rule: none"), "{text}");
    let out = explain(&config(), &["--json", r#"{"domain": 1}"#]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the --json body:"),
        "{out:?}"
    );
}
