//! The Redis store: one sorted set (or, for buckets, one hash) per counter, at most one Lua script
//! call per request.
//!
//! # Algorithm
//! A counter is a sorted set under `prefix + CounterKey` (`slidegate:{api:user=alice}60000`):
//! score = time of a hit in microseconds, member = a unique hit id (see [`script::RequestIds`]:
//! a random per-store instance id plus a sequence number, base 62, about 12 bytes; hit `n > 1` of
//! a request appends `:n`). One `EVALSHA` of `sliding_window.lua` does, for all counters of a
//! request: `ZREMRANGEBYSCORE` what left the window, `ZCARD`, decide; then, only if no enforced
//! counter is over, `ZADD` the hits and `PEXPIRE` each key to its window, so an idle key disappears
//! exactly when its last hit leaves the window. The time is Redis's own `TIME`, read inside the
//! script: replicas whose clocks disagree still share one timeline. One call decides, in order,
//! the requests a worker has started together (up to 16; in a cluster, those of one slot; see
//! `Lane`).
//!
//! Memory on Redis 7.0, measured by the `redis_bytes_per_tracked_hit` test: about 32 bytes per
//! tracked hit (`used_memory`; `MEMORY USAGE` says 26) while a key holds at most 128 hits (Redis
//! keeps it as a compact listpack), about 110 bytes per hit for bigger logs (skiplist encoding).
//! `zset-max-listpack-entries` moves that threshold.
//!
//! A bucket counter ([`Precision::Buckets`](crate::store::Precision), its key ending in `b` and
//! the width) is a hash instead: field = bucket index (Redis time / width), value = hits admitted
//! in that bucket, plus `t` (their sum) and `o` (the oldest bucket). The same script call decides
//! it beside the logs: it reads `t` and `o`, deletes the buckets that left the window (the oldest
//! overlapping bucket counts whole), reads the oldest bucket only when it needs its hits (a deny,
//! the reset time), and only if the request is admitted `HINCRBY`s the current bucket and `t`; the
//! hash expires when its newest bucket leaves the window. So a decision costs about what the log's
//! does (BENCHMARKS.md, "Buckets against the log"), however many buckets the window has. It holds at most one field per bucket of the window, whatever the traffic:
//! a 10,000,000-per-day counter taking 200,000 hits grows `used_memory` by under 64 KB
//! (`redis_bucket_counter_memory_is_bounded`), where the log would take about 20 MB. In a cluster,
//! a cross-slot part's hits on a bucket counter also go to its provisional hash (bucket index →
//! provisional hits, bounded like the counter); the script reports the bucket it used, and the
//! compensation takes the hits off that bucket of both (`bucket_take_back.lua`).
//!
//! # Standalone
//! A `redis://` or `rediss://` URL (`[user:pass@]host:port[/db]`). The script runs atomically, so
//! the all-or-nothing decision across the request's counters is exact, whatever the number of
//! replicas. [`ConnectionManager`] reconnects in the background; calls in flight during a
//! disconnect fail with a [`StoreError`] (never retried, never a panic).
//!
//! # Cluster
//! Seed node URLs. Keys carry the [`CounterKey`] hash tag, so a counter lives on one slot and all
//! windows of one descriptor share a slot. The counters of a request are grouped by slot; each group
//! is decided on its own counters only, in a script call of its slot (shared with other requests'
//! groups of that slot), and the groups are sent concurrently. A
//! request whose counters all share a slot (the common case: one descriptor, several windows) is
//! exactly as atomic as on a standalone server.
//! Slot migrations (resharding) answer calls with `MOVED`, `ASK` or `TRYAGAIN`; the client follows
//! and retries them within the call's timeout and counts them (the `cluster` module).
//!
//! Across slots no single step is atomic. The store therefore lets every group decide and record
//! atomically, and if any group denies, it takes back the hits the other groups just recorded
//! (`ZREM` of this request's members). Consequences, plainly:
//! - nothing is ever over-admitted: every hit that is admitted was within its limit in its own
//!   atomic step, and the request is admitted only if all groups admitted it;
//! - a denied request consumes no quota once the compensation has run, a few hundred microseconds
//!   later; during that moment its hits still count, so a concurrent request on those counters may
//!   be denied although it would fit (spuriously denied, never spuriously admitted);
//! - if the compensation itself fails (node down), those hits stay until they leave the window:
//!   again over-counting, never under-counting.
//!
//! The deny cache needs a counter's full state to end only with time, and a compensation ends it
//! early. So the hits of a cross-slot request also go to the counter's provisional log
//! (`prefix + CounterKey + "p"`, same slot), and the compensation removes them from both. A full
//! counter whose window holds provisional hits is reported as such and not cached; requests that
//! stay within one slot (one descriptor, or descriptors sharing a hash tag) are cached exactly as
//! on a standalone server.
//!
//! # Timeouts and failures
//! Every call runs under the constructor's timeout (`tokio::time::timeout`), because a client that
//! waits for a dead server holds every request hostage. Errors are [`StoreError::Timeout`],
//! [`StoreError::Connection`] or [`StoreError::Backend`]; what they mean for the request
//! (`--failure-mode`) is the limiter's decision. A call that reaches Redis after its callers'
//! deadline decides nothing and records nothing (the `deadline` module: the deadline travels in
//! Redis's clock, estimated from the `TIME` earlier replies reported); one that ran in time but
//! whose reply came late keeps its hits, and is counted. A Redis at `maxmemory` (`noeviction`)
//! refuses the script before it runs: [`StoreError::OutOfMemory`], logged at most every 10 s.
//! The `node` module tracks whether the node answers and warns about eviction policies that can
//! evict counters. Sockets use
//! `TCP_NODELAY` and `TCP_USER_TIMEOUT`, so a silently dead connection errors and is replaced
//! instead of timing out forever.
//!
//! Passwords never leave this module in any text: URLs are shown through [`redact_url`], and client
//! error messages are scrubbed of the configured passwords.

