//! Rule reloads: a watched directory or file reloaded on changes (and kept on bad ones), a
//! forced reload on SIGHUP, and `reload_now`'s outcome. In one file because they share a lock
//! that runs them one at a time (one of them signals the whole test process).

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use slidegate::config::reload::{ConfigStatus, ReloadHook, ReloadOutcome, Reloader};
use slidegate::config::{LiveRules, load_path};

use crate::config_rules::RULE;

/// Reload tests install SIGHUP handlers and one sends SIGHUP to this process: run them one at
/// a time, so that a forced reload never lands in another test's count.
static RELOAD_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn domain_file(domain: &str, keys: &[&str]) -> String {
    let mut text = format!("domain: {domain}\ndescriptors:\n");
    for key in keys {
        text.push_str(&format!("  - key: {key}\n{RULE}"));
    }
    text
}

/// Records every reload attempt.
#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<Vec<ReloadOutcome>>>);

impl Attempts {
    fn hook(&self) -> ReloadHook {
        let attempts = self.0.clone();
        Arc::new(move |outcome: &ReloadOutcome, _: &ConfigStatus| {
            attempts.lock().expect("lock").push(outcome.clone());
        })
    }

    fn len(&self) -> usize {
        self.0.lock().expect("lock").len()
    }

    fn failures(&self) -> Vec<String> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .filter_map(|o| match o {
                ReloadOutcome::Failed(e) => Some(e.to_string()),
                ReloadOutcome::Loaded { .. } => None,
            })
            .collect()
    }
}

/// Polls `condition` every 20 ms for up to 10 s (tolerant of slow machines; passes as soon as
/// the condition holds).
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The SIGHUP stream a reloader listens to.
fn hangup() -> tokio::signal::unix::Signal {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).expect("SIGHUP handler")
}

fn live_from(path: &Path) -> LiveRules {
    Arc::new(ArcSwap::from_pointee(
        load_path(path).expect("initial rules"),
    ))
}

#[tokio::test]
async fn watched_directory_reloads_good_changes_and_keeps_rules_on_bad_ones() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.yaml");
    std::fs::write(&a, domain_file("one", &["k1"])).expect("write");
    let live = live_from(dir.path());
    let attempts = Attempts::default();
    let reloader = Reloader::spawn(
        dir.path().to_owned(),
        live.clone(),
        attempts.hook(),
        hangup(),
    )
    .expect("spawn reloader");

    // A good change goes live.
    std::fs::write(&a, domain_file("one", &["k1", "k2"])).expect("write");
    wait_for("two rules", || live.load().rule_count() == 2).await;

    // A broken change is reported and the previous rules stay.
    std::fs::write(
        &a,
        "domain: one\ndescriptors:\n  - key: k1\n    ratelimit: {}\n",
    )
    .expect("write");
    let broken = "a.yaml: descriptors[0]: unknown field `ratelimit`";
    let reported = || {
        attempts
            .failures()
            .iter()
            .filter(|f| f.contains(broken))
            .count()
    };
    wait_for("a failed reload", || reported() >= 1).await;
    assert_eq!(live.load().rule_count(), 2);

    // All or nothing: a new good file does not go live while another file is broken.
    std::fs::write(dir.path().join("b.yaml"), domain_file("two", &["x"])).expect("write");
    wait_for("a second failed reload", || reported() >= 2).await;
    assert!(live.load().domain("two").is_none());
    assert!(matches!(
        reloader.reload_now().await,
        ReloadOutcome::Failed(_)
    ));
    assert_eq!(live.load().rule_count(), 2);

    // Fixing the broken file brings both in.
    std::fs::write(&a, domain_file("one", &["k1"])).expect("write");
    wait_for("both domains", || live.load().domain("two").is_some()).await;
    assert_eq!(live.load().rule_count(), 2);
    assert!(live.load().domain("one").is_some());

    // Dropping the reloader stops watching.
    drop(reloader);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = attempts.len();
    std::fs::write(&a, domain_file("one", &["k1", "k2", "k3"])).expect("write");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(attempts.len(), before);
    assert_eq!(live.load().rule_count(), 2);
}

#[tokio::test]
async fn watched_file_reloads_on_replace_by_rename_and_ignores_unrelated_files() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, domain_file("one", &["k1"])).expect("write");
    let live = live_from(&file);
    let attempts = Attempts::default();
    let _reloader = Reloader::spawn(file.clone(), live.clone(), attempts.hook(), hangup())
        .expect("spawn reloader");

    // Unrelated files next to the rule file do not cause reload attempts.
    std::fs::write(dir.path().join("other.txt"), "hello").expect("write");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(attempts.len(), 0);

    // An editor-style save: write a temporary file, rename it over the rule file.
    let tmp = dir.path().join(".rules.yaml.tmp");
    std::fs::write(&tmp, domain_file("one", &["k1", "k2", "k3"])).expect("write");
    std::fs::rename(&tmp, &file).expect("rename");
    wait_for("three rules", || live.load().rule_count() == 3).await;
    assert_eq!(attempts.len(), 1);
}

#[tokio::test]
async fn sighup_forces_a_reload() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), domain_file("one", &["k1"])).expect("write");
    let live = live_from(dir.path());
    let before = live.load_full();
    let attempts = Attempts::default();
    let _reloader = Reloader::spawn(
        dir.path().to_owned(),
        live.clone(),
        attempts.hook(),
        hangup(),
    )
    .expect("spawn reloader");

    // The files are unchanged, so only SIGHUP can cause this reload. The Reloader's handler is
    // installed, so the signal does not terminate the test process.
    let status = Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    wait_for("a reload after SIGHUP", || attempts.len() == 1).await;
    assert!(attempts.failures().is_empty());
    assert!(
        !Arc::ptr_eq(&before, &live.load_full()),
        "a new rule set is live"
    );
}

#[tokio::test]
async fn reload_now_reports_the_outcome() {
    let _serial = RELOAD_TESTS.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), domain_file("one", &["k1", "k2"])).expect("write");
    let live = live_from(dir.path());
    let before = live.load_full();
    let hooked = Arc::new(AtomicUsize::new(0));
    let counter = hooked.clone();
    let hook: ReloadHook = Arc::new(move |_: &ReloadOutcome, status: &ConfigStatus| {
        assert!(!status.is_stale());
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let reloader =
        Reloader::spawn(dir.path().to_owned(), live.clone(), hook, hangup()).expect("spawn");
    assert!(matches!(
        reloader.reload_now().await,
        ReloadOutcome::Loaded { rules: 2 }
    ));
    assert!(!Arc::ptr_eq(&before, &live.load_full()));
    assert_eq!(hooked.load(Ordering::SeqCst), 1);
    assert_eq!(reloader.path(), dir.path());
    assert_eq!(reloader.status().load().served, live.load().checksum());
}
