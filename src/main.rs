//! The `slidegate` command line: `serve` (the default) and `check-config`. Wiring only: the
//! behaviour lives in the library.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use clap::builder::BoolishValueParser;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use tokio::sync::watch;
use tonic::service::Routes;

use slidegate::compat::Translation;
use slidegate::config::RuleSet;
use slidegate::config::metrics::ConfigMetrics;
use slidegate::config::reload::{ReloadHook, ReloadOutcome, Reloader};
use slidegate::config::source::xds::{XdsOptions, XdsSource, XdsTls};
use slidegate::limiter::{DecisionMetrics, Options, RateLimiter, RequestLimits};
use slidegate::metrics::Metrics;
use slidegate::server::grpc_port::GrpcApp;
use slidegate::server::limits::{self, ServerLimits};
use slidegate::server::metrics::ServerMetrics;
use slidegate::server::socket::Address;
use slidegate::server::tls::rotate::Rotation;
use slidegate::server::tls::{Listener, Tls, TlsFiles};
use slidegate::server::{Apps, Listeners, Workers};
use slidegate::service::front::Front;
use slidegate::service::health::Health;
use slidegate::service::http_routes::{AppState, admin_router, data_router};
use slidegate::service::rls::{FILE_DESCRIPTOR_SET, GrpcService};
use slidegate::store::redis::RedisMetrics;
use slidegate::store::{
    ClientCertFiles, FailureMode, MemoryStore, RedisOptions, SentinelOptions, Store, SystemClock,
    connect, redact_url,
};
use slidegate::telemetry::{Protocol, TraceMetrics, TraceSettings, Traces};

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
    /// limit's window and representation (exact log or buckets of a width) (exit 0); and a warning
    /// for every file skipped and every value read differently from a strict YAML reading.
    CheckConfig {
        /// A rule file, or a directory of rule files (every file not starting with `.`).
        path: PathBuf,
        /// The server's --max-entries: a rule deeper than this can never match (a request
        /// reaching it would be refused), and is reported with a warning.
        #[arg(long, env = "SLIDEGATE_MAX_ENTRIES", default_value_t = RequestLimits::default().max_entries)]
        max_entries: usize,
    },
}