mod cluster;
mod deadline;
mod deny_cache;
mod metrics;
mod node;
mod per_thread;
mod redact;
pub mod script;
pub mod sentinel;

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_routing::Slot;
use ::redis::io::tcp::TcpSettings;
use ::redis::{ClientTlsConfig, ConnectionInfo, IntoConnectionInfo, RedisError, TlsCertificates};
use async_trait::async_trait;
use futures::future::join_all;
use tokio::sync::{OnceCell, oneshot};

use cluster::ClusterConnection;
pub use cluster::{Redirections, redirections};
use deadline::ServerClocks;
pub use deny_cache::{DenyCache, Lookup, Refresh};
use node::NodeHealth;
pub use node::SAFE_POLICIES;
use per_thread::PerThread;
pub use redact::{Redactor, redact_url};
use script::{CallPart, Reply, Reported, RequestIds};
pub use sentinel::SentinelOptions;
use sentinel::{PrimaryConn, Sentinels};

pub use metrics::{CallResult, RedisMetrics};

use super::{Counter, CounterKey, CounterResult, Decision, Precision, Store, StoreError};

/// The default key prefix (`--redis-prefix`).
pub const DEFAULT_PREFIX: &str = "slidegate:";

/// Default per-call timeout when none is configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Default capacity of the local deny cache (counters).
pub const DEFAULT_DENY_CACHE: usize = 100_000;

/// Default of [`RedisOptions::max_call_hits`]: the limiter's default budget for one request.
pub const DEFAULT_MAX_CALL_HITS: u64 = 4096;

/// How long a batch task keeps waiting, after its callers timed out, for the late reply that says
/// whether the call expired or recorded its hits (`slidegate_redis_*` metrics); the reply is
/// dropped unread after that.
const LATE_REPLY_WAIT: Duration = Duration::from_secs(10);

/// Most calls waiting for their late reply at once, per store: each holds about 2.5 KB (its
/// task and the client's future), so a frozen Redis that thousands of calls time out against
/// costs at most about 1.3 MB. Calls beyond it are not waited for (nor counted as expired or
/// late).
const MAX_LATE_WAITERS: usize = 512;

/// How a socket reports a peer that stopped answering: unacknowledged data for this long fails
/// the connection, which [`ConnectionManager`] then replaces.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Most hits one script call may add to exact logs, summed over its counters (a 0-hit check
    /// and a bucket counter count 1):
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

/// How each thread's [`ConnectionManager`] connects and retries.
fn manager_config(opts: &RedisOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.timeout.max(Duration::from_secs(1))))
        .set_response_timeout(None)
        .set_number_of_retries(2)
}

/// The CA and client certificate files read into what redis-rs takes, or `None` when neither is
/// set (system roots, no client certificate). Read once at startup: a reconnect reuses them.
fn tls_certificates(opts: &RedisOptions) -> Result<Option<TlsCertificates>, StoreError> {
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

/// Builds the Redis store the options describe: cluster when seed nodes are given, else standalone.
/// Fails only on bad options (URL, prefix, CA file); an unreachable Redis is not an error here
/// (the store connects lazily and reconnects), so call [`Store::ping`] to report it at startup.
pub async fn connect(opts: &RedisOptions) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(RedisStore::connect(opts).await?))
}

/// The Redis store, standalone or cluster. See the module docs.
pub struct RedisStore {
    conn: Conn,
    ids: RequestIds,
    deny_cache: Option<DenyCache>,
    shared: Arc<Shared>,
}

/// What the store and its batch calls (tasks of their own) both need.
struct Shared {
    prefix: String,
    timeout: Duration,
    /// [`RedisOptions::max_call_hits`].
    max_call_hits: u64,
    redactor: Redactor,
    /// Redacted endpoint(s), for Debug and messages.
    endpoint: String,
    /// Each server's clock, for the calls' deadlines.
    clocks: ServerClocks,
    metrics: RedisMetrics,
    /// The node (standalone) or the cluster as a whole, as calls see it.
    node: NodeHealth,
    /// Calls waiting for their late reply now (at most [`MAX_LATE_WAITERS`]).
    late_waiters: AtomicUsize,
}

/// A connection (standalone, or a cluster's) and the requests waiting for its next script call.
///
/// Requests that a worker starts in one go (the calls that one read of a connection brought, or
/// of several) are decided in one script call: about half of what Redis spends on a one-counter
/// request is the call itself (BENCHMARKS.md), and the call is shared. The first request into an
/// empty queue spawns the task that sends it; that task runs once the worker has started every
/// call at hand, so it takes them all, and no request ever waits for a timer. In a cluster a call
/// holds the requests (or cross-slot parts of requests) of one slot.
struct Lane<C> {
    conn: C,
    /// Cluster: calls pass each counter's provisional log and hold one slot's parts.
    cluster: bool,
    queue: parking_lot::Mutex<Vec<Queued>>,
}

impl<C> Lane<C> {
    fn new(conn: C, cluster: bool) -> Arc<Lane<C>> {
        Arc::new(Lane {
            conn,
            cluster,
            queue: parking_lot::Mutex::new(Vec::new()),
        })
    }
}

/// What a [`Lane`] sends its script calls on.
trait LaneConn: ::redis::aio::ConnectionLike + Clone + Send + Sync + 'static {}

impl<C: ::redis::aio::ConnectionLike + Clone + Send + Sync + 'static> LaneConn for C {}

/// A request, or one slot's part of a cross-slot request, in a [`Lane`]'s queue.
struct Queued {
    id: String,
    /// One slot's part of a cross-slot request (its hits also go to the provisional logs).
    provisional: bool,
    /// The counters' cluster slot (`None` on standalone).
    slot: Option<Slot>,
    counters: Vec<Counter>,
    /// When the caller gives up.
    deadline: Instant,
    answer: oneshot::Sender<Result<Reply, StoreError>>,
}

/// Most requests decided in one script call: Redis runs nothing else while a script runs, so a
/// call is kept to a few hundred microseconds.
const MAX_BATCH: usize = 16;

enum Conn {
    Standalone(PerThread<Arc<Lane<ConnectionManager>>>),
    /// The primary the sentinels name, followed through failovers.
    Sentinel(PerThread<Arc<Lane<PrimaryConn>>>),
    /// Connected on first use (and again after a failed first attempt), because redis-rs needs a
    /// reachable seed to build a cluster connection; it handles reconnects and slot moves after.
    Cluster(Box<Cluster>),
}

