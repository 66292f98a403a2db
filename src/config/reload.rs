//! Reloading rules on file changes (debounced) and on SIGHUP, all or nothing.
//!
//! The watcher watches the rule directory, or the parent directory of a single rule file, rather
//! than the files themselves: editors and deploy tools often replace a file by renaming a new one
//! over it, and Kubernetes swaps a symlinked directory. A watch on the old file would miss both.
//! Events are debounced so that a copy (truncate, then write) is read once it is complete.
//!
//! Any change in the watched directory leads to reading the rule files again; they are only
//! compiled and swapped in when their contents differ from the live rules' files (and from the
//! last failed attempt, which was already reported). That keeps swap files and unrelated files in
//! a watched parent directory from causing reloads, and lets a watcher follow a Kubernetes
//! ConfigMap, whose update only renames a hidden directory. SIGHUP and [`Reloader::reload_now`]
//! always reload.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::load::read_sources;
use super::{ConfigError, ConfigErrors, LiveRules, RuleSet, load_sources};

/// How long the files must be quiet before a reload: long enough for an editor's
/// truncate-then-write, short enough to feel immediate.
const DEBOUNCE: Duration = Duration::from_millis(250);

/// The result of one reload attempt.
#[derive(Debug, Clone)]
pub enum ReloadOutcome {
    /// The new rules are live.
    Loaded { rules: usize },
    /// The previous rules stay live.
    Failed(ConfigErrors),
}

/// Called after every reload attempt (metrics, logs). A file event that leaves the rule files'
/// contents unchanged is not an attempt.
pub type ReloadHook = Arc<dyn Fn(&ReloadOutcome) + Send + Sync>;

/// Watches `path` (file or directory) and swaps `live` on every good change and on SIGHUP.
/// Stops when dropped.
pub struct Reloader {
    inner: Arc<Inner>,
    /// Dropping the debouncer stops the watcher thread.
    _debouncer: Debouncer<notify::RecommendedWatcher, RecommendedCache>,
    task: JoinHandle<()>,
}

impl Reloader {
    /// Starts watching. Must be called inside a Tokio runtime.
    pub fn spawn(path: PathBuf, live: LiveRules, hook: ReloadHook) -> std::io::Result<Reloader> {
        let inner = Arc::new(Inner {
            path,
            live,
            hook,
            failed: Mutex::new(None),
        });
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
            match result {
                Ok(events) => {
                    if events.iter().any(|e| is_change(&e.event.kind)) {
                        // The receiver is gone only when the Reloader is dropped.
                        let _ = changed_tx.send(());
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
        debouncer
            .watch(watch_dir(&inner.path), RecursiveMode::NonRecursive)
            .map_err(std::io::Error::other)?;
        let mut hangup = signal(SignalKind::hangup())?;

        let worker = inner.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    Some(()) = changed.recv() => {
                        // Several debounced batches may have queued up: one reload covers them.
                        while changed.try_recv().is_ok() {}
                        worker.reload_if_changed().await;
                    }
                    Some(()) = hangup.recv() => {
                        tracing::info!(path = %worker.path.display(), "SIGHUP: reloading rules");
                        worker.reload().await;
                    }
                    else => break,
                }
            }
        });
        Ok(Reloader {
            inner,
            _debouncer: debouncer,
            task,
        })
    }

    /// Reloads now, whether or not the files changed, as SIGHUP does. The hook is called too.
    pub async fn reload_now(&self) -> ReloadOutcome {
        self.inner.reload().await
    }

    /// The watched rule path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The directory to watch: the path itself, or a file's parent.
fn watch_dir(path: &Path) -> &Path {
    if path.is_dir() {
        return path;
    }
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Everything but reads: opening a file (as our own reloads do) must not trigger a reload.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

struct Inner {
    path: PathBuf,
    live: LiveRules,
    hook: ReloadHook,
    /// The sources of the last failed attempt, if the latest attempt failed. The lock also
    /// serializes reloads, so an older read can never be swapped in after a newer one.
    failed: Mutex<Option<Vec<(String, String)>>>,
}

type Sources = Result<Vec<(String, String)>, ConfigErrors>;

impl Inner {
    /// Reloads unless nothing is new: the files are what is live (and no failure is pending that
    /// this would clear), or they are the same broken files as last time (already reported).
    async fn reload_if_changed(&self) -> Option<ReloadOutcome> {
        let mut failed = self.failed.lock().await;
        let sources = self.read().await;
        if let Ok(sources) = &sources {
            let live = failed.is_none() && self.live.load().built_from(sources);
            let same_failure = failed.as_ref() == Some(sources);
            if live || same_failure {
                tracing::debug!(path = %self.path.display(), "rule files unchanged");
                return None;
            }
        }
        Some(self.apply(sources, &mut failed).await)
    }

    async fn reload(&self) -> ReloadOutcome {
        let mut failed = self.failed.lock().await;
        let sources = self.read().await;
        self.apply(sources, &mut failed).await
    }

    async fn read(&self) -> Sources {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || read_sources(&path))
            .await
            .unwrap_or_else(|e| Err(self.task_failed(e)))
    }

    /// Compiles `sources`; swaps them in if good; logs and calls the hook either way.
    async fn apply(
        &self,
        sources: Sources,
        failed: &mut Option<Vec<(String, String)>>,
    ) -> ReloadOutcome {
        let result = match sources {
            Err(errors) => {
                *failed = None;
                Err(errors)
            }
            Ok(sources) => {
                let compiled = tokio::task::spawn_blocking(move || {
                    let result = load_sources(&sources);
                    (sources, result)
                })
                .await;
                match compiled {
                    Ok((_, Ok(rules))) => {
                        *failed = None;
                        Ok(rules)
                    }
                    Ok((sources, Err(errors))) => {
                        *failed = Some(sources);
                        Err(errors)
                    }
                    Err(e) => Err(self.task_failed(e)),
                }
            }
        };
        let outcome = self.swap(result);
        (self.hook)(&outcome);
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
