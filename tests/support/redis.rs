//! Throwaway redis-servers on free ports, without persistence: plain, over TLS, and as a Redis
//! Cluster (`cluster.rs`).

use std::path::PathBuf;
use std::process::Command;

use super::{
    CertFiles, KillOnDrop, on_a_free_port, redis_server_program, require_program,
    try_spawn_listening,
};

mod cluster;

pub use cluster::{RedisCluster, TlsRedisCluster};

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
        redis_server_program()?;
        Some(on_a_free_port(|port| {
            let port_arg = port.to_string();
            let mut args = vec!["--port", port_arg.as_str()];
            args.extend(extra);
            Self::try_spawn(&args, port).expect("redis-server, found above")
        }))
    }

    /// Starts redis-server (bound to 127.0.0.1, no persistence, in a fresh directory) with `args`,
    /// which must make it listen on `port`, and waits until that port accepts connections.
    pub fn spawn(args: &[&str], port: u16) -> Option<RedisServer> {
        Some(Self::try_spawn(args, port)?.unwrap_or_else(|why| panic!("{why}")))
    }

    /// [`RedisServer::spawn`], or why the server did not come up (see [`try_spawn_listening`]).
    pub fn try_spawn(args: &[&str], port: u16) -> Option<Result<RedisServer, String>> {
        let bin = redis_server_program()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut command = redis_server_command(&bin, dir.path(), args);
        Some(
            try_spawn_listening(&mut command, port, "redis-server").map(|process| RedisServer {
                port,
                process,
                dir,
            }),
        )
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }
}

/// The major version of the redis-server the tests start ([`redis_server_program`]), from its
/// `--version` (`Redis server v=6.2.14 ...`); `None` when it is missing outside CI. Options
/// differ between versions (`--enable-debug-command` is 7.0's).
pub fn redis_server_major() -> Option<u32> {
    let bin = redis_server_program()?;
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} --version: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    let major = text
        .split_once("v=")
        .and_then(|(_, v)| v.split('.').next())
        .and_then(|major| major.parse().ok());
    Some(major.unwrap_or_else(|| panic!("no version in {text:?}")))
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
        redis_server_program()?;
        let ca = CertFiles::new();
        let tls_args = ca.server_args();
        let server = on_a_free_port(|tls_port| {
            let tls_port_arg = tls_port.to_string();
            let mut args: Vec<&str> = vec!["--port", "0", "--tls-port", &tls_port_arg];
            args.extend(tls_args.iter().map(String::as_str));
            args.extend(extra);
            RedisServer::try_spawn(&args, tls_port).expect("redis-server, found above")
        });
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