struct Cluster {
    client: ClusterClient,
    lanes: PerThread<OnceCell<Arc<Lane<ClusterConnection>>>>,
}

impl RedisStore {
    /// See [`connect`]; this returns the concrete type (tests use its extras).
    pub async fn connect(opts: &RedisOptions) -> Result<RedisStore, StoreError> {
        if opts.prefix.contains(['{', '}']) {
            return Err(StoreError::Backend(format!(
                "invalid Redis key prefix {:?}: it must not contain '{{' or '}}' (they decide the \
                 cluster hash slot)",
                opts.prefix
            )));
        }
        let urls: Vec<&str> = if opts.cluster_nodes.is_empty() {
            vec![opts.url.as_str()]
        } else {
            opts.cluster_nodes.iter().map(String::as_str).collect()
        };
        let endpoint = urls
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(",");
        let mut redactor = Redactor::default();
        let mut infos = Vec::with_capacity(urls.len());
        for url in &urls {
            let info = connection_info(url)?;
            if let Some(password) = info.redis_settings().password() {
                redactor.add(password);
            }
            infos.push(info);
        }
        if urls.iter().any(|u| u.starts_with("rediss://")) {
            // redis-rs leaves rustls without a crypto provider; the first TLS handshake would panic.
            // An error here only means one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let certs = tls_certificates(opts)?;
        if let Some(sentinel) = &opts.sentinel {
            return Self::connect_sentinel(opts, sentinel, certs, redactor).await;
        }
        let clean = |e: RedisError| {
            StoreError::Backend(format!(
                "invalid Redis options for {endpoint}: {}",
                redactor.clean(&e.to_string())
            ))
        };
        // A node's address without credentials (a standalone URL's host and port).
        let node = match (opts.cluster_nodes.is_empty(), infos.first()) {
            (true, Some(info)) => info.addr().to_string(),
            _ => "cluster".to_string(),
        };
        let conn = if opts.cluster_nodes.is_empty() {
            let info = infos.remove(0);
            let client = match certs {
                Some(certs) => ::redis::Client::build_with_tls(info, certs),
                None => ::redis::Client::open(info),
            }
            .map_err(clean)?;
            let config = manager_config(opts);
            let managers = PerThread::new(opts.connections, || {
                let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
                Ok(Lane::new(conn, false))
            });
            Conn::Standalone(managers.map_err(clean)?)
        } else {
            let builder = ClusterClientBuilder::new(infos)
                .connection_timeout(opts.timeout.max(Duration::from_secs(1)))
                .response_timeout(opts.timeout)
                .tcp_settings(tcp_settings());
            let mut builder = cluster::retry_policy(builder, opts.timeout);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            cluster::report_node_state(opts.metrics.nodes());
            Conn::Cluster(Box::new(Cluster {
                client: builder.build().map_err(clean)?,
                lanes: PerThread::new(opts.connections, || Ok::<_, StoreError>(OnceCell::new()))?,
            }))
        };
        Ok(Self::with_conn(opts, conn, redactor, endpoint, node))
    }

    fn with_conn(
        opts: &RedisOptions,
        conn: Conn,
        redactor: Redactor,
        endpoint: String,
        node: String,
    ) -> RedisStore {
        let deny_cache = (opts.deny_cache > 0).then(|| DenyCache::new(opts.deny_cache));
        let cluster = matches!(conn, Conn::Cluster(_));
        RedisStore {
            conn,
            ids: RequestIds::new(),
            deny_cache,
            shared: Arc::new(Shared {
                prefix: opts.prefix.clone(),
                timeout: opts.timeout,
                max_call_hits: opts.max_call_hits,
                redactor,
                endpoint,
                clocks: ServerClocks::new(cluster),
                node: NodeHealth::new(node.clone(), opts.metrics.node(&node)),
                metrics: opts.metrics.clone(),
                late_waiters: AtomicUsize::new(0),
            }),
        }
    }

    /// The store on the primary that the sentinels name (see the `sentinel` module): one lane per
    /// thread, as standalone. Fails when no sentinel names a usable primary within
    /// [`sentinel::LOOKUP_TIMEOUT`].
    async fn connect_sentinel(
        opts: &RedisOptions,
        sentinel: &SentinelOptions,
        certs: Option<TlsCertificates>,
        mut redactor: Redactor,
    ) -> Result<RedisStore, StoreError> {
        if sentinel
            .sentinels
            .iter()
            .any(|s| s.starts_with("rediss://"))
        {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let sentinels = Sentinels::start(
            sentinel,
            &opts.url,
            certs,
            manager_config(opts),
            &mut redactor,
        )
        .await?;
        tracing::info!(
            sentinels = %sentinels.endpoint(),
            primary = %sentinels.primary(),
            "Redis Sentinel named the primary"
        );
        let lanes = PerThread::new(opts.connections, || {
            Ok::<_, StoreError>(Lane::new(sentinels.connection(), false))
        })?;
        let endpoint = sentinels.endpoint();
        let primary = sentinels.primary();
        let store = Self::with_conn(opts, Conn::Sentinel(lanes), redactor, endpoint, primary);
        // The node's series and eviction-policy check follow the primary.
        let shared = Arc::clone(&store.shared);
        sentinels.on_failover(Box::new(move |addr: &str| {
            shared
                .node
                .moved_to(addr.to_string(), shared.metrics.node(addr));
        }));
        Ok(store)
    }

    /// The deny cache, when on.
    pub fn deny_cache(&self) -> Option<&DenyCache> {
        self.deny_cache.as_ref()
    }

    /// The Redis key of a counter.
    pub fn redis_key(&self, key: &CounterKey) -> String {
        format!("{}{}", self.shared.prefix, key.as_str())
    }

    /// Asks Redis for the decision on `counters` (a request, or one slot's part of one) in the
    /// next script call of this worker's [`Lane`].
    #[allow(clippy::too_many_arguments)]
    async fn ask<C: LaneConn>(
        &self,
        lane: &Arc<Lane<C>>,
        id: String,
        provisional: bool,
        slot: Option<Slot>,
        counters: Vec<Counter>,
        deadline: Instant,
    ) -> Result<Reply, StoreError> {
        let (answer, reply) = oneshot::channel();
        let first = {
            let mut queue = lane.queue.lock();
            queue.push(Queued {
                id,
                provisional,
                slot,
                counters,
                deadline,
                answer,
            });
            queue.len() == 1
        };
        if first {
            tokio::spawn(send_queued(lane.clone(), self.shared.clone()));
        }
        reply
            .await
            .unwrap_or_else(|_| Err(StoreError::Backend("the script call was dropped".into())))
    }

    /// Consults the deny cache until it denies the request or lets it ask Redis, waiting while
    /// another request refreshes one of its counters. Waiting, in all, lasts at most a quarter of
    /// our timeout, however long the leader takes: then stop waiting for other requests' answers
    /// and ask Redis, so that waiting never turns a request into a timeout.
    async fn consult(&self, counters: &[Counter]) -> ControlFlow<Decision, Vec<(usize, Refresh)>> {
        let stop_waiting = Instant::now() + self.shared.timeout / 4;
        while Instant::now() < stop_waiting {
            match self.consult_cache(counters, Instant::now()) {
                Consult::Deny(decision) => return ControlFlow::Break(decision),
                Consult::Wait(mut done) => {
                    let until = tokio::time::Instant::from_std(stop_waiting);
                    let _ = tokio::time::timeout_at(until, done.changed()).await;
                }
                Consult::Ask(leads) => return ControlFlow::Continue(leads),
            }
        }
        ControlFlow::Continue(Vec::new())
    }

    /// Stores what Redis said about the counters of a request sent at `sent`, then releases the
    /// refreshes this request led: the requests that waited for them find the answer cached.
    fn remember(
        &self,
        counters: &[Counter],
        reply: &Reply,
        sent: Instant,
        refreshes: Vec<(usize, Refresh)>,
    ) {
        if let Some(cache) = &self.deny_cache {
            for (c, r) in counters.iter().zip(&reply.counters) {
                if let (false, Some(wait)) = (c.shadow, full_for(r, reply.allowed)) {
                    cache.insert(&c.key, c.limit, sent + wait, sent);
                }
            }
            for (i, refresh) in &refreshes {
                let (c, r) = (&counters[*i], &reply.counters[*i].result);
                if full_for(&reply.counters[*i], reply.allowed).is_none() {
                    cache.settle(&c.key, c.limit, r.remaining, refresh);
                }
            }
        }
        drop(refreshes);
    }

    /// Consults the deny cache for every enforced counter; see [`DenyCache`].
    ///
    /// A local deny is exact for the full counter: `count` = limit (one more hit does not fit, so
    /// the log holds the limit), `remaining` 0, `reset_after` the time until one hit fits (the
    /// whole window for `hits > limit`). Its exact `reset_after` for `1 < hits <= limit` would need
    /// the log, so such counters go to Redis, as do checks (`hits` 0), which fit a full counter.
    /// A counter the request names twice is looked up once: the request never waits for a
    /// refresh it leads itself. The request's other counters were not looked at:
    /// they are reported as not over limit with `count` 0, `remaining` = limit and `reset_after` 0
    /// (unknown, and untouched by this request).
    fn consult_cache(&self, counters: &[Counter], now: Instant) -> Consult {
        let Some(cache) = self.deny_cache.as_ref() else {
            return Consult::Ask(Vec::new());
        };
        let mut waits = Vec::with_capacity(counters.len());
        let mut denied = false;
        let mut pending = None;
        let mut leads = Vec::new();
        for (i, c) in counters.iter().enumerate() {
            let exact = !c.shadow && (c.hits == 1 || c.hits > c.limit);
            let mut wait = None;
            if exact {
                match cache.lookup(&c.key, c.limit, now) {
                    Lookup::Miss => {}
                    Lookup::Denied(d) => wait = Some(d),
                    Lookup::Wait(_) if leads_counter(&leads, counters, c) => {}
                    Lookup::Wait(done) => pending = pending.or(Some(done)),
                    Lookup::Lead(refresh) => leads.push((i, refresh)),
                }
            }
            denied |= wait.is_some();
            waits.push(wait);
        }
        if denied {
            return Consult::Deny(local_deny(counters, waits));
        }
        match pending {
            // Leads taken in this round are dropped here, so their counters are handed over.
            Some(done) => Consult::Wait(done),
            None => Consult::Ask(leads),
        }
    }

    /// Asks the cluster: one part per slot, each in its slot's next script call, concurrently; if
    /// any slot denies, the hits the others recorded are taken back (see the module docs).
    async fn ask_cluster(
        &self,
        lane: &Arc<Lane<ClusterConnection>>,
        counters: &[Counter],
        deadline: Instant,
    ) -> Result<Reply, StoreError> {
        let keys: Vec<String> = counters.iter().map(|c| self.redis_key(&c.key)).collect();
        let id = self.ids.next();
        let groups = group_by_slot(&keys);
        let cross_slot = groups.len() > 1;
        // Each slot's counters, in the order the script answers for them.
        let calls = groups.iter().map(|(slot, group)| {
            let counters = group.iter().map(|&i| counters[i].clone()).collect();
            self.ask(
                lane,
                id.clone(),
                cross_slot,
                Some(*slot),
                counters,
                deadline,
            )
        });
        let answers = join_all(calls).await;

        let mut results: Vec<Option<Reported>> = vec![None; counters.len()];
        let mut allowed = true;
        let mut failure = None;
        // Counters whose hits were recorded by an allowing group (with the bucket, for bucket
        // counters): what to take back on a deny.
        let mut recorded: Vec<(usize, Option<u64>)> = Vec::new();
        for ((_, group), answer) in groups.iter().zip(answers) {
            match answer {
                Ok(reply) => {
                    allowed &= reply.allowed;
                    for (&i, r) in group.iter().zip(reply.counters) {
                        if reply.allowed && !r.result.over_limit && counters[i].hits > 0 {
                            recorded.push((i, r.bucket));
                        }
                        results[i] = Some(r);
                    }
                }
                Err(e) => {
                    allowed = false;
                    failure.get_or_insert(e);
                }
            }
        }
        if !allowed && !recorded.is_empty() {
            self.take_back(&lane.conn, &keys, counters, &recorded, &id)
                .await;
            // Each counter of an admitting slot reported its key's hits up to it, this request's
            // included: take back all of them that were recorded on that key before it or by it.
            for (i, result) in results.iter_mut().enumerate() {
                let taken: u64 = recorded
                    .iter()
                    .filter(|&&(j, _)| j <= i && keys[j] == keys[i])
                    .map(|&(j, _)| counters[j].hits)
                    .sum();
                if let (Some(Reported { result: r, .. }), true) = (result.as_mut(), taken > 0) {
                    r.count = r.count.saturating_sub(taken);
                    r.remaining = counters[i].limit.saturating_sub(r.count);
                    if r.count == 0 {
                        r.reset_after = Duration::ZERO;
                    }
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let counters = results
            .into_iter()
            .map(|r| r.ok_or_else(|| StoreError::Backend("missing counter result".into())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Reply { allowed, counters })
    }

    /// The compensation of a denied cross-slot request: removes the members it recorded. Runs as
    /// its own task so that it completes even if the caller gives up (timeout) meanwhile. A failure
    /// is logged and leaves the hits to expire (over-counting, never over-admitting).
    async fn take_back(
        &self,
        conn: &ClusterConnection,
        keys: &[String],
        counters: &[Counter],
        recorded: &[(usize, Option<u64>)],
        id: &str,
    ) {
        // Hits are numbered per key across the request (a counter may be named twice; a bucket
        // counter named twice took both in one bucket).
        let mut per_key: Vec<(String, u64, Option<u64>)> = Vec::new();
        for &(i, bucket) in recorded {
            match per_key.iter_mut().find(|(k, _, _)| *k == keys[i]) {
                Some((_, hits, _)) => *hits += counters[i].hits,
                None => per_key.push((keys[i].clone(), counters[i].hits, bucket)),
            }
        }
        // From the counter, then from its provisional log, where a cross-slot part's hits also go.
        // In this order: a counter whose log lost them first would look full for good to a call
        // in between, which a deny cache would then keep. If the first fails, the hits stay in
        // both (never cached as full) until they leave the window. A bucket counter's come off
        // the bucket the script reported, from both hashes in one script.
        let removals: Vec<Vec<::redis::Cmd>> = per_key
            .into_iter()
            .map(|(key, hits, bucket)| {
                let log = format!("{key}{}", script::PROVISIONAL_SUFFIX);
                if let Some(bucket) = bucket {
                    return vec![script::take_back_buckets(&key, &log, bucket, hits)];
                }
                let members = script::members(id, hits);
                let zrem = |key: &str| ::redis::cmd("ZREM").arg(key).arg(&members).clone();
                vec![zrem(&key), zrem(&log)]
            })
            .collect();
        let conn = conn.clone();
        let redactor = self.shared.redactor.clone();
        let task = tokio::spawn(async move {
            let calls = removals.into_iter().map(|cmds| {
                let mut conn = conn.clone();
                async move {
                    for cmd in cmds {
                        cmd.query_async::<i64>(&mut conn).await?;
                    }
                    Ok::<_, RedisError>(())
                }
            });
            for result in join_all(calls).await {
                if let Err(e) = result {
                    tracing::warn!(
                        error = %redactor.clean(&e.to_string()),
                        "could not take back the hits of a denied cross-slot request; they expire with their window"
                    );
                }
            }
        });
        let _ = task.await;
    }

    async fn cluster_lane<'a>(
        &self,
        client: &ClusterClient,
        lane: &'a OnceCell<Arc<Lane<ClusterConnection>>>,
    ) -> Result<&'a Arc<Lane<ClusterConnection>>, StoreError> {
        lane.get_or_try_init(|| async {
            let conn = client
                .get_async_generic_connection::<cluster::Observed>()
                .await?;
            Ok(Lane::new(conn, true))
        })
        .await
        .map_err(|e| self.error(e))
    }

    async fn decide_inner(
        &self,
        counters: &[Counter],
        deadline: Instant,
    ) -> Result<Decision, StoreError> {
        if counters.is_empty() {
            return Ok(Decision {
                allowed: true,
                counters: Vec::new(),
            });
        }
        let refreshes = match self.consult(counters).await {
            ControlFlow::Break(local_deny) => return Ok(local_deny),
            ControlFlow::Continue(refreshes) => refreshes,
        };
        let sent = Instant::now();
        let reply = match &self.conn {
            Conn::Standalone(lanes) => {
                let id = self.ids.next();
                self.ask(lanes.get(), id, false, None, counters.to_vec(), deadline)
                    .await?
            }
            Conn::Sentinel(lanes) => {
                let id = self.ids.next();
                self.ask(lanes.get(), id, false, None, counters.to_vec(), deadline)
                    .await?
            }
            Conn::Cluster(cluster) => {
                let Cluster { client, lanes } = &**cluster;
                let lane = self.cluster_lane(client, lanes.get()).await?;
                self.ask_cluster(lane, counters, deadline).await?
            }
        };
        self.remember(counters, &reply, sent, refreshes);
        Ok(Decision {
            allowed: reply.allowed,
            counters: reply.counters.into_iter().map(|r| r.result).collect(),
        })
    }

    /// `PING`s the node; the answer (or its absence) also updates the node's state.
    async fn ping_inner(&self) -> Result<(), StoreError> {
        let shared = &self.shared;
        match &self.conn {
            Conn::Standalone(lanes) => shared.ping(&lanes.get().conn).await,
            Conn::Sentinel(lanes) => shared.ping(&lanes.get().conn).await,
            Conn::Cluster(cluster) => {
                let Cluster { client, lanes } = &**cluster;
                let lane = self
                    .cluster_lane(client, lanes.get())
                    .await
                    .inspect_err(|e| {
                        if matches!(e, StoreError::Connection(_) | StoreError::Timeout(_)) {
                            shared.node.unreachable();
                        }
                    })?;
                shared.ping(&lane.conn).await
            }
        }
    }

    fn error(&self, e: RedisError) -> StoreError {
        self.shared.error(e)
    }

    async fn with_timeout<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.shared.timeout;
        let result = tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(timeout)));
        if let Err(StoreError::Timeout(_)) = &result {
            self.shared.node.unreachable();
        }
        result
    }
}

/// Whether `e` means the connection could not be made or is gone (rather than an answer).
fn connection_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
}

