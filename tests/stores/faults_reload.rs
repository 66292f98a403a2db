//! Fault tests: rule files that break while the service runs (garbage, truncated, emptied, a
//! dangling symlink, a FIFO, deleted, replaced by a directory), as a single `--config` file and in
//! a directory: the previous rules keep serving, the failure is counted and logged.

use std::path::Path;
use std::time::Duration;

use crate::faults_fixture::{RULES, Rules, healthy, metrics, request};
use crate::support::{Slidegate, metric_value, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// Waits until `slidegate_config_reloads_total{result="failure"}` reaches `n`.
fn wait_failures(server: &Slidegate, n: usize) -> bool {
    wait_until(Duration::from_secs(10), || {
        metric_value(
            &metrics(server),
            r#"slidegate_config_reloads_total{result="failure"}"#,
        ) >= n as f64
    })
}

/// `tight=t` is over its limit (2 per minute, used up at the start), and `user` still has its
/// old limit: the previous rules are serving, with their counters.
async fn old_rules_still_serve(client: &mut RateLimitServiceClient<Channel>, what: &str) {
    let r = client
        .should_rate_limit(request(&[("tight", "t")]))
        .await
        .expect("call")
        .into_inner();
    assert_eq!(r.overall_code(), Code::OverLimit, "after {what}: {r:?}");
    let r = client
        .should_rate_limit(request(&[("user", "u")]))
        .await
        .expect("call")
        .into_inner();
    let limit = r.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit),
        ("per_user", 100_000),
        "after {what}"
    );
}

/// The rule lines of `/rlconfig` (not its `#` header, which shows the on-disk checksum).
fn rule_lines(server: &Slidegate) -> Vec<String> {
    let (status, body) = server.get("/rlconfig");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Replaces `path` (whatever it is now) by `make`.
fn replace(path: &Path, make: impl FnOnce(&Path)) {
    if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path).expect("remove dir");
    } else if path.symlink_metadata().is_ok() {
        std::fs::remove_file(path).expect("remove file");
    }
    make(path);
}

/// One way to break the rule file: its name, what it does to the path, a fragment of the reason
/// slidegate must log, and whether it is a fault in a directory of several rule files too
/// (deleting one file there, or replacing it by a directory, removes its domain on purpose).
struct Fault {
    what: &'static str,
    make: Box<dyn Fn(&Path)>,
    reason: &'static str,
    in_directory: bool,
}

fn faults() -> Vec<Fault> {
    let truncated = &RULES[..RULES.find("requests_per_unit: 2").expect("rule") + 9];
    vec![
        Fault {
            what: "garbage",
            make: Box::new(|p| std::fs::write(p, b"\x00\xff\xfe{{{ ]]] :: \x01").expect("write")),
            reason: "",
            in_directory: true,
        },
        Fault {
            what: "truncated mid-write",
            make: Box::new(move |p| std::fs::write(p, truncated).expect("write")),
            reason: "",
            in_directory: true,
        },
        Fault {
            what: "truncated to nothing",
            make: Box::new(|p| std::fs::write(p, "").expect("write")),
            reason: "empty file",
            in_directory: true,
        },
        Fault {
            what: "a dangling symlink",
            make: Box::new(|p| {
                std::os::unix::fs::symlink("/nonexistent/slidegate-rules.yaml", p).expect("symlink")
            }),
            reason: "cannot read",
            in_directory: true,
        },
        Fault {
            what: "a FIFO (reading it would block forever)",
            make: Box::new(|p| {
                let status = std::process::Command::new("mkfifo")
                    .arg(p)
                    .status()
                    .expect("mkfifo");
                assert!(status.success());
            }),
            reason: "not a regular file",
            in_directory: true,
        },
        Fault {
            what: "deleted",
            make: Box::new(|_| {}),
            reason: "cannot read",
            in_directory: false,
        },
        Fault {
            what: "replaced by a directory",
            make: Box::new(|p| std::fs::create_dir(p).expect("mkdir")),
            reason: "no rule files",
            in_directory: false,
        },
    ]
}

