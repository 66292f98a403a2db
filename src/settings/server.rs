//! The serving threads and what every connection is allowed.

use std::time::Duration;

use super::spelled;
use crate::server::limits::{ServerLimits, default_max_connections};

#[derive(clap::Args, Debug, Clone)]
pub struct ServerSettings {
    /// Threads that serve calls, each with a single-threaded runtime; connections are dealt out
    /// to them in turn [default: one per CPU core].
    #[arg(long, env = "SLIDEGATE_WORKERS", default_value_t = default_workers(), hide_default_value = true, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// How long to let in-flight calls finish after SIGTERM/SIGINT, e.g. `5s`.
    #[arg(long, env = "SLIDEGATE_DRAIN_TIMEOUT", default_value = spelled!(ServerLimits::DEFAULT_DRAIN_TIMEOUT), value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// Most open connections, gRPC and HTTP ports together (the operator listener counts apart);
    /// more are closed as they are accepted and counted in `slidegate_connections_refused_total`
    /// [default: the soft file-descriptor limit (`ulimit -n`) less 128: 64 for the store and the
    /// rules, 64 for the operator listener].
    #[arg(long, env = "SLIDEGATE_MAX_CONNECTIONS", default_value_t = default_max_connections(), hide_default_value = true, value_parser = clap::value_parser!(usize))]
    pub max_connections: usize,
    /// Most open connections from one client IP address, both ports together.
    #[arg(
        long,
        env = "SLIDEGATE_MAX_CONNECTIONS_PER_PEER",
        default_value_t = ServerLimits::DEFAULT_MAX_CONNECTIONS_PER_PEER
    )]
    pub max_connections_per_peer: usize,
    /// Most open connections on the operator listener (--admin-addr), from all peers and from
    /// one; counted apart from --max-connections, so that clients of the data ports at their cap
    /// cannot keep operators or Prometheus out.
    #[arg(long, env = "SLIDEGATE_ADMIN_MAX_CONNECTIONS", default_value_t = ServerLimits::DEFAULT_ADMIN_MAX_CONNECTIONS)]
    pub admin_max_connections: usize,
    /// Time a new connection has to start, counted from accept (a TLS handshake included):
    /// gRPC, the HTTP/2 preface; HTTP, the first byte, then each request's headers (which also
    /// closes an HTTP/1.1 connection idle that long between requests).
    #[arg(long, env = "SLIDEGATE_HANDSHAKE_TIMEOUT", default_value = spelled!(ServerLimits::DEFAULT_HANDSHAKE_TIMEOUT), value_parser = humantime::parse_duration)]
    pub handshake_timeout: Duration,
    /// A connection without calls or requests in flight for this long is closed (GOAWAY on
    /// HTTP/2), on every port; `0s` never.
    #[arg(long, env = "SLIDEGATE_IDLE_TIMEOUT", default_value = spelled!(ServerLimits::DEFAULT_IDLE_TIMEOUT), value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// A gRPC connection this old (±10 %, per connection) gets a GOAWAY and closes once its
    /// calls end, so that Envoys reconnect and spread over the replicas that started since,
    /// e.g. `30m`; `0s` never.
    #[arg(long, env = "SLIDEGATE_GRPC_MAX_CONNECTION_AGE", default_value = "0s", value_parser = humantime::parse_duration)]
    pub grpc_max_connection_age: Duration,
    /// How long the calls of a connection aged out by --grpc-max-connection-age may go on after
    /// its GOAWAY; then it is closed.
    #[arg(long, env = "SLIDEGATE_GRPC_MAX_CONNECTION_AGE_GRACE", default_value = spelled!(ServerLimits::DEFAULT_GRPC_MAX_CONNECTION_AGE_GRACE), value_parser = humantime::parse_duration)]
    pub grpc_max_connection_age_grace: Duration,
    /// Time for a request's body to arrive: a gRPC call's message (else DEADLINE_EXCEEDED), an
    /// HTTP request as a whole (else 408).
    #[arg(long, env = "SLIDEGATE_BODY_TIMEOUT", default_value = spelled!(ServerLimits::DEFAULT_BODY_TIMEOUT), value_parser = humantime::parse_duration)]
    pub body_timeout: Duration,
    /// HTTP/2 keepalive: a PING this often on every connection; one not answered by the next is
    /// closed. `0s` turns it off.
    #[arg(long, env = "SLIDEGATE_KEEPALIVE_INTERVAL", default_value = spelled!(ServerLimits::DEFAULT_KEEPALIVE_INTERVAL), value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,
    /// Bytes of incomplete gRPC messages held, all connections together (each connection holds
    /// at most one largest message, 4 MiB); a call over it waits for room, then for the body
    /// timeout.
    #[arg(long, env = "SLIDEGATE_MAX_BUFFERED_BYTES", default_value_t = ServerLimits::DEFAULT_MAX_BUFFERED_BYTES)]
    pub max_buffered_bytes: usize,
    /// Bytes of HTTP requests held, all connections of the HTTP port together: each request
    /// reserves its Content-Length (or --max-body-bytes without one) and its headers until it is
    /// answered; one that does not fit is answered 503 with Retry-After at once.
    #[arg(long, env = "SLIDEGATE_HTTP_MAX_BUFFERED_BYTES", default_value_t = ServerLimits::DEFAULT_HTTP_MAX_BUFFERED_BYTES)]
    pub http_max_buffered_bytes: usize,
}

impl ServerSettings {
    /// The bounds every connection gets.
    pub fn limits(&self) -> ServerLimits {
        ServerLimits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            admin_max_connections: self.admin_max_connections,
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
            grpc_max_connection_age: self.grpc_max_connection_age,
            grpc_max_connection_age_grace: self.grpc_max_connection_age_grace,
            body_timeout: self.body_timeout,
            keepalive_interval: self.keepalive_interval,
            max_buffered_bytes: self.max_buffered_bytes,
            http_max_buffered_bytes: self.http_max_buffered_bytes,
            http_max_body_bytes: ServerLimits::DEFAULT_HTTP_MAX_BODY_BYTES,
            drain_timeout: self.drain_timeout,
        }
    }
}

/// One worker per core the process may use.
fn default_workers() -> u16 {
    std::thread::available_parallelism().map_or(1, |n| u16::try_from(n.get()).unwrap_or(u16::MAX))
}