impl Shared {
    /// Maps a client error to a [`StoreError`] whose text holds no password.
    fn error(&self, e: RedisError) -> StoreError {
        let text = self.redactor.clean(&e.to_string());
        if e.is_timeout() {
            StoreError::Timeout(self.timeout)
        } else if e.code() == Some("OOM") {
            StoreError::OutOfMemory(format!("{}: {text}", self.endpoint))
        } else if connection_lost(&e) {
            StoreError::Connection(format!("{}: {text}", self.endpoint))
        } else {
            StoreError::Backend(format!("{}: {text}", self.endpoint))
        }
    }

    /// What a call's answer (or failure) tells about the node: up when it answered, down when it
    /// could not be reached; an answer after an outage (or the first) has its eviction policy
    /// checked, an OOM refusal is logged.
    fn note<C: LaneConn>(&self, conn: &C, result: Result<(), &StoreError>) {
        match result {
            Err(StoreError::Connection(_) | StoreError::Timeout(_)) => self.node.unreachable(),
            other => {
                if let Err(StoreError::OutOfMemory(text)) = other {
                    self.node.out_of_memory(text);
                }
                if self.node.answered() {
                    self.node
                        .check_policy(conn.clone(), self.redactor.clone(), self.timeout);
                }
            }
        }
    }

