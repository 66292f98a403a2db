//! TLS and mutual TLS on the real binary, with certificates generated here (rcgen): a client with
//! a certificate from the configured CA and a SAN on the allow-list gets answers over gRPC and
//! HTTPS; a certificate from another CA, no certificate, a SAN not on the list and plaintext are
//! refused during the handshake and counted by reason. The certificate, key and client CA are
//! replaced while serving (a rename over the file, a Kubernetes Secret `..data` swap): new
//! connections get the new certificate, open ones keep working, and a broken replacement keeps
//! the old one serving.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{
    Ca, Pair, Slidegate, descriptor, https_get, metric_value, request, tls_client_config,
    wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const RULES: &str = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000\n";

/// The SAN the allowed clients carry.
pub(crate) const ALLOWED: &str = "spiffe://cluster.local/ns/edge/sa/envoy";

/// Writes `contents` to `path` through a temporary file renamed over it, as cert-manager does.
pub(crate) fn rename_over(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// A directory laid out as a Kubernetes Secret volume: `tls.crt`, `tls.key` and `ca.crt` are
/// symlinks through `..data` to a timestamped directory.
pub(crate) struct SecretVolume {
    dir: tempfile::TempDir,
    generation: usize,
}

impl SecretVolume {
    pub(crate) fn new(server: &Pair, ca: &str) -> SecretVolume {
        let mut volume = SecretVolume {
            dir: tempfile::tempdir().expect("tempdir"),
            generation: 0,
        };
        volume.swap(server, ca);
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.path(name)).expect("link");
        }
        volume
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// slidegate serving this volume's certificate, key and client CA (see [`start`]), with
    /// `more` flags.
    pub(crate) fn serve(&self, rules: &Path, more: &[&str]) -> Slidegate {
        start_with(
            rules,
            &self.path("tls.crt"),
            &self.path("tls.key"),
            &self.path("ca.crt"),
            more,
        )
    }

    /// What kubelet does on a Secret update: a new timestamped directory, a `..data_tmp`
    /// symlink to it, renamed over `..data`.
    pub(crate) fn swap(&mut self, server: &Pair, ca: &str) {
        self.generation += 1;
        let data = format!("..2026_12_01_{}", self.generation);
        let dir = self.dir.path().join(&data);
        std::fs::create_dir(&dir).expect("data dir");
        std::fs::write(dir.join("tls.crt"), &server.cert).expect("cert");
        std::fs::write(dir.join("tls.key"), &server.key).expect("key");
        std::fs::write(dir.join("ca.crt"), ca).expect("ca");
        let tmp = self.path("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).expect("data link");
        std::fs::rename(&tmp, self.path("..data")).expect("swap ..data");
    }
}

pub(crate) fn rules() -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("rules");
    std::fs::write(file.path(), RULES).expect("write rules");
    file
}

/// slidegate with TLS on both ports from `files` (cert, key, client CA) and the SAN allow-list.
pub(crate) fn start(rules: &Path, cert: &Path, key: &Path, client_ca: &Path) -> Slidegate {
    start_with(rules, cert, key, client_ca, &[])
}

/// [`start`] with more flags.
pub(crate) fn start_with(
    rules: &Path,
    cert: &Path,
    key: &Path,
    client_ca: &Path,
    more: &[&str],
) -> Slidegate {
    let sans = format!("{ALLOWED},envoy.internal");
    let mut flags = vec![
        "--tls-cert-file",
        path_str(cert),
        "--tls-key-file",
        path_str(key),
        "--tls-client-ca-file",
        path_str(client_ca),
        "--tls-client-san",
        &sans,
    ];
    flags.extend_from_slice(more);
    Slidegate::start(rules, &flags)
}

/// `server`'s certificate and key and `ca`'s certificate written to `tls.crt`, `tls.key` and
/// `ca.crt` in `dir`; their paths.
pub(crate) fn pem_files(dir: &Path, server: &Pair, ca: &Ca) -> [PathBuf; 3] {
    [
        ("tls.crt", &server.cert),
        ("tls.key", &server.key),
        ("ca.crt", &ca.pem),
    ]
    .map(|(name, pem)| {
        let path = dir.join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path
    })
}

