//! The slidegate binary as a process: its command without the caller's `SLIDEGATE_*` variables,
//! and a running `slidegate serve` on free ports with clients for each of its listeners.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use super::{KillOnDrop, free_port, http_get, rss_kib, send_signal, wait_until};

/// The operator listener's address when a test chose it (`--admin-addr`, `SLIDEGATE_ADMIN_ADDR`,
/// or envoyproxy/ratelimit's `DEBUG_PORT`); otherwise [`Slidegate::launch`] picks a free port.
fn given_admin_addr(args: &[&str], env: &[(&str, &str)]) -> Option<String> {
    let flag = args
        .iter()
        .position(|a| *a == "--admin-addr")
        .and_then(|i| args.get(i + 1))
        .map(|a| a.to_string())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix("--admin-addr=").map(str::to_owned))
        });
    let var = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    flag.or_else(|| var("SLIDEGATE_ADMIN_ADDR").map(str::to_owned))
        .or_else(|| var("DEBUG_PORT").map(|port| format!("127.0.0.1:{port}")))
}

/// The slidegate binary, without the `SLIDEGATE_*` and `RUST_LOG` variables of the environment
/// running the tests (they would change its flags).
pub fn slidegate_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_slidegate"));
    for (key, _) in std::env::vars() {
        if key.starts_with("SLIDEGATE_") {
            command.env_remove(key);
        }
    }
    command.env_remove("RUST_LOG");
    command
}

/// A running `slidegate serve` on free ports, its stderr in a log file; killed on drop.
pub struct Slidegate {
    pub grpc_port: u16,
    pub http_port: u16,
    /// The operator listener's port (`/metrics`, `/rlconfig`); 0 when the test gave it a Unix
    /// socket.
    pub admin_port: u16,
    pub process: KillOnDrop,
    /// Holds the log file.
    pub dir: tempfile::TempDir,
}

impl Slidegate {
    /// Starts `slidegate serve --config CONFIG ARGS...` (SLIDEGATE_* and RUST_LOG removed from its
    /// environment) and waits until both ports accept connections.
    pub fn start(config: &std::path::Path, args: &[&str]) -> Slidegate {
        Self::start_with_env(config, args, &[])
    }