#[derive(Args, Debug, Clone)]
struct ServeArgs {
    /// Rule file or directory of rule files (every file not starting with `.`); reloaded on
    /// change and on SIGHUP [default: config]. Not with --xds-server (which overrides
    /// SLIDEGATE_CONFIG).
    #[arg(long, env = "SLIDEGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Whether `config` came from `SLIDEGATE_CONFIG` (an image's default, perhaps) rather than
    /// the command line: --xds-server then overrides it instead of conflicting.
    #[arg(skip)]
    config_from_env: bool,
    /// Control plane that serves the rules over xDS instead of rule files (as Envoy Gateway serves
    /// envoyproxy/ratelimit: `RateLimitConfig` resources, ADS, state of the world): `host:port`,
    /// `http://host:port` or `https://host:port`. With it no rule files are read.
    #[arg(long, env = "SLIDEGATE_XDS_SERVER")]
    xds_server: Option<String>,
    /// Node id sent to the control plane, which chooses the rules by it (Envoy Gateway serves
    /// `envoy-ratelimit`).
    #[arg(long, env = "SLIDEGATE_XDS_NODE_ID", default_value = "default")]
    xds_node_id: String,
    /// Node metadata sent to the control plane: `key=value` pairs, comma-separated.
    #[arg(long, env = "SLIDEGATE_XDS_NODE_METADATA", value_delimiter = ',',
          value_parser = slidegate::config::source::xds::parse_metadata_pair)]
    xds_node_metadata: Vec<(String, String)>,
    /// First wait before connecting to the control plane again after a failure, e.g. `3s`; it
    /// doubles after each failed attempt, up to 60 s.
    #[arg(long, env = "SLIDEGATE_XDS_CONNECT_RETRY_INTERVAL", default_value = "3s", value_parser = humantime::parse_duration)]
    xds_connect_retry_interval: Duration,
    /// PEM file of CA certificates to verify the control plane with (turns TLS on) [default: the
    /// system roots, for `https://`].
    #[arg(long, env = "SLIDEGATE_XDS_TLS_CA_FILE")]
    xds_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain shown to the control plane (mutual TLS; turns TLS on; needs
    /// --xds-tls-key-file).
    #[arg(long, env = "SLIDEGATE_XDS_TLS_CERT_FILE")]
    xds_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert-file.
    #[arg(long, env = "SLIDEGATE_XDS_TLS_KEY_FILE")]
    xds_tls_key_file: Option<PathBuf>,
    /// Name to verify in the control plane's certificate when it is not the host of
    /// --xds-server (turns TLS on).
    #[arg(long, env = "SLIDEGATE_XDS_TLS_SERVER_NAME")]
    xds_tls_server_name: Option<String>,
    /// With --xds-server: report ready before the control plane has sent rules. Until they arrive
    /// no request matches a rule, so every request is allowed.
    #[arg(long, env = "SLIDEGATE_FORCE_START_WITHOUT_INITIAL_CONFIG", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    force_start_without_initial_config: bool,
    /// Address of the gRPC server (RateLimitService, health, reflection): HOST:PORT, or
    /// unix:/path for a Unix domain socket (Envoy's `pipe` address).
    #[arg(long, env = "SLIDEGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: Address,
    /// Address of the HTTP server (/json, /check, /healthcheck): HOST:PORT, or unix:/path for a
    /// Unix domain socket (nginx's `server unix:/path;`).
    #[arg(long, env = "SLIDEGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: Address,
    /// Address of the operator listener (plaintext unless --tls-listeners names `admin`):
    /// /metrics, /rlconfig and /healthcheck. The data ports never serve the rules or the metrics,
    /// and the default binds only the loopback interface; give Prometheus a reachable address
    /// (e.g. 0.0.0.0:6070 in a pod) where it scrapes. HOST:PORT or unix:/path.
    #[arg(long, env = "SLIDEGATE_ADMIN_ADDR", default_value = "127.0.0.1:6070")]
    admin_addr: Address,
    /// Permissions of the Unix socket files (octal, e.g. 0660: the owner and its group may
    /// connect); without it the umask decides. A socket file left by a crashed run is replaced,
    /// anything else at the path is refused; the file is removed on shutdown.
    #[arg(long, env = "SLIDEGATE_UNIX_SOCKET_MODE", value_parser = slidegate::server::socket::parse_mode)]
    unix_socket_mode: Option<u32>,
    /// PEM certificate chain (leaf first): both listeners serve TLS only (gRPC with ALPN h2,
    /// HTTP with h2 and http/1.1). Replaced without a restart when the file changes.
    #[arg(long, env = "SLIDEGATE_TLS_CERT_FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "SLIDEGATE_TLS_KEY_FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// PEM bundle of CAs for client certificates: mutual TLS, every client must present a
    /// certificate signed by one of them (refused with a TLS alert otherwise).
    #[arg(long, env = "SLIDEGATE_TLS_CLIENT_CA_FILE", requires = "tls_cert_file")]
    tls_client_ca_file: Option<PathBuf>,
    /// Comma-separated URI SANs (SPIFFE IDs) and DNS names: with --tls-client-ca-file, a client
    /// certificate must carry one of them exactly (refused with a TLS alert otherwise).
    #[arg(
        long,
        env = "SLIDEGATE_TLS_CLIENT_SAN",
        value_delimiter = ',',
        requires = "tls_client_ca_file"
    )]
    tls_client_san: Vec<String>,
    /// Comma-separated listeners that serve TLS with --tls-cert-file (and mutual TLS with
    /// --tls-client-ca-file): `grpc`, `http`, `admin` (the operator listener; Prometheus then
    /// scrapes with `scheme: https`). The others stay plaintext (say, HTTP for a kubelet's
    /// /healthcheck probe).
    #[arg(
        long,
        env = "SLIDEGATE_TLS_LISTENERS",
        value_enum,
        value_delimiter = ',',
        default_value = "grpc,http",
        requires = "tls_cert_file"
    )]
    tls_listeners: Vec<Listener>,
    /// Redis server, `redis://[user:pass@]host:port[/db]` or `rediss://` for TLS. Without it (and
    /// without --redis-cluster or --redis-sentinel) counters live in this process's memory.
    #[arg(long, env = "SLIDEGATE_REDIS_URL")]
    redis_url: Option<String>,
    /// Redis Cluster seed nodes, comma-separated URLs; selects the cluster store.
    #[arg(long, env = "SLIDEGATE_REDIS_CLUSTER", value_delimiter = ',')]
    redis_cluster: Vec<String>,
    /// Redis Sentinel: comma-separated sentinels, `HOST:PORT` (or `rediss://HOST:PORT` for TLS,
    /// with --redis-tls-ca-file and the client certificate as for Redis). The store uses the
    /// primary they name for --redis-sentinel-master and follows it through failovers;
    /// --redis-url then gives only the primary's password, database and TLS
    /// (`rediss://:PASSWORD@mymaster/0`; its host is not used).
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_SENTINEL",
        value_delimiter = ',',
        conflicts_with = "redis_cluster",
        requires = "redis_sentinel_master"
    )]
    redis_sentinel: Vec<String>,
    /// The master name the sentinels monitor (`sentinel monitor NAME ...`), e.g. `mymaster`.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_SENTINEL_MASTER",
        requires = "redis_sentinel"
    )]
    redis_sentinel_master: Option<String>,
    /// Password of the sentinels (their `requirepass`), if they need one.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_SENTINEL_PASSWORD",
        hide_env_values = true,
        requires = "redis_sentinel"
    )]
    redis_sentinel_password: Option<String>,
    /// Upper bound for every Redis call, e.g. `50ms`; a slower call is a store failure.
    #[arg(long, env = "SLIDEGATE_REDIS_TIMEOUT", default_value = "50ms", value_parser = humantime::parse_duration)]
    redis_timeout: Duration,
    /// Prefix of every Redis key (must not contain `{` or `}`).
    #[arg(long, env = "SLIDEGATE_REDIS_PREFIX", default_value = slidegate::store::DEFAULT_PREFIX)]
    redis_prefix: String,
    /// PEM file of CA certificates to trust for `rediss://` instead of the system roots.
    #[arg(long, env = "SLIDEGATE_REDIS_TLS_CA_FILE")]
    redis_tls_ca_file: Option<PathBuf>,
    /// PEM certificate chain presented to Redis over `rediss://`, for servers started with
    /// `tls-auth-clients yes`; needs --redis-tls-key-file. Read at startup.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_TLS_CERT_FILE",
        requires = "redis_tls_key_file"
    )]
    redis_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --redis-tls-cert-file.
    #[arg(
        long,
        env = "SLIDEGATE_REDIS_TLS_KEY_FILE",
        requires = "redis_tls_cert_file"
    )]
    redis_tls_key_file: Option<PathBuf>,
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
    /// Most descriptors one request may carry; more is refused (INVALID_ARGUMENT / 400): only a
    /// proxy's configuration decides how many it sends.
    #[arg(long, env = "SLIDEGATE_MAX_DESCRIPTORS", default_value_t = RequestLimits::default().max_descriptors)]
    max_descriptors: usize,
    /// Most entries one descriptor may carry; more is refused, as for --max-descriptors.
    #[arg(long, env = "SLIDEGATE_MAX_ENTRIES", default_value_t = RequestLimits::default().max_entries)]
    max_entries: usize,
    /// Longest domain or entry key, in bytes (longer is refused). A longer entry value, which a
    /// client can choose, is not refused: it is counted under its SHA-256 digest.
    #[arg(long, env = "SLIDEGATE_MAX_VALUE_BYTES", default_value_t = RequestLimits::default().max_value_bytes)]
    max_value_bytes: usize,
    /// Most hits one request may add to limits kept as exact logs, summed over its counters
    /// (`hits_addend`, `x-ratelimit-hits`; a log checked with 0 hits counts 1). A sliding log
    /// stores every hit, so this bounds the store's work for one request (and for one Redis script
    /// call). Limits kept as buckets (`precision`) take any number of hits, each bucket counter
    /// counting 1: a bucket adds them in one count, at the same cost. A limited descriptor past it
    /// is answered over limit, and the request records nothing.
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
    /// Most open connections, gRPC and HTTP ports together; more are closed as they are accepted
    /// and counted in `slidegate_connections_refused_total` [default: the soft file-descriptor
    /// limit (`ulimit -n`) less 64].
    #[arg(long, env = "SLIDEGATE_MAX_CONNECTIONS", default_value_t = limits::default_max_connections(), hide_default_value = true, value_parser = clap::value_parser!(usize))]
    max_connections: usize,
    /// Most open connections from one client IP address, both ports together.
    #[arg(
        long,
        env = "SLIDEGATE_MAX_CONNECTIONS_PER_PEER",
        default_value_t = 1024
    )]
    max_connections_per_peer: usize,
    /// Time a new connection has to start, counted from accept (a TLS handshake included):
    /// gRPC, the HTTP/2 preface; HTTP, the first byte, then each request's headers (which also
    /// closes an HTTP/1.1 connection idle that long between requests).
    #[arg(long, env = "SLIDEGATE_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    handshake_timeout: Duration,
    /// A connection without calls or requests in flight for this long is closed (GOAWAY on
    /// HTTP/2), on every port; `0s` never.
    #[arg(long, env = "SLIDEGATE_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// Time for a request's body to arrive: a gRPC call's message (else DEADLINE_EXCEEDED), an
    /// HTTP request as a whole (else 408).
    #[arg(long, env = "SLIDEGATE_BODY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    body_timeout: Duration,
    /// HTTP/2 keepalive: a PING this often on every connection; one not answered by the next is
    /// closed. `0s` turns it off.
    #[arg(long, env = "SLIDEGATE_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    keepalive_interval: Duration,
    /// Bytes of incomplete gRPC messages held, all connections together (each connection holds
    /// at most one largest message, 4 MiB); a call over it waits for room, then for the body
    /// timeout.
    #[arg(long, env = "SLIDEGATE_MAX_BUFFERED_BYTES", default_value_t = 64 << 20)]
    max_buffered_bytes: usize,
    /// Log format.
    #[arg(long, env = "SLIDEGATE_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log filter in RUST_LOG syntax, e.g. `info` or `info,slidegate=debug` [default: RUST_LOG,
    /// else info].
    #[arg(long, env = "SLIDEGATE_LOG_LEVEL")]
    log_level: Option<String>,
    /// OpenTelemetry collector to send traces to, one span per decision (README, Traces):
    /// `http://HOST:4317` for gRPC, `http://HOST:4318` for HTTP (a URL without a path gets
    /// `/v1/traces`). Without it no span is made at all.
    #[arg(long, env = "SLIDEGATE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc`, or `http` (protobuf bodies).
    #[arg(long, env = "SLIDEGATE_OTLP_PROTOCOL", default_value = "grpc")]
    otlp_protocol: Protocol,
    /// The `service.name` of the spans.
    #[arg(long, env = "SLIDEGATE_OTLP_SERVICE_NAME", default_value = "slidegate")]
    otlp_service_name: String,
    /// The `service.namespace` of the spans.
    #[arg(long, env = "SLIDEGATE_OTLP_SERVICE_NAMESPACE")]
    otlp_service_namespace: Option<String>,
    /// The `service.instance.id` of the spans (a pod's name, for instance).
    #[arg(long, env = "SLIDEGATE_OTLP_SERVICE_INSTANCE_ID")]
    otlp_service_instance_id: Option<String>,
    /// Share of requests traced when the caller sent no sampling decision, 0.0 to 1.0; a caller's
    /// `traceparent` or B3 sampled flag is always followed.
    #[arg(long, env = "SLIDEGATE_TRACE_SAMPLING_RATIO", default_value_t = 1.0)]
    trace_sampling_ratio: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// mimalloc instead of the system allocator: gRPC over HTTP/2 allocates and frees many small
