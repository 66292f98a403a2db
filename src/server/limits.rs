//! What one client may hold of the server: connections (in total and per peer address), the time
//! a connection may take to start, to stay idle or to send a request, and the request bytes the
//! gRPC port buffers.
//!
//! Why here, before any protocol: every request of the proxy in front depends on this service,
//! so a single client that opens connections and never uses them, or sends half a request and
//! waits, must run into a bound of its own long before the process runs out of file descriptors
//! or memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::metrics::ServerMetrics;
use super::socket::PeerKey;

/// File descriptors kept for everything that is not a client connection (Redis connections, the
/// rule watcher, the log, the listeners) when the connection cap follows the descriptor limit.
pub const RESERVED_FDS: u64 = 64;

/// The connection cap when the descriptor limit cannot be read.
const FALLBACK_MAX_CONNECTIONS: usize = 10_000;

/// The bounds every connection gets, on both ports.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// Open connections on both ports together.
    pub max_connections: usize,
    /// Open connections on the operator listener, counted apart from the data ports (and
    /// per peer against this cap alone), so that clients of the data ports at their cap cannot
    /// keep operators or Prometheus out.
    pub admin_max_connections: usize,
    /// Open connections from one peer IP address, on both ports together.
    pub max_connections_per_peer: usize,
    /// gRPC: time to the HTTP/2 preface. HTTP: time to a request's complete headers (hyper's
    /// header-read timeout, which also closes an HTTP/1.1 connection idle that long between
    /// requests).
    pub handshake_timeout: Duration,
    /// gRPC: a connection with no call in flight for this long is closed (GOAWAY). Zero: never.
    pub idle_timeout: Duration,
    /// gRPC: a connection this old gets a GOAWAY and closes once its calls end (±10 %, per
    /// connection). Zero: never.
    pub grpc_max_connection_age: Duration,
    /// gRPC: how long an aged connection's calls may go on after its GOAWAY.
    pub grpc_max_connection_age_grace: Duration,
    /// Time for a request's body to arrive (gRPC: the call's message; HTTP: the whole request).
    pub body_timeout: Duration,
    /// HTTP/2 PING interval on idle and busy connections alike; a connection that has not
    /// answered by the next one is closed. Zero: no keepalive.
    pub keepalive_interval: Duration,
    /// Request bytes the gRPC port holds, all connections together, beyond what flow control
    /// lets a client send unasked.
    pub max_buffered_bytes: usize,
    /// Request bytes the HTTP port holds, all connections together (see `http_budget`).
    pub http_max_buffered_bytes: usize,
    /// What an HTTP request without a declared length reserves of that budget: the largest body
    /// the HTTP port reads (`--max-body-bytes`).
    pub http_max_body_bytes: usize,
    /// After SIGTERM, how long calls in flight may take; at the end, those still open are
    /// answered UNAVAILABLE.
    pub drain_timeout: Duration,
}

impl ServerLimits {
    pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 1024;
    pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    pub const DEFAULT_GRPC_MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(60);
    pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
    pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
    pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 64 << 20;
    pub const DEFAULT_HTTP_MAX_BUFFERED_BYTES: usize = 16 << 20;
    pub const DEFAULT_HTTP_MAX_BODY_BYTES: usize = 64 << 10;
    pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: default_max_connections(),
            max_connections_per_peer: Self::DEFAULT_MAX_CONNECTIONS_PER_PEER,
            admin_max_connections: Self::DEFAULT_ADMIN_MAX_CONNECTIONS,
            handshake_timeout: Self::DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            grpc_max_connection_age: Duration::ZERO,
            grpc_max_connection_age_grace: Self::DEFAULT_GRPC_MAX_CONNECTION_AGE_GRACE,
            body_timeout: Self::DEFAULT_BODY_TIMEOUT,
            keepalive_interval: Self::DEFAULT_KEEPALIVE_INTERVAL,
            max_buffered_bytes: Self::DEFAULT_MAX_BUFFERED_BYTES,
            http_max_buffered_bytes: Self::DEFAULT_HTTP_MAX_BUFFERED_BYTES,
            http_max_body_bytes: Self::DEFAULT_HTTP_MAX_BODY_BYTES,
            drain_timeout: Self::DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// The soft `RLIMIT_NOFILE` of this process less [`RESERVED_FDS`] and the operator listener's
/// default allowance (which counts apart): a connection cap that keeps descriptors for the store,
/// the rules and the operators however many clients connect.
pub fn default_max_connections() -> usize {
    let kept = RESERVED_FDS + ServerLimits::DEFAULT_ADMIN_MAX_CONNECTIONS as u64;
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| soft_open_files(&limits))
        .map_or(FALLBACK_MAX_CONNECTIONS, |soft| {
            usize::try_from(soft.saturating_sub(kept).max(1)).unwrap_or(FALLBACK_MAX_CONNECTIONS)
        })
}

