//! From a request's descriptors to counters, one store decision, and per-descriptor statuses.
//!
//! The limiter is transport-neutral: gRPC `ShouldRateLimit`, `POST /json` and `/check` all build a
//! [`Request`] and call [`RateLimiter::should_rate_limit`]. One call:
//!
//! 1. validates the request against what only a proxy's configuration decides ([`RequestLimits`];
//!    violations are [`LimitError::InvalidArgument`]); what a client can choose is decided instead:
//!    a long value is counted under its digest, hits past the request's budget are a deny;
//! 2. loads the live rules once (one `ArcSwap` load, so a reload mid-request cannot mix rule sets);
//! 3. matches each descriptor to at most one rule; a descriptor `limit` override (Envoy's
//!    `RateLimitOverride`) replaces the rule lookup whenever the domain is configured, as in
//!    envoyproxy/ratelimit (the override is never shadow, has no name and no `replaces`);
//! 4. applies `replaces`: a matched rule whose `name` is in another matched rule's `replaces` is
//!    skipped (status OK without a limit; its counters are untouched);
//! 5. builds one [`Counter`] per limit of every remaining rule, within the request's budget of
//!    hits on exact logs (a descriptor past it is over limit, and then no counter of the request
//!    records hits), and asks the store **once**, so all counters of the request are decided
//!    all-or-nothing;
//! 6. reports each descriptor's most restrictive counter (an over-limit one first, the one that
//!    frees up last; else the one with the fewest hits remaining).
//!
//! Statuses follow envoyproxy/ratelimit: a descriptor with no rule (or an unknown domain) is OK with
//! no limit and `limit_remaining` 0; an `unlimited` rule is OK with `limit_remaining` `u32::MAX`.
//! A rule with `shadow_mode` is counted but reported OK. Under the global shadow mode every counter
//! is a shadow counter: descriptors still report `OVER_LIMIT` truthfully, but the overall code is
//! always OK, so nothing is denied.
//!
//! When the store fails, the failure mode decides: `error` returns [`LimitError::Unavailable`],
//! `allow` answers OK and `deny` answers OVER_LIMIT for every descriptor with a limit (shadow
//! rules and the global shadow mode still never deny). Statuses then carry the configured limit,
//! `limit_remaining` 0 and no reset; no response headers are added.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Scratch;
use crate::config::{DomainRules, Limit, LiveRules, Precision, RuleMatch, RuleSet, Unit};
use crate::metrics::{DecisionLabel, Metrics};
use crate::store::key::CounterTag;
use crate::store::{Counter, CounterResult, FailureMode, Store, StoreError};
use crate::telemetry::Traces;

/// Bounds on what one request may carry, the same for gRPC, `/json` and `/check`.
///
/// Each bound is answered by who can break it. The proxy's configuration decides how many
/// descriptors and entries a request has, and its domain and keys: a request over those bounds
/// can only come from a misconfigured proxy and is refused (`INVALID_ARGUMENT`, HTTP 400). Values
/// and hits can come from clients (a header, a path, a token count), and a refusal would let them
/// through (Envoy treats an error like an outage and, with `failure_mode_deny: false`, passes the
/// request uncounted). So a long value is counted under its digest, and hits over the budget are a
/// deny: no input a client chooses makes a request skip its limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// Longest domain and key (longer: refused); a longer value is counted under its SHA-256
    /// digest instead of its text, so a counter's key stays small and the limit still holds.
    pub max_value_bytes: usize,
    /// Most hits one request may add to counters kept as exact logs, summed over them (a log
    /// checked with 0 hits, and every bucket counter, counts as 1). A sliding log keeps every hit
    /// (one sorted-set member each in Redis), so this bounds what one request costs the store. A
    /// bucket counter adds any number of hits in one field at the same cost, so its hits are free
    /// (its limit still bounds what is admitted). A limited descriptor past the budget is
    /// `OVER_LIMIT` without being counted, and nothing of the denied request is recorded.
    pub max_hits: u64,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 32,
            max_value_bytes: 4096,
            max_hits: 4096,
        }
    }
}

impl RequestLimits {
    /// Refuses more than `max_descriptors` (checked while decoding, before the rest is built).
    pub fn check_descriptors(&self, count: usize) -> Result<(), LimitError> {
        if count > self.max_descriptors {
            return Err(LimitError::InvalidArgument(format!(
                "too many descriptors: {count} (at most {} allowed)",
                self.max_descriptors
            )));
        }
        Ok(())
    }

    /// Refuses more than `max_entries` in descriptor `i`.
    pub fn check_entries(&self, i: usize, count: usize) -> Result<(), LimitError> {
        if count > self.max_entries {
            return Err(LimitError::InvalidArgument(format!(
                "descriptors[{i}] has too many entries: {count} (at most {} allowed)",
                self.max_entries
            )));
        }
        Ok(())
    }
}

/// How the limiter behaves, from the command line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub failure_mode: FailureMode,
    /// Global shadow mode: everything is evaluated and counted, nothing is denied.
    pub shadow_mode: bool,
    /// Add IETF `RateLimit-*` headers (and `Retry-After` on deny) to responses.
    pub response_headers: bool,
    pub limits: RequestLimits,
}

/// One rate-limit request, borrowed from whatever the transport decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub domain: &'a str,
    pub descriptors: Scratch<Descriptor<'a>>,
    /// Hits for descriptors without their own; 0 means 1.
    pub hits_addend: u64,
}

/// One request descriptor: hierarchical (key, value) entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor<'a> {
    pub entries: Scratch<(&'a str, &'a str)>,
    /// A limit chosen by the client instead of the configured one.
    pub limit: Option<LimitOverride>,
    /// Hits for this descriptor only; `Some(0)` checks without counting.
    pub hits_addend: Option<u64>,
    /// Envoy's `is_negative_hits` (returning hits); not supported by a sliding log.
    pub negative_hits: bool,
}

/// Envoy's `RateLimitOverride`. `unit` is `None` when the client sent an unknown unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Option<Unit>,
}

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
    /// names; empty when headers are off or no descriptor had a limit.
    pub headers: Vec<(&'static str, String)>,
}

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorStatus {
    pub code: Code,
    /// The limit that decided; `None` for no rule, `unlimited` and replaced rules.
    pub current_limit: Option<CurrentLimit>,
    pub limit_remaining: u32,
    pub duration_until_reset: Option<Duration>,
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

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request is malformed (gRPC `INVALID_ARGUMENT`, HTTP 400).
    #[error("{0}")]
    InvalidArgument(String),
    /// The store failed and the failure mode is `error` (gRPC `UNAVAILABLE`, HTTP 503).
    #[error("rate-limit store unavailable: {0}")]
    Unavailable(StoreError),
}

