//! docs/benchmarks.md, "Precision in practice": how many hits buckets admit per window against the
//! exact log and a fixed window, for a steady over-limit client and for bursty clients.
//!
//! A deterministic simulation, not a timed test: the real memory store on a manual clock, every
//! arrival time computed up front, nothing slept. The fixed window is not a slidegate store; it is
//! a few lines of reference arithmetic below ([`fixed_window`]) to show the 2N at its edges. Run:
//! `cargo test --test stores -- --ignored precision:: --nocapture`.
//!
//! The table is only worth printing if the stores keep their guarantees, so the run asserts them:
//! no interval of length W holds more than N hits admitted by the log or by buckets, and under the
//! steady client capacity is never late by more than one bucket width.

use std::sync::Arc;
use std::time::Duration;

use slidegate::store::{Counter, CounterKey, ManualClock, MemoryStore, Precision};

/// The window W, in microseconds.
const W: u64 = 60_000_000;
/// The limit N per window.
const N: u64 = 600;
/// Simulated time: 300 windows, long enough that the first window's fill and the last partial
/// cycle move the mean per window by at most 2 hits.
const SPAN: u64 = 300 * W;

/// One request: its arrival time (microseconds since the store was created) and its hits.
type Request = (u64, u64);

/// The client patterns of the table, each a list of requests in time order.
fn clients() -> Vec<(&'static str, Vec<Request>)> {
    // Steady: single hits at 4N per window, evenly spaced.
    let spacing = W / (4 * N);
    let steady = (0..SPAN / spacing).map(|i| (i * spacing, 1)).collect();
    // Edge bursts: at every multiple of W, 2N single hits spread over the last and the first
    // hundredth of the window around it, the pattern that makes a fixed window admit 2N.
    let edge = (1..SPAN / W)
        .flat_map(|k| {
            let from = k * W - W / 100;
            (0..2 * N).map(move |i| (from + i * (W / 50) / (2 * N), 1))
        })
        .collect();
    // Random bursts: N/2 single hits 1 ms apart, bursts starting at random gaps of 0 to W/2
    // (2N per window on average).
    let mut random = Vec::new();
    let mut rng = XorShift(0x5eed_1234_abcd_0001);
    let mut at = 0;
    while at < SPAN {
        random.extend((0..N / 2).map(|i| (at + i * 1_000, 1)));
        at += (N / 2) * 1_000 + rng.below(W / 2);
    }
    // Random requests of 1 to N/10 hits each, at random gaps of 0 to W/100 (about 3N per window
    // offered).
    let mut heavy = Vec::new();
    let mut at = 0;
    while at < SPAN {
        heavy.push((at, 1 + rng.below(N / 10)));
        at += rng.below(W / 100);
    }
    let trim = |mut r: Vec<Request>| {
        r.retain(|&(t, _)| t < SPAN);
        r
    };
    vec![
        ("steady, 4N per W in single hits", steady),
        ("edge bursts, 2N around each W edge", edge),
        ("random bursts of N/2 single hits", trim(random)),
        ("random requests of 1 to N/10 hits", trim(heavy)),
    ]
}

/// A small deterministic generator, so the table is the same on every run.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The requests the real memory store admits, with `precision`, on a manual clock.
fn memory_store(precision: Precision, requests: &[Request]) -> Vec<Request> {
    let start = Duration::from_secs(1_700_000_000);
    let clock = Arc::new(ManualClock::new(start));
    let store = MemoryStore::new(clock.clone());
    let window = Duration::from_micros(W);
    let counter = Counter {
        key: CounterKey::new("precision", [("client", "c")], window),
        kind: slidegate::store::HitKind::Admitted,
        limit: N,
        window,
        hits: 1,
        shadow: false,
        precision,
    };
    requests
        .iter()
        .filter(|&&(at, hits)| {
            clock.set(start + Duration::from_micros(at));
            let request = Counter {
                hits,
                ..counter.clone()
            };
            store.decide_now(&[request]).allowed
        })
        .copied()
        .collect()
}

