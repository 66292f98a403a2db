//! `slidegate-bench`: a gRPC load generator for any RateLimitService v3 server.
//!
//! It speaks only the public Envoy API over gRPC (plain, or TLS with `https://`), so it measures
//! slidegate and its peers alike. Every worker runs a closed loop (send, wait, record):
//! `--concurrency` workers share `--connections` HTTP/2 connections. Latency goes into an HDR
//! histogram per worker, merged at the end, so percentiles are exact to three significant digits
//! with no coordination on the hot path. A warm-up phase runs first and is not measured.
//!
//! The modules follow a run:
//!
//! - [`args`]: the command line and its checks.
//! - [`load`]: the generator threads, their phases and the workers' closed loop (and pacing).
//! - [`prefill`]: the rounds over the whole key space before the warm-up.
//! - [`keys`]: the requests and the key space their values are drawn from.
//! - [`client`]: where `--target` points and the HTTP/2 connections to it, dialled again when lost.
//! - [`grpc`]: one unary gRPC call on an HTTP/2 stream, and its framing.
//! - [`direct`]: a `redis://` target, decided by slidegate's own Redis store in the generator.
//! - [`report`]: tallies, CPU time per request, and the text and JSON report.
//!
//! It is its own binary, outside the `slidegate` crate, so that the product carries neither the
//! generator nor its dependencies (histograms, progress bar, distributions). It uses the
//! `slidegate` library only for what a `redis://` target must share with the server: the Redis
//! store and the counters' keys.

mod args;
mod client;
mod direct;
mod grpc;
mod keys;
mod load;
mod prefill;
mod report;

use std::process::ExitCode;

use clap::Parser as _;

use crate::args::BenchArgs;

/// mimalloc, as in the server: the generator allocates and frees small buffers on every call as
/// the server does, and its CPU per request is reported beside the server's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// Runs one benchmark. The exit status is an interface for scripts: 0 when every measured call
/// got an answer (allowed or denied), 3 when the run finished but some calls failed, 1 when it
/// could not run, 2 for bad arguments. The generator builds its own runtimes, one per thread.
fn main() -> ExitCode {
    match load::run(BenchArgs::parse()) {
        Ok(report) if report.errors == 0 => ExitCode::SUCCESS,
        // A script must not take a run of failed calls for a measurement: a distinct code, so
        // that it can still tell this from a run that never started (1).
        Ok(report) => {
            eprintln!(
                "slidegate-bench: {} of {} calls failed",
                report.errors, report.requests
            );
            ExitCode::from(3)
        }
        Err(error) => {
            eprintln!("slidegate-bench: {error:#}");
            match error {
                // As clap does for the arguments it checks itself.
                BenchError::Invalid(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