/// What a decision shows beyond its [`Response`], for a trace span ([`crate::telemetry`]). Every
/// method does nothing by default; `()` is the observer of an untraced request.
pub trait Observer {
    /// Whether [`Observer::rule`] wants the matched rules (the loop over them is skipped if not).
    const WANTS_RULES: bool = false;

    /// The request's domain, before anything is decided.
    fn domain(&mut self, _domain: &str) {}

    /// A matched rule, by its metrics label (its `name`, or its descriptor path), once per
    /// descriptor that matched one.
    fn rule(&mut self, _label: &str) {}

    /// The store call of the request (one round trip for Redis) took `elapsed`.
    fn store_call(&mut self, _elapsed: Duration) {}

    /// The store call failed, and `mode` answers.
    fn store_failed(&mut self, _error: &StoreError, _mode: FailureMode) {}
}

impl Observer for () {}

/// The transport-neutral rate limiter.
pub struct RateLimiter {
    rules: LiveRules,
    store: Arc<dyn Store>,
    options: Options,
    metrics: Arc<Metrics>,
    traces: Option<Traces>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("store", &self.store.kind())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What one descriptor resolved to before the store call.
enum Plan<'a> {
    /// Unknown domain or no matching rule.
    NoRule,
    Unlimited {
        label: Cow<'a, str>,
        hits: u64,
    },
    /// Replaced by another matched rule of the request.
    Replaced,
    Limited(Limited<'a>),
    /// Limited, but its hits do not fit in what is left of the request's budget
    /// ([`RequestLimits::max_hits`]): over limit without a counter.
    OverBudget(Limited<'a>),
}

struct Limited<'a> {
    /// The metrics `rule` label of the descriptor.
    label: Cow<'a, str>,
    name: Option<&'a str>,
    /// A limit's own `name` replaces `label` when that limit decides (not where the rule's
    /// metrics show request values: `detailed_metric`, `value_to_metric`).
    own_labels: bool,
    /// In the order of the descriptor's counters.
    limits: Cow<'a, [Limit]>,
    shadow: bool,
    hits: u64,
    counters: Range<usize>,
}

impl Limited<'_> {
    /// The metrics `rule` label when the limit at `i` decides: its own name where it has one.
    fn label_of(&self, i: usize) -> &str {
        match self.limits.get(i).and_then(|l| l.name.as_deref()) {
            Some(name) if self.own_labels => name,
            _ => &self.label,
        }
    }
}

impl RateLimiter {
    pub fn new(
        rules: LiveRules,
        store: Arc<dyn Store>,
        options: Options,
        metrics: Arc<Metrics>,
    ) -> Self {
        RateLimiter {
            rules,
            store,
            options,
            metrics,
            traces: None,
        }
    }

    /// Spans for the decisions ([`crate::telemetry`]); without, the transports trace nothing.
    pub fn with_traces(mut self, traces: Traces) -> Self {
        self.traces = Some(traces);
        self
    }

    /// The traces, when on.
    pub fn traces(&self) -> Option<&Traces> {
        self.traces.as_ref()
    }

    /// The live rules (for `/rlconfig` and health).
    pub fn rules(&self) -> &LiveRules {
        &self.rules
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Decides one request; see the module docs.
    pub async fn should_rate_limit(&self, request: &Request<'_>) -> Result<Response, LimitError> {
        self.should_rate_limit_observed(request, &mut ()).await
    }

    /// [`RateLimiter::should_rate_limit`], telling `observer` what the answer does not show: the
    /// matched rules, the store call's time, the failure mode when it answered. With `()` this
    /// is `should_rate_limit` itself: the calls compile to nothing.
    pub async fn should_rate_limit_observed<O: Observer>(
        &self,
        request: &Request<'_>,
        observer: &mut O,
    ) -> Result<Response, LimitError> {
        observer.domain(request.domain);
        validate(request, &self.options.limits)?;
        // One load per request. `load_full` (a reference count, not a copy of the rules) rather
        // than a guard, because the matches borrow from the rules across the store's `await`.
        let rules = self.rules.load_full();
        let rules: &RuleSet = &rules;
        let Some(domain) = rules.domain(request.domain) else {
            self.metrics.unknown_domain();
            return Ok(Response {
                overall: Code::Ok,
                statuses: vec![NO_LIMIT; request.descriptors.len()],
                headers: Vec::new(),
            });
        };

        let (plans, counters) = self.plan(request, domain);
        if O::WANTS_RULES {
            for plan in &plans {
                if let Plan::Unlimited { label, .. }
                | Plan::Limited(Limited { label, .. })
                | Plan::OverBudget(Limited { label, .. }) = plan
                {
                    observer.rule(label);
                }
            }
        }
        match self.decide(&counters, observer).await {
            Ok(results) => Ok(self.respond(request.domain, &plans, &counters, &results)),
            Err(error) => {
                observer.store_failed(&error, self.options.failure_mode);
                self.on_store_error(request.domain, &plans, error)
            }
        }
    }

    /// Resolves every descriptor to a plan, and the counters of all limited ones.
    fn plan<'a>(
        &self,
        request: &'a Request<'_>,
        domain: &'a DomainRules,
    ) -> (Scratch<Plan<'a>>, Scratch<Counter>) {
        // Match every descriptor first: `replaces` depends on all matches of the request.
        let matches: Scratch<Option<RuleMatch<'a>>> = request
            .descriptors
            .iter()
            .map(|d| match d.limit {
                Some(_) => None,
                None => domain.match_entries(&d.entries),
            })
            .collect();
        let replacing: Vec<&str> = matches
            .iter()
            .flatten()
            .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
            .collect();
        let mut counters = Scratch::with_capacity(request.descriptors.len());
        let mut budget = self.options.limits.max_hits;
        let plans: Scratch<Plan<'a>> = request
            .descriptors
            .iter()
            .zip(matches)
            .map(|(descriptor, matched)| {
                let hits = descriptor.hits_addend.unwrap_or(request.hits_addend.max(1));
                let is_replaced =
                    |m: &RuleMatch<'_>| replacing.iter().any(|name| m.rule.is_named(name));
                match (descriptor.limit, matched) {
                    (Some(limit), _) => {
                        let limited = override_plan(descriptor, limit, hits);
                        self.admit(&mut counters, &mut budget, limited, || {
                            self.override_tag(request.domain, &descriptor.entries)
                        })
                    }
                    (None, None) => Plan::NoRule,
                    (None, Some(m)) if m.rule.unlimited => Plan::Unlimited {
                        label: m.stats_name,
                        hits,
                    },
                    (None, Some(m)) if is_replaced(&m) => Plan::Replaced,
                    (None, Some(m)) if m.rule.limits.is_empty() => Plan::NoRule,
                    (None, Some(mut m)) => {
                        let limited = Limited {
                            // Moved out: the tag below needs only the match's entries.
                            label: std::mem::take(&mut m.stats_name),
                            name: m.rule.name.as_deref(),
                            own_labels: !m.rule.detailed_metric && !m.rule.value_to_metric,
                            limits: Cow::Borrowed(&m.rule.limits),
                            shadow: m.rule.shadow_mode,
                            hits,
                            counters: 0..0,
                        };
                        self.admit(&mut counters, &mut budget, limited, || self.match_tag(&m))
                    }
                }
            })
            .collect();
        // A request that an over-budget descriptor denies must record nothing, as any denied
        // request: its other counters are only checked.
        let denied = plans
            .iter()
            .any(|p| matches!(p, Plan::OverBudget(l) if !l.shadow));
        if denied && !self.options.shadow_mode {
            counters.iter_mut().for_each(|c| c.hits = 0);
        }
        (plans, counters)
    }

