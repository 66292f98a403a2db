//! The time source of the memory store, injectable so tests never sleep.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Wall-clock time since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Duration;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// A clock that moves only when told to: tests and the property suite drive time with it instead of
/// sleeping. Microsecond resolution, like the stores.
#[derive(Debug, Default)]
pub struct ManualClock {
    micros: std::sync::atomic::AtomicU64,
}

impl ManualClock {
    /// A clock showing `start` (time since the Unix epoch).
    pub fn new(start: Duration) -> Self {
        let clock = ManualClock::default();
        clock.set(start);
        clock
    }

    /// Jumps to `t`, backwards too (to test clocks that step back).
    pub fn set(&self, t: Duration) {
        let micros = u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
        self.micros
            .store(micros, std::sync::atomic::Ordering::SeqCst);
    }

    /// Moves forward by `d`.
    pub fn advance(&self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.micros
            .fetch_add(micros, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_micros(self.micros.load(std::sync::atomic::Ordering::SeqCst))
    }
}
