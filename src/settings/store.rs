//! Where the counters live: this process's memory, or Redis (standalone, Cluster, Sentinel).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{LOG_TARGET, spelled};
use crate::metrics::Metrics;
use crate::store::memory::{MemoryBudget, default_max_bytes};
use crate::store::{
    ClientCertFiles, DEFAULT_DENY_CACHE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, MemoryStore,
    RedisOptions, SentinelOptions, Store, StoreError, SystemClock, connect, redact_url,
};

/// A size such as `64MiB`, `1GB` or `1048576` (bytes).
fn parse_bytes(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|e| format!("{e} (a size such as 64MiB, 1GB or 1048576)"))
}

/// How often the memory store drops the counters whose windows have passed.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// The store cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The error names the sentinels and the master; the rest of the options add nothing.
    #[error("cannot find the Redis primary through Redis Sentinel")]
    Sentinel(#[source] StoreError),
    #[error("invalid store settings ({options})")]
    Invalid {
        options: String,
        #[source]
        source: StoreError,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct StoreSettings {
    /// Redis server, `redis://[user:pass@]host:port[/db]` or `rediss://` for TLS. Without it (and
    /// without --redis-cluster or --redis-sentinel) counters live in this process's memory.
    #[arg(long, env = "SLIDEGATE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Redis Cluster seed nodes, comma-separated URLs; selects the cluster store.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_CLUSTER",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub redis_cluster: Vec<String>,
    /// Redis Sentinel: comma-separated sentinels, `HOST:PORT` (or `rediss://HOST:PORT` for TLS,
    /// with --redis-tls-ca-file and the client certificate as for Redis). The store uses the
    /// primary they name for --redis-sentinel-master and follows it through failovers;
    /// --redis-url then gives only the primary's password, database and TLS
    /// (`rediss://:PASSWORD@mymaster/0`; its host is not used).
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_SENTINEL",
        value_delimiter = ',',
        hide_env_values = true,
        conflicts_with = "redis_cluster",
        requires = "redis_sentinel_master"
    )]
    pub redis_sentinel: Vec<String>,
    /// The master name the sentinels monitor (`sentinel monitor NAME ...`), e.g. `mymaster`.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_SENTINEL_MASTER",
        requires = "redis_sentinel"
    )]
    pub redis_sentinel_master: Option<String>,
    /// Password of the sentinels (their `requirepass`), if they need one.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_SENTINEL_PASSWORD",
        hide_env_values = true,
        requires = "redis_sentinel"
    )]
    pub redis_sentinel_password: Option<String>,
    /// File holding the Redis password (of --redis-url, the primary, or the --redis-cluster nodes),
    /// e.g. a mounted Kubernetes Secret; the URLs then carry none. Read at start and again at every
    /// connection, so a rotated password needs no restart.
    #[arg(long, env = "SLIDEGATE_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,
    /// Upper bound for every Redis call, e.g. `50ms`; a slower call is a store failure.
    #[arg(long, env = "SLIDEGATE_REDIS_TIMEOUT", default_value = spelled!(DEFAULT_TIMEOUT), value_parser = humantime::parse_duration)]
    pub redis_timeout: Duration,
    /// Prefix of every Redis key (must not contain `{` or `}`).
    #[arg(long, env = "SLIDEGATE_REDIS_PREFIX", default_value = DEFAULT_PREFIX)]
    pub redis_prefix: String,
    /// PEM file of CA certificates to trust for `rediss://` instead of the system roots.
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_CA_FILE")]
    pub redis_tls_ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to Redis over `rediss://`, for servers started with
    /// `tls-auth-clients yes`; needs --redis-tls-key-file. Read at startup.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_TLS_CERT_FILE",
        requires = "redis_tls_key_file"
    )]
    pub redis_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert-file.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_TLS_KEY_FILE",
        requires = "redis_tls_cert_file"
    )]
    pub redis_tls_key_file: Option<PathBuf>,
    /// Capacity (counters) of the local cache of known denies that saves Redis round trips; 0 turns
    /// it off.
    #[arg(long, env = "SLIDEGATE_REDIS_DENY_CACHE", default_value_t = DEFAULT_DENY_CACHE)]
    pub redis_deny_cache: usize,
    /// Most memory the embedded store holds (keys, logs, buckets), e.g. `64MiB` or `1GB`; at it, a
    /// request that would create a counter is decided over limit, and existing counters decide as
    /// before. Default: half the container's memory limit (cgroup v2 `memory.max`), else 256 MiB.
    #[arg(long, env = "SLIDEGATE_MEMORY_MAX_BYTES", value_parser = parse_bytes)]
    pub memory_max_bytes: Option<u64>,
    /// Keep health (`/healthcheck`, gRPC health) SERVING while the store is unreachable, as
    /// envoyproxy/ratelimit does: for liveness probes that would restart every replica during a
    /// Redis outage. Implied by `--failure-mode allow` or `deny`, which answer through an outage.
    /// A store that answers but cannot run the script is NOT_SERVING either way.
    #[arg(long, env = "SLIDEGATE_HEALTH_IGNORES_STORE_OUTAGE", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub health_ignores_store_outage: bool,
}

