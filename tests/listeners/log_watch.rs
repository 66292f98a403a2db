//! A trace-level log written beside the rule directory does not feed on itself: the file
//! watcher's own events stay out of the log, so the log's writes are not events that write lines.

use std::process::Stdio;
use std::time::Duration;

use crate::support::{KillOnDrop, free_port, slidegate_command};

#[test]
fn a_trace_log_beside_the_rules_stays_small() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("mkdir");
    std::fs::write(
        rules.join("rules.yaml"),
        "domain: lw\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
    )
    .expect("write rules");
    let log_path = dir.path().join("slidegate.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let child = slidegate_command()
        .arg("serve")
        .arg("--config")
        .arg(&rules)
        .args(["--log-level", "trace"])
        .arg("--grpc-addr")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--admin-addr")
        .arg(format!("127.0.0.1:{}", free_port()))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start slidegate");
    let _process = KillOnDrop(child);
    std::thread::sleep(Duration::from_secs(3));
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(text.contains("rules loaded"), "{text}");
    // Idle for 3 s at trace: a few hundred lines at most, none from the watcher's crates.
    let watcher_lines = text
        .lines()
        .filter(|l| l.contains("notify::") || l.contains("notify_debouncer_full::"))
        .count();
    assert_eq!(watcher_lines, 0, "{}", &text[..text.len().min(4000)]);
    assert!(text.len() < 1_000_000, "{} bytes in 3 s", text.len());
}
