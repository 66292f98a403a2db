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
//! - `h == 0` is a check: it records nothing, and is over limit only when the window holds more
//!   than `N` (a limit lowered below what it holds). 0 hits fit a full counter, so a check of a
//!   full counter is allowed and reports `remaining` 0, as envoyproxy/ratelimit answers it;
//! - `h > N` is always over limit;
//! - if any non-shadow counter of the request is over limit, nothing is recorded anywhere;
//!   shadow counters are evaluated and reported but never cause a deny.
//! - when the request is allowed, every counter that is not itself over limit records its hits. A
//!   shadow counter over its limit records nothing: an enforced limit would not have admitted the
//!   request either, so a shadow counter keeps measuring exactly what enforcing it would do.
//! - a request that names the same counter twice is decided as one log: the second occurrence
//!   sees the hits the first would add. Named in two representations (a rule and a limit override
//!   on the same entries and window), it is decided in the coarser one for the whole request
//!   ([`form`]). What a store reports about a counter follows only from
//!   hits that are recorded: a denied request reports, for every counter, the hits it holds (the
//!   first's hits were never added), and the Redis deny cache only remembers counters that recorded
//!   hits fill.
//!
//! Windows are at most [`MAX_WINDOW`] long (rule validation rejects longer ones); both stores hold
//! such windows exactly.
//!
//! Time has microsecond resolution. The window is `(t - W, t]`: a hit recorded at `s` counts until
//! `s + W` and is gone at that instant.
//!
//! A counter is an exact log or buckets ([`Precision`], resolved per limit when the rules load;
//! not part of the counter's key). Buckets of width `g` (`W = B * g`) split time at multiples of `g`
//! (of the store's clock); "the hits already admitted in `(t - W, t]`" above becomes "the hits of
//! every bucket that overlaps `(t - W, t]`", the oldest bucket counted whole: a hit recorded at `s`
//! counts from `s` until the end of its bucket plus `W`, so for somewhere between `W` and `W + g`.
//! Both representations therefore keep the same guarantee: **no interval of length `W` ever holds
//! more than `N` admitted hits.** The log returns capacity exactly `W` after a hit, buckets at most
//! `g` later; `reset_after` reports the time as the representation has it (the end of a bucket's
//! stay). Every other rule above (checks, `h > N`, all or nothing across counters of both kinds,
//! shadow counters, a counter named twice) is the same for both.
//!
//! # Charges and returned hits
//! A counter's hits are of one of three kinds ([`HitKind`]):
//! - **admitted** (the default): everything above. Recorded only if the whole request fits;
//! - **charged**: the cost of something already served (a response's cost sent after it). It is
//!   decided like admitted hits (over limit when it does not fit, which makes an enforced counter
//!   deny the request), but recorded whatever the decision, on its own counter, even over the
//!   limit. The window then holds more than `N`: a debt, which denies every later request of
//!   that counter, checks included, until enough hits leave the window. The whole charge is kept
//!   (up to [`MAX_HITS`]; a charge too large for a log is recorded in buckets, see [`form`]), so
//!   the debt denies as long as the whole charge would, also after a reload raises the limit. A charged counter never
//!   makes the request's other counters record: they follow the decision as above;
//! - **returned** (Envoy's `is_negative_hits`): the counter's newest hits are taken back, at most
//!   as many as it holds (never below zero), whatever the decision. A returned counter is never
//!   over limit and reports what is left.
//!
//! So the guarantee becomes: **admitted hits (less those returned) never exceed `N` in any
//! interval of length `W`** (each was admitted only where it fitted among everything recorded);
//! charges may take the recorded count above `N`, and while it is, nothing more is admitted. Both representations and both stores treat the kinds
//! alike.
//!
//! A store only reports failures as [`StoreError`]; what a failure means for the request
//! ([`FailureMode`]) is the limiter's business, so every store behaves the same way when it fails.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;

pub mod clock;
pub mod form;
pub mod key;
pub mod memory;
pub mod quota;
pub mod redis;
pub mod work;