    /// As [`Slidegate::start`], with extra environment variables (e.g. `MALLOC_ARENA_MAX`).
    pub fn start_with_env(
        config: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Slidegate {
        Slidegate::start_on(config, free_port(), args, env)
    }

    /// [`Slidegate::start_with_env`] with the gRPC port given (to restart a server in place).
    pub fn start_on(
        config: &std::path::Path,
        grpc_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Slidegate {
        Slidegate::launch(Some(config), grpc_port, args, env)
    }

    /// `slidegate serve ARGS...` without `--config` (rules from `--xds-server`), on free ports.
    pub fn start_without_config(args: &[&str]) -> Slidegate {
        Slidegate::launch(None, free_port(), args, &[])
    }

    /// `slidegate serve` on free ports with `--config CONFIG` if given, ARGS and extra
    /// environment variables.
    pub fn launch(
        config: Option<&std::path::Path>,
        grpc_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Slidegate {
        let dir = tempfile::tempdir().expect("tempdir");
        let http_port = free_port();
        let log = std::fs::File::create(dir.path().join("slidegate.log")).expect("log file");
        let mut command = slidegate_command();
        command.arg("serve");
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let admin_port = match given_admin_addr(args, env) {
            Some(addr) => addr
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse().ok())
                .unwrap_or(0),
            None => {
                let port = free_port();
                command.args(["--admin-addr", &format!("127.0.0.1:{port}")]);
                port
            }
        };
        command
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc_port}")])
            .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let process = KillOnDrop(command.spawn().expect("spawn slidegate"));
        let mut server = Slidegate {
            grpc_port,
            http_port,
            admin_port,
            process,
            dir,
        };
        let up = wait_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", http_port)).is_ok()
        });
        if !up {
            let exit = server.process.0.try_wait().ok().flatten();
            panic!("slidegate did not start (exit {exit:?}):\n{}", server.log());
        }
        server
    }

    /// Everything slidegate wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("slidegate.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The port that serves `path`: the operator listener's for `/metrics`, `/rlconfig`,
    /// `/explain`, `/counters` and `/limited`, the HTTP port's for the rest.
    pub fn port_for(&self, path: &str) -> u16 {
        if ["/metrics", "/rlconfig", "/explain", "/counters", "/limited"]
            .iter()
            .any(|p| path.starts_with(p))
        {
            self.admin_port
        } else {
            self.http_port
        }
    }

    /// `http://127.0.0.1:PORT{path}`, on the port that serves `path` ([`Slidegate::port_for`]).
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port_for(path))
    }

    /// `http://127.0.0.1:GRPC_PORT`.
    pub fn grpc_uri(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// A gRPC channel to the server.
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Channel::from_shared(self.grpc_uri())
            .expect("uri")
            .connect()
            .await
            .expect("connect gRPC")
    }

    /// A gRPC channel to the server from the local address `from` (127.0.0.2, say: another peer
    /// than 127.0.0.1 for what the server bounds per peer).
    pub async fn channel_from(&self, from: std::net::IpAddr) -> tonic::transport::Channel {
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], self.grpc_port));
        let connector = tower::service_fn(move |_: http::Uri| async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind((from, 0).into())?;
            let stream = socket.connect(to).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        });
        tonic::transport::Endpoint::from_shared(self.grpc_uri())
            .expect("uri")
            .connect_with_connector(connector)
            .await
            .expect("connect gRPC")
    }

    /// A RateLimitService client on a new channel.
    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    /// A blocking `GET path` on the port that serves it ([`Slidegate::port_for`]): (status, body);
    /// (0, "") on a connection error.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port_for(path), path)
    }

    /// `POST /json` with `body`; the answer's JSON.
    pub async fn post_json(&self, body: &str) -> serde_json::Value {
        reqwest::Client::new()
            .post(self.url("/json"))
            .body(body.to_string())
            .send()
            .await
            .expect("POST /json")
            .json()
            .await
            .expect("a JSON answer")
    }

    /// `POST /explain` on the operator listener with `body`: (status, the answer's JSON, or
    /// `Null` when it is not JSON).
    pub async fn explain(&self, body: &str) -> (u16, serde_json::Value) {
        let response = reqwest::Client::new()
            .post(self.url("/explain"))
            .body(body.to_string())
            .send()
            .await
            .expect("POST /explain");
        let status = response.status().as_u16();
        let text = response.text().await.expect("an answer");
        (status, serde_json::from_str(&text).unwrap_or_default())
    }

    /// Sends a signal by name (`TERM`, `HUP`, ...).
    pub fn signal(&self, name: &str) {
        send_signal(self.pid(), name);
    }

    /// Waits up to `within` for the process to exit, and fails unless it exited with status 0.
    pub fn expect_clean_exit(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut status = None;
        while status.is_none() && Instant::now() < deadline {
            status = self.process.0.try_wait().ok().flatten();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            status.map(|s| s.code()),
            Some(Some(0)),
            "exit within {within:?}; log:\n{}",
            self.log()
        );
    }

    /// The resident set size of the process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid()).expect("VmRSS of slidegate")
    }
}

/// The load generator, `slidegate-bench` (the workspace's bench crate), from the same target
/// directory as the server and with the same environment cleared. `scripts/test` builds it.
pub fn bench_command() -> Command {
    let server = std::path::Path::new(env!("CARGO_BIN_EXE_slidegate"));
    let bench = server.with_file_name("slidegate-bench");
    assert!(
        bench.exists(),
        "{} is missing: build it with `cargo build -p slidegate-bench` (scripts/test does)",
        bench.display()
    );
    let mut command = Command::new(bench);
    for (key, _) in std::env::vars() {
        if key.starts_with("SLIDEGATE_") {
            command.env_remove(key);
        }
    }
    command.env_remove("RUST_LOG");
    command
}