    async fn ping<C: LaneConn>(&self, conn: &C) -> Result<(), StoreError> {
        let result = ::redis::cmd("PING")
            .query_async::<::redis::Value>(&mut conn.clone())
            .await
            .map(|_| ())
            .map_err(|e| self.error(e));
        self.note(conn, result.as_ref().map(|_| ()));
        result
    }

    /// A reply that came after the callers had given up: counts whether the call expired or ran
    /// (and so recorded the hits of the requests it admitted).
    fn late(&self, slot: Option<Slot>, sent: Instant, reply: &[u8]) {
        let Some((now, expired)) = script::header(reply) else {
            return;
        };
        self.clocks.observe(slot, sent, Instant::now(), now);
        if expired {
            self.metrics.deadline_expired();
        } else {
            self.metrics.late_recorded();
        }
    }
}

/// Sends what a [`Lane`] has queued, up to [`MAX_BATCH`] requests of one slot per script call
/// (the calls go out together on the lane's pipelined connection), and hands each request its
/// answer. A request whose caller has gone (timed out, cancelled) before the call is built is
/// left out.
async fn send_queued<C: LaneConn>(lane: Arc<Lane<C>>, shared: Arc<Shared>) {
    let mut queued = std::mem::take(&mut *lane.queue.lock());
    queued.retain(|q| !q.answer.is_closed());
    let calls = batches(queued, shared.max_call_hits)
        .into_iter()
        .map(|batch| send_batch(&lane, &shared, batch));
    join_all(calls).await;
}

