//! `GET /limited` on the operator listener, through the binary: the counters being denied now with
//! their rule, not the admitted ones; across replicas that share a Redis; a fixed size under a
//! flood of distinct denied keys; values hidden when told.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{RedisServer, Slidegate};

const RULES: &str = "domain: lim
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 2 }
  - key: bot
    rate_limit: { name: no_bots, unit: minute, requests_per_unit: 0 }
";

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

/// A `/json` body of domain `lim` with one descriptor `key=value` per value.
fn body(key: &str, values: &[String]) -> String {
    let descriptors: Vec<Value> = values
        .iter()
        .map(|v| serde_json::json!({"entries": [{"key": key, "value": v}]}))
        .collect();
    serde_json::json!({"domain": "lim", "descriptors": descriptors}).to_string()
}

fn limited(server: &Slidegate, query: &str) -> Value {
    let (status, text) = server.get(&format!("/limited{query}"));
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).expect("JSON")
}

fn entries(answer: &Value) -> &Vec<Value> {
    answer["entries"].as_array().expect("entries")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limited_lists_the_denied_key_with_its_rule_and_not_the_admitted_ones() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    let mallory = body("user", &["mallory".to_string()]);
    let alice = body("user", &["alice".to_string()]);
    for _ in 0..5 {
        server.post_json(&mallory).await;
    }
    assert_eq!(server.post_json(&alice).await["overallCode"], "OK");
    let answer = limited(&server, "");
    let listed = entries(&answer);
    assert_eq!(listed.len(), 1, "{answer}");
    let row = &listed[0];
    assert_eq!(row["domain"], "lim");
    assert_eq!(row["rule"], "per_user");
    assert_eq!(row["entries"][0]["key"], "user");
    assert_eq!(row["entries"][0]["value"], "mallory");
    assert_eq!(row["denied"], 3, "{row}");
    assert!(
        row["firstDeny"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{row}"
    );
    assert_eq!(answer["replicas"], 1);
    assert!(entries(&limited(&server, "?domain=other")).is_empty());

    let hidden = Slidegate::start(rules.path(), &["--operator-hide-values"]);
    for _ in 0..3 {
        hidden.post_json(&mallory).await;
    }
    let answer = limited(&hidden, "");
    assert!(!answer.to_string().contains("mallory"), "{answer}");
    assert_eq!(entries(&answer)[0]["entries"][0]["value"], "(hidden)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_denied_keys_leaves_the_list_its_fixed_size() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    let heavy = body("bot", &["heavy".to_string()]);
    for round in 0..40 {
        let values: Vec<String> = (0..64).map(|i| format!("bot-{round}-{i}")).collect();
        server.post_json(&body("bot", &values)).await;
        server.post_json(&heavy).await;
        server.post_json(&heavy).await;
    }
    let answer = limited(&server, "?limit=1000");
    let listed = entries(&answer);
    // 2,560 distinct keys denied once, one denied 80 times: 256 slots, the heavy one first.
    assert_eq!(listed.len(), 256, "{}", listed.len());
    assert_eq!(listed[0]["entries"][0]["value"], "heavy", "{}", listed[0]);
    assert!(
        listed[0]["denied"].as_u64().is_some_and(|d| d >= 80),
        "{}",
        listed[0]
    );
    assert_eq!(entries(&limited(&server, "?limit=3")).len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_denied_through_one_replica_is_listed_by_another() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();
    let args = ["--redis-url", &redis.url()];
    let a = Slidegate::start(rules.path(), &args);
    let b = Slidegate::start(rules.path(), &args);
    let mallory = body("user", &["mallory".to_string()]);
    for _ in 0..4 {
        a.post_json(&mallory).await;
    }
    // B denied nothing itself; A posts its list every 2 s.
    let started = Instant::now();
    loop {
        let answer = limited(&b, "");
        if let Some(row) = entries(&answer).first() {
            assert_eq!(row["entries"][0]["value"], "mallory", "{answer}");
            assert_eq!(row["rule"], "per_user");
            assert_eq!(row["denied"], 2, "{answer}");
            assert_eq!(answer["replicas"], 2, "{answer}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "B does not list what A denied: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Denied through B too: one row, both replicas' denies.
    for _ in 0..2 {
        b.post_json(&mallory).await;
    }
    let answer = limited(&b, "");
    let row = &entries(&answer)[0];
    assert_eq!(
        (&row["denied"], &row["replicas"]),
        (&4.into(), &2.into()),
        "{answer}"
    );
}
