//! `POST /explain` on the operator listener, through the binary: what a request would get now and
//! why, from the live rules and the live store (memory and Redis, the exact log and buckets),
//! counting nothing; never on the data ports; values hidden under `--operator-hide-values`.

use serde_json::Value;

use crate::support::{RedisServer, Slidegate};

const RULES: &str = "domain: ex
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 3 }
  - key: team
    rate_limit: { name: per_team, unit: minute, requests_per_unit: 3, precision: 10s }
  - key: plan
    value: gold
    rate_limit:
      { name: gold, unit: minute, requests_per_unit: 100, replaces: [{ name: per_user }] }
  - key: probe
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: path
    descriptors:
      - key: method
        value: GET
        rate_limit: { unit: minute, requests_per_unit: 5 }
";

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

/// A `/json` body of domain `ex` with one descriptor per `entries` list and `hits`.
fn body(descriptors: &[&[(&str, &str)]], hits: u64) -> String {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<Value> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({"domain": "ex", "descriptors": descriptors, "hits_addend": hits}).to_string()
}

/// The store flags of each store this machine runs: memory, and Redis when redis-server is here
/// (always in CI).
fn stores(redis: Option<&RedisServer>) -> Vec<(&'static str, Vec<String>)> {
    let mut stores = vec![("memory", Vec::new())];
    if let Some(redis) = redis {
        stores.push(("redis", vec!["--redis-url".to_string(), redis.url()]));
    }
    stores
}