/// `queued` in script calls: at most [`MAX_BATCH`] each and at most `max_hits` hits each (but a
/// request alone always), one slot each, in queue order per slot.
fn batches(queued: Vec<Queued>, max_hits: u64) -> Vec<Vec<Queued>> {
    let fits = |batch: &Vec<Queued>, hits: u64, cost: u64| {
        batch.len() < MAX_BATCH && hits.saturating_add(cost) <= max_hits
    };
    if queued.iter().all(|q| q.slot.is_none()) {
        // Standalone: any requests may share a call, so filling calls in order is all there is
        // (a slot map here cost about 370 instructions per call).
        let mut batches: Vec<Vec<Queued>> = Vec::new();
        let mut hits = 0;
        for q in queued {
            let cost = call_cost(&q);
            match batches.last_mut() {
                Some(batch) if fits(batch, hits, cost) => {
                    batch.push(q);
                    hits += cost;
                }
                _ => {
                    batches.push(vec![q]);
                    hits = cost;
                }
            }
        }
        return batches;
    }
    let mut batches: Vec<Vec<Queued>> = Vec::new();
    // The batch still taking requests of each slot, and its hits.
    let mut open: HashMap<Option<Slot>, (usize, u64)> = HashMap::new();
    for q in queued {
        let cost = call_cost(&q);
        match open.get_mut(&q.slot) {
            Some((b, hits)) if fits(&batches[*b], *hits, cost) => {
                *hits += cost;
                batches[*b].push(q);
            }
            _ => {
                open.insert(q.slot, (batches.len(), cost));
                batches.push(vec![q]);
            }
        }
    }
    batches
}

/// What a request adds to a script call's work, as in the limiter's budget: its hits on each
/// exact log, a log checked with 0 and every bucket counter (one field, whatever its hits)
/// counting 1.
fn call_cost(q: &Queued) -> u64 {
    q.counters.iter().fold(0u64, |sum, c| {
        let cost = match c.precision {
            Precision::Exact => c.hits.max(1),
            Precision::Buckets(_) => 1,
        };
        sum.saturating_add(cost)
    })
}

