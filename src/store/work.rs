//! What one counter can cost a store in one decision, in the unit of the request's budget
//! (`--max-hits`): a write of one hit to a sliding log.
//!
//! A log writes one member per hit (at least one read for a check). A bucket counter writes one
//! field whatever its hits, but a decision may read its buckets: trimming those that left the
//! window and finding the next one that holds hits, or the time until the request's hits fit. The
//! script reads a range in growing chunks or as the whole hash, whichever is fewer fields, so a
//! decision reads at most about `2 * (B + 1)` fields of a counter of `B` buckets per window and
//! usually a handful (each bucket index is passed about once as the window moves). Counted as
//! `B + 1`, the request's budget bounds what its script call reads and writes alike: with the
//! default budget of 4096, at most about 8 000 fields and members per call whatever the precision,
//! and a counter at the finest precision validation allows (1000 buckets) takes a quarter of it.
//! docs/benchmarks.md, "Redis's time per call by precision", has the measured cost.

use std::time::Duration;

use super::Precision;

/// The budget `hits` hits on a counter of `window` kept with `precision` take (see the module
/// docs): the hits (at least 1) for a log, the buckets per window plus one for buckets.
pub fn work(precision: Precision, window: Duration, hits: u64) -> u64 {
    match precision.bucket_width() {
        Some(width) if !width.is_zero() => {
            let span = window.as_micros().div_ceil(width.as_micros());
            u64::try_from(span).unwrap_or(u64::MAX).saturating_add(1)
        }
        _ => hits.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_counter_costs_its_buckets_a_log_its_hits() {
        let minute = Duration::from_secs(60);
        assert_eq!(work(Precision::Exact, minute, 0), 1);
        assert_eq!(work(Precision::Exact, minute, 7), 7);
        let automatic = Precision::automatic(1000, minute);
        assert_eq!(work(automatic, minute, 50_000), 61);
        let finest = Precision::Buckets(Duration::from_millis(1));
        assert_eq!(work(finest, Duration::from_secs(1), 1), 1001);
    }
}
