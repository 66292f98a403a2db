//! Shared test support: real programs (redis-server, ...) started on free ports and killed on drop.
//!
//! In CI (`CI=true`) a missing program fails the test; on a developer machine the test is skipped
//! with a message, because `scripts/test` installs everything and is the supported way to run tests.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound then released; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
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
        let bin = require_program("redis-server")?;
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let server = RedisServer {
            port,
            process: KillOnDrop(child),
            dir,
        };
        let up = wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "redis-server did not start on port {port}");
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}