/// One script call for `batch`, each request answered with its part of the reply (or the error).
///
/// The call carries its callers' earliest deadline in the server's clock (see the `deadline`
/// module): if it reaches Redis later, the script decides nothing. When the call outlives the
/// timeout its callers are answered at once, and the task waits on (up to [`LATE_REPLY_WAIT`])
/// for the late reply, to count whether the call expired or recorded hits.
async fn send_batch<C: LaneConn>(lane: &Lane<C>, shared: &Shared, batch: Vec<Queued>) {
    let slot = batch.first().and_then(|q| q.slot);
    let deadline = batch.iter().map(|q| q.deadline).min();
    let (answers, requests): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|q| (q.answer, (q.id, q.provisional, q.counters)))
        .unzip();
    let parts: Vec<CallPart<'_>> = requests
        .iter()
        .map(|(id, provisional, counters)| CallPart {
            id,
            provisional: *provisional,
            counters,
        })
        .collect();
    let redis_deadline = deadline.map_or(0, |d| shared.clocks.deadline(slot, d));
    let cmd = script::command(&shared.prefix, lane.cluster, redis_deadline, &parts);
    let mut conn = lane.conn.clone();
    let sent = Instant::now();
    let mut call = std::pin::pin!(script::run(&mut conn, &cmd));
    let Ok(reply) = tokio::time::timeout(shared.timeout, call.as_mut()).await else {
        // By the timeout every caller of the batch has given up (each one's own timeout started
        // before the call was sent): answer them now, or a frozen Redis would hold every request
        // it was sent.
        for answer in answers {
            let _ = answer.send(Err(StoreError::Timeout(shared.timeout)));
        }
        shared.metrics.call(CallResult::Timeout, None);
        shared.node.unreachable();
        // Only the reply's header matters now: free the requests while waiting (a frozen Redis
        // may hold thousands of calls).
        drop(parts);
        drop(requests);
        if shared.late_waiters.fetch_add(1, Ordering::Relaxed) < MAX_LATE_WAITERS
            && let Ok(Ok(reply)) = tokio::time::timeout(LATE_REPLY_WAIT, call).await
        {
            shared.late(slot, sent, &reply);
        }
        shared.late_waiters.fetch_sub(1, Ordering::Relaxed);
        return;
    };
    let received = Instant::now();
    let parsed = reply
        .map_err(|e| shared.error(e))
        .and_then(|reply| script::parse(&reply, &parts));
    let (result, outcome) = match parsed {
        Ok(script::Answer { now, replies }) => {
            shared.clocks.observe(slot, sent, received, now);
            match replies {
                Some(replies) => (Ok(replies), CallResult::Ok),
                None => {
                    shared.metrics.deadline_expired();
                    (
                        Err(StoreError::Timeout(shared.timeout)),
                        CallResult::Expired,
                    )
                }
            }
        }
        Err(e) => {
            let outcome = call_result(&e);
            (Err(e), outcome)
        }
    };
    shared.metrics.call(outcome, Some(received - sent));
    shared.note(&lane.conn, result.as_ref().map(|_| ()));
    match result {
        Ok(replies) => {
            for (answer, reply) in answers.into_iter().zip(replies) {
                let _ = answer.send(Ok(reply));
            }
        }
        Err(e) => {
            for answer in answers {
                let _ = answer.send(Err(e.clone()));
            }
        }
    }
}

/// The `slidegate_redis_calls_total` result of a failed call.
fn call_result(e: &StoreError) -> CallResult {
    match e {
        StoreError::Timeout(_) => CallResult::Timeout,
        StoreError::Connection(_) => CallResult::Connection,
        StoreError::OutOfMemory(_) => CallResult::Oom,
        StoreError::Backend(_) => CallResult::Backend,
    }
}

/// What the deny cache says about a request.
enum Consult {
    /// An enforced counter is known to be full.
    Deny(Decision),
    /// Another request is asking Redis about one of the counters: wait for it, then look again.
    Wait(tokio::sync::watch::Receiver<()>),
    /// Ask Redis; the refreshes this request leads are released once the answer is cached.
    Ask(Vec<(usize, Refresh)>),
}

/// How long one more hit cannot fit in a counter after this answer, if it cannot fit now.
///
/// Denied: what Redis computed (nothing was recorded). Admitted and now full: one hit fits when
/// the oldest hit leaves, which is the counter's `reset_after`. Either way the time was measured
/// by Redis after the request was sent, so `sent + wait` is never later than the truth.
fn full_for(reported: &Reported, allowed: bool) -> Option<Duration> {
    if reported.provisional {
        return None;
    }
    let r = &reported.result;
    if allowed && !r.over_limit {
        (r.remaining == 0 && !r.reset_after.is_zero()).then_some(r.reset_after)
    } else {
        reported.one_hit_fits_in
    }
}

/// Whether `leads` (this request's refreshes so far) holds `counter`'s cache entry.
fn leads_counter(leads: &[(usize, Refresh)], counters: &[Counter], counter: &Counter) -> bool {
    leads
        .iter()
        .any(|(j, _)| counters[*j].key == counter.key && counters[*j].limit == counter.limit)
}

