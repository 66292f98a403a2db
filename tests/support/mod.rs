//! Shared test support: real programs (redis-server, ...) started on free ports and killed on drop.
//!
//! In CI (`CI=true`) a missing program fails the test; on a developer machine the test is skipped
//! with a message, because `scripts/test` installs everything and is the supported way to run tests.
#![allow(dead_code)]

pub mod reshard;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod sentinel;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// A free TCP port on 127.0.0.1: bound then released, and never the same port twice in one test
/// process. The kernel may hand a just-released port out again, and a test that asks for two
/// ports before starting its servers (Envoy's listener and admin port, say) must get two.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("no free port");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The Envoy binary: `$SLIDEGATE_ENVOY`, else the project's `.venv/bin/envoy` (which
/// `scripts/test` installs), else `envoy` on the PATH; as [`require_program`] when none is found.
pub fn envoy_program() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SLIDEGATE_ENVOY") {
        return require_program(&path.to_string_lossy());
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/envoy");
    if venv.exists() {
        return Some(venv);
    }
    require_program("envoy")
}

/// Finds a program on PATH (or at an absolute path). `None` means: skip this test. In CI a missing
/// program panics, so the run fails instead of passing with the test skipped.
pub fn require_program(name: &str) -> Option<PathBuf> {
    let found = if name.contains('/') {
        let p = PathBuf::from(name);
        p.exists().then_some(p)
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    };
    if found.is_none() {
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!("{name} is required in CI but was not found (scripts/test installs it)");
        }
        eprintln!("SKIPPED: {name} not found; run scripts/test to install it");
    }
    found
}

/// Waits until `check` returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// A child process killed when dropped, so a failing test never leaves a server on a port.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A throwaway redis-server on a free port, without persistence.
pub struct RedisServer {
    pub port: u16,
    pub process: KillOnDrop,
    pub dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one; `None` when redis-server is missing outside CI.
    pub fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    /// Starts one with extra arguments (e.g. `["--requirepass", "secret"]`).
    pub fn start_with(extra: &[&str]) -> Option<RedisServer> {
        let port = free_port();
        let port_arg = port.to_string();
        let mut args = vec!["--port", port_arg.as_str()];
        args.extend(extra);
        Self::spawn(&args, port)
    }

    /// Starts redis-server (bound to 127.0.0.1, no persistence, in a fresh directory) with `args`,
    /// which must make it listen on `port`, and waits until that port accepts connections.
    pub fn spawn(args: &[&str], port: u16) -> Option<RedisServer> {
        let bin = require_program("redis-server")?;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut command = redis_server_command(&bin, dir.path(), args);
        Some(RedisServer {
            port,
            process: spawn_listening(&mut command, port, "redis-server"),
            dir,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }
}

/// Runs `redis-cli -p PORT ARGS...` and returns its stdout, trimmed.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `redis-server` bound to 127.0.0.1, without persistence, in `dir`, then `args` (which may
/// turn persistence on again).
pub fn redis_server_command(
    bin: &std::path::Path,
    dir: &std::path::Path,
    args: &[&str],
) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(args);
    command
}

impl RedisServer {
    /// `INFO commandstats` calls of one command (e.g. `evalsha`), 0 if never called.
    pub fn command_calls(&self, command: &str) -> u64 {
        command_calls(&self.cli(&["INFO", "commandstats"]), command)
    }
}

/// Spawns `command` (its output discarded) and waits until it accepts connections on `port`.
pub fn spawn_listening(command: &mut Command, port: u16, what: &str) -> KillOnDrop {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let process = KillOnDrop(child);
    let up = wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(up, "{what} did not start on port {port}");
    process
}

/// Reads `cmdstat_<command>:calls=N,...` from `INFO commandstats` output.
pub fn command_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
    info.lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A redis-server reached over TLS only, with a CA and server certificate generated for the test.
/// The server does not ask clients for certificates unless `extra` holds
/// `--tls-auth-clients yes`.
pub struct TlsRedisServer {
    pub server: RedisServer,
    /// PEM of the CA that signed the server certificate (what a client must trust).
    pub ca_file: PathBuf,
    /// A client certificate and key the same CA signed, for `--tls-auth-clients yes`.
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
}

impl TlsRedisServer {
    /// Starts one; `None` when redis-server is missing outside CI. `extra` as for
    /// [`RedisServer::start_with`] (e.g. `--requirepass`).
    pub fn start(extra: &[&str]) -> Option<TlsRedisServer> {
        require_program("redis-server")?;
        let ca = TestCa::new();
        let tls_port = free_port();
        let tls_port_arg = tls_port.to_string();
        let tls_args = ca.server_args();
        let mut args: Vec<&str> = vec!["--port", "0", "--tls-port", &tls_port_arg];
        args.extend(tls_args.iter().map(String::as_str));
        args.extend(extra);
        let server = RedisServer::spawn(&args, tls_port)?;
        // Keep the CA and client files as long as the server (its dir is deleted on drop).
        let keep = |from: &PathBuf| {
            let kept = server.dir.path().join(from.file_name().expect("file name"));
            std::fs::copy(from, &kept).expect("keep TLS file");
            kept
        };
        Some(TlsRedisServer {
            ca_file: keep(&ca.ca_file),
            client_cert_file: keep(&ca.client_cert_file),
            client_key_file: keep(&ca.client_key_file),
            server,
        })
    }

