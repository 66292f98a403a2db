//! Where `--target` points, and the clients the workers call: HTTP/2 connections to a
//! RateLimitService (plain or TLS), shared by a thread's workers and dialled again when lost, or
//! slidegate's Redis store for a `redis://` target ([`crate::direct`]).
//!
//! The workers call through `h2` directly, not through a tonic client: a tonic call crosses two
//! channels and two tasks (tower's `Buffer`, then hyper's client dispatcher) before it reaches h2,
//! and cost the generator about as much CPU per request as the server it measured, on the same
//! cores. An instrument should cost less than what it measures.

use std::path::Path;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use h2::client::SendRequest;
use http::uri::{PathAndQuery, Scheme, Uri};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use slidegate::store::{RedisStore, Store as _};
use tokio::net::TcpStream;

use crate::BenchError;
use crate::args::BenchArgs;
use crate::direct::{direct_counters, direct_store};
use crate::grpc::{CallError, call, encode_frame, grpc_request};

/// The one method the generator calls.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// HTTP/2 receive windows, per stream and per connection: a few MiB, so that the responses (about
/// a hundred bytes each) never wait for a WINDOW_UPDATE.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// Where `--target` points.
#[derive(Clone, Debug)]
pub enum Target {
    /// A RateLimitService over HTTP/2: where to dial, and the URI of the method there (its scheme
    /// and authority become every request's `:scheme` and `:authority`).
    Rls { dial: Dial, uri: Uri },
    /// A Redis server, called directly (see the module docs).
    Redis { url: String },
}

impl Target {
    /// Accepts `http://host[:port]` (port 80 by default), `https://host[:port]` (443; TLS
    /// trusting `ca_file`) and `redis://...`, any URL slidegate's Redis store takes.
    pub fn parse(target: &str, ca_file: Option<&Path>) -> Result<Self, BenchError> {
        if target.starts_with("redis://") {
            return Ok(Target::Redis {
                url: target.to_string(),
            });
        }
        let invalid = || {
            BenchError::Invalid(format!(
                "--target must be http://host:port, https://host:port (with --ca-file) or \
                 redis://host:port, got {target:?}"
            ))
        };
        let uri: Uri = target.parse().map_err(|_| invalid())?;
        let scheme = uri
            .scheme()
            .filter(|s| *s == &Scheme::HTTP || *s == &Scheme::HTTPS);
        let plain_path = matches!(uri.path(), "" | "/") && uri.query().is_none();
        let (Some(scheme), Some(authority), true) = (scheme, uri.authority(), plain_path) else {
            return Err(invalid());
        };
        let tls = scheme == &Scheme::HTTPS;
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let tls = match (tls, ca_file) {
            (false, _) => None,
            (true, Some(ca_file)) => Some(tls_client(authority.host(), ca_file)?),
            (true, None) => return Err(invalid()),
        };
        let dial = Dial {
            addr: format!("{}:{port}", authority.host()),
            tls,
        };
        let uri = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query(PathAndQuery::from_static(SHOULD_RATE_LIMIT))
            .build()
            .map_err(|_| invalid())?;
        Ok(Target::Rls { dial, uri })
    }
}

/// Where an HTTP/2 connection goes: the address, and for an `https://` target the TLS client and
/// the name the server's certificate must carry.
#[derive(Clone)]
pub struct Dial {
    addr: String,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
}

impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dial")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// A TLS client trusting only the CA certificates in `ca_file`, offering ALPN `h2` (gRPC).
fn tls_client(
    host: &str,
    ca_file: &Path,
) -> Result<(tokio_rustls::TlsConnector, ServerName<'static>), BenchError> {
    let invalid = |what: String| BenchError::Invalid(format!("--ca-file {ca_file:?}: {what}"));
    let pem = std::fs::read(ca_file).map_err(|e| invalid(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots
            .add(cert.map_err(|e| invalid(e.to_string()))?)
            .map_err(|e| invalid(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(|e| BenchError::Invalid(format!("--target host {host:?}: {e}")))?;
    Ok((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
}

/// Opens `count` connections to the target on the current runtime.
pub async fn connect(
    args: &BenchArgs,
    target: &Target,
    count: usize,
) -> Result<Vec<Client>, BenchError> {
    let failed = |source| BenchError::Connect {
        target: args.target.clone(),
        source,
    };
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let client = match target {
            Target::Rls { dial, uri } => Client::Rls(
                RlsClient::connect(dial, uri, args.timeout)
                    .await
                    .map_err(failed)?,
            ),
            Target::Redis { url } => Client::Redis(Arc::new(
                direct_store(url, args.timeout)
                    .await
                    .map_err(|e| failed(e.into()))?,
            )),
        };
        clients.push(client);
    }
    Ok(clients)
}

/// A client of any target: what a worker calls.
#[derive(Clone)]
pub enum Client {
    Rls(RlsClient),
    /// Shared by the workers of one connection, like a connection of slidegate's.
    Redis(Arc<RedisStore>),
}

impl Client {
    /// Sends `request` (encoded into `buf`, which is reused). `Ok(true)` when it was over the limit.
    pub async fn over_limit(
        &mut self,
        request: &RateLimitRequest,
        buf: &mut BytesMut,
    ) -> Result<bool, CallError> {
        match self {
            Client::Rls(client) => {
                let response = client.should_rate_limit(encode_frame(request, buf)).await?;
                Ok(response.overall_code == Code::OverLimit as i32)
            }
            Client::Redis(store) => match store.decide(&direct_counters(request)).await {
                Ok(decision) => Ok(!decision.allowed),
                Err(_) => Err(CallError::Store),
            },
        }
    }

    /// After a failed call: see [`RlsClient::recover`]. A Redis connection reconnects by itself;
    /// the pause keeps a worker from spinning while Redis is away.
    pub async fn recover(&mut self) {
        match self {
            Client::Rls(client) => client.recover().await,
            Client::Redis(_) => tokio::time::sleep(REDIAL_PAUSE / 10).await,
        }
    }
}

/// How long a failed dial keeps the others from dialling again: a stopped server is tried ten
/// times a second, not in a busy loop.
const REDIAL_PAUSE: Duration = Duration::from_millis(100);

/// One HTTP/2 connection, shared by a thread's workers and dialled again when it is lost (a
/// server restarting mid-run): the first worker to find it dead dials, the others take the new
/// handle. Calls made while no server answers fail, and are counted as errors.
struct Connection {
    dial: Dial,
    /// The live handle and its generation (how many times the connection was replaced).
    current: parking_lot::Mutex<(u64, SendRequest<Bytes>)>,
    /// When a worker last dialled; held while dialling, so only one worker dials at a time.
    last_dial: tokio::sync::Mutex<Option<Instant>>,
}

impl Connection {
    /// After generation `seen` was found dead: the next generation's handle, dialled here unless
    /// another worker already did. `None` while the server cannot be reached.
    async fn replace(&self, seen: u64, timeout: Duration) -> Option<(u64, SendRequest<Bytes>)> {
        let mut last_dial = self.last_dial.lock().await;
        {
            let current = self.current.lock();
            if current.0 != seen {
                return Some(current.clone());
            }
        }
        if last_dial.is_some_and(|at| at.elapsed() < REDIAL_PAUSE) {
            return None;
        }
        *last_dial = Some(Instant::now());
        let dialled = tokio::time::timeout(timeout, open(&self.dial)).await;
        let send = dialled.ok()?.ok()?;
        let mut current = self.current.lock();
        *current = (seen + 1, send);
        Some(current.clone())
    }
}

/// Dials, over TLS for an `https://` target, and starts HTTP/2. The connection runs as a task of
/// its own on the current runtime; its error is not logged, since every call on a failed
/// connection fails too and is counted, and [`Connection`] dials again.
async fn open(dial: &Dial) -> Result<SendRequest<Bytes>, Box<dyn std::error::Error + Send + Sync>> {
    let tcp = TcpStream::connect(&dial.addr).await?;
    tcp.set_nodelay(true)?;
    match &dial.tls {
        None => start_h2(tcp).await,
        Some((connector, name)) => start_h2(connector.connect(name.clone(), tcp).await?).await,
    }
}

async fn start_h2<T>(io: T) -> Result<SendRequest<Bytes>, Box<dyn std::error::Error + Send + Sync>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .enable_push(false)
        .handshake(io)
        .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(send)
}

/// A worker's handle on one HTTP/2 connection. Clones share the connection, but each waits only
/// for its own stream to open, so workers never queue behind one another.
#[derive(Clone)]
pub struct RlsClient {
    send: SendRequest<Bytes>,
    /// The generation of the connection `send` belongs to.
    generation: u64,
    connection: Arc<Connection>,
    uri: Uri,
    timeout: Duration,
}

impl RlsClient {
    /// Dials `dial`; calls go to the method at `uri`.
    async fn connect(
        dial: &Dial,
        uri: &Uri,
        timeout: Duration,
    ) -> Result<RlsClient, Box<dyn std::error::Error + Send + Sync>> {
        let send = open(dial).await?;
        let connection = Arc::new(Connection {
            dial: dial.clone(),
            current: parking_lot::Mutex::new((0, send.clone())),
            last_dial: tokio::sync::Mutex::new(None),
        });
        Ok(RlsClient {
            send,
            generation: 0,
            connection,
            uri: uri.clone(),
            timeout,
        })
    }

    /// One `ShouldRateLimit` call sending `frame` (see [`encode_frame`]), bounded by `--timeout`.
    async fn should_rate_limit(&mut self, frame: Bytes) -> Result<RateLimitResponse, CallError> {
        let call = call(&mut self.send, grpc_request(&self.uri), frame);
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(CallError::Timeout))
    }

    /// After a failed call: when the connection itself is gone, moves to a new one, or waits a
    /// little while none can be opened (a dead connection fails calls without waiting).
    async fn recover(&mut self) {
        let state = std::future::poll_fn(|cx| Poll::Ready(self.send.poll_ready(cx))).await;
        if !matches!(state, Poll::Ready(Err(_))) {
            return; // The connection is fine: only that call failed.
        }
        match self.connection.replace(self.generation, self.timeout).await {
            Some((generation, send)) => (self.generation, self.send) = (generation, send),
            None => tokio::time::sleep(REDIAL_PAUSE / 10).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_plain_http_or_redis() {
        let addr = |target: &str| match Target::parse(target, None) {
            Ok(Target::Rls { dial, .. }) => Some(dial.addr),
            _ => None,
        };
        let Ok(Target::Rls { dial, uri }) = Target::parse("http://127.0.0.1:8081", None) else {
            panic!("plain http is a gRPC target");
        };
        assert_eq!(dial.addr, "127.0.0.1:8081");
        assert!(dial.tls.is_none());
        assert_eq!(
            uri.to_string(),
            format!("http://127.0.0.1:8081{SHOULD_RATE_LIMIT}")
        );
        assert_eq!(addr("http://[::1]:9/"), Some("[::1]:9".into()));
        assert_eq!(addr("http://localhost"), Some("localhost:80".into()));
        assert!(matches!(
            Target::parse("redis://127.0.0.1:6379", None),
            Ok(Target::Redis { url }) if url == "redis://127.0.0.1:6379"
        ));
        for bad in [
            "https://127.0.0.1:8081", // no --ca-file
            "ftp://127.0.0.1:8081",
            "127.0.0.1:8081",
            "http://host/path",
            "",
        ] {
            assert!(
                matches!(Target::parse(bad, None), Err(BenchError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
