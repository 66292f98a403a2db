//! The Redis store: one sorted set (or, for buckets, one hash) per counter, at most one Lua script
//! call per request.
//!
//! # Algorithm
//! A counter is a sorted set under `prefix + CounterKey` (`slidegate:{api:user=alice}60000`):
//! score = time of a hit in microseconds, member = a unique hit id (see [`script::RequestIds`]:
//! a random per-store instance id plus a sequence number, base 62, about 12 bytes; hit `n > 1` of
//! a request appends `:n`). One `EVALSHA` of the script in `sliding_window/` does, for all
//! counters of a request: `ZREMRANGEBYSCORE` what left the window, `ZCARD`, decide; then, only if
//! no enforced counter is over, `ZADD` the hits and `PEXPIRE` each key to its window, so an idle
//! key disappears exactly when its last hit leaves the window. The time is Redis's own `TIME`, read inside the
//! script: replicas whose clocks disagree still share one timeline. A counter whose newest hit is
//! later than `TIME` (Redis's clock stepped back, or a failover to a node whose clock is behind)
//! is decided as of that hit, as the memory store does: trimmed as of it, recorded after it
//! (outside a cluster, as of the node's clock, which is at least every counter's newest hit; see
//! the script). One call decides, in order, the requests a worker has started together (up to
//! 16; in a cluster, those of one slot; see `Lane`).
//!
//! Memory on Redis 7.0, measured by the `redis_bytes_per_tracked_hit` test: about 32 bytes per
//! tracked hit (`used_memory`; `MEMORY USAGE` says 26) while a key holds at most 128 hits (Redis
//! keeps it as a compact listpack), about 110 bytes per hit for bigger logs (skiplist encoding).
//! `zset-max-listpack-entries` moves that threshold.
//!
//! A bucket counter ([`Precision::Buckets`](crate::store::Precision), its key ending in `b` and
//! the width) is a hash instead: field = bucket index (Redis time / width), value = hits admitted
//! in that bucket, plus `t` (their sum), `o` (the oldest bucket) and `n` (the newest). The same script call decides
//! it beside the logs: it reads `t` and `o`, deletes the buckets that left the window (the oldest
//! overlapping bucket counts whole), reads the oldest bucket only when it needs its hits (a deny,
//! the reset time), and only if the request is admitted `HINCRBY`s the current bucket and `t`; the
//! hash expires when its newest bucket leaves the window. So a decision costs about what the log's
//! does (docs/benchmarks.md, "Buckets against the log"), however many buckets the window has. It holds at most one field per bucket of the window, whatever the traffic:
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
//! - if the compensation itself fails (node down) or misses its deadline (the store's timeout),
//!   those hits stay until they leave the window: again over-counting, never under-counting. One
//!   that reaches a slow node late takes off a bucket at most what that bucket still holds, so it
//!   never removes the hits of requests admitted meanwhile.
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

mod anchor;
mod batch;
mod board;
mod classify;
mod cluster;
mod consult;
mod cross_slot;
mod deadline;
mod deny_cache;
mod metrics;
mod node;
mod options;
mod password;
mod per_thread;
mod redact;
mod resets;
pub mod script;
pub mod sentinel;
#[cfg(test)]
mod tests;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use ::redis::aio::ConnectionManager;
use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_routing::Slot;
use ::redis::{ConnectionInfo, RedisError, TlsCertificates};
use async_trait::async_trait;
use tokio::sync::{OnceCell, oneshot};

use cluster::ClusterConnection;
pub use cluster::{Redirections, redirections};
use deadline::ServerClocks;
pub use deny_cache::{DenyCache, Lookup, Refresh};
use node::NodeHealth;
pub use node::SAFE_POLICIES;
use per_thread::PerThread;
pub use redact::{Redactor, redact_url};
use script::{Reply, RequestIds};
pub use sentinel::SentinelOptions;
use sentinel::{PrimaryConn, Sentinels};

use batch::{Lane, LaneConn, Queued, send_queued};
pub use metrics::{CallResult, RedisMetrics};
pub use options::{
    ClientCertFiles, DEFAULT_DENY_CACHE, DEFAULT_MAX_CALL_HITS, DEFAULT_PREFIX, DEFAULT_TIMEOUT,
    RedisOptions,
};
use options::{connection_info, manager_config, resp3, tcp_settings, tls_certificates};
use password::PasswordFile;

use super::{
    Counter, CounterKey, CounterResult, Decided, Decision, Store, StoreError, checks_of,
    decided_forms,
};