impl StoreSettings {
    /// The kind of store the settings select, as the effective settings log it.
    pub fn kind(&self) -> &'static str {
        match () {
            _ if !self.redis_sentinel.is_empty() => "redis-sentinel",
            _ if !self.redis_cluster.is_empty() => "redis-cluster",
            _ if self.redis_url.is_some() => "redis",
            _ => "memory",
        }
    }

    /// The Redis store's options, `None` for the memory store (no URL, cluster nodes or
    /// sentinels). `connections` is one per thread that calls the store; `max_call_hits` the
    /// request budget (`--max-hits`), which a batched call does not exceed. The metrics are
    /// registered nowhere: the caller gives the registered ones.
    pub fn redis_options(&self, connections: usize, max_call_hits: u64) -> Option<RedisOptions> {
        if self.kind() == "memory" {
            return None;
        }
        let sentinel = self.redis_sentinel_master.as_ref().map(|master| {
            let mut sentinel = SentinelOptions::new(self.redis_sentinel.clone(), master);
            sentinel.password = self.redis_sentinel_password.clone();
            sentinel
        });
        Some(RedisOptions {
            url: (self.redis_url.clone()).unwrap_or_else(|| RedisOptions::default().url),
            cluster_nodes: self.redis_cluster.clone(),
            sentinel,
            password_file: self.redis_password_file.clone(),
            prefix: self.redis_prefix.clone(),
            timeout: self.redis_timeout,
            tls_ca_file: self.redis_tls_ca_file.clone(),
            tls_client_cert: (self.redis_tls_cert_file.clone())
                .zip(self.redis_tls_key_file.clone())
                .map(|(cert, key)| ClientCertFiles { cert, key }),
            deny_cache: self.redis_deny_cache,
            connections,
            max_call_hits,
            ..RedisOptions::default()
        })
    }

    /// Opens the store: the memory store, or Redis with [`StoreSettings::redis_options`] as
    /// `registered` completes them (the metrics to count in). A Redis that does not answer yet is
    /// not fatal: the store reconnects, and health reports NOT_SERVING until it answers.
    pub async fn open(
        &self,
        connections: usize,
        max_call_hits: u64,
        metrics: &Metrics,
        registered: impl FnOnce(&mut RedisOptions),
    ) -> Result<Arc<dyn Store>, OpenError> {
        let Some(mut opts) = self.redis_options(connections, max_call_hits) else {
            let max_bytes = self.memory_max_bytes.unwrap_or_else(default_max_bytes);
            let budget = MemoryBudget::new(max_bytes, metrics).map_err(|e| OpenError::Invalid {
                options: "--memory-max-bytes".into(),
                source: StoreError::Backend(e.to_string()),
            })?;
            tracing::info!(target: LOG_TARGET, max_bytes, "memory store budget");
            let store = Arc::new(MemoryStore::with_budget(Arc::new(SystemClock), budget));
            store.spawn_sweeper(SWEEP_INTERVAL);
            return Ok(store);
        };
        registered(&mut opts);
        let store = connect(&opts)
            .await
            .map_err(|source| match &opts.sentinel {
                Some(_) => OpenError::Sentinel(source),
                // The flag, not the options' debug form: the source names the (redacted) URL.
                None => OpenError::Invalid {
                    options: if opts.cluster_nodes.is_empty() {
                        "--redis-url".into()
                    } else {
                        "--redis-cluster".into()
                    },
                    source,
                },
            })?;
        // An incompatible store, or one that refuses the credentials, is logged at `error` by
        // health.
        if let Err(error) = store.ping().await
            && !error.is_configuration()
        {
            tracing::warn!(target: LOG_TARGET, %error, store = store.kind(), "Redis does not answer yet");
        }
        Ok(store)
    }

    /// The URLs without their passwords, for the log: the standalone URL, the cluster nodes and
    /// the sentinels.
    pub(super) fn redacted(&self) -> (Option<String>, String, String) {
        let join = |urls: &[String]| {
            let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
            urls.join(",")
        };
        (
            self.redis_url.as_deref().map(redact_url),
            join(&self.redis_cluster),
            join(&self.redis_sentinel),
        )
    }
}
