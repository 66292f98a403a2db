//! Where rules come from: rule files, or a control plane over xDS.
//!
//! Both sources end the same way: a validated [`RuleSet`](super::RuleSet) built by
//! [`load_sources`](super::load_sources) (one validation, the same error messages), swapped into
//! the [`LiveRules`](super::LiveRules) all or nothing, and reported to the same
//! [`ReloadHook`](super::reload::ReloadHook) with a [`ConfigStatus`](super::reload::ConfigStatus),
//! so the reload metrics and `/rlconfig` read the same for both. The limiter and the servers only
//! see the live rules and never learn which source filled them.
//!
//! - [`files`]: rule files, watched and reloaded (the default).
//! - [`xds`]: `RateLimitConfig` resources from a control plane, as envoyproxy/ratelimit receives
//!   them from Envoy Gateway.

pub use super::reload as files;
pub mod xds;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::signal::unix::Signal;

use super::LiveRules;
use super::reload::{ReloadHook, Reloader, SharedStatus};
use xds::{XdsError, XdsOptions, XdsSource};

/// The running source of the rules; dropping it stops the watching or the xDS client.
pub enum RuleSource {
    Files(Reloader),
    Xds(XdsSource),
}

/// Why a rule source did not start.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot start the xDS client: {0}")]
    Xds(#[from] XdsError),
    #[error("cannot watch {path}: {source}")]
    Watch {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl RuleSource {
    /// Starts the xDS client when `xds` is given, else watches `path` (and reloads on `hangup`).
    /// Must be called inside a Tokio runtime.
    pub fn spawn(
        xds: Option<XdsOptions>,
        path: PathBuf,
        live: LiveRules,
        hook: ReloadHook,
        hangup: Signal,
    ) -> Result<RuleSource, SourceError> {
        Ok(match xds {
            Some(options) => RuleSource::Xds(XdsSource::spawn(options, live, hook)?),
            None => match Reloader::spawn(path.clone(), live, hook, hangup) {
                Ok(reloader) => RuleSource::Files(reloader),
                Err(source) => return Err(SourceError::Watch { path, source }),
            },
        })
    }

    /// Which rules are served, from which files or resources, and since when.
    pub fn status(&self) -> SharedStatus {
        match self {
            RuleSource::Files(reloader) => reloader.status(),
            RuleSource::Xds(xds) => xds.status(),
        }
    }

    /// For a control plane, true once its first rules are in (health waits for it); rule files
    /// are loaded before serving starts, so `None`.
    pub fn ready(&self) -> Option<Arc<AtomicBool>> {
        match self {
            RuleSource::Files(_) => None,
            RuleSource::Xds(xds) => Some(xds.ready()),
        }
    }
}
