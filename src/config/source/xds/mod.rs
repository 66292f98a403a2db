//! Rules from a control plane over xDS, as envoyproxy/ratelimit gets them with
//! `CONFIG_TYPE=GRPC_XDS_SOTW` (Envoy Gateway's way of configuring its rate-limit service).
//!
//! slidegate opens the Aggregated Discovery Service stream, state of the world, for one resource
//! type, [`RESOURCE_TYPE`] (`RateLimitConfig`, one domain each). Every response carries the whole
//! rule set: a domain missing from it is removed. A response is applied all or nothing, as a reload
//! of rule files is: one bad resource refuses the response (a NACK carrying the errors), and the
//! rules in force stay. A good one is swapped in and acknowledged with its version and nonce.
//!
//! The stream is reopened after any failure, with exponential backoff from
//! `--xds-connect-retry-interval`; the last good rules are served meanwhile, and the version they
//! came from is sent on the new stream, so a control plane with nothing new need not resend.
//!
//! Until the first response is applied the rule set is empty and health reports NOT_SERVING, unless
//! the operator asked to start without it (`--force-start-without-initial-config`, which Envoy
//! Gateway sets): requests are then answered as if no rule matched (allowed).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio::task::JoinHandle;

use super::super::reload::{ConfigStatus, ReloadHook, SharedStatus};
use super::super::{Checksum, LiveRules, RuleSet};

pub mod bound;
mod connect;
pub mod resource;
mod stream;

pub use connect::{XdsTls, parse_metadata_pair};
pub use resource::{RESOURCE_TYPE, proto};

/// Where the control plane is and who slidegate is to it.
#[derive(Clone, Debug)]
pub struct XdsOptions {
    /// `host:port`, `http://host:port` or `https://host:port`.
    pub server: String,
    /// The node id; the control plane serves rules by it.
    pub node_id: String,
    /// Node metadata, as string values.
    pub node_metadata: Vec<(String, String)>,
    /// The first wait before reconnecting; it doubles after each failed attempt up to
    /// [`MAX_RETRY_INTERVAL`] (or this, if longer).
    pub retry_interval: Duration,
    pub tls: XdsTls,
    /// Report ready before the first rules arrive.
    pub force_start: bool,
}

/// The longest wait between two connection attempts: long enough not to hammer a control plane
/// that is down, short enough that rules flow soon after it is back.
pub const MAX_RETRY_INTERVAL: Duration = Duration::from_secs(60);

/// The largest response accepted. The whole rule set comes in one message; rule files are each
/// limited to 8 MiB, and a response this large is far beyond any real set of domains.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// A setting of the xDS source that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("invalid --xds-server {0}")]
    Server(String),
    #[error("xDS TLS: {0}")]
    Tls(String),
}

/// The running xDS client. Stops when dropped.
pub struct XdsSource {
    task: JoinHandle<()>,
    status: SharedStatus,
    ready: Arc<AtomicBool>,
}

impl XdsSource {
    /// Checks the settings and starts the client, which swaps `live` on every good response and
    /// calls `hook` after every applied or refused one. Must be called inside a Tokio runtime.
    pub fn spawn(
        options: XdsOptions,
        live: LiveRules,
        hook: ReloadHook,
    ) -> Result<XdsSource, XdsError> {
        let endpoint = connect::endpoint(&options)?;
        let status = Arc::new(ArcSwap::from_pointee(ConfigStatus {
            served: live.load().checksum(),
            on_disk: Some(live.load().checksum()),
            loaded_at: SystemTime::now(),
            last_error: None,
        }));
        let ready = Arc::new(AtomicBool::new(options.force_start));
        let applier = stream::Applier::new(live, hook, Arc::clone(&status), Arc::clone(&ready));
        let task = tokio::spawn(stream::run(options, endpoint, applier));
        Ok(XdsSource {
            task,
            status,
            ready,
        })
    }

    /// The checksums of the rules served and last received (`on_disk`: `None` after a refused
    /// response), and when the served ones were applied; for `/rlconfig` and the metrics.
    pub fn status(&self) -> SharedStatus {
        Arc::clone(&self.status)
    }

    /// True once the first response has been applied (or from the start, when forced): the rule
    /// set is then the control plane's, even when it is empty.
    pub fn ready(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.ready)
    }
}

impl Drop for XdsSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RuleSet {
    /// No domains: what slidegate serves before a control plane has sent rules.
    pub fn empty() -> RuleSet {
        RuleSet::new(Default::default(), Vec::new(), Checksum::default())
    }
}
