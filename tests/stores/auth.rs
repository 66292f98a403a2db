//! A Redis that refuses slidegate's credentials (a wrong password, or none where one is needed)
//! is told apart from an outage, through the binary: within a second health is NOT_SERVING and
//! the log says so at `error`, calls fail as `auth` in `slidegate_redis_calls_total` (not as
//! timeouts), and the client's 503 names nothing of the store. The password can come from a
//! file, read again at every connection; an address with nothing behind it and a name that does
//! not resolve are reported as `refused` and `dns`.

use std::time::{Duration, Instant};

use crate::support::{RedisServer, Slidegate, free_port, metric_value, wait_until};

const RULES: &str = "domain: auth\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";

fn rules() -> tempfile::TempDir {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    rules
}

/// `POST /json` for user `user`: the status and the body.
async fn check(server: &Slidegate, user: &str) -> (u16, String) {
    let answer = reqwest::Client::new()
        .post(server.url("/json"))
        .body(format!(
            r#"{{"domain":"auth","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
        ))
        .send()
        .await
        .expect("POST /json");
    let status = answer.status().as_u16();
    (status, answer.text().await.expect("body"))
}

fn calls(server: &Slidegate, result: &str) -> f64 {
    let (_, text) = server.get("/metrics");
    metric_value(
        &text,
        &format!(r#"slidegate_redis_calls_total{{result="{result}"}}"#),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_reported_as_such() {
    let Some(redis) = RedisServer::start_with(&["--requirepass", "right-password"]) else {
        return;
    };
    let rules = rules();
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
        let (status, body) = check(&server, "a").await;
        assert_eq!(status, 503, "{url}");
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

/// `--redis-password-file`: the password comes from the file, never shows in the log, and is
/// read again when slidegate reconnects, so rotating it in Redis and in the file together needs
/// no restart; a wrong one in the file is an authentication failure like a wrong one in the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_file_is_read_again_at_every_connection() {
    let Some(redis) = RedisServer::start_with(&["--requirepass", "first-secret"]) else {
        return;
    };
    let rules = rules();
    let secret = tempfile::tempdir().expect("tempdir");
    let file = secret.path().join("redis-password");
    std::fs::write(&file, "first-secret\n").expect("write password");
    let file_arg = file.to_str().expect("UTF-8 path");
    let url = redis.url();
    let start = || {
        let args = ["--redis-url", &url, "--redis-password-file", file_arg];
        Slidegate::start(rules.path(), &args)
    };
    let server = start();
    assert!(
        wait_until(Duration::from_secs(5), || server.get("/healthcheck").0
            == 200),
        "{}",
        server.log()
    );
    assert_eq!(check(&server, "a").await.0, 200);

    // Rotate: Redis and the file take the new password; slidegate's connections are closed.
    let auth = ["-a", "first-secret", "--no-auth-warning"];
    let cli = |args: &[&str]| redis.cli(&[&auth[..], args].concat());
    std::fs::write(&file, "second-secret\n").expect("write password");
    assert_eq!(
        cli(&["CONFIG", "SET", "requirepass", "second-secret"]).trim(),
        "OK"
    );
    let killed = redis.cli(&[
        "-a",
        "second-secret",
        "--no-auth-warning",
        "CLIENT",
        "KILL",
        "TYPE",
        "normal",
    ]);
    assert!(
        killed.trim().parse::<u32>().is_ok_and(|n| n >= 1),
        "{killed}"
    );
    let served = wait_until(Duration::from_secs(5), || {
        server.get("/healthcheck").0 == 200
            && redis
                .cli(&["-a", "second-secret", "--no-auth-warning", "CLIENT", "LIST"])
                .contains("cmd=evalsha")
    });
    assert!(served, "{}", server.log());
    for _ in 0..4 {
        assert_eq!(check(&server, "a").await.0, 200, "{}", server.log());
    }
    // 5 per minute: the sixth is over, so the calls after the rotation counted in Redis.
    assert_eq!(check(&server, "a").await.0, 429);
    assert_eq!(calls(&server, "auth"), 0.0, "{}", server.log());
    let log = server.log();
    assert!(
        !log.contains("first-secret") && !log.contains("second-secret"),
        "{log}"
    );
    drop(server);

    // A wrong password in the file: health and the calls say `auth`.
    std::fs::write(&file, "not-the-secret").expect("write password");
    let server = start();
    let told = wait_until(Duration::from_secs(2), || {
        server.log().contains("refuses slidegate's credentials")
    });
    assert!(told, "{}", server.log());
    assert_eq!(check(&server, "b").await.0, 503);
    assert!(calls(&server, "auth") >= 1.0, "{}", server.log());
    assert!(!server.log().contains("not-the-secret"), "{}", server.log());
}

/// A password in the URL and a password file, or a file that cannot be read, stop the start
/// with an error that says so.
#[test]
fn a_password_in_two_places_or_an_unreadable_file_stops_the_start() {
    let rules = rules();
    let secret = tempfile::tempdir().expect("tempdir");
    let file = secret.path().join("redis-password");
    std::fs::write(&file, "from-file").expect("write password");
    let missing = secret.path().join("missing");
    let cases = [
        (
            "redis://:from-url@127.0.0.1:6379",
            &file,
            "give it in one place",
        ),
        (
            "redis://127.0.0.1:6379",
            &missing,
            "cannot read the Redis password file",
        ),
    ];
    for (url, path, said) in cases {
        let out = crate::support::slidegate_command()
            .args(["serve", "--config"])
            .arg(rules.path())
            .args(["--redis-url", url, "--redis-password-file"])
            .arg(path)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .output()
            .expect("run slidegate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}: {stderr}");
        assert!(stderr.contains(said), "{url}: {stderr}");
        assert!(
            !stderr.contains("from-url") && !stderr.contains("from-file"),
            "{stderr}"
        );
    }
}

/// Nothing listening, and a host name that does not resolve: health and the calls name each
/// (`refused`, `dns`), not a timeout of the call deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_and_an_unknown_host_are_named() {
    let rules = rules();
    let refused = format!("redis://127.0.0.1:{}", free_port());
    for (url, kind) in [
        (refused.as_str(), "refused"),
        ("redis://no-such-host.invalid:6379", "dns"),
    ] {
        let server = Slidegate::start(rules.path(), &["--redis-url", url]);
        let (status, body) = check(&server, "a").await;
        assert_eq!(
            (status, body.trim()),
            (503, "rate-limit store unavailable"),
            "{url}"
        );
        if kind == "refused" {
            assert!(calls(&server, kind) >= 1.0, "{url}: {}", server.log());
            assert_eq!(calls(&server, "timeout"), 0.0, "{url}: {}", server.log());
        } else {
            // A resolver slower than the call deadline makes the first calls time out; the
            // connection attempt goes on, and the next call gets its answer.
            for _ in 0..30 {
                if calls(&server, kind) >= 1.0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                check(&server, "a").await;
            }
            assert!(calls(&server, kind) >= 1.0, "{url}: {}", server.log());
        }
        let named = wait_until(Duration::from_secs(3), || {
            server.log().contains(&format!("kind=\"{kind}\""))
                && server.log().contains("store unreachable")
        });
        assert!(named, "{url}: {}", server.log());
        assert_eq!(server.get("/healthcheck").0, 503, "{url}");
    }
}
