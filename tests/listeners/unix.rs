//! Unix domain sockets on the real binary: `--grpc-addr unix:/path` and `--http-addr unix:/path`
//! answer, the socket files get `--unix-socket-mode`, a socket file left by a crashed run is
//! replaced while any other file at the path is refused, and the files are gone after SIGTERM.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::support::{
    KillOnDrop, call, descriptor, request, send_signal, slidegate_command, wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

const RULES: &str = "domain: uds\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n";

/// slidegate serving both listeners on Unix sockets in `dir`, with `args`.
struct UnixSlidegate {
    grpc: PathBuf,
    http: PathBuf,
    process: KillOnDrop,
    log: PathBuf,
}

impl UnixSlidegate {
    fn start(dir: &Path, args: &[&str]) -> UnixSlidegate {
        let config = dir.join("rules.yaml");
        std::fs::write(&config, RULES).expect("write rules");
        let (grpc, http, log) = (
            dir.join("grpc.sock"),
            dir.join("http.sock"),
            dir.join("log"),
        );
        let child = slidegate_command()
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--grpc-addr")
            .arg(format!("unix:{}", grpc.display()))
            .arg("--http-addr")
            .arg(format!("unix:{}", http.display()))
            .arg("--admin-addr")
            .arg(format!("unix:{}", http.with_extension("admin").display()))
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn slidegate");
        let server = UnixSlidegate {
            grpc,
            http,
            process: KillOnDrop(child),
            log,
        };
        let up = wait_until(Duration::from_secs(30), || {
            std::os::unix::net::UnixStream::connect(&server.grpc).is_ok()
                && std::os::unix::net::UnixStream::connect(&server.http).is_ok()
        });
        assert!(up, "slidegate did not start:\n{}", server.log());
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A RateLimitService client whose channel dials the gRPC socket.
    async fn client(&self) -> RateLimitServiceClient<Channel> {
        let path = self.grpc.clone();
        let connector = tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        });
        let channel = Endpoint::from_static("http://slidegate")
            .connect_with_connector(connector)
            .await
            .expect("connect over the socket");
        RateLimitServiceClient::new(channel)
    }
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Answers over both sockets, the mode applied, and both files gone after SIGTERM.
#[tokio::test]
async fn grpc_and_http_answer_over_unix_sockets_which_go_on_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = UnixSlidegate::start(dir.path(), &["--unix-socket-mode", "0660"]);
    for path in [&server.grpc, &server.http] {
        let mode = std::fs::metadata(path)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o660, "{}", path.display());
    }

    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let req = request("uds", vec![descriptor(&[("k", "v")])]);
        codes.push(call(&mut client, req).await.overall_code());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);

    let answer = http_over_unix(&server.http, "/healthcheck");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    send_signal(server.process.pid(), "TERM");
    let exited = wait_until(Duration::from_secs(10), || {
        server.process.0.try_wait().ok().flatten().is_some()
    });
    assert!(exited, "no exit after SIGTERM:\n{}", server.log());
    assert!(!server.grpc.exists(), "gRPC socket file left behind");
    assert!(!server.http.exists(), "HTTP socket file left behind");
}

/// A socket file left by a crashed run (nobody listens on it) is replaced; a regular file at
/// the path is refused with an error naming it, and left alone.
#[test]
fn a_stale_socket_is_replaced_and_another_file_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stale = std::os::unix::net::UnixListener::bind(dir.path().join("grpc.sock"))
        .expect("bind the stale socket");
    drop(stale); // the file stays, as after a crash
    assert!(is_socket(&dir.path().join("grpc.sock")));
    let server = UnixSlidegate::start(dir.path(), &[]);
    drop(server);

    let dir = tempfile::tempdir().expect("tempdir");
    let precious = dir.path().join("http.sock");
    std::fs::write(&precious, "not a socket").expect("write");
    let config = dir.path().join("rules.yaml");
    std::fs::write(&config, RULES).expect("write rules");
    let out = slidegate_command()
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--grpc-addr")
        .arg(format!("unix:{}", dir.path().join("grpc.sock").display()))
        .arg("--http-addr")
        .arg(format!("unix:{}", precious.display()))
        .arg("--admin-addr")
        .arg(format!("unix:{}", dir.path().join("admin.sock").display()))
        .output()
        .expect("run slidegate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&precious).ok().as_deref(),
        Some("not a socket")
    );
}

/// A blocking HTTP/1.1 `GET path` over the socket at `path`: the raw answer.
fn http_over_unix(path: &Path, target: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(path).expect("connect");
    write!(
        stream,
        "GET {target} HTTP/1.1\r\nhost: slidegate\r\nconnection: close\r\n\r\n"
    )
    .expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
}
