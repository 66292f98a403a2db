//! `slidegate bench`: a gRPC load generator for any RateLimitService v3 server.
//!
//! It speaks only the public Envoy API, so it measures slidegate and its peers alike. Every worker
//! runs a closed loop (send, wait, record): `--concurrency` workers share `--connections` HTTP/2
//! connections. Latency goes into an HDR histogram per worker, merged at the end, so percentiles are
//! exact to three significant digits with no coordination on the hot path. A warm-up phase runs
//! first and is not measured.
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

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Zipf};
use tonic::transport::{Channel, Endpoint};

/// Errors that stop a benchmark (all but a thread's crash before it measures anything).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: String,
        source: tonic::transport::Error,
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
    /// gRPC address of the RateLimitService to load.
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
    /// HTTP/2 connections to open; workers are spread over them.
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
    let keys = Arc::new(KeySpace::new(&args)?);
    let phases = Phases::new(args.threads);
    let done = Arc::new(AtomicU64::new(0));
    let (sender, results) = mpsc::channel();
    let measured = std::thread::scope(|scope| {
        let handles: Vec<_> = Share::all(&args)
            .into_iter()
            .map(|share| {
                let (args, phases, keys) = (&args, &phases, keys.clone());
                let (done, sender) = (done.clone(), sender.clone());
                scope.spawn(move || run_thread(args, share, phases, keys, done, sender))
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
    share: Share,
    phases: &Phases,
    keys: Arc<KeySpace>,
    done: Arc<AtomicU64>,
    results: Sender<Vec<WorkerStats>>,
) -> Result<(), BenchError> {
    let setup = setup_thread(args, share);
    if setup.is_err() {
        phases.failed.store(true, Ordering::Relaxed);
    }
    // The barrier orders the stores to `failed` before every load after it.
    phases.ready.wait();
    if phases.failed.load(Ordering::Relaxed) {
        return setup.map(drop);
    }
    let (runtime, channels) = setup?;
    if !args.warmup.is_zero() {
        let discarded = Arc::new(AtomicU64::new(0));
        let warmup = drive(
            args,
            share,
            &channels,
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
        &channels,
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
/// connections (a channel lives on the runtime that opened it) and, on the first thread only,
/// the prefill, so that every key gets exactly `--prefill` hits.
fn setup_thread(
    args: &BenchArgs,
    share: Share,
) -> Result<(tokio::runtime::Runtime, Vec<Channel>), BenchError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let channels = runtime.block_on(connect(args, share.connections))?;
    if share.index == 0 && args.prefill > 0 {
        runtime.block_on(prefill(args, &channels));
    }
    Ok((runtime, channels))
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

/// Opens `count` HTTP/2 connections on the current runtime.
async fn connect(args: &BenchArgs, count: usize) -> Result<Vec<Channel>, BenchError> {
    let connect_error = |source| BenchError::Connect {
        target: args.target.clone(),
        source,
    };
    let endpoint = Endpoint::from_shared(args.target.clone())
        .map_err(connect_error)?
        .tcp_nodelay(true)
        .timeout(args.timeout);
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        channels.push(endpoint.connect().await.map_err(connect_error)?);
    }
    Ok(channels)
}

/// Runs one thread's workers from `start` for `duration` and returns their tallies.
async fn drive(
    args: &BenchArgs,
    share: Share,
    channels: &[Channel],
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
        let client = RateLimitServiceClient::new(channels[local % channels.len()].clone());
        let job = Worker {
            client,
            keys: keys.clone(),
            domain: args.domain.clone(),
            key: args.key.clone(),
            descriptors: args.descriptors,
            hits: args.hits,
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
    client: RateLimitServiceClient<Channel>,
    keys: Arc<KeySpace>,
    domain: String,
    key: String,
    descriptors: usize,
    hits: u32,
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
            let request = self.request();
            let sent = Instant::now();
            let outcome = self.client.should_rate_limit(request).await;
            let micros = sent.elapsed().as_micros().min(u64::MAX as u128) as u64;
            let _ = stats.histogram.record(micros.max(1));
            match outcome {
                Ok(response) if response.get_ref().overall_code == Code::OverLimit as i32 => {
                    stats.denied += 1
                }
                Ok(_) => stats.allowed += 1,
                Err(_) => stats.errors += 1,
            }
            done.fetch_add(1, Ordering::Relaxed);
        }
        stats
    }

    fn request(&mut self) -> RateLimitRequest {
        let keys = &self.keys;
        let rng = &mut self.rng;
        build_request(&self.domain, &self.key, self.descriptors, self.hits, |_| {
            keys.sample(rng)
        })
    }
}

/// A request whose descriptor at `position` is `[(key, "{position}-{pick(position)}")]`.
fn build_request(
    domain: &str,
    key: &str,
    descriptors: usize,
    hits: u32,
    mut pick: impl FnMut(usize) -> u64,
) -> RateLimitRequest {
    let descriptors = (0..descriptors)
        .map(|position| RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_string(),
                value: format!("{position}-{}", pick(position)),
            }],
            ..Default::default()
        })
        .collect();
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: hits,
    }
}

/// Sends `--prefill` rounds of one request for every key (all descriptor positions on the same
/// key), `--concurrency` at a time. Errors are counted and reported, not fatal: the measured phase
/// reports its own.
async fn prefill(args: &BenchArgs, channels: &[Channel]) {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.concurrency);
    for worker in 0..args.concurrency {
        let mut client = RateLimitServiceClient::new(channels[worker % channels.len()].clone());
        let (next, errors) = (next.clone(), errors.clone());
        let (domain, key, descriptors, hits, keys) = (
            args.domain.clone(),
            args.key.clone(),
            args.descriptors,
            args.hits,
            args.keys,
        );
        let total = keys.saturating_mul(args.prefill);
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break;
                }
                let k = n % keys;
                let request = build_request(&domain, &key, descriptors, hits, |_| k);
                if client.should_rate_limit(request).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
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
