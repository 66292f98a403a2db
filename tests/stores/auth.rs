//! A Redis that refuses slidegate's credentials (a wrong password, or none where one is needed)
//! is told apart from an outage, through the binary: within a second health is NOT_SERVING and
//! the log says so at `error`, calls fail as `auth` in `slidegate_redis_calls_total` (not as
//! timeouts), and the client's 503 names nothing of the store.

use std::time::{Duration, Instant};

use crate::support::{RedisServer, Slidegate, metric_value, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_reported_as_such() {
    let Some(redis) = RedisServer::start_with(&["--requirepass", "right-password"]) else {
        return;
    };
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        rules.path().join("rules.yaml"),
        "domain: auth\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .expect("write rules");
    let port = redis
        .url()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    for url in [
        format!("redis://:wrong-password@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let started = Instant::now();
        let server = Slidegate::start(rules.path(), &["--redis-url", &url]);
        let told = wait_until(Duration::from_secs(1), || {
            server.log().contains("refuses slidegate's credentials")
        });
        assert!(told, "{url}: {:?}\n{}", started.elapsed(), server.log());
        assert_eq!(server.get("/healthcheck").0, 503, "{url}");
        let answer = reqwest::Client::new()
            .post(server.url("/json"))
            .body(r#"{"domain":"auth","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#)
            .send()
            .await
            .expect("POST /json");
        assert_eq!(answer.status().as_u16(), 503, "{url}");
        let body = answer.text().await.expect("body");
        assert_eq!(body.trim(), "rate-limit store unavailable", "{url}");
        let (_, text) = server.get("/metrics");
        let auth = metric_value(&text, r#"slidegate_redis_calls_total{result="auth"}"#);
        let timeouts = metric_value(&text, r#"slidegate_redis_calls_total{result="timeout"}"#);
        assert!(
            auth >= 1.0 && timeouts == 0.0,
            "{url}: auth {auth}, timeout {timeouts}"
        );
        assert!(server.log().contains("kind=\"auth\""), "{}", server.log());
        assert!(!server.log().contains("wrong-password"), "{}", server.log());
    }
}
