//! Replacing the TLS material without a restart, when its files change.
//!
//! cert-manager, SPIFFE agents and Kubernetes Secret volumes replace certificates every few
//! hours, by renaming a new file over the old one or, in a Secret volume, by swapping the
//! `..data` symlink that the file names point through. Both show up as events in the directory
//! that holds the file name, so that directory is watched (not the file, whose inode a rename
//! replaces), with the rule watcher's debounce: the files are read once they have been quiet
//! for it, so a copy, or a certificate written just before its key, is read once complete. A
//! periodic check covers file systems that send no events.
//!
//! A change is applied only when the files' bytes differ from what is live and from the last
//! failed attempt (one broken file is reported once, however many events follow). A replacement
//! that does not build (unparseable, a key not matching the certificate, an expired
//! certificate, a client CA bundle without a CA) keeps the previous material serving, is logged
//! with the reason and counted in `slidegate_tls_reloads_total{result="failure"}`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_full::{DebounceEventResult, new_debouncer};
use tokio::task::JoinHandle;

use super::Tls;
use super::material::{self, Contents, TlsFiles};
use crate::config::reload::{DEBOUNCE, is_change, until_quiet};
use crate::server::metrics::ServerMetrics;

/// How often the files are read even without an event (network file systems send none).
pub const VERIFY_INTERVAL: Duration = Duration::from_secs(30);

/// Watches the TLS files and replaces the live material on every good change. Stops when
/// dropped.
pub struct Rotation {
    task: JoinHandle<()>,
}

impl Drop for Rotation {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why TLS could not start: the first material or the watching of its files.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot load TLS material: {0}")]
    Load(#[from] material::TlsError),
    #[error("cannot watch the TLS files: {0}")]
    Watch(#[from] std::io::Error),
}

impl Rotation {
    /// Loads the material from `files` and watches them: the live material, and its rotation
    /// (which stops when dropped). Must be called inside a Tokio runtime.
    pub fn start(
        files: TlsFiles,
        metrics: Arc<ServerMetrics>,
    ) -> Result<(Arc<Tls>, Rotation), StartError> {
        let tls = Tls::load(&files, Arc::clone(&metrics))?;
        let rotation = Rotation::spawn(files, Arc::clone(&tls), metrics)?;
        Ok((tls, rotation))
    }

    /// Starts watching `files`, which `tls` was loaded from. Must be called inside a Tokio
    /// runtime.
    pub fn spawn(
        files: TlsFiles,
        tls: Arc<Tls>,
        metrics: Arc<ServerMetrics>,
    ) -> std::io::Result<Self> {
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel();
        let mut debouncer = new_debouncer(DEBOUNCE, None, move |result: DebounceEventResult| {
            if let Ok(events) = result
                && events.iter().any(|e| is_change(&e.event.kind))
            {
                let _ = changed_tx.send(());
            }
        })
        .map_err(std::io::Error::other)?;
        let dirs: HashSet<PathBuf> = files
            .paths()
            .filter_map(|path| std::path::absolute(path).ok()?.parent().map(PathBuf::from))
            .collect();
        for dir in &dirs {
            debouncer
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(std::io::Error::other)?;
        }
        let mut state = State {
            seen: material::read(&files).ok(),
            files,
            tls,
            metrics,
        };
        let task = tokio::spawn(async move {
            // Dropping the debouncer (when this task is aborted) stops its thread.
            let _debouncer = debouncer;
            let mut verify = tokio::time::interval(VERIFY_INTERVAL);
            verify.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            verify.reset();
            loop {
                tokio::select! {
                    Some(()) = changed.recv() => until_quiet(&mut changed, |()| {}).await,
                    _ = verify.tick() => {}
                }
                state.check();
            }
        });
        Ok(Rotation { task })
    }
}

/// What the watcher compares new files against.
struct State {
    files: TlsFiles,
    tls: Arc<Tls>,
    metrics: Arc<ServerMetrics>,
    /// The files' bytes as last read, live or failed: the same bytes are not tried twice.
    seen: Option<Contents>,
}

impl State {
    /// Reads the files; when they changed, builds and swaps in the new material or keeps the
    /// old and reports why.
    fn check(&mut self) {
        let contents = match material::read(&self.files) {
            Ok(contents) => contents,
            Err(error) => {
                // Removed, or mid-swap: reported once, until the files can be read again.
                if self.seen.take().is_some() {
                    self.failed(&error);
                }
                return;
            }
        };
        if self.seen.as_ref() == Some(&contents) {
            return;
        }
        let built = material::build(&self.files, &contents);
        self.seen = Some(contents);
        match built {
            Ok(material) => {
                self.tls.replace(material);
                self.metrics.tls_reload(true);
                tracing::info!(
                    cert = %self.files.cert.display(),
                    "TLS material replaced; new connections get it"
                );
            }
            Err(error) => self.failed(&error),
        }
    }

    fn failed(&self, error: &material::TlsError) {
        self.metrics.tls_reload(false);
        tracing::warn!(
            %error,
            "the new TLS material is not usable; the previous material keeps serving"
        );
    }
}