pub use self::redis::{
    ClientCertFiles, DEFAULT_DENY_CACHE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisOptions, RedisStore,
    SentinelOptions, connect, redact_url,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use form::{LOG_RECORD_MAX, decided_forms};
pub use key::CounterKey;
pub use memory::MemoryStore;

/// How a counter remembers the hits of its window. Resolved once per limit when the rules are
/// loaded (`precision` in YAML, or [`Precision::automatic`]). Not part of the counter's key: a
/// store that finds a counter in another representation than the one asked carries its hits over
/// (each placed at the latest instant it can have been admitted), so a reload that changes the
/// precision keeps what was counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The sliding log: the time of every admitted hit. Exact; memory grows with the hits held.
    Exact,
    /// The window in buckets of this width (the window is a whole multiple of it), each holding
    /// the number of hits admitted in it; the oldest overlapping bucket counts whole. Memory is
    /// bounded by the bucket count; capacity returns at most one width later than with the log.
    Buckets(Duration),
}

impl Precision {
    /// Most buckets per window: a decision reads at most about this many fields of a counter (a
    /// Redis hash of up to this many buckets; usually a few, see `sliding_window/4_buckets.lua`),
    /// so the bound keeps a request's cost and a counter's memory small. Redis
    /// keeps up to 128 fields as a compact listpack (about 11 bytes per bucket), more as a hash
    /// table of about 64 bytes per bucket: 64 KB for 1000.
    pub const MAX_BUCKETS: u64 = 1000;

    /// Limits up to this many hits per window keep the exact log when `precision` is not given. In
    /// Redis a log of at most 128 hits is a compact listpack of about 27 bytes per hit (3.5 KB when
    /// full, docs/benchmarks.md); above that each hit costs 100 to 113 bytes and the log grows without
    /// bound in N, while a counter of [`Precision::AUTO_BUCKETS`] buckets stays under 1 KB
    /// (`MEMORY USAGE` of a saturated counter's hash: 520 to 712 bytes, docs/benchmarks.md).
    pub const AUTO_EXACT_UP_TO: u64 = 128;

    /// Buckets per window chosen automatically: one sixtieth of the window (a minute of an hour),
    /// or one fiftieth where a sixtieth is not a whole number of microseconds (1-second windows).
    pub const AUTO_BUCKETS: [u64; 2] = [60, 50];

    /// The representation slidegate chooses for `limit` hits per `window` when the rule does not
    /// say: the exact log while it is cheap, buckets where it would grow large.
    pub fn automatic(limit: u64, window: Duration) -> Precision {
        if limit <= Precision::AUTO_EXACT_UP_TO {
            return Precision::Exact;
        }
        let micros = window.as_micros();
        Precision::AUTO_BUCKETS
            .into_iter()
            .find(|&b| micros.is_multiple_of(u128::from(b)) && micros >= u128::from(b))
            .and_then(|b| u64::try_from(micros / u128::from(b)).ok())
            .map_or(Precision::Exact, |width| {
                Precision::Buckets(Duration::from_micros(width))
            })
    }

    /// The bucket width, or `None` for the exact log.
    pub fn bucket_width(self) -> Option<Duration> {
        match self {
            Precision::Exact => None,
            Precision::Buckets(width) => Some(width),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Precision::Exact => f.write_str("exact"),
            Precision::Buckets(width) => {
                write!(f, "buckets of {}", humantime::format_duration(*width))
            }
        }
    }
}

/// The longest window a store holds exactly (100 years). In Redis a hit's time plus the window must
/// stay an exact integer in a Lua double, below 2^53 µs since 1970: true until the year 2155.
pub const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The most hits one counter takes from one request: 2^50 (about 10^15, an exact integer in a Lua
/// double). The limiter counts a larger `hits_addend` as this many, and both stores cap what they
/// are asked at it, so no sum of hits can wrap.
pub const MAX_HITS: u64 = 1 << 50;

/// The most hits a counter holds: 2^52. A record that would take a counter past it makes room by
/// dropping its oldest hits: the counter is over every limit while it holds that many, and keeping
/// the newest hits keeps it so for as long as the whole debt would. So a counter's total never
/// wraps, in the memory store's `u64` nor in Redis's `HINCRBY` or Lua's doubles.
pub const MAX_HELD: u64 = 1 << 52;

/// One sliding-window counter that a request touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    /// Identity of the counter: domain, descriptor entries as matched, window, representation.
    pub key: CounterKey,
    /// Hits admitted per window.
    pub limit: u64,
    /// Length of the sliding window.
    pub window: Duration,
    /// Hits this request adds; 0 checks without recording.
    pub hits: u64,
    /// Evaluated and reported, but never causes a deny.
    pub shadow: bool,
    /// The exact log or buckets (the key carries it too).
    pub precision: Precision,
    /// What the hits do: admitted if the request fits, charged whatever, or returned.
    pub kind: HitKind,
}

