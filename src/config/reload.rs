//! Reloading rules on file changes (debounced) and on SIGHUP, all or nothing.
//!
//! The rule path is followed as the user means it, not as it resolved at start: the watches
//! cover every directory in which resolving the path looks up a name (see [`super::follow`]),
//! and move whenever one of those names changes. So a swapped `current -> releases/N` symlink,
//! a directory deleted and created again, a directory replaced by a symlink, a symlinked rule
//! file whose target is edited, and a Kubernetes ConfigMap's `..data` swap are all seen, and so
//! are later edits in whatever the path names then. Events are debounced so that a copy
//! (truncate, then write) is read once it is complete.
//!
//! A relevant change leads to reading the rule files again; they are only compiled and swapped in
//! when their checksum differs from the live rules' (and from the last failed attempt, which was
//! already reported, whether the files did not parse or could not be read): one cause is counted
//! once, however many unrelated changes follow. SIGHUP and [`Reloader::reload_now`] always
//! reload. As a last resort against a watcher that misses changes (network file systems send
//! no events), the files are also checked every [`VERIFY_INTERVAL`].
//!
//! The [`ConfigStatus`] (checksum of the served files and of the files on disk, time of the last
//! successful load) makes a reload that did not happen visible.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};
use tokio::signal::unix::Signal;
use tokio::sync::Mutex;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use super::follow::{self, Plan};
use super::load::read_sources;
use super::{Checksum, ConfigError, ConfigErrors, LiveRules, RuleSet, load_sources};

/// How long the files must be quiet before a reload: long enough for an editor's
/// truncate-then-write, short enough to feel immediate.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(250);

/// How often the rule files are read even without an event. Long enough that reading them costs
/// nothing worth measuring; short enough that a missed change is served within a minute.
pub const VERIFY_INTERVAL: Duration = Duration::from_secs(30);

/// The longest a reload waits for the rule files to be quiet: a file written without pause for
/// longer is read as it is then, and again after the writes that follow.
const MAX_SETTLE: Duration = Duration::from_secs(2);

/// How many times [`Watches::follow`] resolves the path again when it moved while the watches
/// were being set. Each round needs another change in that instant; this bounds a path that
/// changes without pause, which the next event or the periodic check then follows.
const MAX_FOLLOW_ROUNDS: usize = 8;

/// The result of one reload attempt.
#[derive(Debug, Clone)]
pub enum ReloadOutcome {
    /// The new rules are live.
    Loaded { rules: usize },
    /// The previous rules stay live.
    Failed(ConfigErrors),
}

/// Whether the rules being served are the files on disk, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigStatus {
    /// The checksum of the files the live rules were built from.
    pub served: Checksum,
    /// The checksum of the files as last read; `None` when they could not be read.
    pub on_disk: Option<Checksum>,
    /// When the live rules were loaded.
    pub loaded_at: SystemTime,
    /// Why the last reload was refused, while the files on disk are not the ones served.
    pub last_error: Option<Arc<str>>,
}

impl ConfigStatus {
    /// The files on disk are not the ones served (the last reload failed).
    pub fn is_stale(&self) -> bool {
        self.on_disk != Some(self.served)
    }
}

/// The latest [`ConfigStatus`], shared with `/rlconfig`.
pub type SharedStatus = Arc<ArcSwap<ConfigStatus>>;

/// Called after every reload attempt (metrics, logs) with the status it left. A file event that
/// leaves the rule files' contents unchanged is not an attempt.
pub type ReloadHook = Arc<dyn Fn(&ReloadOutcome, &ConfigStatus) + Send + Sync>;

/// Watches `path` (file or directory) and swaps `live` on every good change and on SIGHUP.
/// Stops when dropped.
pub struct Reloader {
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

impl Reloader {
    /// Starts watching. `hangup` is the SIGHUP stream, created by the caller as early as it can
    /// (a SIGHUP that arrives before a handler exists kills the process); one that arrived
    /// meanwhile causes a reload now. Must be called inside a Tokio runtime.
    pub fn spawn(
        path: PathBuf,
        live: LiveRules,
        hook: ReloadHook,
        hangup: Signal,
    ) -> std::io::Result<Reloader> {
        let status = ConfigStatus {
            served: live.load().checksum(),
            on_disk: Some(live.load().checksum()),
            loaded_at: SystemTime::now(),
            last_error: None,
        };
        let inner = Arc::new(Inner {
            path,
            live,
            hook,
            failed: Mutex::new(None),
            status: Arc::new(ArcSwap::from_pointee(status)),
        });
        let (watches, events) = Watches::new()?;
        let task = tokio::spawn(run(inner.clone(), watches, events, hangup));
        Ok(Reloader { inner, task })
    }

    /// Reloads now, whether or not the files changed, as SIGHUP does. The hook is called too.
    pub async fn reload_now(&self) -> ReloadOutcome {
        self.inner.reload().await
    }

