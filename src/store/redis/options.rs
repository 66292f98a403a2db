//! How to reach Redis: the options, their defaults, TLS material and socket settings.

use std::path::PathBuf;
use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;
use ::redis::io::tcp::TcpSettings;
use ::redis::{
    ClientTlsConfig, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, TlsCertificates,
};

use super::password::PasswordFile;
use super::{RedisMetrics, SentinelOptions, redact_url};
use crate::store::StoreError;

/// The default key prefix (`--redis-prefix`).
pub const DEFAULT_PREFIX: &str = "slidegate:";

/// Default per-call timeout when none is configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Default capacity of the local deny cache (counters).
pub const DEFAULT_DENY_CACHE: usize = 100_000;

/// Default of [`RedisOptions::max_call_hits`]: the limiter's default budget for one request.
pub const DEFAULT_MAX_CALL_HITS: u64 = 4096;

/// How a socket reports a peer that stopped answering: unacknowledged data for this long fails
/// the connection, which [`ConnectionManager`] then replaces.
pub(super) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything the CLI knows about the Redis store.
#[derive(Clone)]
pub struct RedisOptions {
    /// Standalone server: `redis://[user:pass@]host:port[/db]` or `rediss://...` (TLS). Ignored
    /// when `cluster_nodes` is not empty. With `sentinel`, how to talk to the primary (scheme,
    /// credentials, database); its host is not used.
    pub url: String,
    /// Redis Sentinel: the sentinels name the primary (see the `sentinel` module).
    pub sentinel: Option<SentinelOptions>,
    /// Redis Cluster seed nodes (same URL forms); not empty selects the cluster store. The first
    /// node's credentials and TLS setting apply to all nodes.
    pub cluster_nodes: Vec<String>,
    /// A file holding the password of the standalone server, the primary or the cluster nodes,
    /// instead of the URL's: read at start and again at every connection (see the `password`
    /// module). The URLs must then carry none.
    pub password_file: Option<PathBuf>,
    /// Prepended to every counter key; must not contain `{` or `}` (they would change the hash tag).
    pub prefix: String,
    /// Upper bound for every call, including connecting.
    pub timeout: Duration,
    /// PEM file of CA certificates to trust for `rediss://` instead of the system roots (a private
    /// CA or a self-signed server certificate).
    pub tls_ca_file: Option<PathBuf>,
    /// PEM certificate chain and private key presented to Redis over `rediss://`, for servers
    /// that require client certificates (`tls-auth-clients yes`). Both or neither.
    pub tls_client_cert: Option<ClientCertFiles>,
    /// Capacity of the exact local deny cache in counters; 0 turns it off. Standalone and Cluster
    /// (where a counter filled by hits a compensation may take back is never cached), see
    /// [`DenyCache`].
    pub deny_cache: usize,
    /// Connections to open (lazily): one per thread that serves calls, see the `per_thread` module.
    pub connections: usize,
    /// Most work one script call may cost, summed over its counters as `store::work` counts it
    /// (a log's hits, a bucket counter's buckets plus one):
    /// the limiter's budget for one request (`--max-hits`), so that batching several requests
    /// into one call never holds Redis longer than the largest single request may. A request
    /// alone always gets its call.
    pub max_call_hits: u64,
    /// Where the store counts its calls to Redis (`Metrics::redis`); registered nowhere by
    /// default.
    pub metrics: RedisMetrics,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            url: "redis://127.0.0.1:6379".to_string(),
            cluster_nodes: Vec::new(),
            sentinel: None,
            password_file: None,
            prefix: DEFAULT_PREFIX.to_string(),
            timeout: DEFAULT_TIMEOUT,
            tls_ca_file: None,
            tls_client_cert: None,
            deny_cache: DEFAULT_DENY_CACHE,
            connections: 1,
            max_call_hits: DEFAULT_MAX_CALL_HITS,
            metrics: RedisMetrics::default(),
        }
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.cluster_nodes.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("RedisOptions")
            .field("url", &redact_url(&self.url))
            .field("cluster_nodes", &nodes)
            .field("sentinel", &self.sentinel)
            .field("password_file", &self.password_file)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert", &self.tls_client_cert)
            .field("deny_cache", &self.deny_cache)
            .field("connections", &self.connections)
            .finish()
    }
}

