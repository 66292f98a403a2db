//! Warnings that a client or a failing store can cause, aggregated: at most one line per
//! [`INTERVAL`] per kind, saying how many were left out.
//!
//! Why: a client that connects and resets thousands of times, or floods control frames on many
//! connections, or a store that fails every call under load, would otherwise write one log line
//! each, and the log is what operators read to find real failures.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The shortest time between two lines of one kind.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// One kind of warning; a `static` at the place that logs it.
pub struct Throttle {
    /// Milliseconds since [`epoch`] of the last line written, plus one (0: never).
    last: AtomicU64,
    /// Occurrences since the last line written.
    left_out: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Throttle {
    pub const fn new() -> Self {
        Throttle {
            last: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being the occurrences left out before this
    /// one; `None` when this one is only counted.
    pub fn admit(&self) -> Option<u64> {
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= INTERVAL.as_millis() as u64;
        if due
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.left_out.swap(0, Ordering::Relaxed));
        }
        self.left_out.fetch_add(1, Ordering::Relaxed);
        None
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_then_counts() {
        let throttle = Throttle::new();
        assert_eq!(throttle.admit(), Some(0));
        for _ in 0..1000 {
            assert_eq!(throttle.admit(), None);
        }
    }
}