/// Builds the Redis store the options describe: cluster when seed nodes are given, else standalone.
/// Fails only on bad options (URL, prefix, CA file); an unreachable Redis is not an error here
/// (the store connects lazily and reconnects), so call [`Store::ping`] to report it at startup.
/// With a deny cache, it follows the resets other replicas make (the `resets` module).
pub async fn connect(opts: &RedisOptions) -> Result<Arc<dyn Store>, StoreError> {
    let store = Arc::new(RedisStore::connect(opts).await?);
    resets::spawn_follower(&store);
    Ok(store)
}

/// Longest wait of the health probe ([`Store::ping`]), connecting included; below the health
/// check's own bound (`service::health`).
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);

/// The Redis store, standalone or cluster. See the module docs.
pub struct RedisStore {
    conn: Conn,
    ids: RequestIds,
    deny_cache: Option<DenyCache>,
    /// The reset generation last read, for the deny cache (the `resets` module).
    resets: resets::Generation,
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
    /// Which script this store's servers run (with or without the Redis 7 header).
    dialect: script::Dialect,
    /// A cluster store: cluster answers (`MOVED`, `CROSSSLOT`...) are its client's to follow; on
    /// any other they mean a cluster node named as a standalone server, as "cluster support
    /// disabled" on a cluster store means the reverse (the `classify` module).
    cluster: bool,
}

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
        let password_file = match &opts.password_file {
            Some(path) => {
                if infos
                    .iter()
                    .any(|i| i.redis_settings().password().is_some())
                {
                    return Err(StoreError::Backend(format!(
                        "{endpoint} carries a password and --redis-password-file gives another: \
                         give it in one place"
                    )));
                }
                let username = infos.first().and_then(|i| i.redis_settings().username());
                let (file, password) = PasswordFile::open(path, username)?;
                redactor.add(&password);
                infos = infos
                    .into_iter()
                    .map(|info| {
                        let redis = info.redis_settings().clone().set_password(&password);
                        info.set_redis_settings(redis)
                    })
                    .collect();
                Some(file)
            }
            None => None,
        };
        let certs = tls_certificates(opts)?;
        if let Some(sentinel) = &opts.sentinel {
            let primary = infos.remove(0);
            return Self::connect_sentinel(opts, sentinel, primary, password_file, certs, redactor)
                .await;
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
            let info = resp3(infos.remove(0));
            let client = match certs {
                Some(certs) => ::redis::Client::build_with_tls(info, certs),
                None => ::redis::Client::open(info),
            }
            .map_err(clean)?;
            let config = manager_config(opts, password_file.as_ref());
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
            if let Some(file) = password_file {
                builder = builder.set_credentials_provider(file);
            }
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
            resets: resets::Generation::default(),
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
                dialect: script::Dialect::default(),
                cluster,
            }),
        }
    }

    /// The store on the primary that the sentinels name (see the `sentinel` module): one lane per
    /// thread, as standalone. Fails when no sentinel names a usable primary within
    /// [`sentinel::LOOKUP_TIMEOUT`].
    /// `primary` is `--redis-url` parsed (with the password file's password, if any).
    async fn connect_sentinel(
        opts: &RedisOptions,
        sentinel: &SentinelOptions,
        primary: ConnectionInfo,
        password_file: Option<PasswordFile>,
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
            primary,
            certs,
            manager_config(opts, password_file.as_ref()),
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
        let epoch = self.deny_cache.as_ref().map_or(0, DenyCache::epoch);
        let reply = self.ask_redis(counters, deadline).await?;
        self.remember(counters, &reply, (sent, epoch), refreshes);
        Ok(Decision {
            allowed: reply.allowed,
            counters: reply.counters.into_iter().map(|r| r.result).collect(),
        })
    }

    /// One request's counters decided by Redis itself (the script), past the deny cache.
    async fn ask_redis(
        &self,
        counters: &[Counter],
        deadline: Instant,
    ) -> Result<Reply, StoreError> {
        match &self.conn {
            Conn::Standalone(lanes) => {
                let id = self.ids.next();
                self.ask(lanes.get(), id, false, None, counters.to_vec(), deadline)
                    .await
            }
            Conn::Sentinel(lanes) => {
                let id = self.ids.next();
                self.ask(lanes.get(), id, false, None, counters.to_vec(), deadline)
                    .await
            }
            // Boxed: connecting a lane and the cross-slot path make a future several times the
            // standalone one's, which every request's future would otherwise be sized for.
            Conn::Cluster(cluster) => {
                Box::pin(async move {
                    let Cluster { client, lanes } = &**cluster;
                    let lane = self.cluster_lane(client, lanes.get()).await?;
                    self.ask_cluster(lane, counters, deadline).await
                })
                .await
            }
        }
    }

    /// Probes the node with the script; the answer (or its absence) also updates the node's state.
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
                        if e.is_unreachable() {
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

    /// `call` within `timeout`; a timeout marks the node unreachable.
    ///
    /// Not an `async fn`: one would hold `call` twice (its argument, and the timeout that it is
    /// moved into), doubling a future that every request's box is made of and copies.
    fn with_timeout<'a, T: 'a>(
        &'a self,
        timeout: Duration,
        call: impl Future<Output = Result<T, StoreError>> + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        let timed = tokio::time::timeout(timeout, call);
        async move {
            let result = timed.await.unwrap_or(Err(StoreError::Timeout(timeout)));
            if let Err(StoreError::Timeout(_)) = &result {
                self.shared.node.unreachable();
            }
            result
        }
    }
}