    /// Gives a limited descriptor its counters when its cost ([`budget_cost`]) fits in the
    /// request's `budget`, or plans it over limit.
    fn admit<'a>(
        &self,
        counters: &mut Scratch<Counter>,
        budget: &mut u64,
        mut limited: Limited<'a>,
        tag: impl FnOnce() -> CounterTag,
    ) -> Plan<'a> {
        let cost = budget_cost(&limited.limits, limited.hits);
        if cost > *budget {
            return Plan::OverBudget(limited);
        }
        *budget -= cost;
        limited.counters = self.push_counters(
            counters,
            tag(),
            &limited.limits,
            limited.hits,
            limited.shadow,
        );
        Plan::Limited(limited)
    }

    /// The counter tag of a matched descriptor, with its long values replaced by their digests
    /// ([`counted_value`]).
    fn match_tag(&self, m: &RuleMatch<'_>) -> CounterTag {
        let max = self.options.limits.max_value_bytes;
        if m.counter_entries.iter().all(|(_, v)| counted_as_is(v, max)) {
            return m.counter_tag();
        }
        let values: Scratch<Cow<'_, str>> = m
            .counter_entries
            .iter()
            .map(|(_, v)| counted_value(v, max))
            .collect();
        m.counter_tag_with(values.iter().map(AsRef::as_ref))
    }

    /// The counter tag of a limit override: no rule, so everything is escaped here (the same
    /// encoding), long values replaced by their digests ([`counted_value`]).
    fn override_tag(&self, domain: &str, entries: &[(&str, &str)]) -> CounterTag {
        let max = self.options.limits.max_value_bytes;
        let values: Scratch<Cow<'_, str>> =
            entries.iter().map(|(_, v)| counted_value(v, max)).collect();
        let counted = entries.iter().zip(&values);
        CounterTag::new(
            domain,
            counted.map(|(&(key, _), value)| (key, value.as_ref())),
        )
    }

    /// One store call for all counters (none when there are no counters), timed.
    async fn decide(
        &self,
        counters: &[Counter],
        observer: &mut impl Observer,
    ) -> Result<Vec<CounterResult>, StoreError> {
        if counters.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let decided = self.store.decide(counters).await;
        let elapsed = started.elapsed();
        self.metrics.observe_store(elapsed);
        observer.store_call(elapsed);
        let results = decided?.counters;
        if results.len() != counters.len() {
            return Err(StoreError::Backend(format!(
                "store answered {} results for {} counters",
                results.len(),
                counters.len()
            )));
        }
        Ok(results)
    }

    /// Appends one counter per limit of a descriptor and returns their range. The descriptor's
    /// `tag` is built once; each limit only adds its window to it.
    fn push_counters(
        &self,
        counters: &mut Scratch<Counter>,
        mut tag: CounterTag,
        limits: &[Limit],
        hits: u64,
        rule_shadow: bool,
    ) -> Range<usize> {
        let start = counters.len();
        for limit in limits {
            let window = limit.window();
            counters.push(Counter {
                key: tag.counter_key(window, limit.precision),
                limit: limit.requests_per_unit,
                window,
                hits,
                shadow: rule_shadow || self.options.shadow_mode,
                precision: limit.precision,
            });
        }
        start..counters.len()
    }

    /// Turns the store's results into statuses, metrics and headers.
    fn respond(
        &self,
        domain: &str,
        plans: &[Plan<'_>],
        counters: &[Counter],
        results: &[CounterResult],
    ) -> Response {
        let mut statuses = Vec::with_capacity(plans.len());
        // The counter whose state the headers show: (index, enforced over limit), and the
        // counters of its descriptor (for the policy). Only enforced limits are candidates: a
        // shadow limit (its rule's or the global shadow mode) changes nothing a client sees.
        let mut header_choice: Option<(usize, bool, Range<usize>)> = None;
        for plan in plans {
            let limited = match plan {
                Plan::Limited(limited) => limited,
                Plan::OverBudget(limited) => {
                    statuses.push(self.status_undecided(domain, limited, true));
                    continue;
                }
                other => {
                    statuses.push(self.status_without_limit(domain, other));
                    continue;
                }
            };
            let range = limited.counters.clone();
            let chosen = range.start + most_restrictive(&results[range.clone()]);
            let result = &results[chosen];
            let near_limit = !result.over_limit
                && range
                    .clone()
                    .any(|i| u128::from(results[i].count) * 5 >= u128::from(counters[i].limit) * 4);
            let code = self.record(
                domain,
                limited,
                chosen - range.start,
                result.over_limit,
                near_limit,
            );
            let enforced_over = code == Code::OverLimit;
            let current = header_choice.as_ref().map(|(i, over, _)| (*i, *over));
            let enforced = !counters[chosen].shadow;
            if enforced && better_for_headers((chosen, enforced_over), current, results) {
                header_choice = Some((chosen, enforced_over, range.clone()));
            }
            let limit = &limited.limits[chosen - range.start];
            statuses.push(DescriptorStatus {
                code,
                current_limit: Some(current_limit(limited, limit)),
                limit_remaining: saturate_u32(result.remaining),
                duration_until_reset: Some(result.reset_after),
            });
        }
        let overall = self.overall(&statuses);
        let headers = match header_choice {
            Some((chosen, _, range)) if self.options.response_headers => headers(
                &counters[chosen],
                &results[chosen],
                &counters[range],
                overall == Code::OverLimit,
            ),
            _ => Vec::new(),
        };
        Response {
            overall,
            statuses,
            headers,
        }
    }

    /// Applies the failure mode after a store error.
    fn on_store_error(
        &self,
        domain: &str,
        plans: &[Plan<'_>],
        error: StoreError,
    ) -> Result<Response, LimitError> {
        let mode = self.options.failure_mode;
        self.metrics.store_error(error.kind());
        self.metrics.failure_mode(mode.as_str());
        tracing::debug!(%error, failure_mode = %mode, "store decision failed");
        if mode == FailureMode::Error {
            return Err(LimitError::Unavailable(error));
        }
        let deny = mode == FailureMode::Deny;
        let statuses: Vec<DescriptorStatus> = plans
            .iter()
            .map(|plan| match plan {
                Plan::Limited(limited) => self.status_undecided(domain, limited, deny),
                Plan::OverBudget(limited) => self.status_undecided(domain, limited, true),
                other => self.status_without_limit(domain, other),
            })
            .collect();
        Ok(Response {
            overall: self.overall(&statuses),
            statuses,
            headers: Vec::new(),
        })
    }

    /// The status (and metrics) of a limited descriptor that the store did not decide (a store
    /// failure, or hits over the budget): over limit when `over`, with the first limit, nothing
    /// remaining and no reset.
    fn status_undecided(
        &self,
        domain: &str,
        limited: &Limited<'_>,
        over: bool,
    ) -> DescriptorStatus {
        DescriptorStatus {
            code: self.record(domain, limited, 0, over, false),
            current_limit: limited
                .limits
                .first()
                .map(|limit| current_limit(limited, limit)),
            limit_remaining: 0,
            duration_until_reset: None,
        }
    }

    /// The status (and metrics) of a descriptor that no limit applies to.
    fn status_without_limit(&self, domain: &str, plan: &Plan<'_>) -> DescriptorStatus {
        match plan {
            Plan::NoRule => {
                self.metrics.no_rule(domain);
                NO_LIMIT
            }
            Plan::Unlimited { label, hits } => {
                self.metrics
                    .rule(domain, label)
                    .record(DecisionLabel::Allowed, *hits, false);
                UNLIMITED
            }
            Plan::Replaced | Plan::Limited(_) | Plan::OverBudget(_) => NO_LIMIT,
        }
    }

    /// Counts a limited descriptor's decision, under the label of the limit at `deciding`, and
    /// returns its code: over limit only when the rule enforces (a shadow rule reports OK; the
    /// global shadow mode acts on the overall code).
    fn record(
        &self,
        domain: &str,
        limited: &Limited<'_>,
        deciding: usize,
        over: bool,
        near_limit: bool,
    ) -> Code {
        let decision = match (over, limited.shadow || self.options.shadow_mode) {
            (false, _) => DecisionLabel::Allowed,
            (true, false) => DecisionLabel::Denied,
            (true, true) => DecisionLabel::ShadowDenied,
        };
        self.metrics
            .rule(domain, limited.label_of(deciding))
            .record(decision, limited.hits, near_limit);
        if over && !limited.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        }
    }

    /// OVER_LIMIT when any descriptor is, unless the global shadow mode is on.
    fn overall(&self, statuses: &[DescriptorStatus]) -> Code {
        let any_over = statuses.iter().any(|s| s.code == Code::OverLimit);
        if any_over && !self.options.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        }
    }
}

