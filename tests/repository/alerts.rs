//! The shipped alert rules: `promtool check rules`, and `promtool test rules` with unit tests that
//! make each alert fire on synthetic series of a failure and stay quiet on healthy ones; every
//! alert is tested, and its runbook is a section of docs/runbooks.md.

use std::path::Path;
use std::process::Command;

use crate::support::{require_program, run_ok};

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let Some(promtool) = require_program("promtool") else {
        return;
    };
    let rules = repo("deploy/prometheus/slidegate-alerts.yml");
    run_ok(
        Command::new(&promtool).args(["check", "rules"]).arg(&rules),
        "promtool check rules",
    );
    run_ok(
        Command::new(&promtool)
            .args(["test", "rules"])
            .arg(repo("deploy/prometheus/slidegate-alerts.test.yml")),
        "promtool test rules",
    );
}

#[test]
fn every_alert_is_tested_and_has_a_runbook_section() {
    let rules = std::fs::read_to_string(repo("deploy/prometheus/slidegate-alerts.yml"))
        .expect("alert rules");
    let tests = std::fs::read_to_string(repo("deploy/prometheus/slidegate-alerts.test.yml"))
        .expect("alert tests");
    let runbooks = std::fs::read_to_string(repo("docs/runbooks.md")).expect("runbooks");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for alert in alerts {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "{alert} has no unit test"
        );
        assert!(
            runbooks.contains(&format!("\n## {alert}\n")),
            "{alert} has no section in docs/runbooks.md"
        );
        let anchor = format!("runbook: \"docs/runbooks.md#{}\"", alert.to_lowercase());
        assert!(
            rules.contains(&anchor),
            "{alert}'s runbook annotation: {anchor}"
        );
    }
}
