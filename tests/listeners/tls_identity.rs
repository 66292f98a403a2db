//! Who may connect under mutual TLS, through the real binary: the client SAN allow-list matches
//! each entry against SANs of its own type only (URI, DNS name with TLS's wildcards, IP
//! address), a bad entry stops the start with the entry named, and a client CA taken out of the
//! bundle closes the connections verified under it, long-lived streams and the HTTP port's
//! keep-alive connections included; one added closes none.

use std::time::Duration;

use rcgen::SanType;
use rcgen::string::Ia5String;

use crate::support::{Ca, Pair, slidegate_command, tls_client_config, wait_until};
use crate::tls::{
    ALLOWED, SecretVolume, call, call_as, channel, metrics, path_str, pem_files, rules,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

fn uri(text: &str) -> SanType {
    SanType::URI(Ia5String::try_from(text).expect("ia5"))
}

fn dns(text: &str) -> SanType {
    SanType::DnsName(Ia5String::try_from(text).expect("ia5"))
}

fn ip(text: &str) -> SanType {
    SanType::IpAddress(text.parse().expect("ip"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sans_match_entries_of_their_own_type_only() {
    let ca = Ca::new("slidegate test CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let [cert, key, client_ca] = pem_files(dir.path(), &ca.server(), &ca);
    let rules = rules();
    // The list `start_with` gives ({ALLOWED}, envoy.internal), and these two more.
    let more = ["--tls-client-san", "10.0.0.7,a.mesh.internal"];
    let slidegate = crate::tls::start_with(rules.path(), &cert, &key, &client_ca, &more);
    let port = slidegate.grpc_port;

    for (who, san) in [
        ("a URI SAN on the list", uri(ALLOWED)),
        ("a DNS SAN on the list", dns("envoy.internal")),
        ("a DNS SAN in another case", dns("Envoy.Internal")),
        ("an IP SAN on the list", ip("10.0.0.7")),
        (
            "a wildcard DNS SAN over a listed name",
            dns("*.mesh.internal"),
        ),
    ] {
        let client = ca.client_with(vec![san]);
        let answer = call_as(port, &ca.pem, Some(&client)).await;
        assert_eq!(answer, Ok(Code::Ok), "{who}: {}", slidegate.log());
    }
    let refused = [
        ("a listed DNS name as a URI SAN", uri("envoy.internal")),
        ("a listed URI as a DNS SAN", dns(ALLOWED)),
        ("a listed IP address as a DNS SAN", dns("10.0.0.7")),
        ("another IP SAN", ip("10.0.0.8")),
        ("a wildcard over two labels", dns("*.b.mesh.internal")),
        ("a wildcard over a top-level domain", dns("*.internal")),
    ];
    for (who, san) in refused.clone() {
        let client = ca.client_with(vec![san]);
        let answer = call_as(port, &ca.pem, Some(&client)).await;
        assert!(answer.is_err(), "{who} got an answer: {answer:?}");
    }
    let counted = wait_until(Duration::from_secs(5), || {
        let text = metrics(&slidegate);
        crate::tls::refused(&text, "grpc", "san_not_allowed") >= refused.len() as f64
    });
    assert!(counted, "{}", metrics(&slidegate));
}

#[test]
fn a_client_san_entry_of_no_type_stops_the_start_naming_it() {
    let ca = Ca::new("slidegate test CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let [cert, key, client_ca] = pem_files(dir.path(), &ca.server(), &ca);
    let rules = rules();
    let out = slidegate_command()
        .arg("serve")
        .arg("--config")
        .arg(rules.path())
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .args(["--tls-cert-file", path_str(&cert)])
        .args(["--tls-key-file", path_str(&key)])
        .args(["--tls-client-ca-file", path_str(&client_ca)])
        .args(["--tls-client-san", "envoy.internal,edge proxy"])
        .output()
        .expect("run slidegate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(
        stderr.contains(r#"--tls-client-san entry "edge proxy""#),
        "{stderr}"
    );
}

/// A gRPC health `Watch` on `channel`: a stream that stays open as long as its connection.
async fn watch(channel: Channel) -> tonic::Streaming<HealthCheckResponse> {
    let request = HealthCheckRequest {
        service: String::new(),
    };
    let mut stream = HealthClient::new(channel)
        .watch(request)
        .await
        .expect("watch")
        .into_inner();
    let first = stream.message().await.expect("a first status");
    assert!(first.is_some(), "the watch ended at once");
    stream
}

/// Whether `stream` ends (or fails) within `within`.
async fn ends_within(stream: &mut tonic::Streaming<HealthCheckResponse>, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => return false,
            Ok(Ok(Some(_))) => continue,
            Ok(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_taken_out_closes_connections_verified_under_it() {
    let old_ca = Ca::new("old client CA");
    let new_ca = Ca::new("new client CA");
    let server = old_ca.server();
    let mut volume = SecretVolume::new(&server, &old_ca.pem);
    let rules = rules();
    let slidegate = volume.serve(rules.path(), &["--drain-timeout", "1s"]);
    let port = slidegate.grpc_port;
    let old_client = old_ca.client(ALLOWED);
    let open = channel(port, &old_ca.pem, Some(&old_client))
        .await
        .expect("connect");
    assert_eq!(call(open.clone()).await, Ok(Code::Ok));
    // A long-lived stream on the connection: it ends only with it.
    let mut stream = watch(open.clone()).await;

    // A CA added: the connection stays.
    volume.swap(&server, &format!("{}{}", old_ca.pem, new_ca.pem));
    let new_client = new_ca.client(ALLOWED);
    let started = tokio::time::Instant::now();
    while call_as(port, &old_ca.pem, Some(&new_client)).await != Ok(Code::Ok) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the added CA is not trusted:\n{}",
            slidegate.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !ends_within(&mut stream, Duration::from_secs(2)).await,
        "a CA added closed the connection"
    );

    // The old CA taken out: the connection is asked to close, its stream cut after the drain
    // timeout (1 s), and a call on the channel reconnects and is refused.
    volume.swap(&server, &new_ca.pem);
    let started = std::time::Instant::now();
    assert!(
        ends_within(&mut stream, Duration::from_secs(10)).await,
        "a stream verified under the removed CA is still open:\n{}",
        slidegate.log()
    );
    let cut = started.elapsed();
    assert!(
        call(open.clone()).await.is_err(),
        "a client of the removed CA still gets answers"
    );
    eprintln!("the stream ended {cut:?} after the swap");
    assert_eq!(
        call_as(port, &old_ca.pem, Some(&new_client)).await,
        Ok(Code::Ok),
        "a client of the new CA"
    );
    assert!(
        slidegate.log().contains("a client CA was taken out"),
        "{}",
        slidegate.log()
    );
}

/// An HTTPS connection to the HTTP port that stays open between requests (HTTP/1.1 keep-alive),
/// as `client` of a server under `server_ca`.
struct KeepAlive(rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>);

impl KeepAlive {
    fn open(port: u16, server_ca: &str, client: &Pair) -> KeepAlive {
        let config = tls_client_config(server_ca, client, b"http/1.1");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let connection = rustls::ClientConnection::new(config, name).expect("client");
        let socket = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        KeepAlive(rustls::StreamOwned::new(connection, socket))
    }

    /// `GET /healthcheck` on the connection: the status, or `None` when the connection is gone.
    fn healthcheck(&mut self) -> Option<u16> {
        use std::io::{Read, Write};
        let request = "GET /healthcheck HTTP/1.1\r\nHost: localhost\r\n\r\n";
        self.0.write_all(request.as_bytes()).ok()?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match self.0.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return None,
            }
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        self.0.read_exact(&mut body).ok()?;
        head.split(' ').nth(1).and_then(|code| code.parse().ok())
    }

    /// Whether the server closes the connection within `within`, without a request on it.
    fn closed_by_server(&mut self, within: Duration) -> bool {
        use std::io::Read;
        self.0.sock.set_read_timeout(Some(within)).expect("timeout");
        let mut byte = [0u8; 1];
        // End of stream, or an error for a close without close_notify; a timeout is neither.
        !matches!(self.0.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
            || e.kind() == std::io::ErrorKind::TimedOut)
    }
}

/// The HTTP port's side of [`a_client_ca_taken_out_closes_connections_verified_under_it`]: an
/// HTTPS keep-alive connection (HTTP/1.1) verified under a client CA.
///
/// Proves: a CA added leaves the connection serving; the CA taken out closes it within 10 s (the
/// server ends it, no request needed; without the close, only the header-read timeout, which
/// `--handshake-timeout` sets, would: here 60 s), a new connection under the removed CA gets no
/// answer, and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_taken_out_closes_http_keep_alive_connections_verified_under_it() {
    let old_ca = Ca::new("old client CA");
    let new_ca = Ca::new("new client CA");
    let server = old_ca.server();
    let mut volume = SecretVolume::new(&server, &old_ca.pem);
    let rules = rules();
    // An idle keep-alive connection is otherwise closed by the header-read timeout (the handshake
    // timeout): far away here.
    let slidegate = volume.serve(
        rules.path(),
        &[
            "--drain-timeout",
            "1s",
            "--body-timeout",
            "60s",
            "--handshake-timeout",
            "60s",
        ],
    );
    let port = slidegate.http_port;
    let old_client = old_ca.client(ALLOWED);
    let mut open = KeepAlive::open(port, &old_ca.pem, &old_client);
    assert_eq!(open.healthcheck(), Some(200), "{}", slidegate.log());

    // A CA added: the connection keeps serving.
    volume.swap(&server, &format!("{}{}", old_ca.pem, new_ca.pem));
    let new_client = new_ca.client(ALLOWED);
    assert!(
        wait_until(Duration::from_secs(10), || {
            KeepAlive::open(port, &old_ca.pem, &new_client).healthcheck() == Some(200)
        }),
        "the added CA is not trusted:\n{}",
        slidegate.log()
    );
    assert_eq!(
        open.healthcheck(),
        Some(200),
        "a CA added closed the connection"
    );

    // The old CA taken out: the server closes the idle connection by itself.
    volume.swap(&server, &new_ca.pem);
    let started = std::time::Instant::now();
    assert!(
        open.closed_by_server(Duration::from_secs(10)),
        "a keep-alive connection verified under the removed CA is still open:\n{}",
        slidegate.log()
    );
    eprintln!(
        "the connection closed {:?} after the swap",
        started.elapsed()
    );
    assert_eq!(
        KeepAlive::open(port, &old_ca.pem, &old_client).healthcheck(),
        None,
        "a client of the removed CA still gets answers"
    );
    assert_eq!(
        KeepAlive::open(port, &old_ca.pem, &new_client).healthcheck(),
        Some(200),
        "a client of the new CA"
    );
    assert!(
        slidegate.log().contains("a client CA was taken out"),
        "{}",
        slidegate.log()
    );
}
