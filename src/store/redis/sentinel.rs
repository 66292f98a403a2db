//! Redis Sentinel: the sentinels name the primary, and the store follows them through a failover.
//!
//! # Why it looks like this
//! The standalone store keeps one [`ConnectionManager`] per serving thread (see `per_thread`):
//! each reconnects by itself, but always to the address it was built with. Behind Sentinel that
//! address changes when the sentinels promote a replica, so each thread's connection here is a
//! [`PrimaryConn`]: the thread's `ConnectionManager` to the primary the sentinels named last, and
//! a fresh one (connected lazily, on that thread) as soon as they name another. A script call
//! costs what it costs standalone: no sentinel is asked on the way, only when something fails.
//!
//! # Following a failover
//! The store re-resolves the primary when a call fails on the connection (refused, dropped, I/O)
//! or Redis answers `READONLY` (the server was demoted to a replica in place). Resolving asks
//! every sentinel at once (`SENTINEL MASTERS`, through redis-rs's [`SentinelClient`], one per
//! sentinel so that one that never answers delays nobody) and takes the first primary named by
//! a sentinel that is not flagged down and that answers `ROLE` as a primary itself; redis-rs
//! makes that `ROLE` check. While no sentinel names a usable primary yet (the old one is down
//! and not replaced), it tries again every [`RETRY`], so calls succeed again at most about
//! `RETRY` plus one lookup after the sentinels switch (docs/operations.md, "Redis Sentinel", has the
//! measured figure). Notifications (`+switch-master`) were not used: they would need one more
//! connection per sentinel and still need this path for a primary demoted behind our back.
//!
//! Calls made meanwhile fail as on a standalone server whose Redis is down (`--failure-mode`
//! decides). Nothing is written to a replica: a new address is used only after `ROLE` said it
//! is a primary, and a replica refuses a script's writes with `READONLY` (`replica-read-only`,
//! its default), which the script turns into no decision and the store into a re-resolution.
//!
//! # Startup
//! [`Sentinels::start`] resolves once and fails, within [`LOOKUP_TIMEOUT`], with an error that
//! names the master name and each sentinel tried with what it said (never a password).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};
use arc_swap::ArcSwap;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use prometheus::IntCounter;

use super::{Redactor, StoreError, connection_info, resp3, tcp_settings};

/// Longest one lookup of the primary may take (connecting to a sentinel, asking it, connecting
/// to the primary it names and asking `ROLE`); also the bound of the startup check.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause between lookups while no sentinel names a usable primary.
pub const RETRY: Duration = Duration::from_millis(100);

/// What the CLI says about Sentinel (`--redis-sentinel*`).
#[derive(Clone)]
pub struct SentinelOptions {
    /// `HOST:PORT`, or `redis://HOST:PORT` / `rediss://HOST:PORT` (TLS) entries; a URL may
    /// carry the sentinel's own `user:password@`.
    pub sentinels: Vec<String>,
    /// The master name the sentinels monitor (`sentinel monitor NAME ...`).
    pub master: String,
    /// `requirepass` of the sentinels, for entries without their own.
    pub password: Option<String>,
    /// Counts failovers followed (`slidegate_store_failovers_total`).
    pub failovers: IntCounter,
}

impl SentinelOptions {
    /// Options without a registered failover counter (tests, tools).
    pub fn new(sentinels: Vec<String>, master: &str) -> SentinelOptions {
        SentinelOptions {
            sentinels,
            master: master.to_string(),
            password: None,
            failovers: unregistered_counter(),
        }
    }
}

fn unregistered_counter() -> IntCounter {
    // A constant, valid name: creating it can only fail on a programming error.
    IntCounter::new("slidegate_store_failovers_total", "Failovers followed.")
        .expect("the failover counter's name is valid")
}

impl std::fmt::Debug for SentinelOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| super::redact_url(s))
            .collect();
        f.debug_struct("SentinelOptions")
            .field("sentinels", &sentinels)
            .field("master", &self.master)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The sentinels of one master name, and the primary they named last.
pub struct Sentinels {
    /// One client per sentinel, with the sentinel's address as shown in messages.
    clients: Vec<(String, tokio::sync::Mutex<SentinelClient>)>,
    master: String,
    primary: ArcSwap<Primary>,
    /// A lookup is running (at most one at a time).
    resolving: AtomicBool,
    manager_config: ConnectionManagerConfig,
    failovers: IntCounter,
    redactor: Redactor,
    /// Told the new primary's address after each failover ([`Sentinels::on_failover`]).
    on_failover: std::sync::OnceLock<FailoverHook>,
}

