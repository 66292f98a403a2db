//! The command line: `check-config` reporting rules, errors and warnings, `serve` refusing bad
//! rules, and an environment variable for every flag.

use crate::service_fixture::{RULE_COUNT, RULES};
use crate::support::{free_port, slidegate_command};

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