/// Reference arithmetic, not a slidegate store: a fixed-window counter (one integer per window
/// `[kW, (k+1)W)`, reset at each edge), as envoyproxy/ratelimit and limitador count.
fn fixed_window(requests: &[Request]) -> Vec<Request> {
    let (mut current, mut count) = (0, 0);
    requests
        .iter()
        .filter(|&&(at, hits)| {
            if at / W != current {
                (current, count) = (at / W, 0);
            }
            let fits = count + hits <= N;
            count += if fits { hits } else { 0 };
            fits
        })
        .copied()
        .collect()
}

/// The most hits admitted in any interval `(t - len, t]`.
fn most_in_any(admitted: &[Request], len: u64) -> u64 {
    let (mut oldest, mut held, mut most) = (0, 0, 0);
    for &(at, hits) in admitted {
        held += hits;
        while admitted[oldest].0 + len <= at {
            held -= admitted[oldest].1;
            oldest += 1;
        }
        most = most.max(held);
    }
    most
}

/// The fewest hits admitted in any interval `(t, t + len]` that starts at an admitted hit after
/// the first window and ends inside the run: how late capacity can come back.
fn fewest_after_any(admitted: &[Request], len: u64) -> u64 {
    // before[i]: hits admitted before admitted[i].
    let before: Vec<u64> = admitted
        .iter()
        .scan(0, |sum, r| {
            let prior = *sum;
            *sum += r.1;
            Some(prior)
        })
        .collect();
    let total: u64 = admitted.iter().map(|r| r.1).sum();
    let mut end = 0;
    let mut fewest = u64::MAX;
    for (i, &(at, hits)) in admitted.iter().enumerate() {
        while end < admitted.len() && admitted[end].0 <= at + len {
            end += 1;
        }
        if at < W || at + len > SPAN {
            continue;
        }
        let through_end = before.get(end).copied().unwrap_or(total);
        fewest = fewest.min(through_end - before[i] - hits);
    }
    fewest
}

#[test]
#[ignore = "a benchmark: prints docs/benchmarks.md's precision in practice"]
fn precision_in_practice() {
    let widths = [("W/10", W / 10), ("W/60", W / 60), ("W/600", W / 600)];
    println!("W = 60 s, N = {N}, {} windows simulated", SPAN / W);
    println!();
    println!("| client | algorithm | most admitted in any W | mean admitted per W |");
    println!("|---|---|---|---|");
    for (name, requests) in clients() {
        let spacing = requests
            .windows(2)
            .map(|p| p[1].0 - p[0].0)
            .max()
            .unwrap_or(0);
        let mut rows = vec![(
            "fixed window (reference arithmetic)".to_string(),
            fixed_window(&requests),
            None,
        )];
        rows.push((
            "exact log".to_string(),
            memory_store(Precision::Exact, &requests),
            Some(0),
        ));
        for (label, width) in widths {
            let precision = Precision::Buckets(Duration::from_micros(width));
            let admitted = memory_store(precision, &requests);
            rows.push((format!("buckets, g = {label}"), admitted, Some(width)));
        }
        for (algorithm, admitted, late_by) in rows {
            let most = most_in_any(&admitted, W);
            let total: u64 = admitted.iter().map(|r| r.1).sum();
            let mean = total as f64 / (SPAN / W) as f64;
            println!("| {name} | {algorithm} | {most} | {mean:.1} |");
            let Some(late_by) = late_by else {
                assert!(most <= 2 * N, "{algorithm}: {most} in one W");
                continue;
            };
            assert!(most <= N, "{name}, {algorithm}: {most} admitted in one W");
            assert!(total > 0, "{name}, {algorithm}: nothing admitted");
            if name.starts_with("steady") {
                let fewest = fewest_after_any(&admitted, W + late_by + spacing);
                assert!(
                    fewest >= N,
                    "{algorithm}: only {fewest} admitted in W + g + one spacing"
                );
            }
        }
    }
}
