//! `slidegate bench`: a gRPC load generator for any RateLimitService v3 server.
//!
//! It speaks only the public Envoy API over gRPC (plain, or TLS with `https://`), so it measures slidegate and its peers
//! alike. Every worker runs a closed loop (send, wait, record): `--concurrency` workers share
//! `--connections` HTTP/2 connections. Latency goes into an HDR histogram per worker, merged at the
//! end, so percentiles are exact to three significant digits with no coordination on the hot path.
//! A warm-up phase runs first and is not measured.
//!
//! The generator is thread-per-core: each of `--threads` threads runs a current-thread tokio
//! runtime of its own with its share of the connections and workers; on the hot path the threads
//! share only a relaxed progress counter. A request costs the server only microseconds, and on a
//! small machine a multi-thread runtime spent more on work stealing and cross-thread wake-ups than
//! on the request itself (33 µs of generator CPU per request against 18 µs on one current-thread
//! runtime, on 2 cores), CPU taken from the server under test. The threads meet at two barriers,
//! after connecting and after the warm-up, so the measured phase starts at one agreed instant
//! everywhere and ends at one deadline; the calling thread only coordinates: CPU snapshots,
//! progress bar, merging the tallies.
//!
//! The workers call through `h2` directly, not through a tonic client: a tonic call crosses two
//! channels and two tasks (tower's `Buffer`, then hyper's client dispatcher) before it reaches h2,
//! and cost the generator about as much CPU per request as the server it measured, on the same
//! cores. An instrument should cost less than what it measures. A call here is one HTTP/2 stream
//! the worker drives itself: a POST with one length-prefixed protobuf message, answered by one
//! message and a `grpc-status` trailer; the request is encoded into a buffer the worker reuses.
//!
//! With `--server-pid`, the server's CPU time (user + system, from `/proc/PID/stat`) over the
//! measured phase is divided by the requests served: CPU per request is the figure that stays
//! comparable on a shared, noisy machine where absolute rates drift. The generator reports its own
//! CPU per request too (it usually shares the cores with the server), and with `--redis-pid` the
//! Redis server's.
//!
//! With `--rate`, each worker sends at `rate / concurrency` (so each thread sends its share of the
//! rate in proportion to its workers), the workers staggered over one interval so the load is
//! spread evenly rather than sent in bursts; latency is measured from the actual send (tokio's
//! timer has millisecond granularity, which would otherwise add up to 1 ms). `--prefill N` first
//! sends N requests for every key, once, from the first thread, so that a large key space starts
//! full.
//!
//! With a `redis://` target there is no server in between: every call is a decision of
//! slidegate's own Redis store, run in the generator (one connection per `--connections`, the
//! deny cache off; the calls a thread has in flight share script calls, as in a server), with
//! every descriptor one counter of [`DIRECT_LIMIT`] hits per [`DIRECT_WINDOW`], the rule
//! `scripts/bench` gives the gRPC runs. The same workers, pacing and
//! key space then measure the raw round trip of the script at a given load: the baseline that
//! a gRPC run against slidegate's Redis store is compared with.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Barrier, OnceLock};
use std::task::Poll;
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use h2::RecvStream;
use h2::client::SendRequest;
use hdrhistogram::Histogram;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue, TE};
use http::uri::{PathAndQuery, Scheme, Uri};
use http::{Method, Request, StatusCode};
use prost::Message;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Zipf};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use crate::server::grpc_port::encode_frame;
use crate::store::{Counter, CounterKey, Precision, RedisOptions, RedisStore, Store};

/// Errors that stop a benchmark (all but a thread's crash before it measures anything).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot start a tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("a benchmark thread stopped unexpectedly")]
    ThreadFailed,
}

/// How descriptor values are drawn from the key space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf-distributed (exponent `--zipf-exponent`): a few hot keys take most requests.
    Zipf,
}

