//! The decision log (`--log-decisions`): one line per decision, for debugging a limit without
//! traces, at most [`MAX_PER_SECOND`] lines a second.
//!
//! A line (target `slidegate::decisions`, level info, whatever `--log-level` says of the rest)
//! holds the transport, the caller (the peer of the connection: the proxy's address, or the Unix
//! socket's pid), the domain, the overall code and each descriptor: its entries (values cut
//! to [`MAX_VALUE_CHARS`] characters, `(hidden)` under `--operator-hide-values`), the rule or limit
//! that decided, the limit, what remains and its code. Over the cap, lines are dropped and counted
//! in `slidegate_decision_log_dropped_total`. Off (the default) it costs one comparison per call.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;

use super::code_name;
use crate::limiter::{Code, Request, Response};
use crate::metrics::Metrics;
use crate::service::Caller;

/// Which decisions get a line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogDecisions {
    #[default]
    Off,
    /// Requests answered OVER_LIMIT.
    Denied,
    /// Every decision.
    All,
}

impl LogDecisions {
    /// The command line's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LogDecisions::Off => "off",
            LogDecisions::Denied => "denied",
            LogDecisions::All => "all",
        }
    }
}

/// Most lines a second; the rest are counted as dropped.
pub const MAX_PER_SECOND: u64 = 100;

/// The most characters of a value written.
pub const MAX_VALUE_CHARS: usize = 64;

/// The log target of decision lines.
pub const TARGET: &str = "slidegate::decisions";

/// The decision log; see the module docs.
pub struct DecisionLog {
    mode: LogDecisions,
    hide_values: bool,
    /// The current second (Unix) in the high 32 bits, lines written in it in the low 32.
    window: AtomicU64,
    dropped: IntCounter,
}

impl fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionLog")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl DecisionLog {
    pub fn new(mode: LogDecisions, hide_values: bool, metrics: &Metrics) -> DecisionLog {
        let dropped = metrics
            .counter(
                "slidegate_decision_log_dropped_total",
                "Decision lines (--log-decisions) not written because more than 100 came in \
                 one second.",
            )
            .expect("metric definitions are valid");
        DecisionLog {
            mode,
            hide_values,
            window: AtomicU64::new(0),
            dropped,
        }
    }

    /// Writes the line of `response` to `request` on `transport` from `caller` if the mode asks
    /// for it.
    #[inline]
    pub fn decided(
        &self,
        transport: &'static str,
        caller: Option<&Caller>,
        request: &Request<'_>,
        response: &Response,
    ) {
        let wanted = match self.mode {
            LogDecisions::Off => false,
            LogDecisions::Denied => response.overall == Code::OverLimit,
            LogDecisions::All => true,
        };
        if wanted {
            self.write(transport, caller, request, response);
        }
    }

    #[cold]
    fn write(
        &self,
        transport: &'static str,
        caller: Option<&Caller>,
        request: &Request<'_>,
        response: &Response,
    ) {
        if !self.admit() {
            self.dropped.inc();
            return;
        }
        let descriptors = Descriptors {
            request,
            response,
            hide: self.hide_values,
        };
        tracing::info!(
            target: TARGET,
            transport,
            caller = caller.map_or("-", Caller::as_str),
            domain = request.domain,
            code = code_name(response.overall),
            descriptors = %descriptors,
            "decision"
        );
    }

    /// Whether one more line fits in this second.
    fn admit(&self) -> bool {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            & 0xffff_ffff;
        let mut current = self.window.load(Ordering::Relaxed);
        loop {
            let next = if current >> 32 == second {
                if current & 0xffff_ffff >= MAX_PER_SECOND {
                    return false;
                }
                current + 1
            } else {
                (second << 32) | 1
            };
            match self.window.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

/// `[user=alice path=/x] limit=per_user 10/1m remaining=0 OVER_LIMIT; [...] ...`
struct Descriptors<'a, 'r> {
    request: &'a Request<'r>,
    response: &'a Response,
    hide: bool,
}

impl fmt::Display for Descriptors<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let statuses = self.request.descriptors.iter().zip(&self.response.statuses);
        for (i, (descriptor, status)) in statuses.enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str("[")?;
            for (j, (key, value)) in descriptor.entries.iter().enumerate() {
                if j > 0 {
                    f.write_str(" ")?;
                }
                let value = if self.hide { "(hidden)" } else { cut(value) };
                write!(f, "{key}={value}")?;
            }
            f.write_str("]")?;
            if let Some(rule) = &status.rule {
                let name = match &rule.plain_name {
                    Some(plain) if self.hide => plain,
                    _ => &rule.name,
                };
                write!(f, " rule={name}")?;
            }
            match &status.current_limit {
                Some(limit) => write!(
                    f,
                    " limit={}/{} remaining={}",
                    limit.requests_per_unit,
                    humantime::format_duration(limit.window),
                    status.limit_remaining
                )?,
                None => f.write_str(" no limit")?,
            }
            write!(f, " {}", code_name(status.code))?;
        }
        Ok(())
    }
}

fn cut(value: &str) -> &str {
    match value.char_indices().nth(MAX_VALUE_CHARS) {
        Some((at, _)) => &value[..at],
        None => value,
    }
}
