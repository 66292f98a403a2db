//! The HTTP port and the operator listener under their bounds, through the binary: pipelined
//! HTTP/1.1 requests are all answered, in order, on one connection; the operator listener has its
//! own connection allowance, so clients that hold the data ports at `--max-connections` cannot
//! keep `/metrics` out; WINDOW_UPDATE floods are closed; half-sent bodies stay within the HTTP
//! port's buffer budget.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::hostile::{h2_connection, send_as_window_allows};
use crate::support::{Slidegate, metric_value, wait_until};

const RULES: &str = "domain: pipe\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 50 }\n";

fn rules() -> tempfile::TempDir {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    rules
}

/// `n` `POST /json` for one user written at once on one connection, then read until `n` answers
/// came (or 5 s passed): the status of each, in order.
fn pipelined(port: u16, n: usize) -> Vec<u16> {
    let body = r#"{"domain":"pipe","descriptors":[{"entries":[{"key":"user","value":"p"}]}]}"#;
    let request = format!(
        "POST /json HTTP/1.1\r\nHost: slidegate\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .write_all(request.repeat(n).as_bytes())
        .expect("write");
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut text = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    while statuses(&text).len() < n && Instant::now() < deadline {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => text.extend_from_slice(&chunk[..read]),
            Err(_) => {}
        }
    }
    statuses(&text)
}

/// The status of every response in `bytes`, in order.
fn statuses(bytes: &[u8]) -> Vec<u16> {
    String::from_utf8_lossy(bytes)
        .match_indices("HTTP/1.1 ")
        .filter_map(|(at, _)| bytes.get(at + 9..at + 12))
        .filter_map(|code| std::str::from_utf8(code).ok()?.parse().ok())
        .collect()
}

#[test]
fn pipelined_requests_are_all_answered_in_order() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    let port = server.port_for("/json");
    assert_eq!(pipelined(port, 3), vec![200; 3]);
    // 47 more for the same user: the limit of 50 is reached at the 50th, in order.
    let answers = pipelined(port, 100);
    let mut expected = vec![200; 47];
    expected.resize(100, 429);
    assert_eq!(answers, expected);
}

#[test]
fn the_operator_listener_is_served_while_the_data_ports_are_full() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &["--max-connections", "8"]);
    // Held open, silent, until the end of the test (the handshake timeout is 10 s).
    let held: Vec<TcpStream> = (0..12)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", server.port_for("/json"))).ok())
        .collect();
    assert_eq!(held.len(), 12, "the kernel accepts them all");
    let refused = || {
        let (_, metrics) = server.get("/metrics");
        metric_value(
            &metrics,
            r#"slidegate_connections_refused_total{listener="http",reason="max_connections"}"#,
        )
    };
    // Before the operator listener had an allowance of its own, these found it full as well.
    let served = wait_until(Duration::from_secs(3), || {
        refused() >= 4.0 && (0..5).all(|_| server.get("/metrics").0 == 200)
    });
    assert!(served, "{} refused\n{}", refused(), server.log());
    drop(held);
}

/// An HTTP/2 frame header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("small").to_be_bytes();
    let mut frame = vec![length[1], length[2], length[3], kind, flags];
    frame.extend(stream.to_be_bytes());
    frame.extend(payload);
    frame
}

/// A client that sends WINDOW_UPDATE frames as fast as it can, having asked for nothing, is
/// closed, on the gRPC port and on the HTTP port (h2c).
#[test]
fn a_window_update_flood_is_closed() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    for port in [server.grpc_port, server.port_for("/json")] {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        start.extend(frame(0x4, 0, 0, &[]));
        stream.write_all(&start).expect("preface");
        let update = frame(0x8, 0, 0, &1u32.to_be_bytes());
        let burst = update.repeat(500);
        let started = Instant::now();
        let mut closed = false;
        while started.elapsed() < Duration::from_secs(5) {
            if stream.write_all(&burst).is_err() {
                closed = true;
                break;
            }
        }
        assert!(
            closed,
            "port {port}: still open after 5 s of WINDOW_UPDATE frames"
        );
    }
}

/// 40 h2c connections each open 100 `POST /json` that announce 65,000 bytes and send 60,000 of
/// them, for 3 s (before the budget: every body held, 260 MB and more). With the default budget
/// (16 MiB, at most 256 KiB per connection) RSS grows by less than 64 MiB, the requests that do
/// not fit are answered 503 and counted, and a normal client's requests are all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_bodies_on_the_http_port_stay_within_the_budget() {
    let rules = rules();
    let server = Slidegate::start(rules.path(), &[]);
    let port = server.port_for("/json");
    let rss_before = server.rss_kib();
    let until = Instant::now() + Duration::from_secs(3);
    let mut attack = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let mut sender = h2_connection(port, h2::client::Builder::new()).await;
        for _ in 0..100 {
            let request = http::Request::post(format!("http://127.0.0.1:{port}/json"))
                .header("content-type", "application/json")
                .header("content-length", "65000")
                .body(())
                .expect("request");
            let Ok((_, stream)) = sender.send_request(request, false) else {
                break;
            };
            attack.spawn(send_as_window_allows(
                stream,
                bytes::Bytes::from(vec![b' '; 60_000]),
            ));
        }
    }
    let normal = reqwest::Client::new();
    let mut answers = Vec::new();
    let mut peak = 0;
    while Instant::now() < until {
        let answer = normal
            .post(server.url("/json"))
            .body(r#"{"domain":"pipe","descriptors":[{"entries":[{"key":"user","value":"n"}]}]}"#)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        answers.push(answer.map(|a| a.status().as_u16()).unwrap_or(0));
        peak = peak.max(server.rss_kib());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    attack.abort_all();
    let grown_mib = peak.saturating_sub(rss_before) / 1024;
    let (_, metrics) = server.get("/metrics");
    let refused = metric_value(&metrics, "slidegate_http_buffer_refused_total");
    eprintln!("RSS +{grown_mib} MiB, {refused} refused, normal answers {answers:?}");
    assert!(grown_mib < 64, "RSS grew by {grown_mib} MiB");
    assert!(refused >= 1000.0, "{refused} refused");
    assert!(
        answers.iter().all(|&a| a == 200 || a == 429),
        "normal answers {answers:?}"
    );
}
