//! The `slidegate` command line: `serve` (the default), `check-config` and `bench`. Wiring only: the
//! behaviour lives in the library.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::service::Routes;

use slidegate::config::reload::{ReloadHook, ReloadOutcome, Reloader};
use slidegate::limiter::{Options, RateLimiter, RequestLimits};
use slidegate::metrics::Metrics;
use slidegate::server::grpc::GrpcApp;
use slidegate::server::{Apps, Workers};
use slidegate::service::grpc::{FILE_DESCRIPTOR_SET, GrpcService};
use slidegate::service::health::Health;
use slidegate::service::http::{AppState, router};
use slidegate::store::{
    FailureMode, MemoryStore, RedisOptions, Store, SystemClock, connect, redact_url,
};

/// Sliding-window rate-limit service for Envoy (RateLimitService v3) and nginx.
///
/// Without a subcommand, `serve` runs. Every option can also be set with the environment variable
/// shown in its help.
#[derive(Parser, Debug)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

// Parsed once at startup: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Serves gRPC (Envoy RateLimitService v3, health, reflection) and HTTP (/json, /check,
    /// /healthcheck, /rlconfig, /metrics). The default.
    Serve(ServeArgs),
    /// Checks rule files: prints every error (exit 1), or a summary and every rule with each
    /// limit's window and representation (exact log or buckets of a width) (exit 0).
    CheckConfig {
        /// A rule file, or a directory of `*.yaml`/`*.yml` files.
        path: PathBuf,
    },
    /// Loads any RateLimitService v3 server over gRPC and reports throughput, latency
    /// percentiles and allowed/denied/error counts (text and one JSON line).
    ///
    /// Exit status: 0 when every measured call got an answer (allowed or denied), 3 when the run
    /// finished but some calls failed (the report counts them), 1 when it could not run (nothing
    /// to connect to), 2 for bad arguments.
    Bench(slidegate::bench::BenchArgs),
}

#[derive(Args, Debug, Clone)]
struct ServeArgs {
    /// Rule file or directory of `*.yaml` files; reloaded on change and on SIGHUP.
    #[arg(long, env = "SLIDEGATE_CONFIG", default_value = "config")]
    config: PathBuf,
    /// Address of the gRPC server (RateLimitService, health, reflection).
    #[arg(long, env = "SLIDEGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Address of the HTTP server (/json, /check, /healthcheck, /rlconfig, /metrics).
    #[arg(long, env = "SLIDEGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Redis server, `redis://[user:pass@]host:port[/db]` or `rediss://` for TLS. Without it (and
    /// without --redis-cluster) counters live in this process's memory.
    #[arg(long, env = "SLIDEGATE_REDIS_URL")]
    redis_url: Option<String>,
    /// Redis Cluster seed nodes, comma-separated URLs; selects the cluster store.
    #[arg(long, env = "SLIDEGATE_REDIS_CLUSTER", value_delimiter = ',')]
    redis_cluster: Vec<String>,
    /// Upper bound for every Redis call, e.g. `50ms`; a slower call is a store failure.
    #[arg(long, env = "SLIDEGATE_REDIS_TIMEOUT", default_value = "50ms", value_parser = humantime::parse_duration)]
    redis_timeout: Duration,
    /// Prefix of every Redis key (must not contain `{` or `}`).
    #[arg(long, env = "SLIDEGATE_REDIS_PREFIX", default_value = slidegate::store::DEFAULT_PREFIX)]
    redis_prefix: String,
    /// PEM file of CA certificates to trust for `rediss://` instead of the system roots.
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_CA_FILE")]
    redis_tls_ca_file: Option<PathBuf>,
    /// Capacity (counters) of the local cache of known denies that saves Redis round trips; 0 turns
    /// it off.
    #[arg(long, env = "SLIDEGATE_REDIS_DENY_CACHE", default_value_t = 100_000)]
    redis_deny_cache: usize,
    /// What to answer when the store fails: `error` (gRPC UNAVAILABLE / HTTP 503, the proxy's
    /// failure policy decides), `allow` (fail open) or `deny` (fail closed).
    #[arg(long, env = "SLIDEGATE_FAILURE_MODE", default_value = "error")]
    failure_mode: FailureMode,
    /// Evaluate and count everything but never deny (try limits on real traffic).
    #[arg(long, env = "SLIDEGATE_SHADOW_MODE", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    shadow_mode: bool,
    /// Add IETF RateLimit-Limit/-Remaining/-Reset/-Policy headers (and Retry-After on deny) to
    /// answers; `--response-headers=false` turns them off (and saves about 1 µs of CPU per call
    /// when nothing reads them).
    #[arg(long, env = "SLIDEGATE_RESPONSE_HEADERS", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    response_headers: bool,
    /// Domain of /check requests that send no `x-ratelimit-domain` header.
    #[arg(long, env = "SLIDEGATE_CHECK_DOMAIN")]
    check_domain: Option<String>,
    /// Most descriptors one request may carry.
    #[arg(long, env = "SLIDEGATE_MAX_DESCRIPTORS", default_value_t = RequestLimits::default().max_descriptors)]
    max_descriptors: usize,
    /// Most entries one descriptor may carry.
    #[arg(long, env = "SLIDEGATE_MAX_ENTRIES", default_value_t = RequestLimits::default().max_entries)]
    max_entries: usize,
    /// Longest domain, entry key or entry value, in bytes.
    #[arg(long, env = "SLIDEGATE_MAX_VALUE_BYTES", default_value_t = RequestLimits::default().max_value_bytes)]
    max_value_bytes: usize,
    /// Most hits one descriptor may add (`hits_addend`, `x-ratelimit-hits`) to a limit kept as an
    /// exact log; more is refused as invalid. A log stores every hit, so this bounds the work one
    /// request can cause. Limits kept as buckets (`precision`) take any number: a bucket adds them
    /// in one count, at the same cost.
    #[arg(long, env = "SLIDEGATE_MAX_HITS", default_value_t = RequestLimits::default().max_hits)]
    max_hits: u64,
    /// Largest HTTP request body, in bytes (larger: 413).
    #[arg(long, env = "SLIDEGATE_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    max_body_bytes: usize,
    /// Threads that serve calls, each with a single-threaded runtime; connections are dealt out
    /// to them in turn [default: one per CPU core].
    #[arg(long, env = "SLIDEGATE_WORKERS", default_value_t = default_workers(), hide_default_value = true, value_parser = clap::value_parser!(u16).range(1..))]
    workers: u16,
    /// How long to let in-flight calls finish after SIGTERM/SIGINT, e.g. `5s`.
    #[arg(long, env = "SLIDEGATE_DRAIN_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Log format.
    #[arg(long, env = "SLIDEGATE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log filter in RUST_LOG syntax, e.g. `info` or `info,slidegate=debug` [default: RUST_LOG,
    /// else info].
    #[arg(long, env = "SLIDEGATE_LOG_LEVEL")]
    log_level: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// mimalloc instead of the system allocator: gRPC over HTTP/2 allocates and frees many small
/// buffers per call on every worker thread, and glibc's per-thread arenas spend a measurable part
/// of each request in `malloc`/`free` and in `mprotect`/`madvise` (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig { path }) => check_config(&path),
        Some(Command::Serve(args)) => serve_main(args),
        Some(Command::Bench(args)) => bench_main(args),
        None => serve_main(cli.serve),
    }
}