/// buffers per call on every worker thread, and glibc's per-thread arenas spend a measurable part
/// of each request in `malloc`/`free` and in `mprotect`/`madvise` (see docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let (cli, compat, config_from_env) = match parse_cli(std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(error) => {
            eprintln!("slidegate: {error}");
            // As clap does for a bad flag.
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Some(Command::CheckConfig { path, max_entries }) => check_config(&path, max_entries),
        Some(Command::Serve(args)) => serve_main(
            ServeArgs {
                config_from_env,
                ..args
            },
            compat,
        ),
        None => serve_main(
            ServeArgs {
                config_from_env,
                ..cli.serve
            },
            compat,
        ),
    }
}

/// The command line, with envoyproxy/ratelimit's environment ([`slidegate::compat`]) filling in
/// the `serve` settings that neither a flag nor a `SLIDEGATE_*` variable set. Those settings are
/// appended as flags and the command line parsed again, so that clap checks them as it checks
/// any flag. Also says whether `--config` came from `SLIDEGATE_CONFIG` (an image's default, which
/// `--xds-server` overrides).
fn parse_cli(
    mut args: Vec<OsString>,
) -> Result<(Cli, Option<Translation>, bool), slidegate::compat::CompatError> {
    let mut matches = Cli::command().get_matches_from(&args);
    let translation = match matches.subcommand() {
        None | Some(("serve", _)) => slidegate::compat::translate(|name| std::env::var(name).ok())?,
        Some(_) => None,
    };
    if let Some(translation) = &translation {
        let serve = serve_matches(&matches);
        let unset = |id: &str| {
            matches!(
                serve.value_source(id),
                None | Some(ValueSource::DefaultValue)
            )
        };
        let extra: Vec<OsString> = translation
            .settings
            .iter()
            .filter(|setting| unset(setting.id))
            .map(|setting| OsString::from(setting.arg()))
            .collect();
        args.extend(extra);
        matches = Cli::command().get_matches_from(&args);
    }
    let config_from_env =
        serve_matches(&matches).value_source("config") == Some(ValueSource::EnvVariable);
    Ok((from_matches(&matches), translation, config_from_env))
}