/// What a counter does with its hits; see the module docs, *Charges and returned hits*.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HitKind {
    /// Recorded only if the whole request fits.
    #[default]
    Admitted,
    /// Decided as admitted hits, but recorded whatever the decision, over the limit too.
    Charged,
    /// Taken back from the counter's newest hits, never below zero; never over limit.
    Returned,
}

/// What a store found for one counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterResult {
    /// This counter alone cannot take the request's hits (for shadow counters too).
    pub over_limit: bool,
    /// Hits in the window after the decision: for a denied request, the hits the counter holds.
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
    /// True when no non-shadow counter is over limit; the hits were then recorded on every counter
    /// that is not itself over limit (only a shadow counter can be over limit in an allowed request).
    pub allowed: bool,
    pub counters: Vec<CounterResult>,
}

/// Why a store could not decide.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// The connection broke, or could not be made for another reason than the two below.
    #[error("store connection failed: {0}")]
    Connection(String),
    /// Nothing listens at the store's address (connection refused): the server is down or
    /// restarting, or the address is wrong.
    #[error("store refused the connection: {0}")]
    Refused(String),
    /// The store's host name does not resolve.
    #[error("store host name does not resolve: {0}")]
    Dns(String),
    /// Redis at `maxmemory` with `noeviction` refused to record hits.
    #[error("store out of memory: {0}")]
    OutOfMemory(String),
    #[error("store error: {0}")]
    Backend(String),
    /// The store answers but cannot run what slidegate sends (a server too old, a command
    /// renamed or forbidden, a script error, Redis named in the wrong mode: a cluster node as a
    /// standalone server or the reverse): permanent until the server or the settings change,
    /// unlike an outage.
    #[error("store cannot run the rate-limit script: {0}")]
    Incompatible(String),
    /// The store refused the credentials (a wrong or missing password, an unknown user): a
    /// configuration error, permanent until the settings or the server change.
    #[error("store refused the credentials: {0}")]
    Auth(String),
}

impl StoreError {
    /// Every [`StoreError::kind`], in the order of [`StoreError::index`].
    pub const KINDS: [&'static str; 8] = [
        "timeout",
        "connection",
        "oom",
        "backend",
        "incompatible",
        "auth",
        "refused",
        "dns",
    ];

    /// A short, stable label for metrics (`timeout`, `connection`, `oom`, `backend`,
    /// `incompatible`, `auth`, `refused`, `dns`).
    pub fn kind(&self) -> &'static str {
        StoreError::KINDS[self.index()]
    }

    /// The position of this error's kind in [`StoreError::KINDS`].
    pub fn index(&self) -> usize {
        match self {
            StoreError::Timeout(_) => 0,
            StoreError::Connection(_) => 1,
            StoreError::OutOfMemory(_) => 2,
            StoreError::Backend(_) => 3,
            StoreError::Incompatible(_) => 4,
            StoreError::Auth(_) => 5,
            StoreError::Refused(_) => 6,
            StoreError::Dns(_) => 7,
        }
    }

    /// The store could not be reached (a timeout, a connection refused, lost or not made, a name
    /// that does not resolve): an outage, which passes by itself or with the network.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout(_)
                | StoreError::Connection(_)
                | StoreError::Refused(_)
                | StoreError::Dns(_)
        )
    }

    /// A configuration error (the server cannot run the script, or refuses the credentials):
    /// permanent until the settings or the server change, unlike an outage.
    pub fn is_configuration(&self) -> bool {
        matches!(self, StoreError::Incompatible(_) | StoreError::Auth(_))
    }
}

