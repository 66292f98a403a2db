//! Processes and ports: free ports, children killed on drop, waiting for a condition or a
//! listener, signals and resident memory.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// Spawns `command` (its output discarded) and waits until it accepts connections on `port`, or
/// says why not: the process exited (another process took its port between [`free_port`] and its
/// bind, say) or did not listen within 10 s.
pub fn try_spawn_listening(
    command: &mut Command,
    port: u16,
    what: &str,
) -> Result<KillOnDrop, String> {
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut process = KillOnDrop(child);
    let mut exited = None;
    let up = wait_until(Duration::from_secs(10), || {
        exited = process.0.try_wait().ok().flatten();
        exited.is_some() || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    match exited {
        Some(status) => Err(format!(
            "{what} exited ({status}) instead of listening on port {port}"
        )),
        None if up => Ok(process),
        None => Err(format!("{what} did not start on port {port}")),
    }
}

/// `spawn(port)` on a [`free_port`], again on another port (three attempts in all) when it did
/// not come up: between `free_port` releasing a port and the server binding it, another process
/// of the test run may take it. Panics with the last reason when no attempt succeeded.
pub fn on_a_free_port<T>(mut spawn: impl FnMut(u16) -> Result<T, String>) -> T {
    let mut why = String::new();
    for _ in 0..3 {
        match spawn(free_port()) {
            Ok(started) => return started,
            Err(reason) => why = reason,
        }
    }
    panic!("{why} (three ports tried)")
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
