//! Rule reloads through the real binary and real file-system operations: the ways deploy tools,
//! operators and Kubernetes change what a `--config` path names (symlink swaps, directories
//! deleted or replaced, symlinked files, `..data` swaps), how failures are counted, how stale
//! rules show, SIGHUP during start-up, the size bound of a rule file, and the metric series of
//! renamed rules.
//!
//! Waits are polls of up to 10 s that pass as soon as the condition holds; the periodic check
//! (every 30 s) never has time to mask a missed file event.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::support::{Slidegate, metric_value, send_signal, slidegate_command, wait_until};

const WAIT: Duration = Duration::from_secs(10);

/// A rule file of domain `d` whose one rule allows `n` per minute (the number tells versions
/// apart in `/rlconfig`).
fn rules(n: u64) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: {n} }}\n"
    )
}

/// Whether `/rlconfig` shows the version `n` of [`rules`].
fn serves(server: &Slidegate, n: u64) -> bool {
    server
        .get("/rlconfig")
        .1
        .contains(&format!("d k: {n} per MINUTE"))
}

/// Waits until the server serves version `n`; fails with the log otherwise.
fn expect_serves(server: &Slidegate, n: u64, after: &str) {
    assert!(
        wait_until(WAIT, || serves(server, n)),
        "after {after}: version {n} not served\n/rlconfig:\n{}\nlog:\n{}",
        server.get("/rlconfig").1,
        server.log()
    );
}

fn metric(server: &Slidegate, series: &str) -> f64 {
    metric_value(&server.get("/metrics").1, series)
}

fn failures(server: &Slidegate) -> f64 {
    metric(
        server,
        r#"slidegate_config_reloads_total{result="failure"}"#,
    )
}

/// A raw `GET /check` for one descriptor; the whole response.
fn check(port: u16, domain: &str, descriptor: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        stream,
        "GET /check HTTP/1.1\r\nHost: 127.0.0.1\r\nx-ratelimit-domain: {domain}\r\n\
         x-ratelimit-descriptor: {descriptor}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    raw
}

/// A canonical temporary directory (watch paths and event paths are physical).
fn temp_root() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().canonicalize().expect("canonical tempdir");
    (dir, path)
}

/// Writes `text` to `path` as editors and deploy tools do: a new file renamed over the old one.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Points the symlink `link` at `target` in one atomic step (a new link renamed over it), as
/// deploy tools and kubelet do.
fn swap_symlink(link: &Path, target: &str) {
    let tmp = link.with_extension("new-link");
    symlink(target, &tmp).expect("symlink");
    std::fs::rename(&tmp, link).expect("rename symlink");
}