/// `slidegate check-config PATH`: one error per line on stderr and exit 1, or a summary and every
/// rule (with each limit's window and representation) and exit 0.
fn check_config(path: &Path) -> ExitCode {
    match slidegate::config::load_path(path) {
        Ok(rules) => {
            println!(
                "OK: {} rules in {} domains",
                rules.rule_count(),
                rules.domain_names().len()
            );
            // Every limit with its window and representation (exact log or buckets), as chosen.
            for rule in rules.rules() {
                println!("{rule}");
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

/// `slidegate bench`: the load generator builds its own runtimes, one per thread.
fn bench_main(args: slidegate::bench::BenchArgs) -> ExitCode {
    match slidegate::bench::main(args) {
        Ok(report) if report.errors == 0 => ExitCode::SUCCESS,
        // A script must not take a run of failed calls for a measurement: a distinct code, so
        // that it can still tell this from a run that never started (1).
        Ok(report) => {
            eprintln!(
                "slidegate bench: {} of {} calls failed",
                report.errors, report.requests
            );
            ExitCode::from(3)
        }
        Err(error) => {
            eprintln!("slidegate bench: {error:#}");
            match error {
                // As clap does for the arguments it checks itself.
                slidegate::bench::BenchError::Invalid(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

fn serve_main(args: ServeArgs) -> ExitCode {
    if let Err(error) = init_logging(&args) {
        eprintln!("slidegate: {error:#}");
        return ExitCode::FAILURE;
    }
    // The main thread runs start-up, the acceptors, reloads, health checks and the Redis
    // connection; the calls themselves run on the workers (`slidegate::server`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(args: &ServeArgs) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match &args.log_level {
        Some(level) => EnvFilter::try_new(level).context("invalid --log-level")?,
        None => EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new("info"))?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // redis-rs uses rustls without choosing a crypto provider; `rediss://` needs one installed.
    // An error means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    log_effective_config(&args);

    let metrics = Arc::new(Metrics::new());
    let rules = slidegate::config::load_path(&args.config).map_err(|errors| {
        anyhow::anyhow!(
            "cannot load rules from {}:\n{errors}",
            args.config.display()
        )
    })?;
    tracing::info!(
        rules = rules.rule_count(),
        domains = rules.domain_names().len(),
        path = %args.config.display(),
        "rules loaded"
    );
    for rule in rules.rules() {
        tracing::info!(%rule, "rule");
    }
    metrics.set_rules_loaded(rules.rule_count());
    let live = Arc::new(ArcSwap::from_pointee(rules));
    let reload_metrics = Arc::clone(&metrics);
    let hook: ReloadHook = Arc::new(move |outcome: &ReloadOutcome| match outcome {
        ReloadOutcome::Loaded { rules } => reload_metrics.config_reload(true, Some(*rules)),
        ReloadOutcome::Failed(_) => reload_metrics.config_reload(false, None),
    });
    let _reloader = Reloader::spawn(args.config.clone(), Arc::clone(&live), hook)
        .with_context(|| format!("cannot watch {}", args.config.display()))?;

    let store = open_store(&args).await?;
    let options = Options {
        failure_mode: args.failure_mode,
        shadow_mode: args.shadow_mode,
        response_headers: args.response_headers,
        limits: RequestLimits {
            max_descriptors: args.max_descriptors,
            max_entries: args.max_entries,
            max_value_bytes: args.max_value_bytes,
            max_hits: args.max_hits,
        },
    };
    let limiter = Arc::new(RateLimiter::new(live, store, options, Arc::clone(&metrics)));

    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health::new(reporter).await;
    health.check(&limiter).await;
    let checker = health.spawn_checker(Arc::clone(&limiter), Duration::from_secs(1));

    let (stop_tx, stop_rx) = watch::channel(false);
    let grpc_listener = TcpListener::bind(args.grpc_addr)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", args.grpc_addr))?;
    let http_listener = TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", args.http_addr))?;
    tracing::info!(grpc = %grpc_listener.local_addr()?, http = %http_listener.local_addr()?, workers = args.workers, "listening");

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("cannot build gRPC reflection")?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("cannot build gRPC reflection")?;
    let apps = Apps {
        grpc: GrpcApp::new(
            GrpcService::new(Arc::clone(&limiter)),
            Routes::new(health_service)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha),
        ),
        http: router(
            AppState {
                limiter: Arc::clone(&limiter),
                health: Arc::clone(&health),
                check_domain: args.check_domain.clone(),
            },
            args.max_body_bytes,
        ),
    };
    let mut workers = Workers::start(
        usize::from(args.workers),
        grpc_listener,
        http_listener,
        apps,
        stop_rx,
    )
    .context("cannot start the worker threads")?;

    tokio::select! {
        signal = shutdown_signal() => tracing::info!(signal = signal?, "shutting down"),
        (worker, outcome) = workers.failed() => bail!("{worker} stopped: {outcome}"),
    }
    health.shut_down().await;
    checker.abort();
    let _ = stop_tx.send(true);
    match workers.drained(args.drain_timeout).await {
        Ok(()) => tracing::info!("stopped"),
        Err(running) => tracing::warn!(
            drain_timeout = ?args.drain_timeout,
            workers = running,
            "calls still in flight after the drain timeout; stopping anyway"
        ),
    }
    Ok(())
}

/// The memory store, or Redis when a URL or cluster nodes are given.
async fn open_store(args: &ServeArgs) -> anyhow::Result<Arc<dyn Store>> {
    if args.redis_url.is_none() && args.redis_cluster.is_empty() {
        let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
        store.spawn_sweeper(Duration::from_secs(30));
        return Ok(store);
    }
    let opts = RedisOptions {
        url: args.redis_url.clone().unwrap_or_default(),
        cluster_nodes: args.redis_cluster.clone(),
        prefix: args.redis_prefix.clone(),
        timeout: args.redis_timeout,
        tls_ca_file: args.redis_tls_ca_file.clone(),
        deny_cache: args.redis_deny_cache,
        // One per worker thread, plus one for the main thread's health checks.
        connections: usize::from(args.workers) + 1,
    };
    let store = connect(&opts)
        .await
        .with_context(|| format!("invalid Redis settings {opts:?}"))?;
    if let Err(error) = store.ping().await {
        // Not fatal: the store reconnects, and health reports NOT_SERVING until it answers.
        tracing::warn!(%error, store = store.kind(), "Redis does not answer yet");
    }
    Ok(store)
}

fn log_effective_config(args: &ServeArgs) {
    let redis_url = args.redis_url.as_deref().map(redact_url);
    let redis_cluster: Vec<String> = args.redis_cluster.iter().map(|u| redact_url(u)).collect();
    let store = match (&redis_url, redis_cluster.is_empty()) {
        (_, false) => "redis-cluster",
        (Some(_), true) => "redis",
        (None, true) => "memory",
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %args.config.display(),
        grpc_addr = %args.grpc_addr,
        http_addr = %args.http_addr,
        store,
        redis_url = redis_url.as_deref().unwrap_or("-"),
        redis_cluster = %redis_cluster.join(","),
        redis_timeout = ?args.redis_timeout,
        redis_prefix = %args.redis_prefix,
        failure_mode = %args.failure_mode,
        shadow_mode = args.shadow_mode,
        response_headers = args.response_headers,
        check_domain = args.check_domain.as_deref().unwrap_or("-"),
        max_descriptors = args.max_descriptors,
        max_entries = args.max_entries,
        max_value_bytes = args.max_value_bytes,
        max_hits = args.max_hits,
        max_body_bytes = args.max_body_bytes,
        drain_timeout = ?args.drain_timeout,
        "starting slidegate"
    );
}

/// One worker per core the process may use.
fn default_workers() -> u16 {
    std::thread::available_parallelism().map_or(1, |n| u16::try_from(n.get()).unwrap_or(u16::MAX))
}

/// Waits for SIGTERM or SIGINT and names it.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