impl Shared {
    /// What a call's answer (or failure) tells about the node: up when it answered, down when it
    /// could not be reached; an answer after an outage (or the first) has its eviction policy
    /// checked, an OOM refusal is logged.
    fn note<C: LaneConn>(&self, conn: &C, result: Result<(), &StoreError>) {
        match result {
            // A node that refuses the credentials decides nothing: down, as for an outage (its
            // own health condition and log say why).
            Err(e) if e.is_unreachable() || matches!(e, StoreError::Auth(_)) => {
                self.node.unreachable()
            }
            other => {
                match other {
                    Err(StoreError::OutOfMemory(text)) => self.node.out_of_memory(text),
                    Err(StoreError::Incompatible(text)) => {
                        self.metrics.incompatible();
                        self.node.incompatible(text);
                    }
                    _ => {}
                }
                if self.node.answered() {
                    self.node
                        .check_policy(conn.clone(), self.redactor.clone(), self.timeout);
                }
            }
        }
    }

    /// The health probe: the script itself, deciding nothing (see [`script::probe`]), so that a
    /// server that answers `PING` but cannot run the script is not taken for a healthy one.
    async fn ping<C: LaneConn>(&self, conn: &C) -> Result<(), StoreError> {
        let probe = script::probe(self.dialect.script(), &self.prefix, self.cluster);
        let result = script::run(&mut conn.clone(), &self.dialect, &probe)
            .await
            .map_err(|e| self.error(e));
        // Redis 7 refuses even the probe at `maxmemory` (the script may write): the server
        // answers and runs the script once memory is freed, so health does not change for it (the
        // calls' refusals are logged and counted).
        if let Err(StoreError::OutOfMemory(_)) = result {
            self.note(conn, Ok(()));
            return Ok(());
        }
        let result = result.and_then(|reply| match script::header(&reply) {
            Some(_) => Ok(()),
            None => Err(StoreError::Incompatible(format!(
                "{}: the sliding-window script answered {} bytes to the health probe",
                self.endpoint,
                reply.len()
            ))),
        });
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

#[async_trait]
impl Store for RedisStore {
    fn decide<'a>(&'a self, counters: &'a [Counter]) -> Decided<'a> {
        Decided::Later(Box::pin(async move {
            // Requests only: the health check's pings and the reset poll come every second and
            // would keep an idle server's anchor ticking.
            anchor::call(self.shared.timeout);
            let deadline = Instant::now() + self.shared.timeout;
            let counters = decided_forms(counters);
            self.with_timeout(self.shared.timeout, self.decide_inner(&counters, deadline))
                .await
        }))
    }

    /// Waits for connecting and authenticating up to [`PROBE_TIMEOUT`], not the call deadline: the startup check and health then name what happened (a
    /// refused password, a name that does not resolve, nothing listening) where a 50 ms deadline
    /// would only say it ran out, and a Redis a slow handshake away still counts as up.
    async fn ping(&self) -> Result<(), StoreError> {
        self.with_timeout(PROBE_TIMEOUT, self.ping_inner()).await
    }

    async fn clear(&self, keys: &[CounterKey]) -> Result<Vec<bool>, StoreError> {
        self.clear_keys(keys).await
    }

    async fn post(
        &self,
        board: &str,
        author: &str,
        note: &str,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.post_note(board, author, note, ttl).await
    }

    async fn notes(&self, board: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.read_notes(board).await
    }

    /// Asks Redis, never the deny cache, and tells the cache nothing: the cache remembers when
    /// one more hit fits, not what a counter holds.
    async fn peek(&self, counters: &[Counter]) -> Result<Vec<CounterResult>, StoreError> {
        let deadline = Instant::now() + self.shared.timeout;
        let checks = checks_of(counters);
        let checks = decided_forms(&checks);
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let reply = self
            .with_timeout(self.shared.timeout, self.ask_redis(&checks, deadline))
            .await?;
        Ok(reply.counters.into_iter().map(|r| r.result).collect())
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
