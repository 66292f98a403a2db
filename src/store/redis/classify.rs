//! What a failed Redis call was: the client's error mapped to a [`StoreError`] kind, which health,
//! the metrics and the log go by (an outage passes by itself; a script the server cannot run, or
//! credentials it refuses, do not).

use ::redis::RedisError;

use super::Shared;
use crate::store::StoreError;

impl Shared {
    /// Maps a client error to a [`StoreError`] whose text holds no password.
    pub(super) fn error(&self, e: RedisError) -> StoreError {
        let text = self.redactor.clean(&e.to_string());
        if e.is_timeout() {
            StoreError::Timeout(self.timeout)
        } else if e.code() == Some("OOM") || text.contains("OOM command not allowed") {
            // Redis 6.x reports a refusal inside the script as a script error (`ERR Error running
            // script ...: -OOM command not allowed ...`); it comes before the script's first
            // write, so nothing was recorded, as with Redis 7's refusal before the script runs.
            StoreError::OutOfMemory(format!("{}: {text}", self.endpoint))
        } else if refused_credentials(&e, &text) {
            StoreError::Auth(format!("{}: {text}", self.endpoint))
        } else if e.is_connection_refusal() || text.contains("Connection refused") {
            // The cluster client reports a failed first connection as text ("Failed to create
            // initial connections"), the refusal only in its message.
            StoreError::Refused(format!("{}: {text}", self.endpoint))
        } else if unresolved(&text) {
            StoreError::Dns(format!("{}: {text}", self.endpoint))
        } else if connection_lost(&e) {
            StoreError::Connection(format!("{}: {text}", self.endpoint))
        } else if !self.cluster && cluster_node(&e) {
            StoreError::Incompatible(format!(
                "{}: {text}: this is a node of a Redis Cluster, whose slots a standalone \
                 connection cannot follow: name the cluster's nodes with --redis-cluster",
                self.endpoint
            ))
        } else if self.cluster && text.contains("cluster support disabled") {
            StoreError::Incompatible(format!(
                "{}: {text}: this Redis is not a node of a Redis Cluster: name a standalone \
                 server with --redis-url",
                self.endpoint
            ))
        } else if cannot_run_script(&e) {
            StoreError::Incompatible(format!("{}: {text}", self.endpoint))
        } else {
            StoreError::Backend(format!("{}: {text}", self.endpoint))
        }
    }
}

/// Whether `e` is an answer that says the server cannot run the script, and will not until it is
/// changed: `EVALSHA` or `SCRIPT` forbidden by an ACL (`NOPERM`) or renamed away (unknown
/// command), the script still unknown after loading it, or a Lua error compiling or running it
/// (`Error compiling script`, `Error running script` on 6.x, `user_script:` on 7.x).
fn cannot_run_script(e: &RedisError) -> bool {
    if matches!(e.code(), Some("NOPERM" | "NOSCRIPT")) {
        return true;
    }
    let text = e.to_string();
    [
        "unknown command",
        "Error compiling script",
        "Error running script",
        "user_script:",
        "shebang",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Whether `e` is an answer only a Redis Cluster node gives: a key of another node's slot
/// (`MOVED`, `ASK`), keys of several slots in one call (`CROSSSLOT`: a standalone call names the
/// node's clock beside its counters), or the cluster's own state (`CLUSTERDOWN`, `TRYAGAIN`).
/// On a standalone or Sentinel connection it means the URL names a cluster node, and no call
/// will be decided until the store is configured as a cluster.
fn cluster_node(e: &RedisError) -> bool {
    use ::redis::{ErrorKind, ServerErrorKind};
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::CrossSlot
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
        )
    )
}

/// Whether `e` is Redis refusing the credentials: a wrong password or user (`WRONGPASS`, or an
/// authentication failure while connecting), or none where one is needed (`NOAUTH`; over RESP2,
/// Redis answers a command sent without one with a protocol error about an unauthenticated
/// request), or a password file that cannot be read.
fn refused_credentials(e: &RedisError, text: &str) -> bool {
    e.kind() == ::redis::ErrorKind::AuthenticationFailed
        // The same, as text inside the cluster client's error about its first connections.
        || text.contains("AuthenticationFailed")
        || text.contains(super::password::UNREADABLE)
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        || text.contains("NOAUTH")
        || text.contains("WRONGPASS")
        || text.contains("unauthenticated")
}

/// Whether the text is a host name that did not resolve (`getaddrinfo` failing, or resolving to
/// no address).
fn unresolved(text: &str) -> bool {
    text.contains("failed to lookup address") || text.contains("No address found for host")
}

/// Whether `e` means the connection could not be made or is gone (rather than an answer).
pub(super) fn connection_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
}
