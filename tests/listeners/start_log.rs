//! What the start log and start errors say, through the binary: settings in plain text (no Rust
//! debug forms such as `Tcp(..)`, `None` or `Some(..)`), and a bad Redis URL named by its flag
//! without a dump of the options.

use crate::support::{Slidegate, slidegate_command};

const DEBUG_FORMS: [&str; 5] = ["Tcp(", "None", "Some(", "RedisOptions", " { "];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_line_is_plain_text() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let server = Slidegate::start(&config, &[]);
    let log = server.log();
    let start = log
        .lines()
        .find(|l| l.contains("starting slidegate"))
        .expect("a start line");
    for form in DEBUG_FORMS {
        assert!(!start.contains(form), "{form} in {start}");
    }
    let admin = format!("admin_addr=127.0.0.1:{}", server.admin_port);
    for part in [
        admin.as_str(),
        "tls=off",
        "redis_timeout=50ms",
        "idle_timeout=5m",
    ] {
        assert!(start.contains(part), "{part} is not in {start}");
    }
}

#[test]
fn a_bad_redis_url_is_named_by_its_flag_without_a_dump() {
    let out = slidegate_command()
        .args([
            "serve",
            "--config",
            "config",
            "--redis-url",
            "redis://:pw@[::1",
        ])
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run slidegate");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr
        .lines()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(error.contains("--redis-url"), "{error}");
    assert!(!error.contains("pw"), "the password leaked: {error}");
    for form in DEBUG_FORMS {
        assert!(!error.contains(form), "{form} in {error}");
    }
}