/// What [`Sentinels::on_failover`] calls with the new primary's address.
pub type FailoverHook = Box<dyn Fn(&str) + Send + Sync>;

/// A primary the sentinels named; `generation` changes with the address.
struct Primary {
    generation: u64,
    addr: String,
    client: Client,
}

impl Sentinels {
    /// Builds a client per sentinel and resolves the primary once (see the module docs). The
    /// primary's credentials, database and TLS come from `template` (`--redis-url` parsed; its host
    /// is not used), `certs` apply to every TLS connection, sentinel or primary.
    pub async fn start(
        opts: &SentinelOptions,
        template: ConnectionInfo,
        certs: Option<TlsCertificates>,
        manager_config: ConnectionManagerConfig,
        redactor: &mut Redactor,
    ) -> Result<Arc<Sentinels>, StoreError> {
        if opts.sentinels.is_empty() || opts.master.is_empty() {
            return Err(StoreError::Backend(
                "Redis Sentinel needs at least one sentinel (--redis-sentinel) and a master name \
                 (--redis-sentinel-master)"
                    .into(),
            ));
        }
        if let Some(password) = template.redis_settings().password() {
            redactor.add(password);
        }
        if let Some(password) = &opts.password {
            redactor.add(password);
        }
        let mut clients = Vec::with_capacity(opts.sentinels.len());
        for entry in &opts.sentinels {
            let info = sentinel_info(entry)?;
            if let Some(password) = info.redis_settings().password() {
                redactor.add(password);
            }
            let shown = info.addr().to_string();
            let client = sentinel_client(info, opts, &template, certs.clone()).map_err(|e| {
                StoreError::Backend(format!(
                    "invalid Redis Sentinel options for {shown}: {}",
                    redactor.clean(&e.to_string())
                ))
            })?;
            clients.push((shown, tokio::sync::Mutex::new(client)));
        }
        let mut sentinels = Sentinels {
            clients,
            master: opts.master.clone(),
            primary: ArcSwap::from_pointee(Primary {
                generation: 0,
                addr: String::new(),
                client: Client::open(template).map_err(|e| StoreError::Backend(e.to_string()))?,
            }),
            resolving: AtomicBool::new(false),
            manager_config,
            failovers: opts.failovers.clone(),
            redactor: redactor.clone(),
            on_failover: std::sync::OnceLock::new(),
        };
        let (addr, client) = sentinels.lookup().await?;
        sentinels.primary = ArcSwap::from_pointee(Primary {
            generation: 1,
            addr,
            client,
        });
        Ok(Arc::new(sentinels))
    }

    /// The address of the primary in use, e.g. `127.0.0.1:6379`.
    pub fn primary(&self) -> String {
        self.primary.load().addr.clone()
    }

    /// Shown in messages: the master name and the sentinels.
    pub fn endpoint(&self) -> String {
        let addrs: Vec<&str> = self.clients.iter().map(|(a, _)| a.as_str()).collect();
        format!("sentinel:{}@{}", self.master, addrs.join(","))
    }

    /// Calls `hook` with the new primary's address after each failover followed (the first hook
    /// set stays).
    pub fn on_failover(&self, hook: FailoverHook) {
        let _ = self.on_failover.set(hook);
    }

    /// A connection for one serving thread (connected on first use).
    pub fn connection(self: &Arc<Self>) -> PrimaryConn {
        PrimaryConn {
            sentinels: Arc::clone(self),
            current: Arc::new(parking_lot::Mutex::new(None)),
        }
    }

    /// Asks every sentinel at once for the primary; the first usable answer wins. The error
    /// names the master and what each sentinel said.
    async fn lookup(&self) -> Result<(String, Client), StoreError> {
        let mut asks: FuturesUnordered<_> = self
            .clients
            .iter()
            .map(|(shown, client)| async move {
                let ask = async { client.lock().await.async_get_client().await };
                let answer = match tokio::time::timeout(LOOKUP_TIMEOUT, ask).await {
                    Ok(Ok(client)) => Ok(client),
                    Ok(Err(e)) => Err(self.describe(&e)),
                    Err(_) => Err(format!("no answer within {LOOKUP_TIMEOUT:?}")),
                };
                (shown, answer)
            })
            .collect();
        let mut said = Vec::new();
        while let Some((shown, answer)) = asks.next().await {
            match answer {
                Ok(client) => return Ok(primary_of(client)),
                Err(why) => said.push(format!("{shown}: {why}")),
            }
        }
        Err(StoreError::Connection(format!(
            "no Redis primary for master name {:?} from the sentinels ({})",
            self.master,
            said.join("; ")
        )))
    }

