//! Who called: the peer of the connection a request came on (`10.0.0.7:51234`, or `unix socket,
//! pid 812`), for the lines that say what a request did (the decision log, a cleared counter).
//!
//! The server names the caller once per connection, and only where a line may use it: the
//! operator listener always, the data ports when `--log-decisions` is on. Each request then holds
//! a reference to the one name, never a copy of it.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// The caller of a request; see the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(Arc<str>);

impl Caller {
    pub fn new(peer: impl fmt::Display) -> Caller {
        Caller(peer.to_string().into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who a connection is from, as the per-peer bounds count it: the IP address, or over a Unix
/// socket the process (each local proxy is a peer of its own, like a proxy on another host). The
/// gRPC port hands it to the services it serves through tonic as a request extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    Ip(IpAddr),
    Process(Option<i32>),
}
