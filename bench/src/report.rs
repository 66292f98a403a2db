//! What a run measured and how it is shown: the workers' tallies, the CPU time of the watched
//! processes, the progress bar, and the report (text, then one JSON line).
//!
//! With `--server-pid`, the server's CPU time (user + system, from `/proc/PID/stat`) over the
//! measured phase is divided by the requests served: CPU per request is the figure that stays
//! comparable on a shared, noisy machine where absolute rates drift. The generator reports its own
//! CPU per request too (it usually shares the cores with the server), and with `--redis-pid` the
//! Redis server's.

use std::io::IsTerminal;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::args::BenchArgs;

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
    /// Of which in the kernel (system time: reads, writes, `epoll_wait`, wake-ups).
    pub server_system_cpu_us_per_request: Option<f64>,
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
pub struct CpuSnapshot {
    server: Option<Duration>,
    server_system: Option<Duration>,
    client: Option<Duration>,
    redis: Option<Duration>,
}

impl CpuSnapshot {
    pub fn take(args: &BenchArgs) -> Self {
        let server = args.server_pid.and_then(process_cpu_times);
        CpuSnapshot {
            server: server.map(|(user, system)| user + system),
            server_system: server.map(|(_, system)| system),
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
pub struct WorkerStats {
    pub histogram: Histogram<u64>,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
}

impl WorkerStats {
    pub fn new() -> Self {
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

/// A spinner with the running total, on a terminal and without `--json`.
pub fn progress_bar(args: &BenchArgs) -> Option<indicatif::ProgressBar> {
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

/// Merges the workers' tallies into the report of a measured phase of `elapsed`, with the CPU
/// time used between the two snapshots.
pub fn summarize(
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
    let server_system = used(before.server_system, after.server_system);
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
        server_system_cpu_us_per_request: per_request(server_system),
        server_cores: cores(server),
        client_cpu_us_per_request: per_request(client),
        redis_cpu_us_per_request: per_request(redis),
        redis_cores: cores(redis),
    }
}

/// Prints the report to stdout: the text lines unless `--json`, then the JSON line.
pub fn print_report(args: &BenchArgs, r: &BenchReport) {
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
    process_cpu_times(pid).map(|(user, system)| user + system)
}

/// User and system CPU time of a process, from `/proc/PID/stat` (Linux; `None` elsewhere).
pub fn process_cpu_times(pid: u32) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields after its closing ')' are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 overall, i.e. 11 and 12 after the state field (3).
    let ticks = |field: usize| fields.get(field)?.parse::<u64>().ok();
    // Linux reports in USER_HZ, which is 100 on every mainstream configuration.
    let time = |ticks: u64| Duration::from_millis(ticks * 10);
    Some((time(ticks(11)?), time(ticks(12)?)))
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
}