    /// A lookup error in words (without secrets).
    fn describe(&self, e: &RedisError) -> String {
        if e.kind() == ErrorKind::MasterNameNotFoundBySentinel {
            "it knows no master of that name, or reports it down or not a primary".to_string()
        } else {
            self.redactor.clean(&e.to_string())
        }
    }

    /// Looks the primary up again in a task of its own, unless a lookup is running, and keeps
    /// trying every [`RETRY`] until a sentinel names a usable primary.
    fn follow(self: &Arc<Self>) {
        if self.resolving.swap(true, Ordering::AcqRel) {
            return;
        }
        let sentinels = Arc::clone(self);
        tokio::spawn(async move {
            let mut logged = false;
            loop {
                match sentinels.lookup().await {
                    Ok((addr, client)) => {
                        sentinels.install(addr, client);
                        break;
                    }
                    Err(error) if !logged => {
                        logged = true;
                        tracing::warn!(%error, "Redis primary unavailable; asking the sentinels again");
                    }
                    Err(error) => tracing::debug!(%error, "still no Redis primary"),
                }
                tokio::time::sleep(RETRY).await;
            }
            sentinels.resolving.store(false, Ordering::Release);
        });
    }

    /// Uses `addr` from now on if it is not the primary in use (a failover).
    fn install(&self, addr: String, client: Client) {
        let current = self.primary.load();
        if current.addr == addr {
            return;
        }
        tracing::warn!(
            master = %self.master,
            from = %current.addr,
            to = %addr,
            "Redis Sentinel failover: following the new primary"
        );
        self.failovers.inc();
        if let Some(hook) = self.on_failover.get() {
            hook(&addr);
        }
        self.primary.store(Arc::new(Primary {
            generation: current.generation + 1,
            addr,
            client,
        }));
    }
}

/// The client for the primary redis-rs found, with slidegate's settings (see `connection_info`).
fn primary_of(client: Client) -> (String, Client) {
    let info = client.get_connection_info().clone();
    let addr = info.addr().to_string();
    let redis = info.redis_settings().clone().set_skip_set_lib_name();
    let info = resp3(
        info.set_tcp_settings(tcp_settings())
            .set_redis_settings(redis),
    );
    // Opening a client from a parsed ConnectionInfo only checks that TLS is compiled in, which
    // the one we were given already passed.
    (addr, Client::open(info).unwrap_or(client))
}

/// One `--redis-sentinel` entry: `HOST:PORT` or a `redis://` / `rediss://` URL.
fn sentinel_info(entry: &str) -> Result<ConnectionInfo, StoreError> {
    let entry = entry.trim();
    if entry.contains("://") {
        connection_info(entry)
    } else {
        connection_info(&format!("redis://{entry}"))
    }
}

