//! One policy for a rule directory without rule files, through the binary: at start and in
//! `check-config` it is no rules (every request OK) with no failed reload counted; a reload never
//! drops live rules that way (refused, counted, the rules stay); emptied again once no rules are
//! live, nothing changes.

use std::time::{Duration, Instant};

use crate::support::{Slidegate, slidegate_command};

const RULES: &str = "domain: em
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
";

fn metric(server: &Slidegate, line_start: &str) -> String {
    let (_, text) = server.get("/metrics");
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or("-")
        .to_owned()
}

async fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_rule_directory_is_no_rules_everywhere_but_never_drops_live_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let check = slidegate_command()
        .args(["check-config"])
        .arg(dir.path())
        .output()
        .expect("check-config");
    assert!(check.status.success(), "{check:?}");
    assert!(String::from_utf8_lossy(&check.stdout).contains("OK: 0 rules"));

    let server = Slidegate::start(dir.path(), &[]);
    // Let the watcher settle: a failed reload at start would show by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let failures = "slidegate_config_reloads_total{result=\"failure\"}";
    assert_eq!(metric(&server, failures), "0", "{}", server.log());
    assert_eq!(metric(&server, "slidegate_config_stale"), "0");
    assert!(!server.log().contains("WARN"), "{}", server.log());
    let body = r#"{"domain":"em","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#;
    assert_eq!(server.post_json(body).await["overallCode"], "OK");

    // Rules appear: they load.
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    wait("the rules did not load", || {
        metric(&server, "slidegate_rules_loaded") == "1"
    })
    .await;
    server.post_json(body).await;
    assert_eq!(server.post_json(body).await["overallCode"], "OVER_LIMIT");

    // Emptied while they are live: refused and counted; the rules stay.
    std::fs::remove_file(dir.path().join("rules.yaml")).expect("remove");
    wait("the emptying was not refused", || {
        metric(&server, failures) == "1"
    })
    .await;
    assert_eq!(metric(&server, "slidegate_rules_loaded"), "1");
    assert_eq!(metric(&server, "slidegate_config_stale"), "1");
    assert_eq!(server.post_json(body).await["overallCode"], "OVER_LIMIT");
}