    /// `rediss://[:password@]127.0.0.1:PORT`.
    pub fn url(&self, password: Option<&str>) -> String {
        match password {
            Some(p) => format!("rediss://:{p}@127.0.0.1:{}", self.server.port),
            None => format!("rediss://127.0.0.1:{}", self.server.port),
        }
    }
}

/// A private CA, a server certificate it signed (for `localhost` and `127.0.0.1`) and a client
/// certificate it signed, as PEM files in a temporary directory that lives as long as this value.
pub struct TestCa {
    pub dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("ca.pem");
        let cert_file = dir.path().join("server.pem");
        let key_file = dir.path().join("server.key");

        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "slidegate test CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = rcgen::KeyPair::generate().expect("ca key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("server params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        // Client auth too: cluster nodes present this certificate to each other on the bus.
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &issuer).expect("server cert");

        let mut client_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("client params");
        client_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "slidegate");
        client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = rcgen::KeyPair::generate().expect("client key");
        let client_cert = client_params
            .signed_by(&client_key, &issuer)
            .expect("client cert");
        let client_cert_file = dir.path().join("client.pem");
        let client_key_file = dir.path().join("client.key");

        std::fs::write(&ca_file, ca_cert.pem()).expect("write ca");
        std::fs::write(&cert_file, cert.pem()).expect("write cert");
        std::fs::write(&key_file, key.serialize_pem()).expect("write key");
        std::fs::write(&client_cert_file, client_cert.pem()).expect("write client cert");
        std::fs::write(&client_key_file, client_key.serialize_pem()).expect("write client key");
        TestCa {
            dir,
            ca_file,
            cert_file,
            key_file,
            client_cert_file,
            client_key_file,
        }
    }

    /// redis-server flags serving this certificate (clients need not present one unless later
    /// flags say `--tls-auth-clients yes`).
    pub fn server_args(&self) -> Vec<String> {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--tls-cert-file".into(),
            path(&self.cert_file),
            "--tls-key-file".into(),
            path(&self.key_file),
            "--tls-ca-cert-file".into(),
            path(&self.ca_file),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

/// A 3-master Redis Cluster (no replicas) on free ports, killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 3 cluster-enabled servers, joins them with `redis-cli --cluster create` and waits
    /// for `cluster_state:ok` on every node. `None` when redis-server is missing outside CI.
    pub fn start() -> Option<RedisCluster> {
        RedisCluster::start_with(&|_| Vec::new())
    }

    /// [`RedisCluster::start`] with extra flags for node `i`.
    fn start_with(per_node: &dyn Fn(usize) -> Vec<String>) -> Option<RedisCluster> {
        let nodes = spawn_cluster(3, 0, &["--cluster-node-timeout", "5000"], per_node)?;
        let ok = wait_until(Duration::from_secs(20), || {
            nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
        assert!(ok, "cluster did not reach cluster_state:ok");
        Some(RedisCluster { nodes })
    }

    /// Seed URLs of all nodes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node serving `key` (by asking any node with `CLUSTER KEYSLOT` and `CLUSTER NODES`).
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot: u16 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("keyslot");
        let nodes = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(addr) = fields.get(1) else { continue };
            let port: u16 = addr
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let serves = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').filter_map(|n| n.parse::<u16>().ok());
                match (ends.next(), ends.next()) {
                    (Some(a), Some(b)) => (a..=b).contains(&slot),
                    (Some(a), None) => a == slot,
                    _ => false,
                }
            });
            if let Some(node) = self.nodes.iter().find(|n| serves && n.port == port) {
                return node;
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// `INFO commandstats` calls of `command` summed over all nodes.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.command_calls(command)).sum()
    }
}