/// What [`Store::decide`] gives: the answer, when the store has it at once (the memory store
/// decides in the call), or the future of it (Redis). Not a boxed future for every store: boxing
/// one that is ready at once cost an allocation per call.
pub enum Decided<'a> {
    /// The answer (taken by the first poll).
    Now(Option<Result<Decision, StoreError>>),
    /// The answer to come.
    Later(Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send + 'a>>),
}

impl Future for Decided<'_> {
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Decided::Now(answer) => Poll::Ready(answer.take().unwrap_or_else(|| {
                Err(StoreError::Backend(
                    "a decision polled after its answer".into(),
                ))
            })),
            Decided::Later(future) => future.as_mut().poll(cx),
        }
    }
}

/// A sliding-window store.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Decides all counters of one request atomically (all or nothing), see the module docs.
    fn decide<'a>(&'a self, counters: &'a [Counter]) -> Decided<'a>;
    /// What `counters` hold now, recording, charging and taking back nothing: each is decided as
    /// a check (0 admitted hits, see the module docs), so `count` is the hits its window holds,
    /// `remaining` what is left of its limit and `reset_after` when its oldest hit leaves (for
    /// a counter over its limit, when one more hit fits). For `POST /explain`: the answer comes
    /// from the store itself, never from a cache of denies.
    async fn peek(&self, counters: &[Counter]) -> Result<Vec<CounterResult>, StoreError> {
        Ok(self.decide(&checks_of(counters)).await?.counters)
    }
    /// Forgets the counters under `keys` entirely, in whatever representation they are (a log,
    /// buckets, a cross-slot provisional log), for `DELETE /counters`: whether each held a
    /// counter. A store shared by replicas makes every replica's cache forget them too (see
    /// `redis::resets`).
    async fn clear(&self, keys: &[CounterKey]) -> Result<Vec<bool>, StoreError>;
    /// Posts `note` on the shared `board` as `author` (a replica), replacing its previous note,
    /// for `ttl`: how replicas tell each other what they see, off the request path (`GET
    /// /limited`). A store that replicas do not share keeps nothing.
    async fn post(
        &self,
        _board: &str,
        _author: &str,
        _note: &str,
        _ttl: Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    /// The unexpired notes on `board`, by author.
    async fn notes(&self, _board: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(Vec::new())
    }
    /// Whether the store answers (used by health checks).
    async fn ping(&self) -> Result<(), StoreError>;
    /// `memory`, `redis` or `redis-cluster`, for logs and metrics.
    fn kind(&self) -> &'static str;
}

/// `counters` as checks: 0 admitted hits each, which record nothing (see [`Store::peek`]).
pub fn checks_of(counters: &[Counter]) -> Vec<Counter> {
    counters
        .iter()
        .map(|c| Counter {
            hits: 0,
            kind: HitKind::Admitted,
            ..c.clone()
        })
        .collect()
}

/// What the service answers when the store fails (`--failure-mode`). Applied by the limiter, not by
/// the stores, which only report [`StoreError`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailureMode {
    /// Answer the request with an error (gRPC `UNAVAILABLE`, HTTP 503): the proxy's own failure
    /// policy decides (Envoy's `failure_mode_deny`).
    #[default]
    Error,
    /// Let the request through (fail open).
    Allow,
    /// Reject the request as over limit (fail closed).
    Deny,
}

impl FailureMode {
    /// The CLI spelling: `error`, `allow` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Error => "error",
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
        }
    }
}

impl fmt::Display for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `--failure-mode` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown failure mode {0:?} (expected error, allow or deny)")]
pub struct ParseFailureModeError(String);

impl FromStr for FailureMode {
    type Err = ParseFailureModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" => Ok(FailureMode::Error),
            "allow" => Ok(FailureMode::Allow),
            "deny" => Ok(FailureMode::Deny),
            _ => Err(ParseFailureModeError(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_mode_round_trips_and_rejects_unknown() {
        for mode in [FailureMode::Error, FailureMode::Allow, FailureMode::Deny] {
            assert_eq!(mode.to_string().parse::<FailureMode>(), Ok(mode));
        }
        assert_eq!(" Allow ".parse::<FailureMode>(), Ok(FailureMode::Allow));
        let err = "open".parse::<FailureMode>().unwrap_err();
        assert!(err.to_string().contains("\"open\""), "{err}");
        assert_eq!(FailureMode::default(), FailureMode::Error);
    }
}