/// The redis-rs client that asks one sentinel for the primary of `opts.master`.
fn sentinel_client(
    sentinel: ConnectionInfo,
    opts: &SentinelOptions,
    primary: &ConnectionInfo,
    certs: Option<TlsCertificates>,
) -> RedisResult<SentinelClient> {
    let tls = matches!(sentinel.addr(), ConnectionAddr::TcpTls { .. });
    let own = sentinel.redis_settings();
    let mut builder = SentinelClientBuilder::new(
        [sentinel.addr().clone()],
        &opts.master,
        SentinelServerType::Master,
    )?
    .set_client_to_sentinel_tcp_settings(tcp_settings())
    .set_client_to_redis_tcp_settings(tcp_settings())
    .set_client_to_redis_db(primary.redis_settings().db());
    if let Some(user) = own.username() {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = own.password().or(opts.password.as_deref()) {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(user) = primary.redis_settings().username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = primary.redis_settings().password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if let ConnectionAddr::TcpTls { insecure, .. } = primary.addr() {
        let mode = if *insecure {
            TlsMode::Insecure
        } else {
            TlsMode::Secure
        };
        builder = builder.set_client_to_redis_tls_mode(mode);
        if let Some(certs) = certs.clone() {
            builder = builder.set_client_to_redis_certificates(certs);
        }
    }
    if let (true, Some(certs)) = (tls, certs) {
        builder = builder.set_client_to_sentinel_certificates(certs);
    }
    builder.build()
}

/// One serving thread's connection to the primary: a [`ConnectionManager`] to the address the
/// sentinels named last, replaced when they name another. Errors that mean "maybe not the
/// primary any more" start a lookup (see the module docs).
#[derive(Clone)]
pub struct PrimaryConn {
    sentinels: Arc<Sentinels>,
    /// The primary's generation and this thread's manager for it.
    current: Arc<parking_lot::Mutex<Option<(u64, ConnectionManager)>>>,
}

impl PrimaryConn {
    /// The manager for the primary in use, made (lazily connected) if the primary changed.
    fn manager(&self) -> RedisResult<ConnectionManager> {
        let primary = self.sentinels.primary.load();
        let mut current = self.current.lock();
        match &*current {
            Some((generation, manager)) if *generation == primary.generation => Ok(manager.clone()),
            _ => {
                let manager = ConnectionManager::new_lazy_with_config(
                    primary.client.clone(),
                    self.sentinels.manager_config.clone(),
                )?;
                *current = Some((primary.generation, manager.clone()));
                Ok(manager)
            }
        }
    }

    /// Starts a lookup if `error` says the primary may have moved.
    fn check(&self, error: &RedisError) {
        if moved(error) {
            self.sentinels.follow();
        }
    }
}

/// Whether an error means the server we write to may not be the primary any more: it cannot be
/// reached, or it answers as a read-only replica.
fn moved(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || super::classify::connection_lost(error)
}

/// Whether a reply is a `READONLY` error (pipelines answer errors in place).
fn read_only_reply(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => e.kind() == Some(ServerErrorKind::ReadOnly),
        _ => false,
    }
}

impl ConnectionLike for PrimaryConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut manager = self.manager()?;
            let result = manager.req_packed_command(cmd).await;
            match &result {
                Err(e) => self.check(e),
                Ok(value) if read_only_reply(value) => self.sentinels.follow(),
                Ok(_) => {}
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut manager = self.manager()?;
            let result = manager.req_packed_commands(pipeline, offset, count).await;
            match &result {
                Err(e) => self.check(e),
                Ok(values) if values.iter().any(read_only_reply) => self.sentinels.follow(),
                Ok(_) => {}
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.sentinels
            .primary
            .load()
            .client
            .get_connection_info()
            .redis_settings()
            .db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_take_host_port_or_urls() {
        let plain = sentinel_info("10.0.0.1:26379").expect("host:port");
        assert!(matches!(plain.addr(), ConnectionAddr::Tcp(h, 26379) if h == "10.0.0.1"));
        let tls = sentinel_info("rediss://:pw@s1:26380").expect("URL");
        assert!(matches!(
            tls.addr(),
            ConnectionAddr::TcpTls { port: 26380, .. }
        ));
        assert_eq!(tls.redis_settings().password(), Some("pw"));
        let err = sentinel_info("redis://:hunter2@[bad")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn read_only_and_connection_errors_mean_the_primary_may_have_moved() {
        let read_only = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(moved(&read_only));
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(moved(&refused));
        let script = RedisError::from((ErrorKind::Server(ServerErrorKind::ResponseError), "ERR x"));
        assert!(!moved(&script));
    }

    #[tokio::test]
    async fn no_sentinel_reachable_is_a_bounded_error_naming_what_was_tried() {
        let ports: Vec<u16> = (0..2)
            .map(|_| {
                std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map(|a| a.port())
                    .expect("port")
            })
            .collect();
        let mut opts = SentinelOptions::new(
            ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            "mymaster",
        );
        opts.password = Some("hunter2".into());
        let started = std::time::Instant::now();
        let err = Sentinels::start(
            &opts,
            connection_info("redis://:s3cret@primary").expect("URL"),
            None,
            ConnectionManagerConfig::new(),
            &mut Redactor::default(),
        )
        .await
        .err()
        .expect("no sentinel answers")
        .to_string();
        assert!(started.elapsed() < LOOKUP_TIMEOUT + Duration::from_secs(1));
        assert!(err.contains("\"mymaster\""), "{err}");
        for port in ports {
            assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
        }
        assert!(!err.contains("hunter2") && !err.contains("s3cret"), "{err}");
    }
}