    /// The watched rule path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The served and on-disk checksums and the time of the last load, kept current.
    pub fn status(&self) -> SharedStatus {
        Arc::clone(&self.inner.status)
    }
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reloader's loop: events, SIGHUP and the periodic check. Owns the watches (dropping them,
/// when the task is aborted, stops the watcher thread).
async fn run(
    inner: Arc<Inner>,
    mut watches: Watches,
    mut events: UnboundedReceiver<Vec<PathBuf>>,
    mut hangup: Signal,
) {
    // Files are read through the path as given (errors and `/rlconfig` show it as the user wrote
    // it); the watches need it absolute. The working directory never changes.
    let watched = std::path::absolute(&inner.path).unwrap_or_else(|_| inner.path.clone());
    let mut verify = tokio::time::interval(VERIFY_INTERVAL);
    verify.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    verify.reset();
    // A change between the first load and the first watch is picked up here.
    watches.follow(&watched);
    inner.reload_if_changed().await;
    loop {
        tokio::select! {
            Some(paths) = events.recv() => {
                if settle(&mut watches, &mut events, &paths).await {
                    watches.follow(&watched);
                    inner.reload_if_changed().await;
                }
            }
            Some(()) = hangup.recv() => {
                tracing::info!(path = %inner.path.display(), "SIGHUP: reloading rules");
                watches.follow(&watched);
                inner.reload().await;
            }
            _ = verify.tick() => {
                watches.follow(&watched);
                if let Some(ReloadOutcome::Loaded { .. }) = inner.reload_if_changed().await {
                    tracing::warn!(
                        path = %inner.path.display(),
                        "the periodic check found changed rule files that no file event reported"
                    );
                }
            }
            else => break,
        }
    }
}

/// Whether the batch of changed `paths` touches the rule path; if it does, first waits until the
/// files are quiet ([`until_quiet`]), taking in the batches that follow.
async fn settle(
    watches: &mut Watches,
    events: &mut UnboundedReceiver<Vec<PathBuf>>,
    paths: &[PathBuf],
) -> bool {
    if !watches.notice(paths) {
        return false;
    }
    until_quiet(events, |more| {
        watches.notice(&more);
    })
    .await;
    true
}

/// Hands each batch of events that follows to `take` until none comes for [`DEBOUNCE`] (at most
/// [`MAX_SETTLE`]). The debouncer delays each event by `DEBOUNCE` but passes on the events of a
/// slow write (a stalled `cp`, a certificate and then its key) as they age, and one read must
/// cover them all: reading before the writer is done would report a half-written file, or a
/// certificate without its key, as a failed reload.
pub(crate) async fn until_quiet<T>(events: &mut UnboundedReceiver<T>, mut take: impl FnMut(T)) {
    let give_up = tokio::time::Instant::now() + MAX_SETTLE;
    while let Ok(Some(more)) = tokio::time::timeout(DEBOUNCE, events.recv()).await {
        take(more);
        if tokio::time::Instant::now() >= give_up {
            break;
        }
    }
}

/// The file watcher and the directories it watches now.
struct Watches {
    /// Dropping the debouncer stops the watcher thread.
    debouncer: Debouncer<notify::RecommendedWatcher, RecommendedCache>,
    plan: Plan,
}

impl Watches {
    /// A watcher with no watches yet; its events (the paths of changes) come out of the receiver.
    fn new() -> std::io::Result<(Watches, UnboundedReceiver<Vec<PathBuf>>)> {
        let (changed_tx, changed) = tokio::sync::mpsc::unbounded_channel();
        let debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
            match result {
                Ok(events) => {
                    let paths: Vec<PathBuf> = events
                        .into_iter()
                        .filter(|e| is_change(&e.event.kind))
                        .flat_map(|e| e.event.paths.clone())
                        .collect();
                    if !paths.is_empty() {
                        // The receiver is gone only when the Reloader is dropped.
                        let _ = changed_tx.send(paths);
                    }
                }
                Err(errors) => {
                    for error in errors {
                        tracing::warn!(%error, "rule file watcher error");
                    }
                }
            }
        })
        .map_err(std::io::Error::other)?;
        let watches = Watches {
            debouncer,
            plan: Plan::default(),
        };
        Ok((watches, changed))
    }

    /// Whether any of `paths` can change what the rule path names or holds. A watched directory
    /// among them is watched again at the next [`Watches::follow`] (see [`Plan::forget`]).
    fn notice(&mut self, paths: &[PathBuf]) -> bool {
        let mut relevant = false;
        for path in paths {
            relevant |= self.plan.covers(path);
            self.plan.forget(path);
        }
        relevant
    }

    /// Resolves `path` again and moves the watches to what it names now. Called before the
    /// files are read, so that a change after the read always has a watch to report it.
    ///
    /// A change between resolving the path and setting a watch on a directory has no watch to
    /// report it (a directory replaced by a symlink as the reloader starts: the new target was
    /// never watched and its edits were missed). So the path is resolved again once the watches
    /// are set, until it resolves as watched: any later change has a watch.
    fn follow(&mut self, path: &Path) {
        for _ in 0..MAX_FOLLOW_ROUNDS {
            let plan = follow::plan(path);
            if plan == self.plan {
                return;
            }
            self.move_to(plan);
            tracing::debug!(path = %path.display(), plan = ?self.plan, "watching the rule path");
        }
    }