/// The decision for a request denied from the cache (see [`RedisStore::consult_cache`]).
fn local_deny(counters: &[Counter], waits: Vec<Option<Duration>>) -> Decision {
    let counters = counters
        .iter()
        .zip(waits)
        .map(|(c, wait)| match wait {
            Some(wait) => CounterResult {
                over_limit: true,
                count: c.limit,
                remaining: 0,
                reset_after: if c.hits > c.limit { c.window } else { wait },
            },
            None => CounterResult {
                over_limit: false,
                count: 0,
                remaining: c.limit,
                reset_after: Duration::ZERO,
            },
        })
        .collect();
    Decision {
        allowed: false,
        counters,
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn decide(&self, counters: &[Counter]) -> Result<Decision, StoreError> {
        let deadline = Instant::now() + self.shared.timeout;
        self.with_timeout(self.decide_inner(counters, deadline))
            .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.with_timeout(self.ping_inner()).await
    }

    fn kind(&self) -> &'static str {
        match self.conn {
            Conn::Standalone(_) => "redis",
            Conn::Sentinel(_) => "redis-sentinel",
            Conn::Cluster(_) => "redis-cluster",
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("kind", &self.kind())
            .field("endpoint", &self.shared.endpoint)
            .field("prefix", &self.shared.prefix)
            .field("timeout", &self.shared.timeout)
            .field("deny_cache", &self.deny_cache.is_some())
            .finish()
    }
}

/// Parses a URL and sets what slidegate wants on every connection: `TCP_NODELAY` (one small
/// command per request; Nagle's algorithm would add latency) and `TCP_USER_TIMEOUT`, and no
/// `CLIENT SETINFO` (Redis before 7.2 rejects it). A parse error never shows the URL.
fn connection_info(url: &str) -> Result<ConnectionInfo, StoreError> {
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

fn tcp_settings() -> TcpSettings {
    TcpSettings::default()
        .set_nodelay(true)
        .set_user_timeout(TCP_USER_TIMEOUT)
}

/// Indices of `keys` grouped by cluster slot, in first-seen order.
fn group_by_slot(keys: &[String]) -> Vec<(Slot, Vec<usize>)> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Precision;

    #[test]
    fn windows_of_one_descriptor_share_a_slot() {
        let a = CounterKey::new("api", [("user", "alice")], Duration::from_secs(1));
        let b = CounterKey::new("api", [("user", "alice")], Duration::from_secs(60));
        let c = CounterKey::new("api", [("user", "bob")], Duration::from_secs(1));
        let keys: Vec<String> = [a, b, c]
            .iter()
            .map(|k| format!("{DEFAULT_PREFIX}{}", k.as_str()))
            .collect();
        let groups: Vec<Vec<usize>> = group_by_slot(&keys).into_iter().map(|(_, g)| g).collect();
        assert_eq!(groups, vec![vec![0, 1], vec![2]]);
    }

    #[test]
    fn batches_hold_one_slot_and_at_most_max_batch_in_queue_order() {
        let queued = |slot: Option<u16>, id: String| Queued {
            id,
            provisional: false,
            slot: slot.and_then(Slot::new),
            counters: Vec::new(),
            deadline: Instant::now(),
            answer: oneshot::channel().0,
        };
        let ids = |batches: Vec<Vec<Queued>>| -> Vec<Vec<String>> {
            batches
                .into_iter()
                .map(|b| b.into_iter().map(|q| q.id).collect())
                .collect()
        };
        let standalone = (0..20).map(|i| queued(None, i.to_string())).collect();
        let batched = ids(batches(standalone, DEFAULT_MAX_CALL_HITS));
        assert_eq!(batched.iter().map(Vec::len).collect::<Vec<_>>(), [16, 4]);
        assert_eq!(
            (batched[0][0].as_str(), batched[1][3].as_str()),
            ("0", "19")
        );
        let cluster = [(7, "a"), (9, "b"), (7, "c"), (9, "d"), (3, "e")]
            .into_iter()
            .map(|(slot, id)| queued(Some(slot), id.to_string()))
            .collect();
        assert_eq!(
            ids(batches(cluster, DEFAULT_MAX_CALL_HITS)),
            [vec!["a", "c"], vec!["b", "d"], vec!["e"]]
        );
        let one_slot = (0..33).map(|i| queued(Some(5), i.to_string())).collect();
        let sizes: Vec<usize> = batches(one_slot, DEFAULT_MAX_CALL_HITS)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, [16, 16, 1]);
    }

    #[test]
    fn batches_add_up_to_at_most_max_call_hits() {
        let counted = |slot: Option<u16>, hits: u64, precision: Precision| Queued {
            id: hits.to_string(),
            provisional: false,
            slot: slot.and_then(Slot::new),
            counters: vec![Counter {
                key: CounterKey::new("d", [("k", "v")], Duration::from_secs(1)),
                limit: u64::MAX,
                window: Duration::from_secs(1),
                hits,
                shadow: false,
                precision,
            }],
            deadline: Instant::now(),
            answer: oneshot::channel().0,
        };
        let queued = |slot: Option<u16>, hits: u64| counted(slot, hits, Precision::Exact);
        for slot in [None, Some(5)] {
            // 4096 hits per call: 3000 + 1000 + 0 (counts 1) fill one, 4000 starts the next,
            // and a request over the bound goes alone.
            let queue = [3000, 1000, 0, 4000, 96, 5000, 1]
                .map(|hits| queued(slot, hits))
                .into_iter()
                .collect();
            let sizes: Vec<usize> = batches(queue, DEFAULT_MAX_CALL_HITS)
                .iter()
                .map(Vec::len)
                .collect();
            assert_eq!(sizes, [3, 2, 1, 1], "slot {slot:?}");
            // A bucket counter costs 1 whatever its hits (one field): 4096 of them fill a call
            // only by their number, so these three share one.
            let width = Precision::Buckets(Duration::from_millis(100));
            let queue = [4000, 1_000_000, 4096]
                .map(|hits| counted(slot, hits, width))
                .into_iter()
                .collect();
            assert_eq!(
                batches(queue, DEFAULT_MAX_CALL_HITS).len(),
                1,
                "slot {slot:?}"
            );
        }
    }

    #[tokio::test]
    async fn bad_options_are_errors_without_secrets() {
        let opts = RedisOptions {
            prefix: "a{b".into(),
            ..RedisOptions::default()
        };
        let err = RedisStore::connect(&opts).await.unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");

        let opts = RedisOptions {
            url: "redis://user:hunter2@[bad".into(),
            ..RedisOptions::default()
        };
        let err = RedisStore::connect(&opts).await.unwrap_err().to_string();
        assert!(!err.contains("hunter2") && err.contains("***"), "{err}");

        let opts = RedisOptions {
            url: "rediss://user:hunter2@localhost:1".into(),
            tls_ca_file: Some("/nonexistent/ca.pem".into()),
            ..RedisOptions::default()
        };
        let err = RedisStore::connect(&opts).await.unwrap_err().to_string();
        assert!(err.contains("CA file") && !err.contains("hunter2"), "{err}");
        assert!(!format!("{opts:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn unreachable_redis_fails_fast_with_a_connection_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let opts = RedisOptions {
            url: format!("redis://:hunter2@127.0.0.1:{port}"),
            timeout: Duration::from_millis(300),
            ..RedisOptions::default()
        };
        let store = RedisStore::connect(&opts).await.expect("lazy connect");
        let counter = Counter {
            key: CounterKey::new("d", [], Duration::from_secs(1)),
            limit: 1,
            window: Duration::from_secs(1),
            hits: 1,
            shadow: false,
            precision: Precision::Exact,
        };
        let started = Instant::now();
        let err = store.decide(&[counter]).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(
            matches!(err, StoreError::Connection(_) | StoreError::Timeout(_)),
            "{err:?}"
        );
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{store:?}").contains("hunter2"));
    }
}