/// `releases/1` and `releases/2` each holding `rules.yaml` (versions 1 and 2), and
/// `current -> releases/1`.
fn releases(root: &Path) -> PathBuf {
    for n in [1, 2] {
        let dir = root.join(format!("releases/{n}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("rules.yaml"), rules(n)).expect("write");
    }
    let current = root.join("current");
    symlink("releases/1", &current).expect("symlink");
    current
}

/// Proves: `--config cap/current`, with `current` a symlink swapped atomically from release 1 to
/// release 2, serves release 2; later edits in release 2 are served; edits in the old release
/// are not (nothing counted).
#[test]
fn a_swapped_release_symlink_is_followed() {
    let (_dir, root) = temp_root();
    let current = releases(&root);
    let server = Slidegate::start(&current, &[]);
    assert!(serves(&server, 1));

    swap_symlink(&current, "releases/2");
    expect_serves(&server, 2, "the symlink swap");
    std::fs::write(root.join("releases/2/rules.yaml"), rules(3)).expect("edit");
    expect_serves(&server, 3, "an edit in the new release");

    let attempts = metric(
        &server,
        r#"slidegate_config_reloads_total{result="success"}"#,
    );
    std::fs::write(root.join("releases/1/rules.yaml"), rules(4)).expect("edit old release");
    std::thread::sleep(Duration::from_millis(800));
    assert!(serves(&server, 3));
    assert_eq!(
        metric(
            &server,
            r#"slidegate_config_reloads_total{result="success"}"#
        ),
        attempts,
        "an edit of the release no longer named must not reload"
    );
}

/// Proves: `--config current/rules.yaml` (a file under the swapped symlink) follows the swap and
/// later edits of the new file.
#[test]
fn a_file_under_a_swapped_symlink_is_followed() {
    let (_dir, root) = temp_root();
    let current = releases(&root);
    let server = Slidegate::start(&current.join("rules.yaml"), &[]);
    assert!(serves(&server, 1));

    swap_symlink(&current, "releases/2");
    expect_serves(&server, 2, "the symlink swap");
    write_atomically(&root.join("releases/2/rules.yaml"), &rules(3));
    expect_serves(&server, 3, "a save in the new release");
}

/// Proves: a rule directory replaced by a symlink to another directory is followed, and so are
/// later edits in that directory (not only the swap).
#[test]
fn a_directory_replaced_by_a_symlink_is_followed() {
    let (_dir, root) = temp_root();
    let rules_dir = root.join("rules");
    std::fs::create_dir(&rules_dir).expect("mkdir");
    std::fs::write(rules_dir.join("a.yaml"), rules(1)).expect("write");
    let server = Slidegate::start(&rules_dir, &[]);

    let elsewhere = root.join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    std::fs::write(elsewhere.join("a.yaml"), rules(2)).expect("write");
    std::fs::remove_dir_all(&rules_dir).expect("rm -r");
    symlink(&elsewhere, &rules_dir).expect("symlink");
    expect_serves(&server, 2, "the directory became a symlink");

    std::fs::write(elsewhere.join("a.yaml"), rules(3)).expect("edit");
    expect_serves(&server, 3, "a later edit in the symlinked directory");
    std::fs::write(
        elsewhere.join("b.yaml"),
        rules(4).replace("domain: d", "domain: e"),
    )
    .expect("add a file");
    assert!(
        wait_until(WAIT, || server
            .get("/rlconfig")
            .1
            .contains("e k: 4 per MINUTE")),
        "a new file in the symlinked directory: {}",
        server.log()
    );
}

/// Proves: a rule directory deleted (one failure, counted once however long it stays away) and
/// created again is loaded, and edits after that are too (the watch is on the new directory).
#[test]
fn a_directory_deleted_and_recreated_is_loaded_again() {
    let (_dir, root) = temp_root();
    let rules_dir = root.join("rules");
    std::fs::create_dir(&rules_dir).expect("mkdir");
    std::fs::write(rules_dir.join("a.yaml"), rules(1)).expect("write");
    let server = Slidegate::start(&rules_dir, &[]);

    std::fs::remove_dir_all(&rules_dir).expect("rm -r");
    assert!(
        wait_until(WAIT, || failures(&server) >= 1.0),
        "{}",
        server.log()
    );
    assert!(serves(&server, 1), "the previous rules stay");

    // Created again whole, as a deploy does (an empty directory would be another failure).
    let staged = root.join("rules.new");
    std::fs::create_dir(&staged).expect("mkdir");
    std::fs::write(staged.join("a.yaml"), rules(2)).expect("write");
    std::fs::rename(&staged, &rules_dir).expect("rename into place");
    expect_serves(&server, 2, "the directory came back");
    std::fs::write(rules_dir.join("a.yaml"), rules(3)).expect("edit");
    expect_serves(&server, 3, "an edit in the recreated directory");
    assert_eq!(failures(&server), 1.0, "one cause, one failure");
}

/// Proves: a rule file that is a symlink to a file elsewhere is reloaded when that file is
/// edited in place (no event happens in the rule directory).
#[test]
fn edits_of_a_symlinked_rule_file_are_seen() {
    let (_dir, root) = temp_root();
    let rules_dir = root.join("rules");
    let shared = root.join("shared");
    std::fs::create_dir(&rules_dir).expect("mkdir");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::write(shared.join("team.yaml"), rules(1)).expect("write");
    symlink("../shared/team.yaml", rules_dir.join("a.yaml")).expect("symlink");
    let server = Slidegate::start(&rules_dir, &[]);

    std::fs::write(shared.join("team.yaml"), rules(2)).expect("edit target");
    expect_serves(&server, 2, "an edit of the symlink's target");
}

/// Proves: a Kubernetes ConfigMap volume (`rules.yaml -> ..data/rules.yaml`, `..data ->
/// ..TIMESTAMP`) is reloaded on each kubelet-style update (new timestamped directory, new
/// `..data_tmp` renamed over `..data`, old directory removed), twice in a row.
#[test]
fn configmap_data_swaps_keep_working() {
    let (_dir, root) = temp_root();
    let volume = root.join("volume");
    let publish = |n: u64| {
        let stamped = volume.join(format!("..2026_12_01_00_00_0{n}"));
        std::fs::create_dir_all(&stamped).expect("mkdir");
        std::fs::write(stamped.join("rules.yaml"), rules(n)).expect("write");
        let data = volume.join("..data");
        let tmp = volume.join("..data_tmp");
        symlink(stamped.file_name().expect("name"), &tmp).expect("symlink");
        std::fs::rename(&tmp, &data).expect("rename ..data_tmp");
        if n > 1 {
            let old = volume.join(format!("..2026_12_01_00_00_0{}", n - 1));
            std::fs::remove_dir_all(old).expect("remove old");
        }
    };
    publish(1);
    symlink("..data/rules.yaml", volume.join("rules.yaml")).expect("symlink");
    let server = Slidegate::start(&volume, &[]);
    assert!(serves(&server, 1));
    publish(2);
    expect_serves(&server, 2, "the first ..data swap");
    publish(3);
    expect_serves(&server, 3, "the second ..data swap");
    assert_eq!(failures(&server), 0.0, "{}", server.log());
}

/// Proves: an unreadable rule file (here a dangling symlink; tests run as root, for whom
/// `chmod 000` changes nothing) is one failed reload, not one more for each unrelated change in
/// the directory; the cause going away and coming back is counted again.
#[test]
fn a_read_error_is_counted_once() {
    let (_dir, root) = temp_root();
    std::fs::write(root.join("a.yaml"), rules(1)).expect("write");
    let server = Slidegate::start(&root, &[]);

    symlink("/nonexistent/slidegate.yaml", root.join("b.yaml")).expect("dangling symlink");
    assert!(
        wait_until(WAIT, || failures(&server) >= 1.0),
        "{}",
        server.log()
    );
    // Hidden files: every other file in the directory is a rule file.
    for i in 0..4 {
        std::fs::write(root.join(format!(".notes-{i}")), "unrelated").expect("write");
        std::thread::sleep(Duration::from_millis(400));
    }
    assert_eq!(failures(&server), 1.0, "one cause, one failure");

    std::fs::remove_file(root.join("b.yaml")).expect("remove");
    std::fs::write(root.join("a.yaml"), rules(2)).expect("edit");
    expect_serves(&server, 2, "the broken file removed");
    symlink("/nonexistent/slidegate.yaml", root.join("b.yaml")).expect("dangling symlink");
    assert!(wait_until(WAIT, || failures(&server) >= 2.0));
}

/// Proves: the served and on-disk checksums, staleness and load time show in `/metrics` and
/// `/rlconfig`: equal and not stale after start; different and stale while the files on disk do
/// not load; equal again once they do, with a later load time.
#[test]
fn stale_rules_show_in_metrics_and_rlconfig() {
    let (_dir, root) = temp_root();
    let file = root.join("rules.yaml");
    std::fs::write(&file, rules(1)).expect("write");
    let server = Slidegate::start(&file, &[]);
    let header = |server: &Slidegate, field: &str| -> String {
        let body = server.get("/rlconfig").1;
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("# {field}: ")))
            .unwrap_or_else(|| panic!("no {field} in\n{body}"))
            .to_owned()
    };
    let sha256 = |text: &str| {
        let out = std::process::Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .expect("stdin")
                    .write_all(text.as_bytes())?;
                child.wait_with_output()
            })
            .expect("sha256sum");
        String::from_utf8_lossy(&out.stdout)[..64].to_owned()
    };
    let served = header(&server, "served_checksum");
    assert_eq!(served.len(), 64);
    assert_eq!(header(&server, "on_disk_checksum"), served);
    assert_eq!(header(&server, "stale"), "false");
    let loaded_at = header(&server, "loaded_at");
    assert!(loaded_at.starts_with("20"), "{loaded_at}");
    let m = server.get("/metrics").1;
    assert_eq!(metric_value(&m, "slidegate_config_stale"), 0.0);
    assert!(
        m.contains(&format!(
            "slidegate_config_checksum_info{{on_disk=\"{served}\",served=\"{served}\"}} 1"
        )),
        "{m}"
    );
    let started = metric_value(&m, "slidegate_config_loaded_timestamp_seconds");
    assert!(started > 1.7e9, "{started}");

    let broken = "domain: d\ndescriptors: [{ key: k, ratelimit: {} }]\n";
    std::fs::write(&file, broken).expect("break");
    assert!(wait_until(WAIT, || metric(
        &server,
        "slidegate_config_stale"
    ) == 1.0));
    assert_eq!(header(&server, "stale"), "true");
    assert_eq!(header(&server, "served_checksum"), served);
    let on_disk = header(&server, "on_disk_checksum");
    assert_ne!(on_disk, served);
    assert!(
        server.get("/metrics").1.contains(&format!(
            "slidegate_config_checksum_info{{on_disk=\"{on_disk}\",served=\"{served}\"}} 1"
        )),
        "one series, with both checksums"
    );
    // The checksum is of the file names and texts, not sha256sum's; it only has to differ.
    assert_ne!(on_disk, sha256(broken));

    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&file, rules(2)).expect("fix");
    assert!(wait_until(WAIT, || metric(
        &server,
        "slidegate_config_stale"
    ) == 0.0));
    assert_eq!(header(&server, "stale"), "false");
    assert_ne!(header(&server, "served_checksum"), served);
    assert!(metric(&server, "slidegate_config_loaded_timestamp_seconds") > started);
    let m = server.get("/metrics").1;
    assert_eq!(
        m.matches("slidegate_config_checksum_info{").count(),
        1,
        "the old checksums' series is gone\n{m}"
    );
}