/// The paths of the client certificate chain and its private key (PEM) presented to Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// How each thread's [`ConnectionManager`] connects: two attempts 10 ms apart, not redis-rs's
/// seven with a backoff from 100 ms, doubling. A call that arrives while the manager connects waits
/// for it, so a long backoff turns every error into a timeout of the call's deadline (a refused
/// password read as "timed out after 50ms") and keeps a restarted Redis unused for its length.
/// Calls drive the reconnects instead: a call that finds the connection failed starts the next
/// attempts, and one refused while connecting is sent once more (`batch::never_sent`).
/// With a password file, every connection reads it (`password` module).
pub(super) fn manager_config(
    opts: &RedisOptions,
    password_file: Option<&PasswordFile>,
) -> ConnectionManagerConfig {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.timeout.max(Duration::from_secs(1))))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(10));
    match password_file {
        Some(file) => config.set_credentials_provider(file.clone()),
        None => config,
    }
}

/// The CA and client certificate files read into what redis-rs takes, or `None` when neither is
/// set (system roots, no client certificate). Read once at startup: a reconnect reuses them.
pub(super) fn tls_certificates(opts: &RedisOptions) -> Result<Option<TlsCertificates>, StoreError> {
    if opts.tls_ca_file.is_none() && opts.tls_client_cert.is_none() {
        return Ok(None);
    }
    let read = |what: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| {
            StoreError::Backend(format!("cannot read Redis TLS {what} file {path:?}: {e}"))
        })
    };
    let root_cert = match &opts.tls_ca_file {
        Some(path) => Some(read("CA", path)?),
        None => None,
    };
    let client_tls = match &opts.tls_client_cert {
        Some(files) => Some(ClientTlsConfig {
            client_cert: read("client certificate", &files.cert)?,
            client_key: read("client key", &files.key)?,
        }),
        None => None,
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// Parses a URL and sets what slidegate wants on every connection: `TCP_NODELAY` (one small
/// command per request; Nagle's algorithm would add latency) and `TCP_USER_TIMEOUT`, and no
/// `CLIENT SETINFO` (Redis before 7.2 rejects it). A parse error never shows the URL.
pub(super) fn connection_info(url: &str) -> Result<ConnectionInfo, StoreError> {
    let info = url.into_connection_info().map_err(|e| {
        // The message may quote the URL; the kind cannot.
        StoreError::Backend(format!(
            "invalid Redis URL {}: {:?}",
            redact_url(url),
            e.kind()
        ))
    })?;
    let redis = info.redis_settings().clone().set_skip_set_lib_name();
    Ok(info
        .set_tcp_settings(tcp_settings())
        .set_redis_settings(redis))
}

/// `info` speaking RESP3 (Redis 6.0 and later), for the connections that carry the store's calls.
/// Over RESP3 a connection's reader learns at once that Redis closed it (an idle `timeout`, a
/// restart, a failover behind one address) and [`ConnectionManager`] connects again in the
/// background, before the next call needs it; over RESP2 the manager learned it only from a call
/// that failed on the dead connection, one per connection after every idle close. The script's
/// reply (one bulk string) reads the same in both.
pub(super) fn resp3(info: ConnectionInfo) -> ConnectionInfo {
    let redis = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    info.set_redis_settings(redis)
}

pub(super) fn tcp_settings() -> TcpSettings {
    TcpSettings::default()
        .set_nodelay(true)
        .set_user_timeout(TCP_USER_TIMEOUT)
}