const NO_LIMIT: DescriptorStatus = DescriptorStatus {
    code: Code::Ok,
    current_limit: None,
    limit_remaining: 0,
    duration_until_reset: None,
};

const UNLIMITED: DescriptorStatus = DescriptorStatus {
    code: Code::Ok,
    current_limit: None,
    limit_remaining: u32::MAX,
    duration_until_reset: None,
};

/// Checks the request against the protocol's rules and the bounds that only a proxy's
/// configuration can break (see [`RequestLimits`]); values and hits are not refused here.
pub fn validate(request: &Request<'_>, limits: &RequestLimits) -> Result<(), LimitError> {
    let invalid = |message: String| Err(LimitError::InvalidArgument(message));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > limits.max_value_bytes {
        return invalid(format!(
            "domain is {} bytes long (at most {} allowed)",
            request.domain.len(),
            limits.max_value_bytes
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    limits.check_descriptors(request.descriptors.len())?;
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return invalid(format!("descriptors[{i}] has no entries"));
        }
        limits.check_entries(i, descriptor.entries.len())?;
        for (j, (key, _)) in descriptor.entries.iter().enumerate() {
            if key.is_empty() {
                return invalid(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                ));
            }
            if key.len() > limits.max_value_bytes {
                return invalid(format!(
                    "descriptors[{i}].entries[{j}].key is {} bytes long (at most {} allowed)",
                    key.len(),
                    limits.max_value_bytes
                ));
            }
        }
        if descriptor.limit.is_some_and(|l| l.unit.is_none()) {
            return invalid(format!(
                "descriptors[{i}].limit.unit must be one of SECOND, MINUTE, HOUR, DAY, MONTH, YEAR"
            ));
        }
        if descriptor.negative_hits {
            return invalid(format!(
                "descriptors[{i}].is_negative_hits is not supported (hits cannot be returned to a sliding window)"
            ));
        }
    }
    Ok(())
}

/// The index of the most restrictive result: over limit first (the one that frees up last), else
/// the fewest remaining (ties: the one that resets last).
fn most_restrictive(results: &[CounterResult]) -> usize {
    let mut best = 0;
    for (i, result) in results.iter().enumerate().skip(1) {
        if more_restrictive(result, &results[best]) {
            best = i;
        }
    }
    best
}

