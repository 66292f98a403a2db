//! `--operator-hide-values` with rules whose metrics name is made of the request's values
//! (`detailed_metric`, `value_to_metric`): the operator listener and the decision log name such a
//! rule by its path, not by the name that carries the values. `GET /limited`, `/status.json` and
//! `--log-decisions` through the binary; `/metrics` keeps the values, as its docs say.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::Slidegate;

const RULES: &str = "domain: hv
descriptors:
  - key: acct
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: plan
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 1 }
";

/// A `/json` body of domain `hv` with one descriptor `key=value`.
fn body(key: &str, value: &str) -> String {
    serde_json::json!({"domain": "hv", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
        .to_string()
}

async fn status(server: &Slidegate) -> Value {
    let url = format!("http://127.0.0.1:{}/status.json", server.admin_port);
    let answer = reqwest::get(&url).await.expect("GET /status.json");
    answer.json::<Value>().await.expect("JSON")
}

/// The rule labels of the decisions `/status.json` has counted so far.
fn status_rules(answer: &Value) -> Vec<String> {
    let samples = answer["history"]["samples"].as_array().cloned();
    let decisions = samples
        .unwrap_or_default()
        .into_iter()
        .flat_map(|s| s["decisions"].as_array().cloned().unwrap_or_default());
    decisions
        .filter_map(|d| d["rule"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_values_stay_out_of_the_rules_named_by_them() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(
        rules.path(),
        &["--operator-hide-values", "--log-decisions", "denied"],
    );
    for (key, value) in [("acct", "mallory"), ("plan", "trudy"), ("user", "walter")] {
        for _ in 0..3 {
            server.post_json(&body(key, value)).await;
        }
    }
    let secrets = ["mallory", "trudy", "walter"];

    let (code, limited) = server.get("/limited");
    assert_eq!(code, 200, "{limited}");
    let rows: Value = serde_json::from_str(&limited).expect("JSON");
    let mut named: Vec<&str> = (rows["entries"].as_array().expect("entries").iter())
        .filter_map(|row| row["rule"].as_str())
        .collect();
    named.sort_unstable();
    assert_eq!(named, ["acct", "per_user", "plan"], "{limited}");
    for secret in secrets {
        assert!(!limited.contains(secret), "{secret} in {limited}");
    }

    // One line per denied request, each rule by its path (or name).
    let started = Instant::now();
    let lines = loop {
        let lines: Vec<String> = (server.log().lines())
            .filter(|l| l.contains("slidegate::decisions"))
            .map(str::to_owned)
            .collect();
        if lines.len() >= 6 || started.elapsed() > Duration::from_secs(5) {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(lines.len(), 6, "{lines:?}");
    for rule in ["rule=acct ", "rule=plan ", "rule=per_user "] {
        assert!(lines.iter().any(|l| l.contains(rule)), "{rule}: {lines:?}");
    }
    for secret in secrets {
        assert!(lines.iter().all(|l| !l.contains(secret)), "{lines:?}");
    }

    // A sample every 5 s: the decisions show in the next one (or two), the value-made names as
    // one.
    let started = Instant::now();
    loop {
        let answer = status(&server).await;
        for secret in secrets {
            assert!(!answer.to_string().contains(secret), "{answer}");
        }
        let mut rules = status_rules(&answer);
        rules.sort_unstable();
        rules.dedup();
        if rules == ["(hidden)", "per_user"] {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{answer}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // `/metrics` keeps the values in these rules' names, as envoyproxy/ratelimit's stats do.
    let (_, metrics) = server.get("/metrics");
    assert!(metrics.contains("acct_mallory"), "{metrics}");
}
