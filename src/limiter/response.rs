//! The answer: per-descriptor statuses, the most restrictive counter, and the response headers.

use std::sync::Arc;
use std::time::Duration;

use compact_str::CompactString;

use super::plan::Limited;
use crate::config::{Limit, RuleMetadata, Unit};
use crate::store::{Counter, CounterResult};

/// OK or over limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub overall: Code,
    /// One per request descriptor, in order.
    pub statuses: Vec<DescriptorStatus>,
    /// `RateLimit-Limit`, `-Remaining`, `-Reset`, `-Policy` and on deny `Retry-After`, lower-case
    /// names; empty when headers are off or no descriptor had a limit. The values are short
    /// (numbers, and a policy per limit), held inline.
    pub headers: Vec<(&'static str, CompactString)>,
}

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorStatus {
    pub code: Code,
    /// The limit that decided; `None` for no rule, `unlimited` and replaced rules.
    pub current_limit: Option<CurrentLimit>,
    pub limit_remaining: u32,
    pub duration_until_reset: Option<Duration>,
    /// The rule that decided, with [`Options::response_metadata`](super::Options::response_metadata);
    /// else `None`. Boxed: it is rarely asked for, and a status is moved several times per call.
    pub rule: Option<Box<DecidingRule>>,
    /// A shadow rule's (or the global shadow mode's): its `OVER_LIMIT` denies nothing.
    pub shadow: bool,
}

/// The rule that decided a descriptor, as answers show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecidingRule {
    /// Its metrics name (or its limit's, under `rate_limits`), at most
    /// [`envoy_stats::MAX_KEY_BYTES`](super::envoy_stats::MAX_KEY_BYTES) long.
    pub name: String,
    /// Its name without the request's values where `name` carries them (a rule with
    /// `detailed_metric` or `value_to_metric`): what is shown where values are hidden.
    pub plain_name: Option<String>,
    /// Its `metadata` from the rule file, if any.
    pub metadata: Option<Arc<RuleMetadata>>,
}

/// The limit reported for a descriptor: as configured (`requests_per_unit` per `unit`), plus the
/// true window (`unit` × `unit_multiplier`), which Envoy's proto cannot carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    pub name: Option<String>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub window: Duration,
}

/// The index of the most restrictive result: over limit first (the one that frees up last), else
/// the fewest remaining (ties: the one that resets last).
pub(super) fn most_restrictive(results: &[CounterResult]) -> usize {
    let mut best = 0;
    for (i, result) in results.iter().enumerate().skip(1) {
        if more_restrictive(result, &results[best]) {
            best = i;
        }
    }
    best
}

pub(super) fn more_restrictive(a: &CounterResult, b: &CounterResult) -> bool {
    match (a.over_limit, b.over_limit) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.reset_after > b.reset_after,
        (false, false) => {
            a.remaining < b.remaining
                || (a.remaining == b.remaining && a.reset_after > b.reset_after)
        }
    }
}

/// Whether `candidate` (chosen counter, enforced over) should give the response headers instead of
/// `current`: an enforced deny first (the one that frees up last), else the fewest remaining.
pub(super) fn better_for_headers(
    candidate: (usize, bool),
    current: Option<(usize, bool)>,
    results: &[CounterResult],
) -> bool {
    let Some(current) = current else {
        return true;
    };
    let (a, b) = (&results[candidate.0], &results[current.0]);
    match (candidate.1, current.1) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.reset_after > b.reset_after,
        (false, false) => more_restrictive(a, b),
    }
}

/// The IETF RateLimit headers (draft-ietf-httpapi-ratelimit-headers) for the chosen counter, with
/// every limit of its descriptor in the policy, and `Retry-After` when the request is denied.
pub(super) fn headers(
    counter: &Counter,
    result: &CounterResult,
    descriptor_counters: &[Counter],
    denied: bool,
) -> Vec<(&'static str, CompactString)> {
    // Numbers through itoa: `to_string` and `write!` go through the formatting machinery, some
    // hundred instructions a number on every answer.
    let mut digits = itoa::Buffer::new();
    let mut policy = CompactString::with_capacity(16 * descriptor_counters.len());
    for (i, c) in descriptor_counters.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
        }
        policy.push_str(digits.format(c.limit));
        policy.push_str(";w=");
        policy.push_str(digits.format(ceil_secs(c.window)));
    }
    let reset = ceil_secs(result.reset_after);
    let mut decimal = |n: u64| CompactString::from(digits.format(n));
    let mut headers = vec![
        ("ratelimit-limit", decimal(counter.limit)),
        ("ratelimit-remaining", decimal(result.remaining)),
        ("ratelimit-reset", decimal(reset)),
        ("ratelimit-policy", policy),
    ];
    if denied {
        headers.push(("retry-after", decimal(reset.max(1))));
    }
    headers
}

/// Whole seconds, rounded up.
pub(super) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

pub(super) fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The limit a descriptor reports, named by its own `name`, else by the rule's.
pub(super) fn current_limit(limited: &Limited<'_>, limit: &Limit) -> CurrentLimit {
    CurrentLimit {
        name: (limit.name.as_ref())
            .or(limited.rule.and_then(|rule| rule.name.as_ref()))
            .cloned(),
        requests_per_unit: saturate_u32(limit.requests_per_unit),
        unit: limit.unit,
        window: limit.window(),
    }
}