fn more_restrictive(a: &CounterResult, b: &CounterResult) -> bool {
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
fn better_for_headers(
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
fn headers(
    counter: &Counter,
    result: &CounterResult,
    descriptor_counters: &[Counter],
    denied: bool,
) -> Vec<(&'static str, String)> {
    let mut policy = String::with_capacity(16 * descriptor_counters.len());
    for (i, c) in descriptor_counters.iter().enumerate() {
        // Writing to a String cannot fail.
        let _ = write!(
            policy,
            "{}{};w={}",
            if i > 0 { ", " } else { "" },
            c.limit,
            ceil_secs(c.window)
        );
    }
    let reset = ceil_secs(result.reset_after);
    let mut headers = vec![
        ("ratelimit-limit", counter.limit.to_string()),
        ("ratelimit-remaining", result.remaining.to_string()),
        ("ratelimit-reset", reset.to_string()),
        ("ratelimit-policy", policy),
    ];
    if denied {
        headers.push(("retry-after", reset.max(1).to_string()));
    }
    headers
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The limit a descriptor reports, named by its own `name`, else by the rule's.
fn current_limit(limited: &Limited<'_>, limit: &Limit) -> CurrentLimit {
    CurrentLimit {
        name: limit.name.as_deref().or(limited.name).map(str::to_string),
        requests_per_unit: saturate_u32(limit.requests_per_unit),
        unit: limit.unit,
        window: limit.window(),
    }
}

/// What a descriptor's counters cost of the request's hit budget ([`RequestLimits::max_hits`]):
/// its hits on each exact log (at least 1, so the budget also bounds the number of counters and
/// the store's work for one request), 1 for each bucket counter, whose cost does not grow with
/// its hits.
fn budget_cost(limits: &[Limit], hits: u64) -> u64 {
    limits.iter().fold(0u64, |sum, limit| {
        let cost = match limit.precision {
            Precision::Exact => hits.max(1),
            Precision::Buckets(_) => 1,
        };
        sum.saturating_add(cost)
    })
}

/// A descriptor with a limit override: one counter on the request's entries, never shadow,
/// no name (as in envoyproxy/ratelimit).
fn override_plan<'a>(descriptor: &Descriptor<'_>, limit: LimitOverride, hits: u64) -> Limited<'a> {
    let requests_per_unit = u64::from(limit.requests_per_unit);
    // Validated: an override without a known unit is rejected before planning.
    let unit = limit.unit.unwrap_or(Unit::Second);
    let limit = Limit {
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        precision: Precision::automatic(requests_per_unit, unit.duration()),
        name: None,
    };
    Limited {
        label: Cow::Owned(override_label(&descriptor.entries)),
        name: None,
        own_labels: false,
        limits: Cow::Owned(vec![limit]),
        shadow: false,
        hits,
        counters: 0..0,
    }
}

/// Marks the digest that stands for a value in a counter key. A value that starts with it is
/// itself counted under its digest, so no value counted as is can name a digest's counter.
const DIGEST_MARK: char = '\0';

/// Whether `value` is counted under its own text.
fn counted_as_is(value: &str, max_value_bytes: usize) -> bool {
    value.len() <= max_value_bytes && !value.starts_with(DIGEST_MARK)
}

/// The value a counter key holds for `value`: the value itself, or for one longer than
/// `--max-value-bytes` its SHA-256 digest (71 bytes), so a client's long header neither escapes
/// its limit nor makes a counter's key as long as it likes.
fn counted_value(value: &str, max_value_bytes: usize) -> Cow<'_, str> {
    if counted_as_is(value, max_value_bytes) {
        return Cow::Borrowed(value);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let mut text = String::with_capacity(8 + 2 * digest.as_ref().len());
    text.push(DIGEST_MARK);
    text.push_str("sha256:");
    for byte in digest.as_ref() {
        // Writing to a String cannot fail.
        let _ = write!(text, "{byte:02x}");
    }
    Cow::Owned(text)
}

/// The metrics label of an override: the entry keys joined with `.`, like a rule path (keys come
/// from the proxy's configuration; values, which clients choose, are left out).
fn override_label(entries: &[(&str, &str)]) -> String {
    let mut label = String::from("override:");
    for (i, (key, _)) in entries.iter().enumerate() {
        if i > 0 {
            label.push('.');
        }
        label.push_str(key);
    }
    label
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_sources;
    use crate::store::{CounterKey, ManualClock, MemoryStore};
    use arc_swap::ArcSwap;

    const START: Duration = Duration::from_secs(1_700_000_000);

    const RULES: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: two
    rate_limits:
      - { unit: second, requests_per_unit: 2 }
      - { unit: minute, requests_per_unit: 5 }
  - key: shadow
    rate_limit: { unit: minute, requests_per_unit: 1 }
    shadow_mode: true
  - key: free
    rate_limit: { unlimited: true }
  - key: general
    rate_limit: { name: general, unit: minute, requests_per_unit: 1 }
  - key: specific
    rate_limit: { name: specific, unit: minute, requests_per_unit: 5, replaces: [{ name: general }] }
  - key: named
    rate_limits:
      - { name: per_second, unit: second, requests_per_unit: 2 }
      - { name: per_hour, unit: hour, requests_per_unit: 3, precision: 1m }
  - key: over_named
    rate_limit: { unit: minute, requests_per_unit: 100, replaces: [{ name: per_hour }] }
  - key: tokens
    rate_limit: { unit: minute, requests_per_unit: 100000, precision: 1s }
"#;

    struct Fixture {
        clock: Arc<ManualClock>,
        limiter: RateLimiter,
        metrics: Arc<Metrics>,
    }

    fn fixture(options: Options) -> Fixture {
        let rules = load_sources(&[("rules.yaml".to_string(), RULES.to_string())])
            .unwrap_or_else(|e| panic!("test rules do not load: {e}"));
        let clock = Arc::new(ManualClock::new(START));
        let store = Arc::new(MemoryStore::new(clock.clone()));
        let metrics = Arc::new(Metrics::new());
        let limiter = RateLimiter::new(
            Arc::new(ArcSwap::from_pointee(rules)),
            store,
            options,
            metrics.clone(),
        );
        Fixture {
            clock,
            limiter,
            metrics,
        }
    }

    fn headers_on() -> Options {
        Options {
            response_headers: true,
            ..Options::default()
        }
    }

    fn request<'a>(descriptors: Vec<Descriptor<'a>>) -> Request<'a> {
        Request {
            domain: "api",
            descriptors: descriptors.into(),
            hits_addend: 0,
        }
    }

    fn desc<'a>(entries: &[(&'a str, &'a str)]) -> Descriptor<'a> {
        Descriptor {
            entries: entries.iter().copied().collect(),
            ..Descriptor::default()
        }
    }

    async fn call(f: &Fixture, request: &Request<'_>) -> Response {
        match f.limiter.should_rate_limit(request).await {
            Ok(response) => response,
            Err(error) => panic!("unexpected error: {error}"),
        }
    }

    #[tokio::test]
    async fn counts_down_and_denies_with_headers() {
        let f = fixture(headers_on());
        let req = request(vec![desc(&[("user", "alice")])]);
        for remaining in [2, 1, 0] {
            let r = call(&f, &req).await;
            assert_eq!(r.overall, Code::Ok);
            assert_eq!(r.statuses[0].limit_remaining, remaining);
            let limit = r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit);
            assert_eq!(limit, Some(3));
        }
        f.clock.advance(Duration::from_secs(10));
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::OverLimit);
        assert_eq!(r.statuses[0].code, Code::OverLimit);
        assert_eq!(
            r.statuses[0].duration_until_reset,
            Some(Duration::from_secs(50))
        );
        let h: std::collections::HashMap<_, _> = r.headers.iter().cloned().collect();
        assert_eq!(h["ratelimit-limit"], "3");
        assert_eq!(h["ratelimit-remaining"], "0");
        assert_eq!(h["ratelimit-reset"], "50");
        assert_eq!(h["ratelimit-policy"], "3;w=60");
        assert_eq!(h["retry-after"], "50");
        // The window slides: once the first hits leave it, requests fit again.
        f.clock.advance(Duration::from_secs(50));
        assert_eq!(call(&f, &req).await.overall, Code::Ok);
    }

    #[tokio::test]
    async fn most_restrictive_limit_of_a_descriptor_is_reported() {
        let f = fixture(headers_on());
        let req = request(vec![desc(&[("two", "x")])]);
        let r = call(&f, &req).await;
        // 2/second leaves 1, 5/minute leaves 4: the per-second limit is reported.
        let status = &r.statuses[0];
        assert_eq!(status.limit_remaining, 1);
        assert_eq!(
            status.current_limit.as_ref().map(|l| l.unit),
            Some(Unit::Second)
        );
        let policy = r.headers.iter().find(|(k, _)| *k == "ratelimit-policy");
        assert_eq!(policy.map(|(_, v)| v.as_str()), Some("2;w=1, 5;w=60"));
        call(&f, &req).await;
        // Third hit within the second: over the per-second limit.
        let r = call(&f, &req).await;
        assert_eq!(r.statuses[0].code, Code::OverLimit);
        assert_eq!(
            r.statuses[0].current_limit.as_ref().map(|l| l.unit),
            Some(Unit::Second)
        );
        // After the second passes, the minute limit is the tighter one: 5 - 2 - 1 = 2 left.
        f.clock.advance(Duration::from_secs(1));
        let r = call(&f, &req).await;
        assert_eq!(r.statuses[0].limit_remaining, 1);
        f.clock.advance(Duration::from_secs(1));
        let r = call(&f, &req).await;
        assert_eq!(
            r.statuses[0].current_limit.as_ref().map(|l| l.unit),
            Some(Unit::Minute)
        );
        assert_eq!(r.statuses[0].limit_remaining, 1);
    }

    #[test]
    fn counter_keys_keep_their_encoding() {
        let f = fixture(Options::default());
        let mut limited = desc(&[("user", "o:1")]);
        limited.limit = Some(LimitOverride {
            requests_per_unit: 1,
            unit: Some(Unit::Hour),
        });
        let req = request(vec![desc(&[("two", "a b")]), limited]);
        let rules = f.limiter.rules().load_full();
        let domain = rules.domain("api").expect("domain api");
        let (_, counters) = f.limiter.plan(&req, domain);
        let keys: Vec<&str> = counters.iter().map(|c| c.key.as_str()).collect();
        // One tag for both windows of `two`; the override is escaped from scratch.
        assert_eq!(
            keys,
            [
                "{api:two=a%20b}1000",
                "{api:two=a%20b}60000",
                "{api:user=o%3A1}3600000"
            ]
        );
        let expected = CounterKey::new("api", [("two", "a b")], Duration::from_secs(60));
        assert_eq!(counters[1].key, expected);
    }

    #[test]
    fn choice_prefers_over_limit_then_fewest_remaining() {
        let r = |over, remaining, secs| CounterResult {
            over_limit: over,
            count: 0,
            remaining,
            reset_after: Duration::from_secs(secs),
        };
        assert_eq!(most_restrictive(&[r(false, 1, 1), r(true, 0, 5)]), 1);
        assert_eq!(most_restrictive(&[r(true, 0, 5), r(true, 0, 9)]), 1);
        assert_eq!(most_restrictive(&[r(false, 3, 1), r(false, 2, 1)]), 1);
        assert_eq!(most_restrictive(&[r(false, 2, 9), r(false, 2, 1)]), 0);
    }

    #[tokio::test]
    async fn descriptor_statuses_for_no_rule_unlimited_and_unknown_domain() {
        let f = fixture(Options::default());
        let req = request(vec![
            desc(&[("nothing", "x")]),
            desc(&[("free", "x")]),
            desc(&[("user", "bob")]),
        ]);
        let r = call(&f, &req).await;
        assert_eq!(r.statuses[0], NO_LIMIT);
        assert_eq!(r.statuses[1], UNLIMITED);
        assert_eq!(r.statuses[2].limit_remaining, 2);
        assert!(r.headers.is_empty(), "headers are off");
        let unknown = Request {
            domain: "nope",
            ..request(vec![desc(&[("user", "bob")])])
        };
        let r = call(&f, &unknown).await;
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses, vec![NO_LIMIT]);
        let text = f.metrics.render();
        assert!(text.contains("slidegate_unknown_domain_total 1"), "{text}");
        assert!(
            text.contains("slidegate_no_rule_total{domain=\"api\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn hits_resolution() {
        let f = fixture(Options::default());
        // Request-level hits apply to descriptors without their own.
        let mut req = request(vec![desc(&[("user", "a")])]);
        req.hits_addend = 2;
        assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 1);
        // A descriptor's own hits win, and 0 checks without counting.
        req.descriptors[0].hits_addend = Some(0);
        assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 1);
        assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 1);
        req.descriptors[0].hits_addend = Some(1);
        assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, 0);
        // Request-level 0 means 1.
        let fresh = request(vec![desc(&[("user", "b")])]);
        assert_eq!(call(&f, &fresh).await.statuses[0].limit_remaining, 2);
        // More hits than the limit never fit.
        let mut big = request(vec![desc(&[("user", "c")])]);
        big.hits_addend = 4;
        assert_eq!(call(&f, &big).await.overall, Code::OverLimit);
    }

    #[tokio::test]
    async fn replaces_skips_the_replaced_rule() {
        let f = fixture(Options::default());
        let req = request(vec![desc(&[("general", "x")]), desc(&[("specific", "x")])]);
        for _ in 0..3 {
            let r = call(&f, &req).await;
            assert_eq!(r.overall, Code::Ok, "general (1/min) is replaced");
            assert_eq!(r.statuses[0], NO_LIMIT);
            assert!(r.statuses[1].current_limit.is_some());
        }
        // Alone, the general rule applies, and its counter was never touched.
        let alone = request(vec![desc(&[("general", "x")])]);
        assert_eq!(call(&f, &alone).await.statuses[0].limit_remaining, 0);
        assert_eq!(call(&f, &alone).await.overall, Code::OverLimit);
    }

    #[tokio::test]
    async fn override_replaces_the_configured_limit() {
        let f = fixture(Options::default());
        let mut d = desc(&[("user", "o")]);
        d.limit = Some(LimitOverride {
            requests_per_unit: 1,
            unit: Some(Unit::Hour),
        });
        let req = request(vec![d.clone()]);
        let r = call(&f, &req).await;
        let limit = r.statuses[0].current_limit.clone();
        assert_eq!(
            limit.map(|l| (l.requests_per_unit, l.unit)),
            Some((1, Unit::Hour))
        );
        assert_eq!(call(&f, &req).await.overall, Code::OverLimit);
        // Also for a descriptor that matches no rule, as long as the domain exists.
        let mut none = desc(&[("nothing", "x")]);
        none.limit = d.limit;
        let r = call(&f, &request(vec![none.clone()])).await;
        assert!(r.statuses[0].current_limit.is_some());
        let unknown = Request {
            domain: "nope",
            ..request(vec![none])
        };
        assert_eq!(call(&f, &unknown).await.statuses[0], NO_LIMIT);
    }

    #[tokio::test]
    async fn rule_shadow_mode_counts_but_passes() {
        let f = fixture(Options::default());
        let req = request(vec![desc(&[("shadow", "x")])]);
        assert_eq!(call(&f, &req).await.overall, Code::Ok);
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses[0].code, Code::Ok);
        let text = f.metrics.render();
        assert!(
            text.contains(r#"slidegate_decisions_total{decision="shadow_denied",domain="api",rule="shadow"} 1"#),
            "{text}"
        );
    }

    /// Each limit of `rate_limits` reports and counts under its own name when it decides, and
    /// `replaces` may name any of them. The hour is kept in buckets of a minute: its reset and
    /// `Retry-After` come when the first hits' bucket leaves the hour, up to a minute late.
    #[tokio::test]
    async fn each_limit_reports_and_counts_under_its_own_name() {
        let f = fixture(headers_on());
        let req = request(vec![desc(&[("named", "a")])]);
        let name = |r: &Response| {
            r.statuses[0]
                .current_limit
                .as_ref()
                .and_then(|l| l.name.clone())
        };
        for _ in 0..2 {
            assert_eq!(call(&f, &req).await.overall, Code::Ok);
        }
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::OverLimit);
        assert_eq!(name(&r).as_deref(), Some("per_second"));
        f.clock.advance(Duration::from_secs(1));
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(
            name(&r).as_deref(),
            Some("per_hour"),
            "the hour is now fuller"
        );
        f.clock.advance(Duration::from_secs(1));
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::OverLimit);
        assert_eq!(name(&r).as_deref(), Some("per_hour"));
        let reset = r.statuses[0].duration_until_reset.unwrap_or_default();
        let hour = Duration::from_secs(3600);
        assert!(reset > hour - Duration::from_secs(2), "{reset:?}");
        assert!(reset <= hour + Duration::from_secs(60), "{reset:?}");
        let retry: Option<u64> = r
            .headers
            .iter()
            .find(|(name, _)| *name == "retry-after")
            .and_then(|(_, value)| value.parse().ok());
        assert_eq!(retry, Some(ceil_secs(reset)), "{:?}", r.headers);
        let text = f.metrics.render();
        for line in [
            r#"slidegate_decisions_total{decision="denied",domain="api",rule="per_second"} 1"#,
            r#"slidegate_decisions_total{decision="denied",domain="api",rule="per_hour"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // `replaces` names the second limit: the whole rule is skipped.
        let both = request(vec![desc(&[("named", "b")]), desc(&[("over_named", "b")])]);
        let r = call(&f, &both).await;
        assert_eq!(r.statuses[0], NO_LIMIT);
        assert_eq!(r.statuses[1].limit_remaining, 99);
    }

    #[tokio::test]
    async fn global_shadow_mode_never_denies() {
        let f = fixture(Options {
            shadow_mode: true,
            response_headers: true,
            ..Options::default()
        });
        let req = request(vec![desc(&[("user", "g")])]);
        for _ in 0..3 {
            assert_eq!(call(&f, &req).await.overall, Code::Ok);
        }
        let r = call(&f, &req).await;
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses[0].code, Code::OverLimit, "reported truthfully");
        assert!(!r.headers.iter().any(|(k, _)| *k == "retry-after"));
    }

    #[tokio::test]
    async fn validation_errors() {
        let f = fixture(Options {
            limits: RequestLimits {
                max_descriptors: 2,
                max_entries: 2,
                max_value_bytes: 8,
                ..RequestLimits::default()
            },
            ..Options::default()
        });
        let long = "x".repeat(9);
        let mut negative = desc(&[("k", "v")]);
        negative.negative_hits = true;
        let mut bad_unit = desc(&[("k", "v")]);
        bad_unit.limit = Some(LimitOverride {
            requests_per_unit: 1,
            unit: None,
        });
        let cases: Vec<(Request<'_>, &str)> = vec![
            (
                Request {
                    domain: "",
                    ..request(vec![desc(&[("k", "v")])])
                },
                "domain must not be empty",
            ),
            (request(vec![]), "descriptor list must not be empty"),
            (
                request(vec![desc(&[("k", "v")]); 3]),
                "too many descriptors",
            ),
            (request(vec![desc(&[])]), "descriptors[0] has no entries"),
            (
                request(vec![desc(&[("a", "1"), ("b", "2"), ("c", "3")])]),
                "too many entries",
            ),
            (
                request(vec![desc(&[("k", "v")]), desc(&[("", "v")])]),
                "descriptors[1].entries[0].key must not be empty",
            ),
            (
                request(vec![desc(&[(&long, "v")])]),
                "entries[0].key is 9 bytes",
            ),
            (
                Request {
                    domain: &long,
                    ..request(vec![desc(&[("k", "v")])])
                },
                "domain is 9 bytes",
            ),
            (request(vec![bad_unit]), "limit.unit must be one of"),
            (request(vec![negative]), "is_negative_hits is not supported"),
        ];
        for (req, expected) in cases {
            match f.limiter.should_rate_limit(&req).await {
                Err(LimitError::InvalidArgument(message)) => {
                    assert!(message.contains(expected), "{message:?} lacks {expected:?}")
                }
                other => panic!("expected InvalidArgument({expected}), got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_long_value_is_counted_under_its_digest() {
        let f = fixture(Options {
            limits: RequestLimits {
                max_value_bytes: 8,
                ..RequestLimits::default()
            },
            ..Options::default()
        });
        let long = "x".repeat(5000);
        let other = "y".repeat(5000);
        // The long value is decided and counted, like any other: 3 per minute.
        let req = request(vec![desc(&[("user", &long)])]);
        for remaining in [2, 1, 0] {
            assert_eq!(call(&f, &req).await.statuses[0].limit_remaining, remaining);
        }
        assert_eq!(call(&f, &req).await.overall, Code::OverLimit);
        // Another long value has its own counter.
        let fresh = request(vec![desc(&[("user", &other)])]);
        assert_eq!(call(&f, &fresh).await.statuses[0].limit_remaining, 2);
        // An over-limit request stays denied when a long value rides along (issue 24).
        let both = request(vec![desc(&[("user", &long)]), desc(&[("two", &other)])]);
        assert_eq!(call(&f, &both).await.overall, Code::OverLimit);

        let rules = f.limiter.rules().load_full();
        let domain = rules.domain("api").expect("domain api");
        let (_, counters) = f.limiter.plan(&req, domain);
        let key = counters[0].key.as_str();
        assert!(key.len() < 100, "{key}");
        assert!(key.starts_with("{api:user=%00sha256%3A"), "{key}");
        // The digest's own text is counted under a digest too: no short value names its counter.
        let digest = counted_value(&long, 8);
        let spoof = request(vec![desc(&[("user", &digest)])]);
        let (_, spoofed) = f.limiter.plan(&spoof, domain);
        assert_ne!(spoofed[0].key, counters[0].key);
        // Values within the bound keep their text, as before.
        let short = request(vec![desc(&[("user", "alice")])]);
        assert_eq!(
            f.limiter.plan(&short, domain).1[0].key.as_str(),
            "{api:user=alice}60000"
        );
    }

    #[tokio::test]
    async fn hits_over_the_budget_deny_and_record_nothing() {
        let f = fixture(Options {
            limits: RequestLimits {
                max_hits: 4,
                ..RequestLimits::default()
            },
            ..Options::default()
        });
        // `two` has two limits: 2 hits cost 4, the whole budget.
        let mut two = desc(&[("two", "b")]);
        two.hits_addend = Some(2);
        let mut user = desc(&[("user", "b")]);
        user.hits_addend = Some(1);
        let r = call(&f, &request(vec![two.clone(), user.clone()])).await;
        assert_eq!(r.overall, Code::OverLimit);
        assert_eq!(r.statuses[1].code, Code::OverLimit, "past the budget");
        assert_eq!(r.statuses[1].limit_remaining, 0);
        // The denied request recorded nothing: both counters are still empty.
        for (d, remaining) in [(&user, 3), (&two, 2)] {
            let mut d = d.clone();
            d.hits_addend = Some(0);
            let r = call(&f, &request(vec![d])).await;
            assert_eq!(r.statuses[0].limit_remaining, remaining);
        }
        // One descriptor over the budget alone: denied, not refused.
        let mut many = desc(&[("user", "c")]);
        many.hits_addend = Some(5);
        let r = call(&f, &request(vec![many])).await;
        assert_eq!(r.statuses[0].code, Code::OverLimit);
        // A shadow rule over the budget reports OK and denies nothing.
        let mut shadow = desc(&[("shadow", "s")]);
        shadow.hits_addend = Some(5);
        let r = call(&f, &request(vec![shadow, user.clone()])).await;
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses[1].limit_remaining, 2);
        // Descriptors without a limit cost nothing.
        let mut free = desc(&[("nothing", "x")]);
        free.hits_addend = Some(1000);
        assert_eq!(call(&f, &request(vec![free])).await.overall, Code::Ok);
    }

    #[tokio::test]
    async fn bucket_hits_are_free_of_the_budget() {
        let f = fixture(Options {
            limits: RequestLimits {
                max_hits: 4,
                ..RequestLimits::default()
            },
            ..Options::default()
        });
        // 50,000 hits on a bucket counter cost 1, so 3 more on an exact log fit the budget of 4.
        let mut tokens = desc(&[("tokens", "t")]);
        tokens.hits_addend = Some(50_000);
        let mut user = desc(&[("user", "t")]);
        user.hits_addend = Some(3);
        let r = call(&f, &request(vec![tokens.clone(), user.clone()])).await;
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 50_000);
        assert_eq!(r.statuses[1].limit_remaining, 0);
        // The bucket counter still counts 1 of the budget: with 4 hits on the log, the request is
        // over it, denied, and records nothing on either.
        let mut other = desc(&[("user", "u")]);
        other.hits_addend = Some(4);
        let r = call(&f, &request(vec![tokens.clone(), other])).await;
        assert_eq!(r.overall, Code::OverLimit);
        assert_eq!(r.statuses[1].code, Code::OverLimit, "past the budget");
        tokens.hits_addend = Some(0);
        let r = call(&f, &request(vec![tokens])).await;
        assert_eq!(r.statuses[0].limit_remaining, 50_000);
    }

    /// A store that always fails, for the failure modes.
    struct Broken;

    #[async_trait::async_trait]
    impl Store for Broken {
        async fn decide(&self, _: &[Counter]) -> Result<crate::store::Decision, StoreError> {
            Err(StoreError::Connection("refused".into()))
        }
        async fn ping(&self) -> Result<(), StoreError> {
            Err(StoreError::Connection("refused".into()))
        }
        fn kind(&self) -> &'static str {
            "broken"
        }
    }

    #[tokio::test]
    async fn failure_modes() {
        let rules = load_sources(&[("rules.yaml".to_string(), RULES.to_string())])
            .unwrap_or_else(|e| panic!("{e}"));
        let live: LiveRules = Arc::new(ArcSwap::from_pointee(rules));
        let req = request(vec![desc(&[("user", "x")]), desc(&[("nothing", "x")])]);
        for (mode, expected) in [
            (FailureMode::Error, None),
            (FailureMode::Allow, Some(Code::Ok)),
            (FailureMode::Deny, Some(Code::OverLimit)),
        ] {
            let metrics = Arc::new(Metrics::new());
            let options = Options {
                failure_mode: mode,
                ..Options::default()
            };
            let limiter =
                RateLimiter::new(live.clone(), Arc::new(Broken), options, metrics.clone());
            let result = limiter.should_rate_limit(&req).await;
            match (expected, result) {
                (None, Err(LimitError::Unavailable(_))) => {}
                (Some(code), Ok(r)) => {
                    assert_eq!(r.overall, code);
                    assert_eq!(r.statuses[0].code, code);
                    assert_eq!(r.statuses[1], NO_LIMIT);
                }
                (expected, got) => panic!("{mode}: expected {expected:?}, got {got:?}"),
            }
            let text = metrics.render();
            let line = format!("slidegate_failure_mode_total{{mode=\"{mode}\"}} 1");
            assert!(text.contains(&line), "{text}");
            assert!(text.contains("slidegate_store_errors_total{kind=\"connection\"} 1"));
        }
    }

    #[tokio::test]
    async fn a_reload_between_requests_is_seen() {
        let f = fixture(Options::default());
        let req = request(vec![desc(&[("user", "r")])]);
        assert!(call(&f, &req).await.statuses[0].current_limit.is_some());
        f.limiter.rules().store(Arc::new(RuleSet::default()));
        assert_eq!(call(&f, &req).await.statuses[0], NO_LIMIT);
    }
}