pub(crate) fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A gRPC channel over TLS trusting `server_ca`, presenting `client` if given.
pub(crate) async fn channel(
    port: u16,
    server_ca: &str,
    client: Option<&Pair>,
) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca))
        .domain_name("localhost");
    if let Some(client) = client {
        tls = tls.identity(Identity::from_pem(&client.cert, &client.key));
    }
    Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("uri")
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| e.to_string())
}

/// One `ShouldRateLimit` call on `channel`: its code, or the error.
pub(crate) async fn call(channel: Channel) -> Result<Code, String> {
    let mut client = RateLimitServiceClient::new(channel);
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        client.should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])])),
    )
    .await
    .map_err(|_| "no answer in 5 s".to_string())?;
    answer
        .map(|a| a.into_inner().overall_code())
        .map_err(|status| status.to_string())
}

/// A call over a new mTLS connection with `client`'s certificate.
pub(crate) async fn call_as(
    port: u16,
    server_ca: &str,
    client: Option<&Pair>,
) -> Result<Code, String> {
    call(channel(port, server_ca, client).await?).await
}

/// The DER of the first certificate in `pem`.
fn der(pem: &str) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .expect("a certificate")
        .expect("pem")
        .to_vec()
}

/// The metrics, from the operator listener (plaintext: it binds where only operators reach it).
pub(crate) fn metrics(slidegate: &Slidegate) -> String {
    let (status, text) = slidegate.get("/metrics");
    assert_eq!(status, 200, "GET /metrics");
    text
}

