//! The `slidegate` command line: `serve` (the default) and `check-config`. Wiring only: the
//! settings and the behaviour live in the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use arc_swap::ArcSwap;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tokio::runtime::Runtime;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use slidegate::compat::Translation;
use slidegate::config::metrics::ConfigMetrics;
use slidegate::config::source::RuleSource;
use slidegate::limiter::{DecisionMetrics, RateLimiter, RequestLimits};
use slidegate::metrics::Metrics;
use slidegate::server::metrics::ServerMetrics;
use slidegate::server::{Apps, Workers, grpc_port::GrpcApp, tls::rotate::Rotation};
use slidegate::service::decision::log::{DecisionLog, LogDecisions};
use slidegate::service::front::Front;
use slidegate::service::http_routes::data_router;
use slidegate::service::operator::token::AdminToken;
use slidegate::service::operator::{OperatorOptions, admin_router, limited, status};
use slidegate::service::ratelimit_prometheus::{self, RatelimitPrometheus};
use slidegate::service::rlqs::QuotaService;
use slidegate::service::rls::GrpcService;
use slidegate::service::{health::Health, http_routes::AppState, side};
use slidegate::settings::{Settings, unreachable_rules};
use slidegate::store::FailureMode;
use slidegate::store::redis::RedisMetrics;
use slidegate::telemetry::{TraceMetrics, Traces};

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
    serve: Settings,
}

// Parsed once at startup: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Serves gRPC (Envoy RateLimitService v3, health, reflection) and HTTP (/json, /check,
    /// /healthcheck, /rlconfig, /metrics). The default.
    Serve(Settings),
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
    /// Explains which rule of the rule files a descriptor matches, and why: the rule with its
    /// limits, windows and flags, its metrics name and its counter's entries; or that none does.
    /// Reads the files only (no server, no store): exit 0, or 1 for files with errors, an unknown
    /// domain or an entry that is not `key=value`.
    Explain {
        /// A rule file, or a directory of rule files (as `check-config` takes it).
        path: PathBuf,
        /// The request's domain.
        #[arg(required_unless_present = "json")]
        domain: Option<String>,
        /// The descriptor's entries in order, each `key=value`; the key ends at the first `=`,
        /// so a value may hold `=` and `,` (quote it for the shell).
        #[arg(required_unless_present = "json", value_name = "KEY=VALUE")]
        entries: Vec<String>,
        /// The whole request instead, as the body of `POST /json` (every descriptor explained).
        #[arg(long, value_name = "BODY", conflicts_with_all = ["domain", "entries"])]
        json: Option<String>,
    },
}

/// mimalloc instead of the system allocator: gRPC over HTTP/2 allocates and frees many small
/// buffers per call on every worker thread, and glibc's per-thread arenas spend a measurable part
/// of each request in `malloc`/`free` and in `mprotect`/`madvise` (see docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The command line, parsed once; for `serve`, envoyproxy/ratelimit's environment
/// ([`slidegate::compat`]) fills in the settings that neither a flag nor a `SLIDEGATE_*` variable
/// gave. A bad setting exits 2, as clap does for a bad flag.
fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    match cli.command {
        Some(Command::CheckConfig { path, max_entries }) => {
            return check_config(&path, max_entries);
        }
        Some(Command::Explain {
            path,
            domain,
            entries,
            json,
        }) => return explain(&path, domain.as_deref(), &entries, json.as_deref()),
        _ => {}
    }
    let serve = matches.subcommand_matches("serve").unwrap_or(&matches);
    let mut settings = Settings::from_matches(serve).unwrap_or_else(|error| error.exit());
    let compat = match slidegate::compat::translate(|name| std::env::var(name).ok()) {
        Ok(compat) => compat,
        Err(error) => {
            eprintln!("slidegate: {error}");
            return ExitCode::from(2);
        }
    };
    if let Some(translation) = &compat
        && let Err(error) = translation.apply(&mut settings)
    {
        error.format(&mut Cli::command()).exit();
    }
    if let Err(error) = settings.check() {
        error.format(&mut Cli::command()).exit();
    }
    serve_main(settings, compat)
}

/// `slidegate explain PATH DOMAIN KEY=VALUE...` or `slidegate explain PATH --json BODY`: the
/// explanation on stdout and exit 0; an error on stderr and exit 1.
fn explain(path: &Path, domain: Option<&str>, entries: &[String], json: Option<&str>) -> ExitCode {
    use slidegate::config::explain;
    let rules = match slidegate::config::load_path(path) {
        Ok(rules) => rules,
        Err(errors) => {
            eprintln!("slidegate: the rules do not load:\n{errors}");
            return ExitCode::from(1);
        }
    };
    let explained = match json {
        Some(body) => explain_json(&rules, body),
        None => explain::parse_entries(entries)
            .and_then(|e| explain::explain(&rules, domain.unwrap_or_default(), &e))
            .map_err(|error| error.to_string()),
    };
    match explained {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("slidegate: {error}");
            ExitCode::from(1)
        }
    }
}