/// Proves: SIGHUPs from the first moment the process logs anything, and all through loading a
/// large rule file, neither kill it nor stop it from starting; they cause a reload once the
/// rules are loaded.
#[test]
fn sighup_during_start_up_does_not_kill() {
    let (_dir, root) = temp_root();
    let file = root.join("rules.yaml");
    let mut text = String::from("domain: d\ndescriptors:\n");
    for i in 0..20_000 {
        text.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{ unit: minute, requests_per_unit: {i} }}\n"
        ));
    }
    std::fs::write(&file, text).expect("write");
    let log_path = root.join("slidegate.log");
    let http_port = crate::support::free_port();
    let mut child = crate::support::KillOnDrop(
        slidegate_command()
            .arg("serve")
            .arg("--config")
            .arg(&file)
            .args([
                "--grpc-addr",
                &format!("127.0.0.1:{}", crate::support::free_port()),
            ])
            .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
            .args([
                "--admin-addr",
                &format!("127.0.0.1:{}", crate::support::free_port()),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).expect("log"))
            .spawn()
            .expect("spawn"),
    );
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        wait_until(WAIT, || !log().is_empty()),
        "no log line at start"
    );
    let mut sent = 0;
    let up = wait_until(Duration::from_secs(60), || {
        if child.0.try_wait().ok().flatten().is_some() {
            return true;
        }
        send_signal(child.pid(), "HUP");
        sent += 1;
        crate::support::http_get(http_port, "/healthcheck").0 == 200
    });
    let exit = child.0.try_wait().ok().flatten();
    assert!(
        up && exit.is_none(),
        "exit {exit:?} after {sent} SIGHUPs\n{}",
        log()
    );
    assert!(
        wait_until(WAIT, || log().contains("SIGHUP: reloading rules")),
        "{}",
        log()
    );
}