/// Options of `slidegate bench`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// gRPC address of the RateLimitService to load (`http://host:port`), or a Redis server
    /// (`redis://host:port`) to call directly with slidegate's Redis store, no server in between:
    /// the raw round trip of slidegate's script under the same load, each descriptor one counter
    /// of 100 hits per second, without the deny cache.
    #[arg(
        long,
        env = "SLIDEGATE_BENCH_TARGET",
        default_value = "http://127.0.0.1:8081"
    )]
    pub target: String,
    /// Domain sent in every request.
    #[arg(long, env = "SLIDEGATE_BENCH_DOMAIN", default_value = "bench")]
    pub domain: String,
    /// Descriptor entry key; the value is drawn from the key space.
    #[arg(long, env = "SLIDEGATE_BENCH_KEY", default_value = "client")]
    pub key: String,
    /// Descriptors per request (each gets its own value, so its own counter).
    #[arg(long, env = "SLIDEGATE_BENCH_DESCRIPTORS", default_value_t = 1)]
    pub descriptors: usize,
    /// Number of distinct descriptor values (counters) per descriptor position.
    #[arg(long, env = "SLIDEGATE_BENCH_KEYS", default_value_t = 10_000)]
    pub keys: u64,
    /// How values are drawn from the key space.
    #[arg(
        long,
        env = "SLIDEGATE_BENCH_DISTRIBUTION",
        value_enum,
        default_value = "uniform"
    )]
    pub distribution: KeyDistribution,
    /// Zipf exponent for `--distribution zipf` (1.0 is the classic skew).
    #[arg(long, env = "SLIDEGATE_BENCH_ZIPF_EXPONENT", default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Connections to open (HTTP/2, or Redis for a `redis://` target); workers are spread over
    /// them.
    #[arg(long, env = "SLIDEGATE_BENCH_CONNECTIONS", default_value_t = 4)]
    pub connections: usize,
    /// Requests in flight at once (closed-loop workers).
    #[arg(long, env = "SLIDEGATE_BENCH_CONCURRENCY", default_value_t = 64)]
    pub concurrency: usize,
    /// Generator threads. Each runs its own single-threaded tokio runtime with its share of the
    /// connections and workers (cross-thread wake-ups cost more than a request). One thread is
    /// the cheapest per request; add threads only when one core cannot saturate the server.
    #[arg(long, env = "SLIDEGATE_BENCH_THREADS", default_value_t = 1)]
    pub threads: usize,
    /// Measured duration, e.g. `10s`.
    #[arg(long, env = "SLIDEGATE_BENCH_DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Unmeasured warm-up before the measured phase, e.g. `2s`.
    #[arg(long, env = "SLIDEGATE_BENCH_WARMUP", default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Target rate in requests per second over all workers (0 = as fast as possible).
    #[arg(long, env = "SLIDEGATE_BENCH_RATE", default_value_t = 0)]
    pub rate: u64,
    /// `hits_addend` of every request.
    #[arg(long, env = "SLIDEGATE_BENCH_HITS", default_value_t = 1)]
    pub hits: u32,
    /// Per-call deadline; slower calls count as errors.
    #[arg(long, env = "SLIDEGATE_BENCH_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// PID of the server under test: report its CPU time per request (Linux /proc).
    #[arg(long, env = "SLIDEGATE_BENCH_SERVER_PID")]
    pub server_pid: Option<u32>,
    /// PID of the Redis server behind it: report its CPU time per request too.
    #[arg(long, env = "SLIDEGATE_BENCH_REDIS_PID")]
    pub redis_pid: Option<u32>,
    /// Before the warm-up, send this many rounds of one request for every key of the key space
    /// (each descriptor position gets the same key): a large key space then starts full, and N
    /// rounds put exactly N hits on every counter.
    #[arg(long, env = "SLIDEGATE_BENCH_PREFILL", default_value_t = 0)]
    pub prefill: u64,
    /// Print only the JSON line (no text report, no progress bar).
    #[arg(long, env = "SLIDEGATE_BENCH_JSON")]
    pub json: bool,
    /// PEM CA certificates to trust for an `https://` target (gRPC over TLS, ALPN `h2`); needed
    /// with one.
    #[arg(long, env = "SLIDEGATE_BENCH_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
}

/// What one run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    pub target: String,
    pub descriptors: usize,
    pub keys: u64,
    pub distribution: String,
    pub domain: String,
    pub key: String,
    pub hits: u32,
    /// The `--rate` asked for (0: as fast as possible).
    pub rate: u64,
    pub connections: usize,
    pub concurrency: usize,
    pub threads: usize,
    pub duration_s: f64,
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    pub throughput_rps: f64,
    pub latency_us: Percentiles,
    /// Server CPU microseconds per request, when `--server-pid` was given.
    pub server_cpu_us_per_request: Option<f64>,
    /// Cores the server used on average (CPU time / wall time), with `--server-pid`.
    pub server_cores: Option<f64>,
    /// This load generator's own CPU microseconds per request.
    pub client_cpu_us_per_request: Option<f64>,
    /// Redis CPU microseconds per request, when `--redis-pid` was given.
    pub redis_cpu_us_per_request: Option<f64>,
    /// Cores Redis used on average, with `--redis-pid`.
    pub redis_cores: Option<f64>,
}

/// CPU time of the processes being watched, at one instant.
#[derive(Clone, Copy, Debug, Default)]
struct CpuSnapshot {
    server: Option<Duration>,
    client: Option<Duration>,
    redis: Option<Duration>,
}

