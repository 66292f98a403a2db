//! Properties of the memory store on a manual clock, against reference models: random arrival
//! schedules decided exactly as a sliding log would, all or nothing across counters, and bucket
//! counters that keep the log's guarantee.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{bucketed, counter, hits};
use proptest::prelude::*;
use slidegate::store::{Clock, ManualClock, MemoryStore};

// ---------------------------------------------------------------------------------------------
// Property: random arrival schedules against a reference sliding log (memory store, manual clock).

/// What a sliding log must answer, from the admitted hits alone: `(time µs, hits)`.
fn model_fits(admitted: &[(u64, u64)], now: u64, window: u64, limit: u64, hits: u64) -> bool {
    let in_window: u64 = admitted
        .iter()
        .filter(|(t, _)| t + window > now)
        .map(|(_, h)| h)
        .sum();
    hits <= limit && in_window + hits <= limit
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every decision equals the reference sliding log's: so no interval of length W ever admits
    /// more than N (checked directly too), and a request is denied only if it truly does not fit,
    /// which under saturation means exactly N per window.
    #[test]
    fn memory_store_is_an_exact_sliding_log(
        limit in 1u64..8,
        window_ms in 1u64..50,
        schedule in prop::collection::vec((0u64..20_000, 0u64..4), 1..300),
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let window = window_ms * 1000;
        let c = counter("prop", "a", limit, Duration::from_millis(window_ms), 1);
        let start = clock.now().as_micros() as u64;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, h) in schedule {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now().as_micros() as u64 - start;
            let expect = model_fits(&admitted, now, window, limit, h);
            let d = store.decide_now(&[hits(c.clone(), h)]);
            prop_assert_eq!(d.allowed, expect, "at {} µs, {} hits", now, h);
            if d.allowed && h > 0 {
                admitted.push((now, h));
            }
            let in_window: u64 = admitted.iter().filter(|(t, _)| t + window > now).map(|(_, h)| h).sum();
            prop_assert!(in_window <= limit);
            prop_assert_eq!(d.counters[0].count, in_window);
        }
        // Saturation: any interval of length W starting at an admission holds at most N hits.
        for (i, &(t, _)) in admitted.iter().enumerate() {
            let n: u64 = admitted[i..].iter().filter(|(u, _)| *u < t + window).map(|(_, h)| h).sum();
            prop_assert!(n <= limit);
        }
    }

    /// Two counters in every request, one of them sometimes shadow: all or nothing, checked
    /// against two reference logs.
    #[test]
    fn memory_store_is_all_or_nothing(
        schedule in prop::collection::vec((0u64..5_000, 0u64..3, any::<bool>(), any::<bool>()), 1..200),
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let (wa, wb) = (10_000u64, 25_000u64);
        let a = counter("prop2", "a", 3, Duration::from_micros(wa), 1);
        let b = counter("prop2", "b", 5, Duration::from_micros(wb), 1);
        let mut log_a: Vec<(u64, u64)> = Vec::new();
        let mut log_b: Vec<(u64, u64)> = Vec::new();
        let start = clock.now().as_micros() as u64;
        for (gap, h, b_shadow, only_b) in schedule {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now().as_micros() as u64 - start;
            let fits_b = model_fits(&log_b, now, wb, 5, h);
            let mut cb = hits(b.clone(), h);
            cb.shadow = b_shadow;
            let d = if only_b {
                store.decide_now(std::slice::from_ref(&cb))
            } else {
                store.decide_now(&[hits(a.clone(), h), cb])
            };
            let fits_a = only_b || model_fits(&log_a, now, wa, 3, h);
            let allowed = fits_a && (fits_b || b_shadow);
            prop_assert_eq!(d.allowed, allowed);
            if allowed && h > 0 {
                if !only_b {
                    log_a.push((now, h));
                }
                if fits_b {
                    log_b.push((now, h));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Property: bucket counters keep the sliding log's guarantee (memory store, manual clock).

/// What a bucket counter must answer from the admitted hits alone: every hit whose bucket
/// overlaps `(now - window, now]` counts, its whole bucket included; a check (0 hits) fits a full
/// counter, as with the log. Times in µs since the store's creation (where its buckets start).
fn buckets_fit(
    admitted: &[(u64, u64)],
    now: u64,
    width: u64,
    span: u64,
    limit: u64,
    hits: u64,
) -> bool {
    let current = now / width;
    let counted: u64 = admitted
        .iter()
        .filter(|(t, _)| t / width + span >= current)
        .map(|(_, h)| h)
        .sum();
    hits <= limit && counted + hits <= limit
}

/// Most admitted hits in any interval of length `len`, from the admissions `(time, hits)` in time
/// order: the busiest interval starts at an admission.
fn most_in_any(admitted: &[(u64, u64)], len: u64) -> u64 {
    (0..admitted.len())
        .map(|i| {
            let t = admitted[i].0;
            admitted[i..]
                .iter()
                .take_while(|(u, _)| *u < t + len)
                .map(|(_, h)| h)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Random arrivals and hit counts against random limits, windows and bucket widths: every
    /// decision is the bucket model's, and no interval of length W ever holds more than N
    /// admitted hits.
    #[test]
    fn buckets_never_admit_more_than_the_limit_in_any_window(
        limit in 1u64..20,
        span in 1u64..12,
        width_us in 1u64..4_000,
        schedule in prop::collection::vec((0u64..6_000, 0u64..5), 1..400),
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let window = span * width_us;
        let c = bucketed(
            counter("prop-b", "a", limit, Duration::from_micros(window), 1),
            Duration::from_micros(width_us),
        );
        let start = clock.now().as_micros() as u64;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, h) in schedule {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now().as_micros() as u64 - start;
            let expect = buckets_fit(&admitted, now, width_us, span, limit, h);
            let d = store.decide_now(&[hits(c.clone(), h)]);
            prop_assert_eq!(d.allowed, expect, "at {} µs, {} hits", now, h);
            if d.allowed && h > 0 {
                admitted.push((now, h));
            }
        }
        prop_assert!(most_in_any(&admitted, window) <= limit);
    }

    /// A steady over-limit stream of single hits: capacity is never late by more than one bucket
    /// width. Once the counter first fills, every interval of length W + g + one spacing holds at
    /// least N admitted hits (and still none of length W more than N).
    #[test]
    fn buckets_return_capacity_at_most_one_width_late(
        limit in 1u64..20,
        span in 1u64..12,
        width_us in 10u64..2_000,
        per_window in 2u64..6,
    ) {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
        let store = MemoryStore::new(clock.clone());
        let window = span * width_us;
        // Over the limit: `per_window` times as many requests as the limit allows.
        let spacing = (window / (limit * per_window)).max(1);
        let c = bucketed(
            counter("prop-s", "a", limit, Duration::from_micros(window), 1),
            Duration::from_micros(width_us),
        );
        let start = clock.now().as_micros() as u64;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut full_since = None;
        let end = 6 * (window + width_us);
        let mut now = 0;
        while now < end {
            let d = store.decide_now(std::slice::from_ref(&c));
            if d.allowed {
                admitted.push((now, 1));
            }
            if full_since.is_none() && d.counters[0].remaining == 0 {
                full_since = Some(now);
            }
            clock.advance(Duration::from_micros(spacing));
            now = clock.now().as_micros() as u64 - start;
        }
        prop_assert!(most_in_any(&admitted, window) <= limit);
        let full_since = full_since.expect("the stream fills the counter");
        let span_late = window + width_us + spacing;
        // The emptiest interval of that length starts just after an admission.
        for &(s, _) in admitted.iter().filter(|(s, _)| *s >= full_since) {
            if s + span_late >= now {
                break;
            }
            let n = admitted.iter().filter(|(u, _)| *u > s && *u <= s + span_late).count() as u64;
            prop_assert!(n >= limit, "only {} admitted in ({}, {}]", n, s, s + span_late);
        }
    }
}
