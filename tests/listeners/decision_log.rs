//! `--log-decisions`, through the binary: a line per denied request (`denied`) or per decision
//! (`all`) whatever `--log-level` says, naming the transport and the caller, none when off, values hidden when told, and at most 100
//! lines a second with the rest counted.

use std::time::Instant;

use crate::support::{Slidegate, call, descriptor};

const RULES: &str = "domain: lg
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 2 }
";

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

fn body(user: &str) -> String {
    format!(
        r#"{{"domain":"lg","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    )
}

fn decision_lines(server: &Slidegate) -> Vec<String> {
    server
        .log()
        .lines()
        .filter(|l| l.contains("slidegate::decisions"))
        .map(str::to_owned)
        .collect()
}

/// The log is written as the server goes: wait for `n` decision lines (a few seconds at most).
async fn wait_for_lines(server: &Slidegate, n: usize) -> Vec<String> {
    let started = Instant::now();
    loop {
        let lines = decision_lines(server);
        if lines.len() >= n || started.elapsed().as_secs() >= 5 {
            return lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_decisions_are_logged_with_their_rule_even_at_warn() {
    let rules = rules();
    let server = Slidegate::start(
        rules.path(),
        &["--log-decisions", "denied", "--log-level", "warn"],
    );
    for _ in 0..3 {
        server.post_json(&body("mallory")).await;
    }
    let lines = wait_for_lines(&server, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    for part in [
        "transport=\"json\"",
        "caller=\"127.0.0.1:",
        "domain=\"lg\"",
        "code=\"OVER_LIMIT\"",
        "[user=mallory] rule=per_user limit=2/1m remaining=0 OVER_LIMIT",
    ] {
        assert!(line.contains(part), "{part} is not in {line}");
    }

    let all = Slidegate::start(
        rules.path(),
        &["--log-decisions", "all", "--operator-hide-values"],
    );
    all.post_json(&body("ann")).await;
    let mut client = all.client().await;
    let request = crate::support::request("lg", vec![descriptor(&[("user", "bob")])]);
    call(&mut client, request).await;
    let lines = wait_for_lines(&all, 2).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    // The gRPC line names the caller by the address of the client's connection.
    let grpc = &lines[1];
    assert!(grpc.contains("transport=\"grpc\""), "{grpc}");
    assert!(grpc.contains("caller=\"127.0.0.1:"), "{grpc}");
    assert!(
        lines[0].contains("[user=(hidden)] rule=per_user limit=2/1m remaining=1 OK"),
        "{}",
        lines[0]
    );
    assert!(!lines[0].contains("ann"), "{}", lines[0]);

    let off = Slidegate::start(rules.path(), &["--log-level", "debug"]);
    for _ in 0..3 {
        off.post_json(&body("mallory")).await;
    }
    assert!(decision_lines(&off).is_empty(), "{}", off.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_a_hundred_lines_a_second_and_the_rest_counted() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &["--log-decisions", "all"]);
    let started = Instant::now();
    let server = &server;
    let calls = (0..300).map(|i| {
        let body = body(&format!("u{}", i % 3));
        async move { server.post_json(&body).await }
    });
    futures::future::join_all(calls).await;
    let elapsed = started.elapsed();
    // Every decision is either a line or counted as dropped, and no second holds more than 100.
    let dropped = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("slidegate_decision_log_dropped_total "))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let started = Instant::now();
    loop {
        let lines = decision_lines(server);
        let (_, metrics) = server.get("/metrics");
        if lines.len() + dropped(&metrics) == 300 {
            let mut per_second = std::collections::HashMap::new();
            for line in &lines {
                // Text logs start with an RFC 3339 time: the second is its first 19 characters.
                *per_second.entry(line.get(..19).unwrap_or("")).or_insert(0) += 1;
            }
            assert!(per_second.values().all(|&n| n <= 100), "{per_second:?}");
            if elapsed.as_millis() < 1900 {
                assert!(
                    dropped(&metrics) >= 100,
                    "300 calls in {elapsed:?}, {} lines",
                    lines.len()
                );
            }
            break;
        }
        assert!(
            started.elapsed().as_secs() < 5,
            "{} lines and {} dropped for 300 calls",
            lines.len(),
            dropped(&metrics)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
