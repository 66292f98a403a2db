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
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
    }
}