impl CpuSnapshot {
    fn take(args: &BenchArgs) -> Self {
        CpuSnapshot {
            server: args.server_pid.and_then(process_cpu_time),
            client: process_cpu_time(std::process::id()),
            redis: args.redis_pid.and_then(process_cpu_time),
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    pub mean: f64,
}

/// Tallies of one worker, merged at the end.
struct WorkerStats {
    histogram: Histogram<u64>,
    allowed: u64,
    denied: u64,
    errors: u64,
}

impl WorkerStats {
    fn new() -> Self {
        WorkerStats {
            // 1 µs .. 60 s at 3 significant digits; the bounds cannot be invalid.
            histogram: Histogram::new_with_bounds(1, 60_000_000, 3)
                .expect("constant histogram bounds are valid"),
            allowed: 0,
            denied: 0,
            errors: 0,
        }
    }
}

/// Runs the benchmark on `--threads` threads and prints the report (text unless `--json`, then
/// one JSON line). Blocking: the calling thread coordinates the others until the end, so call it
/// from plain synchronous code (it needs no runtime; every thread builds its own).
pub fn main(args: BenchArgs) -> Result<BenchReport, BenchError> {
    validate(&args)?;
    let target = Target::parse(&args.target, args.ca_file.as_deref())?;
    let keys = Arc::new(KeySpace::new(&args)?);
    let phases = Phases::new(args.threads);
    let done = Arc::new(AtomicU64::new(0));
    let (sender, results) = mpsc::channel();
    let measured = std::thread::scope(|scope| {
        let handles: Vec<_> = Share::all(&args)
            .into_iter()
            .map(|share| {
                let (args, target, phases) = (&args, &target, &phases);
                let (keys, done, sender) = (keys.clone(), done.clone(), sender.clone());
                scope.spawn(move || run_thread(args, target, share, phases, keys, done, sender))
            })
            .collect();
        // Only the threads hold senders now: `results` disconnects if they all stop.
        drop(sender);
        let measured = coordinate(&args, &phases, &done, &results);
        join_all(handles).map(|()| measured)
    })?;
    // No tallies but no thread error either cannot happen: a failed setup returns its error.
    let m = measured.ok_or(BenchError::ThreadFailed)?;
    let report = summarize(&args, m.stats, m.elapsed, m.cpu_before, m.cpu_after);
    print_report(&args, &report);
    Ok(report)
}

fn validate(args: &BenchArgs) -> Result<(), BenchError> {
    let invalid = |m: &str| Err(BenchError::Invalid(m.to_string()));
    if args.descriptors == 0 {
        return invalid("--descriptors must be at least 1");
    }
    if args.keys == 0 {
        return invalid("--keys must be at least 1");
    }
    if args.connections == 0 || args.concurrency == 0 {
        return invalid("--connections and --concurrency must be at least 1");
    }
    if args.threads == 0 || args.threads > args.connections.min(args.concurrency) {
        return invalid("--threads must be at least 1 and at most --connections and --concurrency");
    }
    if args.duration.is_zero() {
        return invalid("--duration must be positive");
    }
    Ok(())
}

/// Where the threads meet. Both barriers count the calling thread too, which takes the CPU
/// snapshots at the start of the measured phase.
struct Phases {
    /// Passed once every thread has connected (and the first one has prefilled).
    ready: Barrier,
    /// Passed once every thread has warmed up: the measured phase starts.
    measure: Barrier,
    /// Set before `ready` by a thread that could not set up: then every thread stops after it,
    /// so none waits forever at `measure`.
    failed: AtomicBool,
    /// The instant the measured phase starts, the same for all threads.
    start: OnceLock<Instant>,
}

impl Phases {
    fn new(threads: usize) -> Self {
        Phases {
            ready: Barrier::new(threads + 1),
            measure: Barrier::new(threads + 1),
            failed: AtomicBool::new(false),
            start: OnceLock::new(),
        }
    }

    /// The measured phase's start: the first thread past `measure` fixes it for everyone, so all
    /// threads share one window and one deadline.
    fn start(&self) -> Instant {
        *self.start.get_or_init(Instant::now)
    }
}

/// One thread's part of the load: its connections and its run of the global worker numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Share {
    index: usize,
    connections: usize,
    /// Global number of its first worker: seeds and pacing offsets stay distinct across threads.
    first_worker: usize,
    workers: usize,
}

impl Share {
    /// Spreads `--connections` and `--concurrency` as evenly as possible over `--threads`; the
    /// shares add up exactly to the flags.
    fn all(args: &BenchArgs) -> Vec<Share> {
        let part = |total: usize, index: usize| {
            total / args.threads + usize::from(index < total % args.threads)
        };
        let mut first_worker = 0;
        (0..args.threads)
            .map(|index| {
                let share = Share {
                    index,
                    connections: part(args.connections, index),
                    first_worker,
                    workers: part(args.concurrency, index),
                };
                first_worker += share.workers;
                share
            })
            .collect()
    }
}

/// What the calling thread measured, to summarize.
struct Measured {
    stats: Vec<WorkerStats>,
    elapsed: Duration,
    cpu_before: CpuSnapshot,
    cpu_after: CpuSnapshot,
}

/// One generator thread: sets up, warms up, runs the measured phase and sends its tallies.
fn run_thread(
    args: &BenchArgs,
    target: &Target,
    share: Share,
    phases: &Phases,
    keys: Arc<KeySpace>,
    done: Arc<AtomicU64>,
    results: Sender<Vec<WorkerStats>>,
) -> Result<(), BenchError> {
    let setup = setup_thread(args, target, share);
    if setup.is_err() {
        phases.failed.store(true, Ordering::Relaxed);
    }
    // The barrier orders the stores to `failed` before every load after it.
    phases.ready.wait();
    if phases.failed.load(Ordering::Relaxed) {
        return setup.map(drop);
    }
    let (runtime, clients) = setup?;
    if !args.warmup.is_zero() {
        let discarded = Arc::new(AtomicU64::new(0));
        let warmup = drive(
            args,
            share,
            &clients,
            &keys,
            Instant::now(),
            args.warmup,
            &discarded,
        );
        let _ = runtime.block_on(warmup);
    }
    phases.measure.wait();
    let measured = drive(
        args,
        share,
        &clients,
        &keys,
        phases.start(),
        args.duration,
        &done,
    );
    // Fails only if the calling thread stopped listening, and then nobody wants the tallies.
    let _ = results.send(runtime.block_on(measured));
    Ok(())
}

/// Everything that can fail, done before the first barrier: the thread's runtime, its
/// connections (a connection is a task on the runtime that opened it) and, on the first thread
/// only, the prefill, so that every key gets exactly `--prefill` hits.
fn setup_thread(
    args: &BenchArgs,
    target: &Target,
    share: Share,
) -> Result<(tokio::runtime::Runtime, Vec<Client>), BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let clients = runtime.block_on(connect(args, target, share.connections))?;
    if share.index == 0 && args.prefill > 0 {
        runtime.block_on(prefill(args, &clients));
    }
    Ok((runtime, clients))
}