/// The soft limit of the `Max open files` line of `/proc/PID/limits` (`unlimited` is none).
fn soft_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Why a connection was refused, as the metric's `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    MaxConnections,
    MaxConnectionsPerPeer,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::MaxConnectionsPerPeer => "max_connections_per_peer",
        }
    }
}

/// Counts open connections, in total and per peer address, and admits new ones under the caps.
#[derive(Debug)]
pub struct Admission {
    max_total: usize,
    max_per_peer: usize,
    open: Mutex<Open>,
    metrics: Arc<ServerMetrics>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_peer: HashMap<PeerKey, usize>,
}

impl Admission {
    pub fn new(limits: &ServerLimits, metrics: Arc<ServerMetrics>) -> Arc<Admission> {
        Admission::with_caps(
            limits.max_connections,
            limits.max_connections_per_peer,
            metrics,
        )
    }

    /// The operator listener's own allowance ([`ServerLimits::admin_max_connections`]).
    pub fn for_operators(limits: &ServerLimits, metrics: Arc<ServerMetrics>) -> Arc<Admission> {
        let cap = limits.admin_max_connections;
        Admission::with_caps(cap, cap, metrics)
    }

    fn with_caps(max_total: usize, max_per_peer: usize, metrics: Arc<ServerMetrics>) -> Arc<Self> {
        Arc::new(Admission {
            max_total,
            max_per_peer,
            open: Mutex::new(Open::default()),
            metrics,
        })
    }

    /// A ticket for one more connection from `peer`, held for the connection's life; or why
    /// not (counted in `slidegate_connections_refused_total` under `listener`).
    pub fn admit(self: &Arc<Self>, peer: PeerKey, listener: &str) -> Result<Ticket, Refusal> {
        let refused = {
            let mut open = self.open.lock();
            let from_peer = open.per_peer.get(&peer).copied().unwrap_or(0);
            if open.total >= self.max_total {
                Some(Refusal::MaxConnections)
            } else if from_peer >= self.max_per_peer {
                Some(Refusal::MaxConnectionsPerPeer)
            } else {
                open.total += 1;
                open.per_peer.insert(peer, from_peer + 1);
                None
            }
        };
        match refused {
            Some(refusal) => {
                self.metrics.connection_refused(listener, refusal.as_str());
                Err(refusal)
            }
            None => Ok(Ticket {
                admission: Arc::clone(self),
                peer,
            }),
        }
    }

    fn release(&self, peer: PeerKey) {
        let mut open = self.open.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(count) = open.per_peer.get_mut(&peer) {
            *count -= 1;
            if *count == 0 {
                open.per_peer.remove(&peer);
            }
        }
    }
}

/// One admitted connection; dropping it (when the connection ends) frees its place.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    peer: PeerKey,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.release(self.peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_descriptor_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(soft_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files(unlimited), None);
    }

    #[test]
    fn caps_hold_in_total_and_per_peer_and_places_come_back() {
        let limits = ServerLimits {
            max_connections: 3,
            max_connections_per_peer: 2,
            admin_max_connections: 1,
            ..ServerLimits::default()
        };
        let admission = Admission::new(&limits, Arc::new(ServerMetrics::default()));
        let a = PeerKey::Ip([10, 0, 0, 1].into());
        let b = PeerKey::Process(Some(42));
        let first = admission.admit(a, "grpc").expect("first");
        let _second = admission.admit(a, "grpc").expect("second");
        assert_eq!(
            admission.admit(a, "grpc").err(),
            Some(Refusal::MaxConnectionsPerPeer)
        );
        let _third = admission.admit(b, "http").expect("another peer");
        assert_eq!(
            admission.admit(b, "http").err(),
            Some(Refusal::MaxConnections)
        );
        drop(first);
        assert!(admission.admit(a, "grpc").is_ok());
    }
}