    /// Unwatches the directories `plan` drops and watches those it adds.
    fn move_to(&mut self, plan: Plan) {
        let old: Vec<_> = self.plan.dirs().map(|(d, id)| (d.to_owned(), id)).collect();
        for (dir, identity) in &old {
            if !plan.dirs().any(|(d, id)| d == dir && id == *identity) {
                // Gone already when the directory was deleted: nothing to undo then.
                let _ = self.debouncer.unwatch(dir);
            }
        }
        for (dir, identity) in plan.dirs() {
            let kept = old.iter().any(|(d, id)| d == dir && *id == identity);
            if kept || identity.is_none() {
                continue;
            }
            if let Err(error) = self.debouncer.watch(dir, RecursiveMode::NonRecursive) {
                tracing::warn!(
                    dir = %dir.display(),
                    %error,
                    "cannot watch a directory on the rule path; changes there are seen by \
                     the periodic check only"
                );
            }
        }
        self.plan = plan;
    }
}

/// Everything but reads: opening a file (as our own reloads do) must not trigger a reload.
pub(crate) fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// What one read of the rule files found, to recognise the same failure again.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// Files with this checksum.
    Files(Checksum),
    /// Files that could not be read, with these errors.
    Unreadable(String),
}

struct Inner {
    path: PathBuf,
    live: LiveRules,
    hook: ReloadHook,
    /// What the latest attempt found, if it failed. The lock also serializes reloads, so an
    /// older read can never be swapped in after a newer one.
    failed: Mutex<Option<Found>>,
    status: SharedStatus,
}

type Sources = Result<Vec<(String, String)>, ConfigErrors>;

impl Inner {
    /// Reloads unless nothing is new: the files are what is live (and no failure is pending that
    /// this would clear), or they are what the last failed attempt found (already reported).
    async fn reload_if_changed(&self) -> Option<ReloadOutcome> {
        let mut failed = self.failed.lock().await;
        let sources = self.read().await;
        let found = found(&sources);
        let unchanged = match &*failed {
            Some(failure) => *failure == found,
            None => found == Found::Files(self.live.load().checksum()),
        };
        if unchanged {
            tracing::debug!(path = %self.path.display(), "rule files unchanged");
            return None;
        }
        Some(self.apply(sources, found, &mut failed).await)
    }

    async fn reload(&self) -> ReloadOutcome {
        let mut failed = self.failed.lock().await;
        let sources = self.read().await;
        let found = found(&sources);
        self.apply(sources, found, &mut failed).await
    }

    async fn read(&self) -> Sources {
        let path = self.path.clone();
        let rules_live = self.live.load().rule_count() > 0;
        tokio::task::spawn_blocking(move || read_sources(&path, rules_live))
            .await
            .unwrap_or_else(|e| Err(self.task_failed(e)))
    }

    /// Compiles `sources`; swaps them in if good; logs and calls the hook either way.
    async fn apply(
        &self,
        sources: Sources,
        found: Found,
        failed: &mut Option<Found>,
    ) -> ReloadOutcome {
        let result = match sources {
            Err(errors) => Err(errors),
            // The sources' text is dropped once compiled: the rule set keeps only its checksum.
            Ok(sources) => tokio::task::spawn_blocking(move || load_sources(&sources))
                .await
                .unwrap_or_else(|e| Err(self.task_failed(e))),
        };
        let on_disk = match found {
            Found::Files(checksum) => Some(checksum),
            Found::Unreadable(_) => None,
        };
        *failed = result.is_err().then_some(found);
        let outcome = self.swap(result);
        let mut status = ConfigStatus::clone(&self.status.load());
        status.on_disk = on_disk;
        match &outcome {
            ReloadOutcome::Loaded { .. } => {
                status.served = self.live.load().checksum();
                status.loaded_at = SystemTime::now();
                status.last_error = None;
            }
            ReloadOutcome::Failed(errors) => status.last_error = Some(errors.to_string().into()),
        }
        (self.hook)(&outcome, &status);
        self.status.store(Arc::new(status));
        outcome
    }

    fn swap(&self, result: Result<RuleSet, ConfigErrors>) -> ReloadOutcome {
        match result {
            Ok(rules) => {
                let count = rules.rule_count();
                self.live.store(Arc::new(rules));
                tracing::info!(path = %self.path.display(), rules = count, "rules reloaded");
                ReloadOutcome::Loaded { rules: count }
            }
            Err(errors) => {
                for error in &errors.0 {
                    tracing::warn!(
                        file = %error.file,
                        reason = %error.message,
                        "rule reload failed; keeping the previous rules"
                    );
                }
                ReloadOutcome::Failed(errors)
            }
        }
    }

    fn task_failed(&self, error: tokio::task::JoinError) -> ConfigErrors {
        ConfigErrors(vec![ConfigError {
            file: self.path.display().to_string(),
            message: format!("reload task failed: {error}"),
        }])
    }
}

fn found(sources: &Sources) -> Found {
    match sources {
        Ok(sources) => Found::Files(Checksum::of(sources)),
        Err(errors) => Found::Unreadable(errors.to_string()),
    }
}