/// A 3-master Redis Cluster whose nodes also serve TLS, with `tls-cluster yes`: the cluster bus
/// is TLS, and a client connected over TLS is given the nodes' TLS ports (`CLUSTER SLOTS`,
/// redirections). The plain ports stay open for [`RedisServer::cli`].
pub struct TlsRedisCluster {
    pub cluster: RedisCluster,
    pub tls_ports: Vec<u16>,
    pub ca: TestCa,
}

impl TlsRedisCluster {
    /// Starts one; `extra` is added to every node's flags (e.g. `--tls-auth-clients yes`: the
    /// nodes present their server certificate, which allows client auth, to each other).
    pub fn start(extra: &[&str]) -> Option<TlsRedisCluster> {
        require_program("redis-server")?;
        let ca = TestCa::new();
        let tls_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let per_node = |i: usize| {
            let mut args = vec!["--tls-port".to_string(), tls_ports[i].to_string()];
            args.extend(ca.server_args());
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            args.extend(extra.iter().map(|a| a.to_string()));
            args
        };
        let cluster = RedisCluster::start_with(&per_node)?;
        Some(TlsRedisCluster {
            cluster,
            tls_ports,
            ca,
        })
    }

    /// `rediss://127.0.0.1:TLS_PORT` of every node.
    pub fn urls(&self) -> Vec<String> {
        let url = |port: &u16| format!("rediss://127.0.0.1:{port}");
        self.tls_ports.iter().map(url).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Added for tests/stores/faults.rs and tests/listeners/hostile.rs: the slidegate binary as a process, a cluster
// with replicas, process RSS and a dependency-free HTTP GET for polling.

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

    /// The port that serves `path`: the operator listener's for `/metrics` and `/rlconfig`, the
    /// HTTP port's for the rest.
    pub fn port_for(&self, path: &str) -> u16 {
        if path.starts_with("/metrics") || path.starts_with("/rlconfig") {
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

    /// A RateLimitService client on a new channel.
    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::new(self.channel().await)
    }

    /// A blocking `GET path` on the port that serves it ([`Slidegate::port_for`]): (status, body);
    /// (0, "") on a connection error.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port_for(path), path)
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

/// A request descriptor of (key, value) entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A request for `domain` with `descriptors` (no request-level `hits_addend`).
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

/// `ShouldRateLimit`, which must succeed (a gRPC error fails the test with its status).
pub async fn call(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    match client.should_rate_limit(req).await {
        Ok(response) => response.into_inner(),
        Err(status) => panic!("ShouldRateLimit failed: {status:?}"),
    }
}

/// What a gRPC call written by hand got back: `grpc-status`, `grpc-message` and the message, if any.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: Option<String>,
    pub message: Option<String>,
    pub body: Vec<u8>,
}

/// `ShouldRateLimit` written by hand over HTTP/2 (the `h2` crate): `body` goes out as is, after
/// `extra` headers. For what a gRPC client library would not send: a `grpc-timeout` it does not
/// enforce itself, a compressed flag, bytes that are not protobuf.
pub async fn raw_should_rate_limit(port: u16, extra: &[(&str, &str)], body: Vec<u8>) -> RawAnswer {
    let io = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (sender, connection) = h2::client::handshake(io).await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let mut builder = http::Request::post(format!(
        "http://127.0.0.1:{port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    for (name, value) in extra {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(()).expect("request");
    let mut sender = sender.ready().await.expect("ready");
    let (response, mut stream) = sender.send_request(request, false).expect("send");
    stream
        .send_data(bytes::Bytes::from(body), true)
        .expect("send body");
    let response = response.await.expect("response");
    let (head, mut received) = response.into_parts();
    let mut answer = RawAnswer {
        status: header(&head.headers, "grpc-status"),
        message: grpc_message(&head.headers),
        body: Vec::new(),
    };
    while let Some(chunk) = received.data().await {
        answer.body.extend_from_slice(&chunk.expect("data"));
    }
    if let Some(trailers) = received.trailers().await.expect("trailers") {
        answer.status = header(&trailers, "grpc-status");
        answer.message = grpc_message(&trailers);
    }
    answer
}

fn header(headers: &http::HeaderMap, name: &str) -> Option<String> {
    let value = headers.get(name)?.to_str().ok()?;
    Some(value.to_string())
}

/// `grpc-message`, percent-decoded.
fn grpc_message(headers: &http::HeaderMap) -> Option<String> {
    let value = header(headers, "grpc-message")?;
    Some(
        percent_encoding::percent_decode_str(&value)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// A gRPC message: the 5-byte prefix (uncompressed) and `message`.
pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

/// The value of one series in Prometheus text, e.g. `slidegate_unknown_domain_total` or
/// `slidegate_no_rule_total{domain="test"}` (labels in the order the encoder writes them:
/// alphabetical). Missing series are 0.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .unwrap_or(0.0)
}

/// `promtool check metrics` on `text` (written to a file in `dir`): the exposition format must be
/// valid. Skipped (outside CI) when promtool is missing.
pub fn promtool_check_metrics(dir: &std::path::Path, text: &str) {
    let Some(promtool) = require_program("promtool") else {
        return;
    };
    let file = dir.join("metrics.txt");
    std::fs::write(&file, text).expect("write metrics");
    run_ok(
        Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&file).expect("metrics file")),
        "promtool check metrics",
    );
}

/// Runs `command`, which must succeed (else the test fails with its output), and returns its output.
pub fn run_ok(command: &mut Command, what: &str) -> std::process::Output {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The status code of a raw HTTP/1.1 response (`HTTP/1.1 429 ...`), 0 when there is none.
pub fn http_status(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `kill -NAME PID`.
pub fn send_signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// `VmRSS` of a process from `/proc/PID/status`, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A minimal blocking HTTP/1.1 `GET` to 127.0.0.1:`port` (no client library, so it works inside
/// `wait_until` on any thread): (status, body), or (0, "") on any error.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let attempt = || -> std::io::Result<(u16, String)> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
        let status = http_status(&text);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    };
    attempt().unwrap_or((0, String::new()))
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas)` cluster-enabled servers with a short
    /// `cluster-node-timeout` (so a replica takes over quickly), joins them with
    /// `redis-cli --cluster create ... --cluster-replicas N` (with `cluster-require-full-coverage
    /// no`, so other masters keep serving during a failover) and waits until every node reports
    /// `cluster_state:ok` and every replica's link to its master is up.
    pub fn start_with_replicas(
        masters: usize,
        replicas: usize,
        node_timeout_ms: u64,
    ) -> Option<RedisCluster> {
        let timeout = node_timeout_ms.to_string();
        let settings = [
            "--cluster-node-timeout",
            &timeout,
            // The other masters keep serving while a failed one's slots are uncovered.
            "--cluster-require-full-coverage",
            "no",
        ];
        let nodes = spawn_cluster(masters, replicas, &settings, &|_| Vec::new())?;
        let ok = wait_until(Duration::from_secs(30), || {
            nodes.iter().all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                let repl = n.cli(&["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            })
        });
        assert!(ok, "cluster with replicas did not become ready");
        Some(RedisCluster { nodes })
    }
}

/// Starts `masters * (1 + replicas)` cluster-enabled servers with `settings` and joins them with
/// `redis-cli --cluster create ... --cluster-replicas N`. `None` when redis is missing outside CI.
fn spawn_cluster(
    masters: usize,
    replicas: usize,
    settings: &[&str],
    per_node: &dyn Fn(usize) -> Vec<String>,
) -> Option<Vec<RedisServer>> {
    require_program("redis-cli")?;
    let mut nodes = Vec::new();
    for index in 0..masters * (1 + replicas) {
        let port = free_port();
        let (port_arg, conf) = (port.to_string(), format!("nodes-{port}.conf"));
        let mut args = vec![
            "--port",
            &port_arg,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &conf,
        ];
        args.extend_from_slice(settings);
        let own = per_node(index);
        args.extend(own.iter().map(String::as_str));
        nodes.push(RedisServer::spawn(&args, port)?);
    }
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    run_ok(
        Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]),
        "redis-cli --cluster create",
    );
    Some(nodes)
}

/// A CA that issues certificates for the tests.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("ca key");
        let cert = params.self_signed(&key).expect("ca cert");
        Ca {
            issuer: rcgen::Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// The server's certificate, for `localhost` and 127.0.0.1.
    pub fn server(&self) -> Pair {
        self.issue(
            &["localhost", "127.0.0.1"],
            None,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate carrying the URI SAN `uri`.
    pub fn client(&self, uri: &str) -> Pair {
        self.issue(&[], Some(uri), rcgen::ExtendedKeyUsagePurpose::ClientAuth)
    }

    pub fn issue(
        &self,
        names: &[&str],
        uri: Option<&str>,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> Pair {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("params");
        if let Some(uri) = uri {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(uri).expect("uri"),
            ));
        }
        params.extended_key_usages = vec![usage];
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("cert");
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A blocking HTTPS exchange (HTTP/1.1) on a new connection: the server's leaf certificate and
/// the response.
pub fn https_get(
    port: u16,
    server_ca: &str,
    client: &Pair,
    path: &str,
) -> std::io::Result<(Vec<u8>, String)> {
    use std::io::{Read, Write};
    let config = tls_client_config(server_ca, client, b"http/1.1");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let connection = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
    let socket = std::net::TcpStream::connect(("127.0.0.1", port))?;
    socket.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut tls = rustls::StreamOwned::new(connection, socket);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    // A server that closes without close_notify ends the read with an error after the body.
    let _ = tls.read_to_end(&mut raw);
    let leaf = tls
        .conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    Ok((leaf, String::from_utf8_lossy(&raw).into_owned()))
}

/// A rustls client configuration trusting `server_ca`, presenting `client`, offering `alpn`.
pub fn tls_client_config(
    server_ca: &str,
    client: &Pair,
    alpn: &[u8],
) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in rustls::pki_types::CertificateDer::pem_slice_iter(server_ca.as_bytes()) {
        roots.add(ca.expect("ca pem")).expect("root");
    }
    let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(client.cert.as_bytes())
        .map(|c| c.expect("cert pem"))
        .collect();
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(client.key.as_bytes()).expect("key pem");
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client cert");
    config.alpn_protocols = vec![alpn.to_vec()];
    std::sync::Arc::new(config)
}