/// Runs every fault against a server watching `config` (the rule file, or its directory), whose
/// rule file is `file`. Between faults the good file is put back.
async fn reload_faults(config: &Path, file: &Path) -> Slidegate {
    let server = Slidegate::start(config, &[]);
    let mut client = server.client().await;
    for _ in 0..2 {
        let r = client
            .should_rate_limit(request(&[("tight", "t")]))
            .await
            .expect("call");
        assert_eq!(r.into_inner().overall_code(), Code::Ok);
    }
    old_rules_still_serve(&mut client, "start").await;
    let rlconfig = rule_lines(&server);
    let rules_loaded = metric_value(&metrics(&server), "slidegate_rules_loaded");
    assert!(rules_loaded >= 2.0);

    let mut failures = 0;
    let in_directory = config.is_dir();
    for Fault {
        what,
        make,
        reason,
        in_directory: applies,
    } in faults()
    {
        if in_directory && !applies {
            continue;
        }
        let log_before = server.log().len();
        replace(file, |p| make(p));
        failures += 1;
        assert!(
            wait_failures(&server, failures),
            "{what}: no failed reload counted\n{}",
            server.log()
        );
        old_rules_still_serve(&mut client, what).await;
        assert_eq!(rule_lines(&server), rlconfig, "{what}");
        let m = metrics(&server);
        assert_eq!(
            metric_value(&m, "slidegate_rules_loaded"),
            rules_loaded,
            "{what}"
        );
        assert!(
            healthy(&server),
            "{what}: health must not depend on a bad reload"
        );
        // Logged with the file and the reason. Waited for by its reason: under load, the reload
        // that restoring the previous fault's file started can still be logging a failure of its
        // own (a directory removed before the file is written back) when this fault is counted.
        let failed_for_this = |log: &str| {
            log[log_before..]
                .lines()
                .find(|l| l.contains("rule reload failed") && l.contains(reason))
                .map(str::to_owned)
        };
        assert!(
            wait_until(Duration::from_secs(10), || failed_for_this(&server.log())
                .is_some()),
            "{what}: no log line with {reason:?}\n{}",
            &server.log()[log_before..]
        );
        let line = failed_for_this(&server.log()).unwrap_or_default();
        let shown = if config.is_dir() { config } else { file };
        assert!(
            line.contains(&shown.display().to_string()) && line.contains("reason="),
            "{what}: {line}"
        );
        eprintln!("{what}: {line}");
        // SIGHUP re-reads the broken file: another failure, counted and survived.
        server.signal("HUP");
        failures += 1;
        assert!(
            wait_failures(&server, failures),
            "{what}: SIGHUP not counted"
        );
        old_rules_still_serve(&mut client, what).await;

        // Put the good file back (a reload of the same rules may or may not be counted).
        replace(file, |p| std::fs::write(p, RULES).expect("write"));
        tokio::time::sleep(Duration::from_millis(600)).await;
        failures = metric_value(
            &metrics(&server),
            r#"slidegate_config_reloads_total{result="failure"}"#,
        ) as usize;
        old_rules_still_serve(&mut client, "restoring").await;
    }
    server
}

/// `--config` is the rule file itself. It is overwritten with garbage, truncated in the middle of
/// a line, truncated to nothing, deleted, replaced by a directory and by a dangling symlink (tests
/// run as root, for whom `chmod 000` does not make a file unreadable; a directory or a dangling
/// symlink does, for anyone).
///
/// Proves, for each: the previous rules keep serving (a counter used up before still denies, the
/// old limit still applies, `/rlconfig` and `slidegate_rules_loaded` unchanged); the failure is
/// counted in `slidegate_config_reloads_total{result="failure"}` (and again on SIGHUP) and logged
/// with the file and the reason; health stays SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_faults_keep_the_previous_rules_single_file() {
    let rules = Rules::new(RULES);
    drop(reload_faults(&rules.file(), &rules.file()).await);
}

/// As above with `--config` a directory holding the rule file and a second domain's file: the
/// broken file must not silently drop its domain either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_faults_keep_the_previous_rules_directory() {
    let rules = Rules::new(RULES);
    std::fs::write(
        rules.dir().join("other.yaml"),
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    )
    .expect("write other");
    let server = reload_faults(&rules.dir(), &rules.file()).await;

    // Deleting one file of several is how a domain is removed: a successful reload.
    let successes = |server: &Slidegate| {
        metric_value(
            &metrics(server),
            r#"slidegate_config_reloads_total{result="success"}"#,
        )
    };
    let before = successes(&server);
    std::fs::remove_file(rules.dir().join("other.yaml")).expect("delete other.yaml");
    assert!(wait_until(Duration::from_secs(10), || successes(&server) > before));
    assert_eq!(
        metric_value(&metrics(&server), "slidegate_rules_loaded"),
        2.0
    );
    assert!(!server.get("/rlconfig").1.contains("other"));
}