/// Proves: a rule file over the size bound is refused with a clear error, by `check-config`, at
/// start, and on reload (where the previous rules stay).
#[test]
fn rule_files_over_the_size_bound_are_refused() {
    let (_dir, root) = temp_root();
    let file = root.join("rules.yaml");
    let mut big = rules(1);
    let padding = usize::try_from(slidegate::config::MAX_RULE_FILE_BYTES).expect("fits");
    big.push_str(&"#".repeat(padding));
    big.push('\n');
    std::fs::write(&file, &big).expect("write");
    let out = slidegate_command()
        .arg("check-config")
        .arg(&file)
        .output()
        .expect("check-config");
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stderr.contains("rules.yaml") && stderr.contains("larger than 8 MiB"),
        "{stderr}"
    );

    std::fs::write(&file, rules(1)).expect("write");
    let server = Slidegate::start(&file, &[]);
    // Written in place (truncated, then filled): a reader may see the file empty, then whole.
    std::fs::write(&file, &big).expect("grow");
    assert!(
        wait_until(WAIT, || server.log().contains("larger than 8 MiB")),
        "{}",
        server.log()
    );
    assert!(failures(&server) >= 1.0);
    assert!(serves(&server, 1));
}

/// Proves: renaming rules drops the series of the old names at the reload (they would otherwise
/// stay forever and, reload after reload, push every live rule into `rule="overflow"`), while
/// the renamed rules count under their new names.
#[test]
fn series_of_renamed_rules_are_dropped() {
    let (_dir, root) = temp_root();
    let file = root.join("rules.yaml");
    let named = |name: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ name: {name}, unit: minute, requests_per_unit: 100 }}\n"
        )
    };
    std::fs::write(&file, named("first")).expect("write");
    let server = Slidegate::start(&file, &[]);
    let hit = || {
        let response = check(server.http_port, "d", "k=v");
        assert_eq!(crate::support::http_status(&response), 200, "{response}");
    };
    hit();
    let series = |rule: &str| {
        format!(r#"slidegate_decisions_total{{decision="allowed",domain="d",rule="{rule}"}}"#)
    };
    assert_eq!(metric(&server, &series("first")), 1.0);

    for (i, name) in ["second", "third"].iter().enumerate() {
        std::fs::write(&file, named(name)).expect("rename rule");
        assert!(wait_until(WAIT, || {
            metric(
                &server,
                r#"slidegate_config_reloads_total{result="success"}"#,
            ) >= (i + 1) as f64
        }));
        hit();
        let m = server.get("/metrics").1;
        assert_eq!(metric_value(&m, &series(name)), 1.0, "{m}");
        assert!(
            !m.contains("rule=\"first\"") && (i == 0 || !m.contains("rule=\"second\"")),
            "series of removed rules remain:\n{m}"
        );
    }
}
