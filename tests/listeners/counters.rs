//! `DELETE /counters` on the operator listener, through the binary: refused without a token
//! configured and with a missing or wrong one, obeyed with the right one (memory and Redis, the
//! exact log and buckets, one limit by `name`), and a key cleared through one replica admitted by
//! another, whose deny cache held it, within 500 ms.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{RedisServer, Slidegate, slidegate_command};

const RULES: &str = "domain: ct
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 3 }
  - key: team
    rate_limit: { name: per_team, unit: minute, requests_per_unit: 3, precision: 10s }
  - key: client
    rate_limits:
      - { name: client_minute, unit: minute, requests_per_unit: 3 }
      - { name: client_hour, unit: hour, requests_per_unit: 100 }
";

const TOKEN: &str = "op-token-1";

/// The rules, and a token file holding [`TOKEN`] with a trailing newline.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("rules")).expect("mkdir");
    std::fs::write(dir.path().join("rules/rules.yaml"), RULES).expect("write rules");
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).expect("write token");
    dir
}

fn body(key: &str, value: &str) -> String {
    serde_json::json!({
        "domain": "ct",
        "descriptors": [{"entries": [{"key": key, "value": value}]}],
    })
    .to_string()
}

/// `DELETE /counters[query]` with `body` and, if given, the bearer token: (status, body text).
async fn clear(server: &Slidegate, query: &str, body: &str, token: Option<&str>) -> (u16, String) {
    let url = format!("http://127.0.0.1:{}/counters{query}", server.admin_port);
    let mut request = reqwest::Client::new().delete(url).body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("DELETE /counters");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

async fn code(server: &Slidegate, body: &str) -> String {
    let answer = server.post_json(body).await;
    answer["overallCode"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_counters_needs_the_operator_token() {
    let dir = setup();
    let rules = dir.path().join("rules");
    let one = body("user", "ann");

    // A token file that cannot be read (or is empty) stops the start, naming it.
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").expect("write");
    for file in [dir.path().join("absent"), empty] {
        let out = slidegate_command()
            .args(["serve", "--config"])
            .arg(&rules)
            .arg("--admin-token-file")
            .arg(&file)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .output()
            .expect("run slidegate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&*file.to_string_lossy()), "{stderr}");
    }

    // No token configured: refused, saying how to turn it on; the counter is untouched.
    let open = Slidegate::start(&rules, &[]);
    assert_eq!(code(&open, &one).await, "OK");
    let (status, text) = clear(&open, "", &one, Some(TOKEN)).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("--admin-token-file"), "{text}");
    let (_, explained) = open.explain(&one).await;
    assert_eq!(explained["descriptors"][0]["counters"][0]["holds"], 1);
    drop(open);

    let token_file = dir.path().join("token");
    let token_arg = token_file.to_string_lossy().into_owned();
    let server = Slidegate::start(&rules, &["--admin-token-file", &token_arg]);
    assert_eq!(code(&server, &one).await, "OK");
    for (token, expected) in [
        (None, 401),
        (Some("op-token-2"), 401),
        (Some("op-token"), 401),
    ] {
        let (status, text) = clear(&server, "", &one, token).await;
        assert_eq!(status, expected, "{token:?}: {text}");
    }
    let (_, explained) = server.explain(&one).await;
    assert_eq!(explained["descriptors"][0]["counters"][0]["holds"], 1);
    // Never on the HTTP port.
    let data = format!("http://127.0.0.1:{}/counters", server.http_port);
    let response = reqwest::Client::new()
        .delete(data)
        .bearer_auth(TOKEN)
        .body(one.clone())
        .send()
        .await
        .expect("DELETE");
    assert_eq!(response.status().as_u16(), 404);
    let (status, text) = clear(&server, "", &one, Some(TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    let cleared = |text: &str| {
        let answer: Value = serde_json::from_str(text).expect("JSON");
        answer["cleared"].as_f64().expect("cleared")
    };
    let mut counted = cleared(&text);

    // The file is read at each use: a rotated token applies at once, the old one is refused.
    std::fs::write(&token_file, "op-token-2").expect("rotate");
    let (status, _) = clear(&server, "", &one, Some(TOKEN)).await;
    assert_eq!(status, 401);
    assert_eq!(code(&server, &one).await, "OK");
    let (status, text) = clear(&server, "", &one, Some("op-token-2")).await;
    assert_eq!(status, 200, "{text}");
    counted += cleared(&text);
    assert!(counted >= 2.0, "each clear cleared a counter");
    // Each clear is logged with who asked, and counted.
    let log = server.log();
    let lines: Vec<&str> = (log.lines())
        .filter(|l| l.contains("counters cleared through DELETE /counters"))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines.iter().all(|l| l.contains("caller=\"127.0.0.1:")),
        "{lines:?}"
    );
    let metrics = server.get("/metrics").1;
    assert_eq!(
        crate::support::metric_value(&metrics, "slidegate_counters_cleared_total"),
        counted
    );
}

/// With `--operator-hide-values`, a clear answers and logs no descriptor value and no counter key,
/// and still clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_counters_with_values_hidden_shows_no_value() {
    let dir = setup();
    let rules = dir.path().join("rules");
    let token_file = dir.path().join("token");
    let token_arg = token_file.to_string_lossy().into_owned();
    let server = Slidegate::start(
        &rules,
        &["--admin-token-file", &token_arg, "--operator-hide-values"],
    );
    let secret = body("user", "secret-person");
    assert_eq!(code(&server, &secret).await, "OK");
    let (status, text) = clear(&server, "", &secret, Some(TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(answer["cleared"], 1, "{text}");
    assert!(!text.contains("secret-person"), "{text}");
    assert!(
        answer["descriptors"][0]["counters"][0].get("key").is_none(),
        "{text}"
    );
    assert!(text.contains("(hidden)"), "{text}");
    let log = server.log();
    assert!(
        log.contains("counters cleared through DELETE /counters"),
        "{log}"
    );
    assert!(!log.contains("secret-person"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_counters_forgets_them_in_both_stores_and_forms() {
    let dir = setup();
    let rules = dir.path().join("rules");
    let token_arg = dir.path().join("token").to_string_lossy().into_owned();
    let redis = RedisServer::start();
    let mut stores = vec![("memory", Vec::new())];
    if let Some(redis) = &redis {
        stores.push(("redis", vec!["--redis-url".to_string(), redis.url()]));
    }
    // A long value: the memory store keeps such a counter under a compact key.
    let long = "v".repeat(300);
    for (store, extra) in stores {
        let mut args = vec!["--admin-token-file", token_arg.as_str()];
        args.extend(extra.iter().map(String::as_str));
        let server = Slidegate::start(&rules, &args);
        for (key, value) in [("user", "ann"), ("team", "blue"), ("user", long.as_str())] {
            let one = body(key, value);
            for _ in 0..3 {
                assert_eq!(code(&server, &one).await, "OK", "{store} {key}");
            }
            assert_eq!(code(&server, &one).await, "OVER_LIMIT", "{store} {key}");
            let (status, text) = clear(&server, "", &one, Some(TOKEN)).await;
            assert_eq!(status, 200, "{store} {key}: {text}");
            let answer: Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(answer["cleared"], 1, "{store} {key}: {answer}");
            assert_eq!(
                answer["descriptors"][0]["counters"][0]["held"], 3,
                "{answer}"
            );
            for _ in 0..3 {
                assert_eq!(code(&server, &one).await, "OK", "{store} {key} after");
            }
            assert_eq!(
                code(&server, &one).await,
                "OVER_LIMIT",
                "{store} {key} after"
            );
        }

        // `?name=` picks one limit of several: the hour keeps its hits.
        let client = body("client", "c1");
        for _ in 0..3 {
            assert_eq!(code(&server, &client).await, "OK");
        }
        let (status, text) = clear(&server, "?name=client_minute", &client, Some(TOKEN)).await;
        assert_eq!(status, 200, "{text}");
        let (_, explained) = server.explain(&client).await;
        let counters = &explained["descriptors"][0]["counters"];
        assert_eq!(counters[0]["name"], "client_minute", "{explained}");
        assert_eq!(counters[0]["holds"], 0, "{store}: {explained}");
        assert_eq!(counters[1]["holds"], 3, "{store}: {explained}");
        // No name: every limit.
        let (_, text) = clear(&server, "", &client, Some(TOKEN)).await;
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["cleared"], 1, "{answer}");
        let (_, explained) = server.explain(&client).await;
        assert_eq!(explained["descriptors"][0]["counters"][1]["holds"], 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_cleared_through_one_replica_is_admitted_by_another_within_half_a_second() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = setup();
    let rules = dir.path().join("rules");
    let token_arg = dir.path().join("token").to_string_lossy().into_owned();
    let args = [
        "--redis-url",
        &redis.url(),
        "--admin-token-file",
        &token_arg,
    ];
    let a = Slidegate::start(&rules, &args);
    let b = Slidegate::start(&rules, &args);
    let one = body("user", "zed");
    for _ in 0..3 {
        assert_eq!(code(&b, &one).await, "OK");
    }
    // Denied through B, whose deny cache now holds the key for the rest of the minute.
    assert_eq!(code(&b, &one).await, "OVER_LIMIT");
    let (status, text) = clear(&a, "", &one, Some(TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    let cleared = Instant::now();
    loop {
        let admitted = code(&b, &one).await == "OK";
        let waited = cleared.elapsed();
        if admitted {
            assert!(
                waited < Duration::from_millis(500),
                "B admitted after {waited:?}"
            );
            break;
        }
        assert!(
            waited < Duration::from_millis(500),
            "B still denies {waited:?} after the clear"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