/// The `serve` settings: the subcommand's, or the top level's when it is left out.
fn serve_matches(matches: &clap::ArgMatches) -> &clap::ArgMatches {
    matches.subcommand_matches("serve").unwrap_or(matches)
}

fn from_matches(matches: &clap::ArgMatches) -> Cli {
    Cli::from_arg_matches(matches).unwrap_or_else(|error| error.exit())
}

/// `slidegate check-config PATH`: warnings (`warning: ` lines: files skipped, values read
/// differently from a strict YAML reading, rules no request can reach) and errors on stderr, exit
/// 1 on any error; else a summary and every rule (with each limit's window and representation) on
/// stdout and exit 0.
fn check_config(path: &Path, max_entries: usize) -> ExitCode {
    let checked = slidegate::config::check_path(path);
    for warning in &checked.warnings {
        eprintln!("warning: {warning}");
    }
    match checked.rules {
        Ok(rules) => {
            for warning in unreachable_rules(&rules, max_entries) {
                eprintln!("warning: {warning}");
            }
            let domains = rules.domain_names().len();
            println!("OK: {} rules in {domains} domains", rules.rule_count());
            if domains == 0 {
                println!("(no rules: every request would be answered OK)");
            }
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

/// One message per rule deeper than `max_entries`: no request can reach it, since a descriptor
/// with more entries is refused.
fn unreachable_rules(rules: &slidegate::config::RuleSet, max_entries: usize) -> Vec<String> {
    rules
        .rules()
        .into_iter()
        .filter(|rule| rule.depth > max_entries)
        .map(|rule| {
            format!(
                "{}: rule {} of domain {} is {} levels deep, but a request carries at most \
                 {max_entries} entries per descriptor (--max-entries): it can never match",
                rule.source, rule.path, rule.domain, rule.depth
            )
        })
        .collect()
}

fn serve_main(args: ServeArgs, compat: Option<Translation>) -> ExitCode {
    // The main thread runs start-up, the acceptors, reloads, health checks and the Redis
    // connection; the calls themselves run on the workers (`slidegate::server`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("slidegate: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Before anything else: until a handler is installed, SIGHUP's default action kills the
    // process, and deploy tools send it whenever they change the rules, start-up included. One
    // that arrives while the rules load causes a reload once they are loaded.
    let hangup = {
        let _entered = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
    };
    let hangup = match hangup {
        Ok(hangup) => hangup,
        Err(error) => {
            eprintln!("slidegate: cannot listen for SIGHUP: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = init_logging(&args) {
        eprintln!("slidegate: {error:#}");
        return ExitCode::FAILURE;
    }
    if let Some(translation) = compat {
        log_compat(&translation);
    }
    match runtime.block_on(serve(args, hangup)) {
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

async fn serve(args: ServeArgs, hangup: tokio::signal::unix::Signal) -> anyhow::Result<()> {
    // redis-rs uses rustls without choosing a crypto provider; `rediss://` needs one installed.
    // An error means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    log_effective_config(&args);

    let metrics = Arc::new(Metrics::new());
    let decisions = Arc::new(DecisionMetrics::new(&metrics));
    let config_metrics = ConfigMetrics::new(&metrics);
    let xds = xds_options(&args)?;
    let config = args
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    let rules = match &xds {
        Some(_) => RuleSet::empty(),
        None => load_rules(&config, args.max_entries)?,
    };
    decisions.set_rules(&rules);
    config_metrics.set_rules(&rules);
    let live = Arc::new(ArcSwap::from_pointee(rules));
    let (reload_metrics, reload_decisions) = (config_metrics.clone(), Arc::clone(&decisions));
    let reloaded = Arc::clone(&live);
    let hook: ReloadHook = Arc::new(move |outcome, status| {
        let loaded = matches!(outcome, ReloadOutcome::Loaded { .. });
        reload_metrics.config_reload(loaded);
        if loaded {
            let rules = reloaded.load();
            reload_decisions.set_rules(&rules);
            reload_metrics.set_rules(&rules);
        }
        reload_metrics.set_config_status(status);
    });
    // Kept until the end: dropping the source stops it.
    let source = match xds {
        Some(options) => RuleSource::Xds(
            XdsSource::spawn(options, Arc::clone(&live), hook)
                .context("cannot start the xDS client")?,
        ),
        None => RuleSource::Files(
            Reloader::spawn(config.clone(), Arc::clone(&live), hook, hangup)
                .with_context(|| format!("cannot watch {}", config.display()))?,
        ),
    };
    let config_status = match &source {
        RuleSource::Files(reloader) => reloader.status(),
        RuleSource::Xds(xds) => xds.status(),
    };
    config_metrics.set_config_status(&config_status.load());

    let store = open_store(&args, &RedisMetrics::new(&metrics)).await?;
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
    let limiter = Arc::new(RateLimiter::new(live, store, options, decisions));
    let trace_metrics = Arc::new(TraceMetrics::new(&metrics));
    let traces = match trace_settings(&args) {
        None => None,
        Some(settings) => {
            let (store, shadow) = (limiter.store().kind(), args.shadow_mode);
            Some(Traces::start(&settings, trace_metrics, store, shadow)?)
        }
    };
    let front = Arc::new(Front::new(
        Arc::clone(&limiter),
        traces,
        Arc::clone(&metrics),
    ));
    let server_metrics = Arc::new(ServerMetrics::new(&metrics));

    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health_service = health_service.max_decoding_message_size(BRIDGED_MESSAGE);
    let health = match &source {
        RuleSource::Files(_) => Health::new(reporter).await,
        RuleSource::Xds(xds) => Health::gated(reporter, xds.ready()).await,
    };
    health.check(&limiter).await;
    let checker = health.spawn_checker(Arc::clone(&limiter), Duration::from_secs(1));

    // Kept until the end: dropping the rotation stops watching the TLS files.
    let (tls, _rotation) = match tls_files(&args) {
        Some(files) => {
            let tls = Tls::load(&files, Arc::clone(&server_metrics))
                .context("cannot load TLS material")?;
            let rotation = Rotation::spawn(files, Arc::clone(&tls), Arc::clone(&server_metrics))
                .context("cannot watch the TLS files")?;
            (Some(tls), Some(rotation))
        }
        None => (None, None),
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let mode = args.unix_socket_mode;
    let grpc_listener = args
        .grpc_addr
        .bind(mode)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", args.grpc_addr))?;
    let http_listener = args
        .http_addr
        .bind(mode)
        .await
        .with_context(|| format!("cannot listen for HTTP on {}", args.http_addr))?;
    let admin_listener = args
        .admin_addr
        .bind(mode)
        .await
        .with_context(|| format!("cannot listen for operators on {}", args.admin_addr))?;
    tracing::info!(grpc = %grpc_listener.local()?, http = %http_listener.local()?, admin = %admin_listener.local()?, workers = args.workers, "listening");

    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("cannot build gRPC reflection")?
        .max_decoding_message_size(BRIDGED_MESSAGE);
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("cannot build gRPC reflection")?
        .max_decoding_message_size(BRIDGED_MESSAGE);
    let state = AppState {
        front: Arc::clone(&front),
        health: Arc::clone(&health),
        check_domain: args.check_domain.clone(),
        config_status,
    };
    let apps = Apps {
        grpc: GrpcApp::new(
            GrpcService::new(Arc::clone(&front)),
            Routes::new(health_service)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha),
        ),
        http: data_router(state.clone(), args.max_body_bytes),
        admin: admin_router(state),
    };
    let mut workers = Workers::start(
        usize::from(args.workers),
        Listeners {
            grpc: grpc_listener,
            http: http_listener,
            admin: admin_listener,
        },
        apps,
        (server_limits(&args), tls),
        server_metrics,
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
    if let Some(traces) = front.traces() {
        traces.flush(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// Health and reflection requests are a few hundred bytes: their streams may buffer no more than
/// this each (tonic's default is 4 MiB), so that 100 streams on one connection hold little.
const BRIDGED_MESSAGE: usize = 16 << 10;

fn server_limits(args: &ServeArgs) -> ServerLimits {
    ServerLimits {
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        handshake_timeout: args.handshake_timeout,
        idle_timeout: args.idle_timeout,
        body_timeout: args.body_timeout,
        keepalive_interval: args.keepalive_interval,
        max_buffered_bytes: args.max_buffered_bytes,
        drain_timeout: args.drain_timeout,
    }
}

/// The trace settings when --otlp-endpoint is given.
fn trace_settings(args: &ServeArgs) -> Option<TraceSettings> {
    Some(TraceSettings {
        endpoint: args.otlp_endpoint.clone()?,
        protocol: args.otlp_protocol,
        sampling_ratio: args.trace_sampling_ratio,
        service_name: args.otlp_service_name.clone(),
        service_namespace: args.otlp_service_namespace.clone(),
        service_instance_id: args.otlp_service_instance_id.clone(),
    })
}

/// The TLS files when --tls-cert-file is given (clap makes --tls-key-file come with it).
fn tls_files(args: &ServeArgs) -> Option<TlsFiles> {
    Some(TlsFiles {
        listeners: args.tls_listeners.clone(),
        cert: args.tls_cert_file.clone()?,
        key: args.tls_key_file.clone()?,
        client_ca: args.tls_client_ca_file.clone(),
        client_sans: args.tls_client_san.clone(),
    })
}

/// The rule path when neither --config nor --xds-server is given.
const DEFAULT_CONFIG: &str = "config";

/// Where the rules come from; dropping it stops the watching or the xDS client.
enum RuleSource {
    Files(Reloader),
    Xds(XdsSource),
}

/// The rule files at start: without them slidegate does not start.
fn load_rules(config: &Path, max_entries: usize) -> anyhow::Result<RuleSet> {
    let rules = slidegate::config::load_path(config).map_err(|errors| {
        anyhow::anyhow!("cannot load rules from {}:\n{errors}", config.display())
    })?;
    tracing::info!(
        rules = rules.rule_count(),
        domains = rules.domain_names().len(),
        path = %config.display(),
        "rules loaded"
    );
    for rule in rules.rules() {
        tracing::info!(%rule, "rule");
    }
    for warning in unreachable_rules(&rules, max_entries) {
        tracing::warn!("{warning}");
    }
    Ok(rules)
}

/// The xDS settings when --xds-server is given; an error for settings that contradict each other.
/// `--config` on the command line contradicts it; `SLIDEGATE_CONFIG` may be an image's default
/// (slidegate's own sets it), so --xds-server overrides it with a warning.
fn xds_options(args: &ServeArgs) -> anyhow::Result<Option<XdsOptions>> {
    let Some(server) = &args.xds_server else {
        if args.force_start_without_initial_config {
            bail!("--force-start-without-initial-config needs --xds-server (rule files must load)");
        }
        return Ok(None);
    };
    let options = XdsOptions {
        server: server.clone(),
        node_id: args.xds_node_id.clone(),
        node_metadata: args.xds_node_metadata.clone(),
        retry_interval: args.xds_connect_retry_interval,
        tls: XdsTls {
            ca_file: args.xds_tls_ca_file.clone(),
            cert_file: args.xds_tls_cert_file.clone(),
            key_file: args.xds_tls_key_file.clone(),
            server_name: args.xds_tls_server_name.clone(),
        },
        force_start: args.force_start_without_initial_config,
    };
    if let Some(config) = &args.config {
        if args.config_from_env {
            // slidegate's own image sets SLIDEGATE_CONFIG for its bundled rules.
            tracing::warn!(
                config = %config.display(),
                "SLIDEGATE_CONFIG is ignored: rules come from --xds-server"
            );
        } else {
            bail!(
                "--config {} and --xds-server {server} both given: rules come either from files \
                 or from a control plane",
                config.display()
            );
        }
    }
    Ok(Some(options))
}

/// The memory store, or Redis when a URL, cluster nodes or sentinels are given.
async fn open_store(args: &ServeArgs, metrics: &RedisMetrics) -> anyhow::Result<Arc<dyn Store>> {
    if args.redis_url.is_none() && args.redis_cluster.is_empty() && args.redis_sentinel.is_empty() {
        let store = Arc::new(MemoryStore::new(Arc::new(SystemClock)));
        store.spawn_sweeper(Duration::from_secs(30));
        return Ok(store);
    }
    let sentinel = args
        .redis_sentinel_master
        .as_ref()
        .map(|master| SentinelOptions {
            sentinels: args.redis_sentinel.clone(),
            master: master.clone(),
            password: args.redis_sentinel_password.clone(),
            failovers: metrics.failovers(),
        });
    let default_url = || RedisOptions::default().url;
    let opts = RedisOptions {
        url: args.redis_url.clone().unwrap_or_else(default_url),
        cluster_nodes: args.redis_cluster.clone(),
        sentinel,
        prefix: args.redis_prefix.clone(),
        timeout: args.redis_timeout,
        tls_ca_file: args.redis_tls_ca_file.clone(),
        tls_client_cert: args
            .redis_tls_cert_file
            .clone()
            .zip(args.redis_tls_key_file.clone())
            .map(|(cert, key)| ClientCertFiles { cert, key }),
        deny_cache: args.redis_deny_cache,
        // One per worker thread, plus one for the main thread's health checks.
        connections: usize::from(args.workers) + 1,
        // A script call batching several requests adds no more than one request may.
        max_call_hits: args.max_hits,
        metrics: metrics.clone(),
    };
    let store = connect(&opts).await.with_context(|| match &opts.sentinel {
        // The error names the sentinels and the master; the rest of the options add nothing.
        Some(_) => "cannot find the Redis primary through Redis Sentinel".to_string(),
        None => format!("invalid Redis settings {opts:?}"),
    })?;
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
        _ if !args.redis_sentinel.is_empty() => "redis-sentinel",
        (_, false) => "redis-cluster",
        (Some(_), true) => "redis",
        (None, true) => "memory",
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        config = %args.config.as_deref().unwrap_or(Path::new(DEFAULT_CONFIG)).display(),
        xds_server = args.xds_server.as_deref().unwrap_or("-"),
        xds_node_id = %args.xds_node_id,
        grpc_addr = %args.grpc_addr,
        http_addr = %args.http_addr,
        admin_addr = ?args.admin_addr,
        tls = ?args.tls_cert_file.as_ref().map(|_| &args.tls_listeners),
        mtls = args.tls_client_ca_file.is_some(),
        store,
        redis_url = redis_url.as_deref().unwrap_or("-"),
        redis_cluster = %redis_cluster.join(","),
        redis_sentinel = %args.redis_sentinel.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(","),
        redis_sentinel_master = args.redis_sentinel_master.as_deref().unwrap_or("-"),
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
        max_connections = args.max_connections,
        max_connections_per_peer = args.max_connections_per_peer,
        handshake_timeout = ?args.handshake_timeout,
        idle_timeout = ?args.idle_timeout,
        body_timeout = ?args.body_timeout,
        keepalive_interval = ?args.keepalive_interval,
        max_buffered_bytes = args.max_buffered_bytes,
        otlp_endpoint = args.otlp_endpoint.as_deref().unwrap_or("-"),
        trace_sampling_ratio = args.trace_sampling_ratio,
        "starting slidegate"
    );
}

/// What envoyproxy/ratelimit's environment set, and, in one warning, what it asked for that
/// slidegate does not do.
fn log_compat(translation: &Translation) {
    let mapped: Vec<String> = translation
        .settings
        .iter()
        .map(|setting| format!("{} -> --{}", setting.from, setting.id.replace('_', "-")))
        .collect();
    tracing::info!(
        mapped = %mapped.join(", "),
        "envoyproxy/ratelimit environment read (slidegate's own flags and SLIDEGATE_* variables take precedence)"
    );
    if translation.unhonoured.is_empty() {
        return;
    }
    let variables: Vec<&str> = translation.unhonoured.iter().map(|u| u.variable).collect();
    let reasons: Vec<String> = translation
        .unhonoured
        .iter()
        .map(|u| format!("{}: {}", u.variable, u.why))
        .collect();
    tracing::warn!(
        variables = %variables.join(","),
        reasons = %reasons.join("; "),
        "envoyproxy/ratelimit settings not honoured by slidegate"
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every setting the compatibility layer produces is a `serve` flag.
    #[test]
    fn compat_settings_are_serve_flags() {
        let command = super::Cli::command();
        for id in slidegate::compat::SETTING_IDS {
            assert!(
                command.get_arguments().any(|arg| arg.get_id() == *id),
                "no serve flag {id}"
            );
        }
    }
}
