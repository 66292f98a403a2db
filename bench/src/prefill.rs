//! `--prefill N`: before the warm-up, N rounds of one request for every key, sent once from the
//! first thread, so that a large key space starts full.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::BytesMut;

use crate::args::BenchArgs;
use crate::client::Client;
use crate::keys::{request_template, set_values};

/// Sends `--prefill` rounds of one request for every key (all descriptor positions on the same
/// key), `--concurrency` at a time. Errors are counted and reported, not fatal: the measured phase
/// reports its own. A lost connection is dialled again, as in the measured phase.
pub async fn prefill(args: &BenchArgs, clients: &[Client]) {
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
