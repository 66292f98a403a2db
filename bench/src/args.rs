//! The command line: what to load, the shape of the load, and what to watch.

use std::time::Duration;

use crate::BenchError;

/// How descriptor values are drawn from the key space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf-distributed (exponent `--zipf-exponent`): a few hot keys take most requests.
    Zipf,
}

/// Loads any RateLimitService v3 server over gRPC and reports throughput, latency
/// percentiles and allowed/denied/error counts (text and one JSON line).
///
/// Exit status: 0 when every measured call got an answer (allowed or denied), 3 when the run
/// finished but some calls failed (the report counts them), 1 when it could not run (nothing
/// to connect to), 2 for bad arguments.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "slidegate-bench", version)]
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

/// Checks what clap cannot: counts that must be positive, and threads that each get at least one
/// connection and one worker.
pub fn validate(args: &BenchArgs) -> Result<(), BenchError> {
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

/// Arguments for tests: one connection, one worker, one thread, nothing to connect to.
#[cfg(test)]
pub fn test_args() -> BenchArgs {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_must_fit_connections_and_concurrency() {
        for (connections, concurrency, threads) in [(4, 64, 0), (4, 64, 5), (8, 2, 3)] {
            let args = BenchArgs {
                connections,
                concurrency,
                threads,
                ..test_args()
            };
            assert!(matches!(validate(&args), Err(BenchError::Invalid(_))));
        }
        let args = BenchArgs {
            connections: 4,
            concurrency: 4,
            threads: 4,
            ..test_args()
        };
        assert!(validate(&args).is_ok());
    }
}
