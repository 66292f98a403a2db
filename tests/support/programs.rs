//! The programs the tests run (redis-server, Envoy, nginx, promtool, ...): found on PATH, skipped
//! when missing on a developer machine, a failure when missing in CI.

use std::path::PathBuf;
use std::process::Command;

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

/// The redis-server binary every Redis test starts: `$SLIDEGATE_REDIS_SERVER` (another version,
/// e.g. the Redis 6.2 that `.ci/run` runs the store tests against a second time), else
/// `redis-server` on the PATH; as [`require_program`] when it is missing (a variable naming a
/// missing file fails in CI as well).
pub fn redis_server_program() -> Option<PathBuf> {
    match std::env::var_os("SLIDEGATE_REDIS_SERVER") {
        Some(path) => require_program(&path.to_string_lossy()),
        None => require_program("redis-server"),
    }
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