pub(crate) fn refused(text: &str, listener: &str, reason: &str) -> f64 {
    metric_value(
        text,
        &format!(
            "slidegate_tls_handshake_failures_total{{listener=\"{listener}\",reason=\"{reason}\"}}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_answers_allowed_clients_and_refuses_the_others_with_a_count() {
    let ca = Ca::new("slidegate test CA");
    let other_ca = Ca::new("another CA");
    let server = ca.server();
    let allowed = ca.client(ALLOWED);
    let dir = tempfile::tempdir().expect("tempdir");
    let [cert, key, client_ca] = pem_files(dir.path(), &server, &ca);
    let rules = rules();
    let slidegate = start(rules.path(), &cert, &key, &client_ca);
    let port = slidegate.grpc_port;

    assert_eq!(
        call_as(port, &ca.pem, Some(&allowed)).await,
        Ok(Code::Ok),
        "{}",
        slidegate.log()
    );
    let dns = ca.issue(
        &["envoy.internal"],
        None,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    );
    assert_eq!(
        call_as(port, &ca.pem, Some(&dns)).await,
        Ok(Code::Ok),
        "a DNS SAN on the list"
    );
    let (_, json) =
        https_get(slidegate.http_port, &ca.pem, &allowed, "/healthcheck").expect("HTTPS");
    assert!(
        json.starts_with("HTTP/1.1 200"),
        "HTTPS /healthcheck: {json}"
    );

    let foreign = other_ca.client(ALLOWED);
    let not_listed = ca.client("spiffe://cluster.local/ns/edge/sa/intruder");
    for (who, client) in [
        ("another CA", Some(&foreign)),
        ("no certificate", None),
        ("a SAN not on the list", Some(&not_listed)),
    ] {
        let answer = call_as(port, &ca.pem, client).await;
        assert!(answer.is_err(), "{who} got an answer: {answer:?}");
    }
    let plaintext = async {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        call(channel).await
    };
    assert!(
        plaintext.await.is_err(),
        "plaintext to the TLS port got an answer"
    );

    let counted = wait_until(Duration::from_secs(5), || {
        let text = metrics(&slidegate);
        [
            "unknown_issuer",
            "no_client_certificate",
            "san_not_allowed",
            "not_tls",
        ]
        .iter()
        .all(|reason| refused(&text, "grpc", reason) >= 1.0)
    });
    let text = metrics(&slidegate);
    assert!(
        counted,
        "refusals not counted:\n{}",
        text.lines()
            .filter(|l| l.contains("tls"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let expiry = metric_value(&text, "slidegate_tls_certificate_expiry_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(
        expiry > now,
        "certificate expiry {expiry} not in the future"
    );
    let log = slidegate.log();
    assert!(
        log.contains("TLS handshake failed"),
        "refusal not logged:\n{log}"
    );
    assert!(!log.contains("PRIVATE KEY"), "key material in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_without_a_restart_and_a_broken_one_keeps_the_old() {
    let ca = Ca::new("slidegate test CA");
    let first = ca.server();
    let client = ca.client(ALLOWED);
    let mut volume = SecretVolume::new(&first, &ca.pem);
    let rules = rules();
    let slidegate = volume.serve(rules.path(), &[]);
    let http = slidegate.http_port;
    let served = || {
        https_get(http, &ca.pem, &client, "/healthcheck")
            .map(|(leaf, _)| leaf)
            .unwrap_or_default()
    };
    assert_eq!(served(), der(&first.cert));
    let open = channel(slidegate.grpc_port, &ca.pem, Some(&client))
        .await
        .expect("connect");
    assert_eq!(call(open.clone()).await, Ok(Code::Ok));

    // A Kubernetes Secret update: the `..data` symlink swapped.
    let second = ca.server();
    volume.swap(&second, &ca.pem);
    assert!(
        wait_until(Duration::from_secs(10), || served() == der(&second.cert)),
        "the swapped Secret was not served:\n{}",
        slidegate.log()
    );
    assert_eq!(
        call(open.clone()).await,
        Ok(Code::Ok),
        "an open connection broke"
    );

    let failures = || {
        metric_value(
            &metrics(&slidegate),
            "slidegate_tls_reloads_total{result=\"failure\"}",
        )
    };
    // cert-manager style: new files renamed over the names, the key first. The pair is read
    // once both are in place: no failure for a key that does not match the old certificate.
    let third = ca.server();
    rename_over(&volume.path("tls.key"), &third.key);
    rename_over(&volume.path("tls.crt"), &third.cert);
    assert!(
        wait_until(Duration::from_secs(10), || served() == der(&third.cert)),
        "the renamed certificate was not served:\n{}",
        slidegate.log()
    );
    assert_eq!(failures(), 0.0, "{}", slidegate.log());

    // Broken replacements: garbage, then a key of another certificate. The third stays.
    rename_over(&volume.path("tls.crt"), "not a certificate\n");
    assert!(
        wait_until(Duration::from_secs(10), || failures() >= 1.0),
        "a broken certificate was not counted"
    );
    rename_over(&volume.path("tls.crt"), &ca.server().cert);
    assert!(
        wait_until(Duration::from_secs(10), || failures() >= 2.0),
        "a key mismatch was not counted"
    );
    assert_eq!(
        served(),
        der(&third.cert),
        "a broken replacement was served"
    );
    assert_eq!(call(open).await, Ok(Code::Ok), "an open connection broke");
    let log = slidegate.log();
    assert!(log.contains("the previous material keeps serving"), "{log}");
    assert!(!log.contains("PRIVATE KEY"), "key material in the log");
}

/// `--tls-listeners grpc,http,admin` puts the operator listener under the same mutual TLS:
/// `/metrics` answers an allowed client over HTTPS, and neither plaintext nor a client whose SAN
/// is not on the list; the refusal is counted with `listener="admin"`.
#[test]
fn the_operator_listener_serves_mutual_tls_when_named() {
    let ca = Ca::new("slidegate test CA");
    let server = ca.server();
    let allowed = ca.client(ALLOWED);
    let dir = tempfile::tempdir().expect("tempdir");
    let [cert, key, client_ca] = pem_files(dir.path(), &server, &ca);
    let rules = rules();
    let flags = [
        "--tls-cert-file",
        path_str(&cert),
        "--tls-key-file",
        path_str(&key),
        "--tls-client-ca-file",
        path_str(&client_ca),
        "--tls-client-san",
        ALLOWED,
        "--tls-listeners",
        "grpc,http,admin",
    ];
    let slidegate = Slidegate::start(rules.path(), &flags);
    let admin = slidegate.admin_port;
    let scrape = || {
        https_get(admin, &ca.pem, &allowed, "/metrics")
            .map(|(_, text)| text)
            .unwrap_or_default()
    };
    let text = scrape();
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains("slidegate_"),
        "HTTPS /metrics: {text}\n{}",
        slidegate.log()
    );
    assert_eq!(
        slidegate.get("/metrics").0,
        0,
        "plaintext /metrics answered"
    );
    let intruder = ca.client("spiffe://cluster.local/ns/edge/sa/intruder");
    let refused = https_get(admin, &ca.pem, &intruder, "/rlconfig")
        .map(|(_, text)| text)
        .unwrap_or_default();
    assert!(
        !refused.contains("HTTP/1.1"),
        "a SAN not on the list: {refused}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || {
            let series = "slidegate_tls_handshake_failures_total{listener=\"admin\",reason=\"san_not_allowed\"}";
            metric_value(&scrape(), series) >= 1.0
        }),
        "the refusal was not counted:\n{}",
        scrape()
    );
}

/// envoyproxy/ratelimit's TLS variables (as Envoy Gateway sets them) turn on mutual TLS on the
/// gRPC port only: a client with an allowed certificate is answered, one with another SAN is
/// refused, and the HTTP port keeps answering plaintext probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_tls_variables_secure_the_grpc_port_only() {
    let ca = Ca::new("slidegate test CA");
    let server = ca.server();
    let dir = tempfile::tempdir().expect("tempdir");
    let [cert, key, client_ca] = pem_files(dir.path(), &server, &ca);
    let env = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", path_str(&cert)),
        ("GRPC_SERVER_TLS_KEY", path_str(&key)),
        ("GRPC_CLIENT_TLS_CACERT", path_str(&client_ca)),
        ("GRPC_CLIENT_TLS_SAN", ALLOWED),
    ];
    let rules = rules();
    let slidegate = Slidegate::start_with_env(rules.path(), &[], &env);
    let port = slidegate.grpc_port;
    assert_eq!(
        call_as(port, &ca.pem, Some(&ca.client(ALLOWED))).await,
        Ok(Code::Ok),
        "{}",
        slidegate.log()
    );
    let other = ca.client("spiffe://cluster.local/ns/edge/sa/other");
    assert!(call_as(port, &ca.pem, Some(&other)).await.is_err());
    let (status, _) = slidegate.get("/healthcheck");
    assert_eq!(status, 200, "plaintext /healthcheck: {}", slidegate.log());
}

/// The limits every connection gets hold under TLS: a client that opens a connection and never
/// finishes the handshake is closed at the handshake timeout (and counted), one that finishes
/// it late and sends nothing is closed at the same timeout counted from accept (not a second
/// timeout after the TLS handshake), and a PING flood
/// inside an mTLS session is cut off by the control-frame meter, which reads the decrypted
/// stream; meanwhile an allowed client keeps getting answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_and_ping_floods_inside_tls_are_closed() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let ca = Ca::new("slidegate test CA");
    let server = ca.server();
    let client = ca.client(ALLOWED);
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path
    };
    let (cert, key, client_ca) = (
        write("tls.crt", &server.cert),
        write("tls.key", &server.key),
        write("ca.crt", &ca.pem),
    );
    let rules = rules();
    let flags = [
        "--tls-cert-file",
        path_str(&cert),
        "--tls-key-file",
        path_str(&key),
        "--tls-client-ca-file",
        path_str(&client_ca),
        "--handshake-timeout",
        "2s",
    ];
    let slidegate = Slidegate::start(rules.path(), &flags);
    let port = slidegate.grpc_port;
    let connector = tokio_rustls::TlsConnector::from(tls_client_config(&ca.pem, &client, b"h2"));
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");

    // A handshake finished 1.5 s after connecting, then no HTTP/2 preface: closed 2 s after
    // connecting (a second timeout after TLS would hold it to 3.5 s).
    let connected = std::time::Instant::now();
    let socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut late = connector
        .connect(name.clone(), socket)
        .await
        .expect("a late mTLS handshake within the timeout");
    let mut buf = vec![0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while matches!(late.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
    assert!(closed.is_ok(), "a connection without a preface stayed open");
    let held = connected.elapsed();
    assert!(
        held < Duration::from_millis(3000),
        "held {held:?}: the handshake timeout ran again after TLS"
    );

    // A handshake that never completes: half a ClientHello, then silence.
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .expect("write");
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "a stalled handshake was not closed: {closed:?}"
    );

    // A PING flood inside an mTLS session.
    let socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let tls = connector
        .connect(name, socket)
        .await
        .expect("mTLS handshake");
    let (mut read, mut write) = tokio::io::split(tls);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 << 10];
        while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    let mut start = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    start.extend([0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let ping = [0, 0, 8, 6, 0, 0, 0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7].repeat(1000);
    let flood = async {
        if write.write_all(&start).await.is_ok() {
            while write.write_all(&ping).await.is_ok() {}
        }
    };
    let cut_off = tokio::select! {
        () = flood => true,
        _ = reader => true,
        _ = tokio::time::sleep(Duration::from_secs(5)) => false,
    };
    assert!(cut_off, "a PING flood inside TLS was not cut off");
    assert_eq!(call_as(port, &ca.pem, Some(&client)).await, Ok(Code::Ok));
    let text = metrics(&slidegate);
    assert!(
        refused(&text, "grpc", "handshake_timeout") >= 1.0,
        "stalled handshake not counted"
    );
}

/// `slidegate-bench` loads a gRPC listener over TLS (`https://`, trusting `--ca-file`): every call
/// answered, none failed; without `--ca-file` an `https://` target is refused up front.
#[test]
fn bench_loads_a_tls_listener() {
    let rules = rules();
    let ca = crate::support::CertFiles::new();
    let server = Slidegate::start(
        rules.path(),
        &[
            "--tls-cert-file",
            path_str(&ca.cert_file),
            "--tls-key-file",
            path_str(&ca.key_file),
        ],
    );
    let target = format!("https://localhost:{}", server.grpc_port);
    let bench = |extra: &[&str]| {
        crate::support::bench_command()
            .args(["--target", &target, "--domain", "tls", "--key", "k"])
            .args(["--duration", "1s", "--warmup", "0s", "--json"])
            .args(extra)
            .output()
            .expect("run slidegate-bench")
    };
    let out = bench(&["--ca-file", path_str(&ca.ca_file)]);
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert!(report["requests"].as_u64().unwrap_or(0) > 0, "{report}");
    assert_eq!(report["errors"].as_u64(), Some(0), "{report}");

    let out = bench(&[]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ca-file"),
        "{out:?}"
    );
}

/// Proves: certificates rotated while `slidegate-bench` keeps calls going over TLS (a Secret
/// `..data` swap, then files renamed over) fail no call, and new connections then get the new
/// certificate.
#[test]
fn rotation_under_load_fails_no_call() {
    let ca = Ca::new("slidegate test CA");
    let client = ca.client(ALLOWED);
    let mut volume = SecretVolume::new(&ca.server(), &ca.pem);
    let rules = rules();
    let (cert, key) = (volume.path("tls.crt"), volume.path("tls.key"));
    let slidegate = Slidegate::start(
        rules.path(),
        &[
            "--tls-cert-file",
            path_str(&cert),
            "--tls-key-file",
            path_str(&key),
        ],
    );
    let ca_file = tempfile::NamedTempFile::new().expect("ca file");
    std::fs::write(ca_file.path(), &ca.pem).expect("write ca");
    let target = format!("https://localhost:{}", slidegate.grpc_port);
    let bench = crate::support::bench_command()
        .args(["--target", &target, "--domain", "tls", "--key", "k"])
        .args(["--ca-file", path_str(ca_file.path())])
        .args(["--connections", "4", "--concurrency", "8"])
        .args(["--duration", "6s", "--warmup", "0s", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run slidegate-bench");
    let http = slidegate.http_port;
    let served = || {
        https_get(http, &ca.pem, &client, "/healthcheck")
            .map(|(leaf, _)| leaf)
            .unwrap_or_default()
    };

    std::thread::sleep(Duration::from_secs(1));
    let second = ca.server();
    volume.swap(&second, &ca.pem);
    assert!(
        wait_until(Duration::from_secs(4), || served() == der(&second.cert)),
        "the swapped Secret was not served:\n{}",
        slidegate.log()
    );
    let third = ca.server();
    rename_over(&key, &third.key);
    rename_over(&cert, &third.cert);
    assert!(
        wait_until(Duration::from_secs(4), || served() == der(&third.cert)),
        "the renamed certificate was not served:\n{}",
        slidegate.log()
    );

    let out = bench.wait_with_output().expect("bench output");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert!(report["requests"].as_u64().unwrap_or(0) > 0, "{report}");
    assert_eq!(report["errors"].as_u64(), Some(0), "calls failed: {report}");
    assert!(out.status.success(), "{out:?}");
}
