//! Sliding-window stores.
//!
//! A store decides, for all counters of one request at once, whether the request fits in every
//! sliding window, and records it only if it does (all or nothing). Two implementations share the
//! semantics below and one behaviour test suite: [`memory::MemoryStore`] (the default) and
//! [`redis::RedisStore`] (standalone or Cluster, shared by replicas).
//!
//! Semantics of a sliding log with limit `N` per window `W`, for a counter asked for `h` hits at
//! time `t`:
//! - the hits already admitted in `(t - W, t]` plus `h` must be at most `N`;
//! - `h == 0` decides as for one hit but records nothing (a check);
//! - `h > N` is always over limit;
//! - if any non-shadow counter of the request is over limit, nothing is recorded anywhere;
//!   shadow counters are evaluated and reported but never cause a deny.

use std::time::Duration;

use async_trait::async_trait;

pub mod clock;
pub mod key;
pub mod memory;
pub mod redis;

pub use clock::{Clock, SystemClock};
pub use key::CounterKey;

/// One sliding-window counter that a request touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    /// Identity of the counter: domain, descriptor entries as matched, window.
    pub key: CounterKey,
    /// Hits admitted per window.
    pub limit: u64,
    /// Length of the sliding window.
    pub window: Duration,
    /// Hits this request adds; 0 checks without recording.
    pub hits: u64,
    /// Evaluated and reported, but never causes a deny.
    pub shadow: bool,
}

/// What a store found for one counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterResult {
    /// This counter alone cannot take the request's hits (for shadow counters too).
    pub over_limit: bool,
    /// Hits in the window after the decision.
    pub count: u64,
    /// `limit - count`, saturating.
    pub remaining: u64,
    /// Over limit: time until the request's hits would fit (the whole window when `hits > limit`).
    /// Otherwise: time until the oldest hit in the window leaves it (zero for an empty window).
    pub reset_after: Duration,
}

/// The store's answer for one request: one result per counter, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// True when no non-shadow counter is over limit; the hits were then recorded everywhere.
    pub allowed: bool,
    pub counters: Vec<CounterResult>,
}

/// Why a store could not decide.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    #[error("store connection failed: {0}")]
    Connection(String),
    #[error("store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// A short, stable label for metrics (`timeout`, `connection`, `backend`).
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Connection(_) => "connection",
            StoreError::Backend(_) => "backend",
        }
    }
}

/// A sliding-window store.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Decides all counters of one request atomically (all or nothing), see the module docs.
    async fn decide(&self, counters: &[Counter]) -> Result<Decision, StoreError>;
    /// Whether the store answers (used by health checks).
    async fn ping(&self) -> Result<(), StoreError>;
    /// `memory`, `redis` or `redis-cluster`, for logs and metrics.
    fn kind(&self) -> &'static str;
}
