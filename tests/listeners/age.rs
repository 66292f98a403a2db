//! The connection age on the gRPC port: a connection older than `--grpc-max-connection-age`
//! (or envoyproxy/ratelimit's `GRPC_MAX_CONNECTION_AGE`) gets a GOAWAY and closes, so that a
//! client reconnects (and lands on whichever replica the balancing picks); a younger one, or one
//! on a server without an age, stays open.

use std::time::{Duration, Instant};

use crate::support::Slidegate;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";

/// How long an idle HTTP/2 connection to `server`'s gRPC port stays open, up to `within`.
async fn connection_lifetime(server: &Slidegate, within: Duration) -> Option<Duration> {
    let io = tokio::net::TcpStream::connect(("127.0.0.1", server.grpc_port))
        .await
        .expect("connect");
    let started = Instant::now();
    let (_client, connection) = h2::client::handshake(io).await.expect("HTTP/2 handshake");
    let _ = tokio::time::timeout(within, connection).await.ok()?;
    Some(started.elapsed())
}

fn rules() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, RULES).expect("rules");
    (dir, path)
}

#[tokio::test]
async fn an_aged_connection_is_closed_and_a_new_one_served() {
    let (_dir, rules) = rules();
    let server = Slidegate::start(&rules, &["--grpc-max-connection-age=1s"]);
    let lifetime = connection_lifetime(&server, Duration::from_secs(5)).await;
    let lifetime = lifetime.unwrap_or_else(|| panic!("still open after 5 s:\n{}", server.log()));
    assert!(lifetime >= Duration::from_millis(850), "{lifetime:?}");
    // The client reconnects and is served.
    let mut client = server.client().await;
    let answer = crate::support::call(
        &mut client,
        crate::support::request("d", vec![crate::support::descriptor(&[("k", "v")])]),
    )
    .await;
    assert_eq!(answer.overall_code, 1, "OK");
}

#[tokio::test]
async fn envoyproxy_ratelimits_variable_sets_the_age() {
    let (_dir, rules) = rules();
    let env = [
        ("GRPC_MAX_CONNECTION_AGE", "1s"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "1s"),
    ];
    let server = Slidegate::start_with_env(&rules, &[], &env);
    let lifetime = connection_lifetime(&server, Duration::from_secs(5)).await;
    assert!(
        lifetime.is_some(),
        "still open after 5 s:\n{}",
        server.log()
    );
}

#[tokio::test]
async fn without_an_age_a_connection_stays_open() {
    let (_dir, rules) = rules();
    let server = Slidegate::start(&rules, &[]);
    let lifetime = connection_lifetime(&server, Duration::from_secs(2)).await;
    assert_eq!(lifetime, None, "{}", server.log());
}
