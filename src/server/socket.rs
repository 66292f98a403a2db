//! Where a listener listens: a TCP address or a Unix domain socket (`unix:/path`).
//!
//! A Unix socket lets a proxy on the same host (Envoy's `pipe` address, nginx's `unix:`) reach
//! slidegate without a port, guarded by the file's permissions. The socket file is slidegate's
//! own: one left behind by a crashed run is replaced, anything else at that path (a regular
//! file, a socket another process still listens on) is refused, and the file is removed when
//! the listener closes.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

pub use crate::service::PeerKey;

/// A listener's address: `HOST:PORT` or `unix:/path/to/socket`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

/// Why an address does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is neither HOST:PORT (an IP address) nor unix:/path")]
pub struct BadAddress(String);

impl FromStr for Address {
    type Err = BadAddress;

    fn from_str(text: &str) -> Result<Address, BadAddress> {
        match text.strip_prefix("unix:") {
            Some(path) if !path.is_empty() => Ok(Address::Unix(PathBuf::from(path))),
            Some(_) => Err(BadAddress(text.to_string())),
            None => text
                .parse()
                .map(Address::Tcp)
                .map_err(|_| BadAddress(text.to_string())),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(addr) => addr.fmt(f),
            Address::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl Address {
    /// Binds it; a Unix socket file gets `mode` (e.g. 0o660) when given, else the umask's.
    pub async fn bind(&self, mode: Option<u32>) -> io::Result<Bound> {
        match self {
            Address::Tcp(addr) => Ok(Bound::Tcp(TcpListener::bind(addr).await?)),
            Address::Unix(path) => {
                clear_stale(path).await?;
                let listener = UnixListener::bind(path)?;
                let socket = UnixSocket {
                    listener,
                    path: path.clone(),
                };
                if let Some(mode) = mode {
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
                }
                Ok(Bound::Unix(socket))
            }
        }
    }
}

/// Removes a socket file nobody listens on (left by a crashed run); refuses a live socket and
/// anything that is not a socket.
async fn clear_stale(path: &Path) -> io::Result<()> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    if UnixStream::connect(path).await.is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process listens on {}", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

/// Why a socket file mode does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a file mode: octal digits up to 0777, e.g. 0660")]
pub struct BadMode(String);

/// Parses an octal file mode (`0660`, `660`, `0o660`).
pub fn parse_mode(text: &str) -> Result<u32, BadMode> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 && !digits.is_empty() => Ok(mode),
        _ => Err(BadMode(text.to_string())),
    }
}

/// A bound listener.
pub enum Bound {
    Tcp(TcpListener),
    Unix(UnixSocket),
}

/// A listening Unix socket; its file goes when it is dropped.
pub struct UnixSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove the socket file");
        }
    }
}

impl Bound {
    /// The address it listens on (with the port chosen for port 0), for the log.
    pub fn local(&self) -> io::Result<Address> {
        match self {
            Bound::Tcp(listener) => listener.local_addr().map(Address::Tcp),
            Bound::Unix(socket) => Ok(Address::Unix(socket.path.clone())),
        }
    }

    /// The next connection, detached from this runtime so that a worker's runtime can own it.
    pub async fn accept(&self) -> io::Result<(Conn, Peer)> {
        match self {
            Bound::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                // Envoy waits on every call: do not let Nagle hold small responses back.
                stream.set_nodelay(true)?;
                Ok((Conn::Tcp(stream.into_std()?), Peer::Ip(peer)))
            }
            Bound::Unix(socket) => {
                let (stream, _) = socket.listener.accept().await?;
                let pid = stream.peer_cred().ok().and_then(|cred| cred.pid());
                Ok((Conn::Unix(stream.into_std()?), Peer::Local { pid }))
            }
        }
    }
}

/// Who is on the other end: an IP peer, or a local process over a Unix socket.
#[derive(Debug, Clone, Copy)]
pub enum Peer {
    Ip(SocketAddr),
    Local { pid: Option<i32> },
}

impl Peer {
    pub fn key(&self) -> PeerKey {
        match self {
            Peer::Ip(addr) => PeerKey::Ip(addr.ip()),
            Peer::Local { pid } => PeerKey::Process(*pid),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Ip(addr) => addr.fmt(f),
            Peer::Local { pid: Some(pid) } => write!(f, "unix socket, pid {pid}"),
            Peer::Local { pid: None } => f.write_str("unix socket"),
        }
    }
}

/// An accepted connection on its way from an acceptor to a worker.
pub enum Conn {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Conn {
    /// Registers it with the current (the worker's) runtime.
    pub fn into_io(self) -> io::Result<Io> {
        match self {
            Conn::Tcp(stream) => TcpStream::from_std(stream).map(Io::Tcp),
            Conn::Unix(stream) => UnixStream::from_std(stream).map(Io::Unix),
        }
    }
}

/// A connection on a worker's runtime, either kind.
pub enum Io {
    Tcp(TcpStream),
    Unix(UnixStream),
}

delegate_io!(Io { Tcp, Unix });

/// Implements tokio's `AsyncRead` and `AsyncWrite` for an enum whose variants each hold one
/// stream, by passing every call to the variant's stream (vectored writes included, so that a
/// round of answers still leaves in one `writev`).
macro_rules! delegate_io {
    ($type:ident { $($variant:ident),+ }) => {
        impl tokio::io::AsyncRead for $type {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($type::$variant(io) => std::pin::Pin::new(io).poll_read(cx, buf),)+
                }
            }
        }

        impl tokio::io::AsyncWrite for $type {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $($type::$variant(io) => std::pin::Pin::new(io).poll_write(cx, buf),)+
                }
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $($type::$variant(io) => std::pin::Pin::new(io).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $($type::$variant(io) => io.is_write_vectored(),)+
                }
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($type::$variant(io) => std::pin::Pin::new(io).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($type::$variant(io) => std::pin::Pin::new(io).poll_shutdown(cx),)+
                }
            }
        }
    };
}
pub(crate) use delegate_io;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_modes_parse() {
        assert_eq!(
            "unix:/run/sg.sock".parse::<Address>().ok(),
            Some(Address::Unix(PathBuf::from("/run/sg.sock")))
        );
        assert_eq!(
            "127.0.0.1:8081".parse::<Address>().ok(),
            Some(Address::Tcp(([127, 0, 0, 1], 8081).into()))
        );
        for bad in ["unix:", "localhost:8081", "/run/sg.sock"] {
            assert!(bad.parse::<Address>().is_err(), "{bad}");
        }
        assert_eq!(parse_mode("0660").ok(), Some(0o660));
        assert_eq!(parse_mode("0o600").ok(), Some(0o600));
        for bad in ["", "0999", "7777", "rw-"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }
}