/// The calling thread's part: waits for the threads to set up and warm up, takes the CPU
/// snapshots around the measured phase, shows the total on the progress bar and gathers every
/// thread's tallies. `None` when a thread failed to set up (its error comes back from its join).
fn coordinate(
    args: &BenchArgs,
    phases: &Phases,
    done: &AtomicU64,
    results: &Receiver<Vec<WorkerStats>>,
) -> Option<Measured> {
    phases.ready.wait();
    if phases.failed.load(Ordering::Relaxed) {
        return None;
    }
    phases.measure.wait();
    let cpu_before = CpuSnapshot::take(args);
    let started = phases.start();
    let progress = progress_bar(args);
    let mut stats = Vec::with_capacity(args.concurrency);
    let mut pending = args.threads;
    while pending > 0 {
        match results.recv_timeout(Duration::from_millis(200)) {
            Ok(thread_stats) => {
                stats.extend(thread_stats);
                pending -= 1;
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Some(bar) = &progress {
                    bar.set_position(done.load(Ordering::Relaxed));
                }
            }
            // A thread died; its join reports it.
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let elapsed = started.elapsed();
    let cpu_after = CpuSnapshot::take(args);
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Some(Measured {
        stats,
        elapsed,
        cpu_before,
        cpu_after,
    })
}

/// Joins every thread (all of them, so none is left running); the first error or panic wins.
fn join_all(handles: Vec<ScopedJoinHandle<'_, Result<(), BenchError>>>) -> Result<(), BenchError> {
    handles
        .into_iter()
        .map(|handle| handle.join().unwrap_or(Err(BenchError::ThreadFailed)))
        .fold(Ok(()), Result::and)
}

/// The one method the generator calls.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// HTTP/2 receive windows, per stream and per connection: a few MiB, so that the responses (about
/// a hundred bytes each) never wait for a WINDOW_UPDATE.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;

/// Where `--target` points.
#[derive(Clone, Debug)]
enum Target {
    /// A RateLimitService over HTTP/2: where to dial, and the URI of the method there (its scheme
    /// and authority become every request's `:scheme` and `:authority`).
    Rls { dial: Dial, uri: Uri },
    /// A Redis server, called directly (see the module docs).
    Redis { url: String },
}

impl Target {
    /// Accepts `http://host[:port]` (port 80 by default), `https://host[:port]` (443; TLS
    /// trusting `ca_file`) and `redis://...`, any URL slidegate's Redis store takes.
    fn parse(target: &str, ca_file: Option<&Path>) -> Result<Self, BenchError> {
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
struct Dial {
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
async fn connect(
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
enum Client {
    Rls(RlsClient),
    /// Shared by the workers of one connection, like a connection of slidegate's.
    Redis(Arc<RedisStore>),
}

impl Client {
    /// Sends `request` (encoded into `buf`, which is reused). `Ok(true)` when it was over the limit.
    async fn over_limit(
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
    async fn recover(&mut self) {
        match self {
            Client::Rls(client) => client.recover().await,
            Client::Redis(_) => tokio::time::sleep(REDIAL_PAUSE / 10).await,
        }
    }
}

/// Hits per window of every counter of a `redis://` target: the rule `scripts/bench` gives the
/// gRPC runs (and its `redis-benchmark` runs of the script).
pub const DIRECT_LIMIT: u64 = 100;
/// The window of every counter of a `redis://` target.
pub const DIRECT_WINDOW: Duration = Duration::from_secs(1);

/// slidegate's Redis store with one connection, opened now on the current runtime (so that its
/// driver runs here), and no deny cache: every call goes to Redis.
async fn direct_store(
    url: &str,
    timeout: Duration,
) -> Result<RedisStore, crate::store::StoreError> {
    let options = RedisOptions {
        url: url.to_string(),
        timeout,
        deny_cache: 0,
        connections: 1,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&options).await?;
    store.ping().await?;
    Ok(store)
}

/// The counters slidegate would decide for `request` under a rule of [`DIRECT_LIMIT`] per
/// [`DIRECT_WINDOW`] on each of its descriptors: the same keys, limits and hits.
fn direct_counters(request: &RateLimitRequest) -> Vec<Counter> {
    let hits = u64::from(request.hits_addend.max(1));
    let key_of = |d: &RateLimitDescriptor| {
        let entries = d.entries.iter();
        CounterKey::new(
            &request.domain,
            entries.map(|e| (e.key.as_str(), e.value.as_str())),
            DIRECT_WINDOW,
        )
    };
    request
        .descriptors
        .iter()
        .map(|d| Counter {
            key: key_of(d),
            limit: DIRECT_LIMIT,
            window: DIRECT_WINDOW,
            hits,
            shadow: false,
            precision: Precision::Exact,
        })
        .collect()
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
struct RlsClient {
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

/// Why a call failed. Failures are only counted; naming them keeps [`call`] readable.
#[derive(Debug, PartialEq, Eq)]
enum CallError {
    /// The connection or the stream failed.
    Http2,
    /// The HTTP status was not 200.
    HttpStatus,
    /// `grpc-status` was missing or not 0.
    GrpcStatus,
    /// The body was not exactly one well-formed, uncompressed message.
    Frame,
    /// No answer within `--timeout`.
    Timeout,
    /// A `redis://` target's store failed (Redis error, lost connection or timeout).
    Store,
}

impl From<h2::Error> for CallError {
    fn from(_: h2::Error) -> Self {
        CallError::Http2
    }
}

/// One unary gRPC call on a new stream: the request head, the one message `frame`, then the
/// response's message and its status. On timeout the caller drops this future, and dropping the
/// stream's handles resets the stream.
async fn call(
    send: &mut SendRequest<Bytes>,
    head: Request<()>,
    frame: Bytes,
) -> Result<RateLimitResponse, CallError> {
    std::future::poll_fn(|cx| send.poll_ready(cx)).await?;
    let (response, mut request_body) = send.send_request(head, false)?;
    request_body.send_data(frame, true)?;
    let (head, mut body) = response.await?.into_parts();
    if head.status != StatusCode::OK {
        return Err(CallError::HttpStatus);
    }
    let message = read_body(&mut body).await?;
    // A trailers-only response (how errors usually come) has its status in the headers.
    let trailers = body.trailers().await?;
    if !grpc_ok(trailers.as_ref().unwrap_or(&head.headers)) {
        return Err(CallError::GrpcStatus);
    }
    decode_frame(&message)
}

/// The head of a gRPC request to `uri`.
fn grpc_request(uri: &Uri) -> Request<()> {
    let mut request = Request::new(());
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri.clone();
    let headers = request.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    request
}

/// Reads a response body to its end, handing the flow-control capacity back as it arrives. The
/// message nearly always comes in one DATA frame, which is kept as is; more are joined.
async fn read_body(body: &mut RecvStream) -> Result<Bytes, CallError> {
    let mut message = Bytes::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
        message = if message.is_empty() {
            chunk
        } else {
            [message, chunk].concat().into()
        };
    }
    Ok(message)
}

/// Whether `headers` say `grpc-status: 0`.
fn grpc_ok(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"0")
}

/// Decodes one gRPC message: uncompressed, and exactly as long as its prefix says.
fn decode_frame<M: Message + Default>(frame: &[u8]) -> Result<M, CallError> {
    match frame {
        [0, a, b, c, d, message @ ..]
            if u32::from_be_bytes([*a, *b, *c, *d]) as usize == message.len() =>
        {
            M::decode(message).map_err(|_| CallError::Frame)
        }
        _ => Err(CallError::Frame),
    }
}

/// Runs one thread's workers from `start` for `duration` and returns their tallies.
async fn drive(
    args: &BenchArgs,
    share: Share,
    clients: &[Client],
    keys: &Arc<KeySpace>,
    start: Instant,
    duration: Duration,
    done: &Arc<AtomicU64>,
) -> Vec<WorkerStats> {
    let deadline = start + duration;
    // Each worker paces itself at rate / concurrency when a rate is asked for.
    let interval = (args.rate > 0)
        .then(|| Duration::from_secs_f64(args.concurrency as f64 / args.rate as f64));
    let mut workers = Vec::with_capacity(share.workers);
    for local in 0..share.workers {
        let worker = share.first_worker + local;
        // Spread the paced workers of all threads evenly over one interval instead of bursts.
        let first_send = match interval {
            Some(interval) => start + interval.mul_f64(worker as f64 / args.concurrency as f64),
            None => start,
        };
        let job = Worker {
            client: clients[local % clients.len()].clone(),
            keys: keys.clone(),
            request: request_template(&args.domain, &args.key, args.descriptors, args.hits),
            buf: BytesMut::new(),
            interval,
            rng: SmallRng::seed_from_u64(worker as u64 + 1),
        };
        workers.push(tokio::spawn(job.run(first_send, deadline, done.clone())));
    }
    let mut stats = Vec::with_capacity(workers.len());
    for worker in workers {
        if let Ok(s) = worker.await {
            stats.push(s);
        }
    }
    stats
}

struct Worker {
    client: Client,
    keys: Arc<KeySpace>,
    /// Built once; each call only rewrites the descriptor values.
    request: RateLimitRequest,
    /// Where requests are encoded, reused from call to call.
    buf: BytesMut,
    interval: Option<Duration>,
    rng: SmallRng,
}

impl Worker {
    async fn run(
        mut self,
        first_send: Instant,
        deadline: Instant,
        done: Arc<AtomicU64>,
    ) -> WorkerStats {
        let mut stats = WorkerStats::new();
        let mut next_send = first_send;
        while Instant::now() < deadline {
            if let Some(interval) = self.interval {
                tokio::time::sleep_until(next_send.into()).await;
                next_send += interval;
            }
            self.draw_values();
            let sent = Instant::now();
            let outcome = self.client.over_limit(&self.request, &mut self.buf).await;
            let micros = sent.elapsed().as_micros().min(u64::MAX as u128) as u64;
            let _ = stats.histogram.record(micros.max(1));
            match outcome {
                Ok(true) => stats.denied += 1,
                Ok(false) => stats.allowed += 1,
                Err(_) => {
                    stats.errors += 1;
                    self.client.recover().await;
                    // Let the others run: failing calls may never have waited.
                    tokio::task::yield_now().await;
                }
            }
            done.fetch_add(1, Ordering::Relaxed);
        }
        stats
    }

    /// Draws the next request's values.
    fn draw_values(&mut self) {
        let (keys, rng) = (&self.keys, &mut self.rng);
        set_values(&mut self.request, |_| keys.sample(rng));
    }
}

/// A request with `descriptors` descriptors of one entry `(key, "")` each; [`set_values`] fills
/// in the values.
fn request_template(domain: &str, key: &str, descriptors: usize, hits: u32) -> RateLimitRequest {
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_string(),
            value: String::new(),
        }],
        ..Default::default()
    };
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: vec![descriptor; descriptors],
        hits_addend: hits,
    }
}

/// Sets the value of the descriptor at `position` to `"{position}-{pick(position)}"`, in place:
/// the strings keep their memory from call to call.
fn set_values(request: &mut RateLimitRequest, mut pick: impl FnMut(usize) -> u64) {
    for (position, descriptor) in request.descriptors.iter_mut().enumerate() {
        let picked = pick(position);
        for entry in &mut descriptor.entries {
            entry.value.clear();
            // Writing to a `String` cannot fail.
            let _ = write!(entry.value, "{position}-{picked}");
        }
    }
}

/// Sends `--prefill` rounds of one request for every key (all descriptor positions on the same
/// key), `--concurrency` at a time. Errors are counted and reported, not fatal: the measured phase
/// reports its own. A lost connection is dialled again, as in the measured phase.
async fn prefill(args: &BenchArgs, clients: &[Client]) {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let keys = args.keys;
    let total = keys.saturating_mul(args.prefill);
    let mut tasks = Vec::with_capacity(args.concurrency);
    for worker in 0..args.concurrency {
        let mut client = clients[worker % clients.len()].clone();
        let mut request = request_template(&args.domain, &args.key, args.descriptors, args.hits);
        let (next, errors) = (next.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut buf = BytesMut::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break;
                }
                set_values(&mut request, |_| n % keys);
                if client.over_limit(&request, &mut buf).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                    client.recover().await;
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    if !args.json {
        eprintln!(
            "prefilled {} keys x {} in {:.1}s ({} errors)",
            args.keys,
            args.prefill,
            started.elapsed().as_secs_f64(),
            errors.load(Ordering::Relaxed)
        );
    }
}

/// The key space the descriptor values are drawn from.
enum KeySpace {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

impl KeySpace {
    fn new(args: &BenchArgs) -> Result<Self, BenchError> {
        match args.distribution {
            KeyDistribution::Uniform => Ok(KeySpace::Uniform(args.keys)),
            KeyDistribution::Zipf => Zipf::new(args.keys as f64, args.zipf_exponent)
                .map(KeySpace::Zipf)
                .map_err(|e| BenchError::Invalid(format!("--zipf-exponent: {e}"))),
        }
    }

    fn sample(&self, rng: &mut SmallRng) -> u64 {
        match self {
            KeySpace::Uniform(n) => rng.random_range(0..*n),
            // Zipf yields 1..=n as a float; shift to 0-based.
            KeySpace::Zipf(zipf) => zipf.sample(rng) as u64 - 1,
        }
    }
}

fn progress_bar(args: &BenchArgs) -> Option<indicatif::ProgressBar> {
    if args.json || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {pos} requests ({per_sec})")
    {
        bar.set_style(style);
    }
    Some(bar)
}

fn summarize(
    args: &BenchArgs,
    stats: Vec<WorkerStats>,
    elapsed: Duration,
    before: CpuSnapshot,
    after: CpuSnapshot,
) -> BenchReport {
    let mut total = WorkerStats::new();
    for s in stats {
        let _ = total.histogram.add(&s.histogram);
        total.allowed += s.allowed;
        total.denied += s.denied;
        total.errors += s.errors;
    }
    let requests = total.allowed + total.denied + total.errors;
    let h = &total.histogram;
    let seconds = elapsed.as_secs_f64();
    let used = |b: Option<Duration>, a: Option<Duration>| {
        b.zip(a)
            .map(|(b, a)| a.saturating_sub(b).as_secs_f64() * 1e6)
    };
    let per_request = |us: Option<f64>| us.filter(|_| requests > 0).map(|us| us / requests as f64);
    let cores = |us: Option<f64>| us.map(|us| us / 1e6 / seconds.max(f64::EPSILON));
    let server = used(before.server, after.server);
    let client = used(before.client, after.client);
    let redis = used(before.redis, after.redis);
    BenchReport {
        target: args.target.clone(),
        descriptors: args.descriptors,
        keys: args.keys,
        distribution: format!("{:?}", args.distribution).to_lowercase(),
        domain: args.domain.clone(),
        key: args.key.clone(),
        hits: args.hits,
        rate: args.rate,
        connections: args.connections,
        concurrency: args.concurrency,
        threads: args.threads,
        duration_s: seconds,
        requests,
        allowed: total.allowed,
        denied: total.denied,
        errors: total.errors,
        throughput_rps: requests as f64 / seconds.max(f64::EPSILON),
        latency_us: Percentiles {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        },
        server_cpu_us_per_request: per_request(server),
        server_cores: cores(server),
        client_cpu_us_per_request: per_request(client),
        redis_cpu_us_per_request: per_request(redis),
        redis_cores: cores(redis),
    }
}

fn print_report(args: &BenchArgs, r: &BenchReport) {
    use std::io::Write as _;
    // A closed pipe (`| head`) is not worth a panic: ignore write errors.
    let mut out = std::io::stdout().lock();
    if !args.json {
        let _ = writeln!(
            out,
            "{} requests in {:.2}s: {:.0} req/s ({} allowed, {} denied, {} errors)",
            r.requests, r.duration_s, r.throughput_rps, r.allowed, r.denied, r.errors
        );
        let l = &r.latency_us;
        let _ = writeln!(
            out,
            "latency µs: p50 {} p90 {} p99 {} p99.9 {} max {} (mean {:.1})",
            l.p50, l.p90, l.p99, l.p999, l.max, l.mean
        );
        let cpu = [
            ("server", r.server_cpu_us_per_request, r.server_cores),
            ("redis", r.redis_cpu_us_per_request, r.redis_cores),
            ("load generator", r.client_cpu_us_per_request, None),
        ];
        for (name, us, cores) in cpu {
            let Some(us) = us else { continue };
            let _ = match cores {
                Some(cores) => {
                    writeln!(out, "{name} CPU: {us:.2} µs per request ({cores:.2} cores)")
                }
                None => writeln!(out, "{name} CPU: {us:.2} µs per request"),
            };
        }
    }
    match serde_json::to_string(r) {
        Ok(line) => {
            let _ = writeln!(out, "{line}");
        }
        Err(e) => eprintln!("cannot encode report: {e}"),
    }
}

/// User + system CPU time of a process, from `/proc/PID/stat` (Linux; `None` elsewhere).
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after its closing ')' are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 overall, i.e. 11 and 12 after the state field (3).
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // Linux reports in USER_HZ, which is 100 on every mainstream configuration.
    Some(Duration::from_millis(ticks * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_time() {
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(process_cpu_time(std::process::id()).is_some());
    }

    /// Arguments for tests: one connection, one worker, one thread, nothing to connect to.
    fn args() -> BenchArgs {
        BenchArgs {
            target: String::new(),
            domain: String::new(),
            key: String::new(),
            descriptors: 1,
            keys: 10,
            distribution: KeyDistribution::Uniform,
            zipf_exponent: 1.0,
            connections: 1,
            concurrency: 1,
            threads: 1,
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            rate: 0,
            hits: 1,
            timeout: Duration::from_secs(1),
            server_pid: None,
            redis_pid: None,
            prefill: 0,
            json: true,
            ca_file: None,
        }
    }

    #[test]
    fn zipf_keys_stay_in_range() {
        let args = BenchArgs {
            distribution: KeyDistribution::Zipf,
            zipf_exponent: 1.2,
            ..args()
        };
        let space = KeySpace::new(&args).expect("valid zipf");
        let mut rng = SmallRng::seed_from_u64(7);
        let samples: Vec<u64> = (0..10_000).map(|_| space.sample(&mut rng)).collect();
        assert!(samples.iter().all(|&k| k < 10));
        let hottest = samples.iter().filter(|&&k| k == 0).count();
        assert!(hottest > 2_000, "key 0 should dominate, got {hottest}");
    }

    #[test]
    fn shares_add_up_to_the_flags() {
        for (connections, concurrency, threads) in [(4, 64, 1), (4, 64, 3), (5, 7, 5), (2, 1000, 2)]
        {
            let args = BenchArgs {
                connections,
                concurrency,
                threads,
                ..args()
            };
            let shares = Share::all(&args);
            assert_eq!(shares.len(), threads);
            assert_eq!(
                shares.iter().map(|s| s.connections).sum::<usize>(),
                connections
            );
            assert_eq!(shares.iter().map(|s| s.workers).sum::<usize>(), concurrency);
            let mut next_worker = 0;
            for share in &shares {
                assert!(share.connections >= 1 && share.workers >= 1, "{share:?}");
                assert!(share.workers.abs_diff(shares[0].workers) <= 1, "{shares:?}");
                assert_eq!(share.first_worker, next_worker);
                next_worker += share.workers;
            }
        }
    }

    #[test]
    fn threads_must_fit_connections_and_concurrency() {
        for (connections, concurrency, threads) in [(4, 64, 0), (4, 64, 5), (8, 2, 3)] {
            let args = BenchArgs {
                connections,
                concurrency,
                threads,
                ..args()
            };
            assert!(matches!(validate(&args), Err(BenchError::Invalid(_))));
        }
        let args = BenchArgs {
            connections: 4,
            concurrency: 4,
            threads: 4,
            ..args()
        };
        assert!(validate(&args).is_ok());
    }

    #[test]
    fn frames_round_trip() {
        let mut request = request_template("bench", "client", 2, 3);
        set_values(&mut request, |position| position as u64 + 7);
        assert_eq!(request.descriptors[1].entries[0].value, "1-8");
        let mut buf = BytesMut::new();
        let frame = encode_frame(&request, &mut buf);
        assert_eq!(frame[0], 0, "uncompressed");
        assert_eq!(
            decode_frame::<RateLimitRequest>(&frame),
            Ok(request.clone())
        );
        // Encoding again into the same buffer gives the same bytes.
        assert_eq!(encode_frame(&request, &mut buf), frame);

        let response = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            ..Default::default()
        };
        let frame = encode_frame(&response, &mut buf);
        assert_eq!(decode_frame(&frame), Ok(response));
        let mut compressed = frame.to_vec();
        compressed[0] = 1;
        let mut too_long = frame.to_vec();
        too_long.push(0);
        let bad: [&[u8]; 5] = [
            &[],
            &frame[..3],
            &frame[..frame.len() - 1],
            &compressed,
            &too_long,
        ];
        for bad in bad {
            assert_eq!(
                decode_frame::<RateLimitResponse>(bad),
                Err(CallError::Frame),
                "{bad:?}"
            );
        }
    }

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

    /// A `redis://` target decides the counters slidegate would for the same request under the
    /// `scripts/bench` rule: one per descriptor, keyed by the domain and the descriptor's entries.
    #[test]
    fn direct_counters_are_the_servers() {
        let mut request = request_template("bench", "client", 2, 0);
        set_values(&mut request, |position| position as u64 + 7);
        let counters = direct_counters(&request);
        assert_eq!(counters.len(), 2);
        assert_eq!(counters[1].key.as_str(), "{bench:client=1-8}1000");
        assert!(counters.iter().all(|c| c.hits == 1
            && c.limit == DIRECT_LIMIT
            && c.window == DIRECT_WINDOW
            && !c.shadow));
    }

    /// A thread that cannot connect must stop all of them at the first barrier, not hang them.
    #[test]
    fn connect_failure_on_any_thread_is_an_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let args = BenchArgs {
            target: format!("http://127.0.0.1:{port}"),
            connections: 2,
            concurrency: 2,
            threads: 2,
            ..args()
        };
        assert!(matches!(main(args), Err(BenchError::Connect { .. })));
    }
}