/// The decision counters of `/metrics`, which `/explain` must not move.
fn decision_lines(server: &Slidegate) -> Vec<String> {
    let (_, text) = server.get("/metrics");
    text.lines()
        .filter(|l| {
            l.starts_with("slidegate_decisions_total")
                || l.starts_with("slidegate_hits_total")
                || l.starts_with("slidegate_store_duration_seconds_count")
        })
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reports_what_requests_recorded_and_records_nothing() {
    let redis = RedisServer::start();
    let rules = rules();
    for (store, args) in stores(redis.as_ref()) {
        if let Some(redis) = &redis {
            redis.cli(&["FLUSHALL"]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Slidegate::start(rules.path(), &args);
        // `user` is an exact log, `team` buckets of 10 s; 3 per minute each.
        for (key, precision) in [("user", "exact"), ("team", "buckets of 10s")] {
            let one = body(&[&[(key, "alice")]], 1);
            // Before any request: nothing held, the whole limit remaining.
            let (_, fresh) = server.explain(&one).await;
            let c = &fresh["descriptors"][0]["counters"][0];
            assert_eq!(
                (&c["holds"], &c["remaining"]),
                (&0.into(), &3.into()),
                "{store} {key}: {c}"
            );
            for _ in 0..2 {
                let answer = server.post_json(&one).await;
                assert_eq!(answer["overallCode"], "OK", "{store} {key}: {answer}");
            }
            let before = decision_lines(&server);
            for _ in 0..5 {
                let (status, explained) = server.explain(&one).await;
                assert_eq!(status, 200, "{store} {key}: {explained}");
                assert_eq!(explained["store"], store);
                assert_eq!(explained["overallCode"], "OK", "{explained}");
                let d = &explained["descriptors"][0];
                assert_eq!(d["outcome"], "limited", "{d}");
                assert_eq!(d["code"], "OK", "{d}");
                let c = &d["counters"][0];
                assert_eq!(c["precision"], precision, "{c}");
                assert_eq!(c["holds"], 2, "{store} {key}: {c}");
                assert_eq!(c["remaining"], 1, "{c}");
                assert_eq!(c["limit"], 3, "{c}");
                assert_eq!(c["over"], false, "{c}");
                let resets = c["resetsInMs"].as_u64().expect("resetsInMs");
                assert!(resets > 0 && resets <= 70_000, "{c}");
                assert_eq!(c["key"], format!("{{ex:{key}=alice}}60000"), "{c}");
            }
            // Asked with 2 hits, it would not fit: OVER_LIMIT, and still nothing counted.
            let (_, two) = server.explain(&body(&[&[(key, "alice")]], 2)).await;
            assert_eq!(two["overallCode"], "OVER_LIMIT", "{two}");
            assert_eq!(two["descriptors"][0]["counters"][0]["over"], true, "{two}");
            assert_eq!(
                decision_lines(&server),
                before,
                "{store} {key}: /explain moved the decision metrics"
            );
            // The third request still fits, the fourth does not: the explanations counted nothing.
            assert_eq!(server.post_json(&one).await["overallCode"], "OK");
            assert_eq!(server.post_json(&one).await["overallCode"], "OVER_LIMIT");
            let (_, full) = server.explain(&one).await;
            let c = &full["descriptors"][0]["counters"][0];
            assert_eq!((&c["holds"], &c["remaining"]), (&3.into(), &0.into()));
            assert_eq!(full["overallCode"], "OVER_LIMIT", "{full}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_redis_itself_not_the_deny_cache() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(rules.path(), &["--redis-url", &redis.url()]);
    let one = body(&[&[("user", "bob")]], 1);
    for _ in 0..3 {
        assert_eq!(server.post_json(&one).await["overallCode"], "OK");
    }
    // Full: the deny cache now remembers it for the rest of the minute.
    assert_eq!(server.post_json(&one).await["overallCode"], "OVER_LIMIT");
    redis.cli(&["FLUSHALL"]);
    // A request is still denied from the cache, which cannot know that the hits are gone...
    assert_eq!(server.post_json(&one).await["overallCode"], "OVER_LIMIT");
    // ...but /explain asks Redis: nothing is held.
    let (_, explained) = server.explain(&one).await;
    let c = &explained["descriptors"][0]["counters"][0];
    assert_eq!(c["holds"], 0, "{explained}");
    assert_eq!(c["remaining"], 3, "{explained}");
    assert_eq!(explained["overallCode"], "OK", "{explained}");
    assert_eq!(redis.cli(&["DBSIZE"]).trim(), "0", "/explain created a key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_why_a_descriptor_matches_nothing_or_is_replaced() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);

    // The first level matched, the second did not: the path names both.
    let (_, explained) = server
        .explain(&body(&[&[("path", "/a"), ("method", "POST")]], 1))
        .await;
    let d = &explained["descriptors"][0];
    assert_eq!(d["outcome"], "no_rule", "{d}");
    assert_eq!(d["counters"], serde_json::json!([]), "{d}");
    let path: Vec<&str> = d["path"]
        .as_array()
        .expect("path")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(path.len(), 2, "{d}");
    assert!(
        path[0].starts_with("path=/a: `path`, by its key"),
        "{path:?}"
    );
    assert!(
        path[1].starts_with("method=POST: no descriptor with key `method`"),
        "{path:?}"
    );
    // Ends above the limits.
    let (_, short) = server.explain(&body(&[&[("path", "/a")]], 1)).await;
    let last = short["descriptors"][0]["path"][1].as_str().unwrap_or("");
    assert!(last.contains("the limits are deeper"), "{short}");

    // `gold` replaces `per_user` in a request that matches both.
    let (_, both) = server
        .explain(&body(&[&[("user", "carol")], &[("plan", "gold")]], 1))
        .await;
    let user = &both["descriptors"][0];
    assert_eq!(user["outcome"], "replaced", "{both}");
    assert_eq!(user["replacedBy"], serde_json::json!(["gold"]), "{both}");
    assert_eq!(user["rule"]["name"], "per_user", "{both}");
    assert_eq!(both["descriptors"][1]["outcome"], "limited", "{both}");

    // A shadow rule over its limit reports OK and denies nothing; its counter says it is over.
    let (_, shadow) = server.explain(&body(&[&[("probe", "x")]], 1)).await;
    let d = &shadow["descriptors"][0];
    assert_eq!(
        (&d["code"], &shadow["overallCode"]),
        (&"OK".into(), &"OK".into())
    );
    assert_eq!(d["counters"][0]["over"], true, "{shadow}");
    assert_eq!(d["counters"][0]["shadow"], true, "{shadow}");
    assert_eq!(d["rule"]["shadow"], true, "{shadow}");

    // An unknown domain: every descriptor OK, nothing counted.
    let (_, unknown) = server
        .explain(r#"{"domain":"nope","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#)
        .await;
    assert_eq!(unknown["domainKnown"], false, "{unknown}");
    assert_eq!(unknown["descriptors"][0]["outcome"], "no_rule", "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_is_operator_only_bounded_and_hides_values_when_told() {
    let rules = rules();
    let server = Slidegate::start(
        rules.path(),
        &["--operator-hide-values", "--max-body-bytes", "2048"],
    );
    let secret = "alice@example.com";
    let one = body(&[&[("user", secret)], &[("path", secret)]], 1);
    assert_eq!(server.post_json(&one).await["overallCode"], "OK");
    let (status, explained) = server.explain(&one).await;
    assert_eq!(status, 200, "{explained}");
    let text = explained.to_string();
    assert!(!text.contains(secret), "a value leaked: {text}");
    assert_eq!(
        explained["descriptors"][0]["entries"][0]["value"],
        "(hidden)"
    );
    let counter = &explained["descriptors"][0]["counters"][0];
    assert_eq!(counter["holds"], 1, "{explained}");
    assert!(counter.get("key").is_none(), "{counter}");
    assert!(
        explained["descriptors"][1]["path"][0]
            .as_str()
            .is_some_and(|p| p.starts_with("path=(hidden): `path`")),
        "{explained}"
    );

    let client = reqwest::Client::new();
    // Never on the HTTP port.
    let data = format!("http://127.0.0.1:{}/explain", server.http_port);
    let status = client
        .post(&data)
        .body(one.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(status.status().as_u16(), 404);
    // A body over --max-body-bytes is refused; a bad one gets a clear 400.
    let big = body(&[&[("user", &"x".repeat(4096))]], 1);
    let (status, _) = server.explain(&big).await;
    assert_eq!(status, 413);
    let admin = server.url("/explain");
    let bad = client.post(&admin).body("{").send().await.expect("post");
    assert_eq!(bad.status().as_u16(), 400);
    assert!(
        bad.text()
            .await
            .unwrap_or_default()
            .contains("invalid JSON")
    );
}
