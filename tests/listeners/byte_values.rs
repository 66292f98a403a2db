//! Descriptor values as bytes through the binary: a value that is not UTF-8 is decided under a
//! counter of its own over gRPC (memory and Redis) and `/check`, never refused (a refusal is an
//! uncounted pass behind Envoy), and a megabyte value never becomes a megabyte metric label.

use std::io::{Read, Write};
use std::time::Duration;

use prost::encoding::{bytes as wire_bytes, string, uint32};

use crate::support::{
    RedisServer, Slidegate, metric_value, promtool_check_metrics, raw_should_rate_limit,
};

const RULES: &str = r#"
domain: bytes
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: detailed
    detailed_metric: true
    rate_limit: { unit: second, requests_per_unit: 1000000 }
"#;

fn rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

/// A `RateLimitRequest` of domain `bytes` encoded by hand, one single-entry descriptor per pair:
/// Envoy's Rust types cannot hold bytes that are not UTF-8, Envoy itself sends them.
fn encoded(descriptors: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut message = Vec::new();
    string::encode(1, &"bytes".to_string(), &mut message);
    for (key, value) in descriptors {
        let mut entry = Vec::new();
        wire_bytes::encode(1, &key.to_vec(), &mut entry);
        wire_bytes::encode(2, &value.to_vec(), &mut entry);
        let mut descriptor = Vec::new();
        wire_bytes::encode(1, &entry, &mut descriptor);
        wire_bytes::encode(2, &descriptor, &mut message);
    }
    uint32::encode(3, &1, &mut message);
    message
}

/// The call's overall code (1 OK, 2 OVER_LIMIT), or the gRPC status it failed with.
async fn overall(server: &Slidegate, descriptors: &[(&[u8], &[u8])]) -> Result<i32, String> {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message as _;
    let answer = raw_should_rate_limit(
        server.grpc_port,
        &[],
        crate::support::grpc_frame(&encoded(descriptors)),
    )
    .await;
    match answer.status.as_deref() {
        Some("0") => {
            let body = answer.body.get(5..).unwrap_or_default();
            let response = RateLimitResponse::decode(body).map_err(|e| e.to_string())?;
            Ok(response.overall_code)
        }
        other => Err(format!("status {other:?}: {:?}", answer.message)),
    }
}

const OK: Result<i32, String> = Ok(1);
const OVER: Result<i32, String> = Ok(2);

async fn non_utf8_values_are_decided(server: &Slidegate) {
    for _ in 0..3 {
        assert_eq!(overall(server, &[(b"user", b"bob")]).await, OK);
    }
    assert_eq!(overall(server, &[(b"user", b"bob")]).await, OVER);
    // The over-limit user stays over with one more descriptor that is not UTF-8.
    assert_eq!(
        overall(server, &[(b"user", b"bob"), (b"path", b"x\xff")]).await,
        OVER
    );
    // Distinct bytes, distinct counters (`path` allows one per minute); the same bytes, the same.
    assert_eq!(overall(server, &[(b"path", b"e\xfe")]).await, OK);
    assert_eq!(overall(server, &[(b"path", b"e\\xfe")]).await, OK);
    assert_eq!(overall(server, &[(b"path", b"e\xfd")]).await, OK);
    assert_eq!(overall(server, &[(b"path", b"e\xfe")]).await, OVER);
    let (_, metrics) = server.get("/metrics");
    let escaped = metric_value(
        &metrics,
        "slidegate_escaped_entries_total{transport=\"grpc\"}",
    );
    assert_eq!(escaped, 4.0, "{metrics}");
}

/// gRPC on the memory store: a value that is not UTF-8 is decided, and distinct bytes count apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_values_that_are_not_utf8_are_decided_in_memory() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    non_utf8_values_are_decided(&server).await;
}

/// The same on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_values_that_are_not_utf8_are_decided_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();
    let server = Slidegate::start(rules.path(), &["--redis-url", &redis.url()]);
    non_utf8_values_are_decided(&server).await;
}

/// `/check` with a raw descriptor header, as nginx forwards it: the status.
fn check(port: u16, descriptor: &[u8]) -> u16 {
    let mut request = b"GET /check HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
        x-ratelimit-domain: bytes\r\nx-ratelimit-descriptor: "
        .to_vec();
    request.extend_from_slice(descriptor);
    request.extend_from_slice(b"\r\n\r\n");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream.write_all(&request).expect("send");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    crate::support::http_status(&String::from_utf8_lossy(&raw))
}

/// `/check` never merges distinct bytes: Unicode whitespace is part of a value (only SP and HTAB
/// around an entry are not), and bytes that are not UTF-8, raw or percent-encoded, count apart.
#[test]
fn check_values_that_differ_in_bytes_count_apart() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    let port = server.http_port;
    for (first, second) in [
        (&b"path=carol"[..], &b"path=carol\xc2\xa0"[..]),
        (b"path=e\xff", b"path=e\xfe"),
        (b"path=f%FF", b"path=f%C0"),
    ] {
        assert_eq!(
            check(port, first),
            200,
            "{:?}",
            String::from_utf8_lossy(first)
        );
        assert_eq!(
            check(port, second),
            200,
            "{:?}",
            String::from_utf8_lossy(second)
        );
        assert_eq!(
            check(port, first),
            429,
            "{:?}",
            String::from_utf8_lossy(first)
        );
    }
    // Spaces and tabs around an entry are HTTP's, not the value's.
    assert_eq!(check(port, b"path=g"), 200);
    assert_eq!(check(port, b"\tpath=g "), 429);
    let (_, metrics) = server.get("/metrics");
    let escaped = metric_value(
        &metrics,
        "slidegate_escaped_entries_total{transport=\"check\"}",
    );
    assert_eq!(escaped, 6.0, "{metrics}");
}

/// 40 calls with a distinct 1 MiB value each on a `detailed_metric` rule: every `rule` label is
/// at most 128 bytes, `/metrics` stays small, and the server's RSS grows by less than 96 MiB
/// (unbounded labels took it to 1.2 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn megabyte_values_make_bounded_labels() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    assert_eq!(overall(&server, &[(b"detailed", b"warm")]).await, OK);
    let rss_before = server.rss_kib();
    for i in 0..40u8 {
        let mut value = vec![b'v'; 1 << 20];
        value[0] = b'a' + i % 26;
        value[1] = b'a' + i / 26;
        assert_eq!(overall(&server, &[(b"detailed", &value)]).await, OK);
    }
    let (status, metrics) = server.get("/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.len() < 256 * 1024,
        "/metrics is {} bytes",
        metrics.len()
    );
    let labels: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("slidegate_decisions_total{decision=\"allowed\""))
        .filter_map(|l| l.split("rule=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert_eq!(labels.len(), 41, "one series per value");
    assert!(labels.iter().all(|l| l.len() <= 128), "{labels:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    promtool_check_metrics(dir.path(), &metrics);
    let grown = server.rss_kib().saturating_sub(rss_before);
    assert!(grown < 96 * 1024, "RSS grew by {grown} KiB");
}