/// Every descriptor of a `POST /json` body, explained in order.
fn explain_json(rules: &slidegate::config::RuleSet, body: &str) -> Result<String, String> {
    let limits = RequestLimits::default();
    let request = slidegate::service::json::parse_request(body.as_bytes(), &limits)
        .map_err(|error| format!("the --json body: {error}"))?;
    let mut text = String::new();
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        let entries: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        text.push_str(&format!("descriptors[{i}]:\n"));
        if descriptor.limit.is_some() {
            text.push_str("limit override: the request's `limit` replaces any rule below\n");
        }
        let explained = slidegate::config::explain::explain(rules, &request.domain, &entries)
            .map_err(|error| error.to_string())?;
        text.push_str(&explained);
    }
    Ok(text)
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

fn serve_main(settings: Settings, compat: Option<Translation>) -> ExitCode {
    let (runtime, hangup) = match start(&settings) {
        Ok(started) => started,
        Err(error) => {
            eprintln!("slidegate: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(translation) = compat {
        translation.log();
    }
    match runtime.block_on(serve(settings, hangup)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The main thread's runtime, SIGHUP's handler and the log. The main thread runs start-up, the
/// acceptors, reloads, health checks and the Redis connection; the calls themselves run on the
/// workers (`slidegate::server`).
fn start(settings: &Settings) -> anyhow::Result<(Runtime, Signal)> {
    let runtime = (tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build())
    .context("cannot start the async runtime")?;
    // Before anything else: until a handler is installed, SIGHUP's default action kills the
    // process, and deploy tools send it whenever they change the rules, start-up included. One
    // that arrives while the rules load causes a reload once they are loaded.
    let hangup = {
        let _entered = runtime.enter();
        signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?
    };
    settings.logging.init()?;
    Ok((runtime, hangup))
}

async fn serve(settings: Settings, hangup: Signal) -> anyhow::Result<()> {
    // redis-rs uses rustls without choosing a crypto provider; `rediss://` needs one installed.
    // An error means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    settings.log_effective();
    let (requests, server) = (&settings.requests, &settings.server);
    // Before anything listens: an operator token that cannot be read stops the start.
    let admin_token = match &settings.listen.admin_token_file {
        Some(file) => Some(Arc::new(AdminToken::open(file)?)),
        None => None,
    };

    let metrics = Arc::new(Metrics::new());
    // envoyproxy/ratelimit's metrics, on their own listener: counted only when it is on.
    let telemetry = &settings.telemetry;
    let prometheus_mapper = match telemetry.prometheus_addr {
        Some(_) => Some(Arc::new(telemetry.prometheus_mapper()?)),
        None => None,
    };
    let decisions = match prometheus_mapper {
        Some(_) => DecisionMetrics::new(&metrics).with_envoy_stats(telemetry.near_limit_ratio),
        None => DecisionMetrics::new(&metrics),
    };
    let decisions = Arc::new(decisions);
    let envoy_stats = decisions.envoy_stats().cloned();
    let config_metrics = ConfigMetrics::new(&metrics);
    let xds = settings.rules.xds(&settings.given)?;
    let from_control_plane = xds.is_some();
    let rules = (settings.rules).initial_rules(xds.is_some(), requests.max_entries)?;
    decisions.set_rules(&rules);
    config_metrics.set_rules(&rules);
    let live = Arc::new(ArcSwap::from_pointee(rules));
    let on_loaded = Arc::clone(&decisions);
    let hook = (config_metrics.clone()).reload_hook(Arc::clone(&live), move |rules| {
        on_loaded.set_rules(rules);
    });
    // Kept until the end: dropping the source stops it.
    let config = settings.rules.config_path();
    let source = RuleSource::spawn(xds, config, Arc::clone(&live), hook, hangup)?;
    let config_status = source.status();
    config_metrics.set_config_status(&config_status.load());

    // One connection per worker thread, plus one for the main thread's health checks; a script
    // call batching several requests adds no more than one request may.
    let connections = usize::from(server.workers) + 1;
    let redis_metrics = RedisMetrics::new(&metrics);
    let store = (settings.store)
        .open(connections, requests.max_hits, &metrics, |opts| {
            if let Some(sentinel) = &mut opts.sentinel {
                sentinel.failovers = redis_metrics.failovers();
            }
            opts.metrics = redis_metrics;
        })
        .await?;
    let mut options = requests.options();
    // The decision log names the rule that decided, as the dynamic metadata does.
    options.name_rules |= settings.logging.log_decisions != LogDecisions::Off;
    let limiter = Arc::new(RateLimiter::new(live, store, options, decisions));
    let trace_metrics = Arc::new(TraceMetrics::new(&metrics));
    let traces = match settings.telemetry.traces() {
        None => None,
        Some(traces) => {
            let (store, shadow) = (limiter.store().kind(), requests.shadow_mode);
            Some(Traces::start(&traces, trace_metrics, store, shadow)?)
        }
    };
    let log = DecisionLog::new(
        settings.logging.log_decisions,
        settings.listen.operator_hide_values,
        &metrics,
    );
    let front = Arc::new(Front::new(
        Arc::clone(&limiter),
        traces,
        Arc::clone(&metrics),
        log,
    ));
    let server_metrics = Arc::new(ServerMetrics::new(&metrics));

    let (reporter, side_routes) = side::routes().context("cannot build gRPC reflection")?;
    let quotas = QuotaService::new(Arc::clone(&limiter), &metrics);
    let side_routes = side_routes.add_service(quotas.clone().server());
    let health = match source.ready() {
        None => Health::new(reporter).await,
        Some(ready) => Health::gated(reporter, ready).await,
    };
    // A replica that answers by --failure-mode allow or deny through an outage is serving: if
    // its readiness followed the outage, every replica would leave at once and Envoy would find
    // no upstream at all, whatever the failure mode says.
    let answers_outages = settings.requests.failure_mode != FailureMode::Error;
    health.ignore_store_outage(settings.store.health_ignores_store_outage || answers_outages);
    health.export(&metrics);
    health.check(&limiter).await;
    let checker = health.spawn_checker(Arc::clone(&limiter), Duration::from_secs(1));

    // Kept until the end: dropping the rotation stops watching the TLS files.
    let (tls, _rotation) = match settings.listen.tls_files() {
        Some(files) => {
            let (tls, rotation) = Rotation::start(files, Arc::clone(&server_metrics))?;
            (Some(tls), Some(rotation))
        }
        None => (None, None),
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let listeners = settings.listen.bind().await?;
    let (grpc, http, admin) = (&listeners.grpc, &listeners.http, &listeners.admin);
    tracing::info!(grpc = %grpc.local()?, http = %http.local()?, admin = %admin.local()?, workers = server.workers, "listening");

    if let (Some(addr), Some(mapper), Some(stats)) =
        (telemetry.prometheus_addr, prometheus_mapper, envoy_stats)
    {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for Prometheus on {addr}"))?;
        tracing::info!(%addr, path = %telemetry.prometheus_path, "envoyproxy/ratelimit's Prometheus metrics");
        let view = RatelimitPrometheus {
            stats,
            metrics: Arc::clone(&metrics),
            mapper,
            response_time_ms: telemetry.prometheus_response_time_as_milliseconds
                && telemetry.prometheus_mapper_yaml.is_none(),
            initial_loads: u64::from(!from_control_plane),
        };
        let path = telemetry.prometheus_path.clone();
        tokio::spawn(ratelimit_prometheus::serve(
            listener,
            path,
            view,
            stop_rx.clone(),
        ));
    }

    // Each replica posts its most-denied counters for the others' `GET /limited`.
    let replica = limited::replica_name();
    limited::spawn_poster(Arc::clone(&front), replica.clone(), stop_rx.clone());
    // The decisions of the last minutes, for the operator page.
    let history = Arc::new(parking_lot::Mutex::new(status::History::default()));
    status::spawn_sampler(Arc::clone(&metrics), Arc::clone(&history), stop_rx.clone());
    let state = AppState {
        front: Arc::clone(&front),
        health: Arc::clone(&health),
        check_domain: requests.check_domain.clone(),
        config_status,
    };
    let apps = Apps {
        grpc: GrpcApp::new(GrpcService::new(Arc::clone(&front)), side_routes),
        http: data_router(state.clone(), requests.max_body_bytes),
        admin: admin_router(
            state,
            OperatorOptions {
                hide_values: settings.listen.operator_hide_values,
                token: admin_token,
                replica: replica.clone(),
                history,
                quotas: Some(quotas),
            },
            requests.max_body_bytes,
        ),
        name_callers: settings.logging.log_decisions != LogDecisions::Off,
    };
    let mut limits = server.limits();
    limits.http_max_body_bytes = requests.max_body_bytes;
    let limits = (limits, tls);
    let mut workers = Workers::start(
        usize::from(server.workers),
        listeners,
        apps,
        limits,
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
    match workers.drained(server.drain_timeout).await {
        Ok(()) => tracing::info!("stopped"),
        Err(running) => tracing::warn!(
            drain_timeout = ?server.drain_timeout,
            workers = running,
            "calls still in flight after the drain timeout; stopping anyway"
        ),
    }
    if let Some(traces) = front.traces() {
        traces.flush(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// Waits for SIGTERM or SIGINT and names it.
async fn shutdown_signal() -> anyhow::Result<&'static str> {
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
