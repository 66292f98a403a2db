//! The load: generator threads, the phases they meet at, and the workers' closed loop.
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
//! With `--rate`, each worker sends at `rate / concurrency` (so each thread sends its share of the
//! rate in proportion to its workers), the workers staggered over one interval so the load is
//! spread evenly rather than sent in bursts; latency is measured from the actual send (tokio's
//! timer has millisecond granularity, which would otherwise add up to 1 ms).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::BenchError;
use crate::args::{self, BenchArgs};
use crate::client::{self, Client, Target};
use crate::keys::{KeySpace, request_template, set_values};
use crate::prefill::prefill;
use crate::report::{self, BenchReport, CpuSnapshot, WorkerStats};

/// Runs the benchmark on `--threads` threads and prints the report (text unless `--json`, then
/// one JSON line). Blocking: the calling thread coordinates the others until the end, so call it
/// from plain synchronous code (it needs no runtime; every thread builds its own).
pub fn run(args: BenchArgs) -> Result<BenchReport, BenchError> {
    args::validate(&args)?;
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
    let report = report::summarize(&args, m.stats, m.elapsed, m.cpu_before, m.cpu_after);
    report::print_report(&args, &report);
    Ok(report)
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
    let clients = runtime.block_on(client::connect(args, target, share.connections))?;
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
    let progress = report::progress_bar(args);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_flags() {
        for (connections, concurrency, threads) in [(4, 64, 1), (4, 64, 3), (5, 7, 5), (2, 1000, 2)]
        {
            let args = BenchArgs {
                connections,
                concurrency,
                threads,
                ..args::test_args()
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
            ..args::test_args()
        };
        assert!(matches!(run(args), Err(BenchError::Connect { .. })));
    }
}
