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
//!    admits hits), and asks the store **once**, so all counters of the request are decided
//!    all-or-nothing. A descriptor's hits are admitted (recorded only if the request fits),
//!    charged (recorded whatever: a gRPC descriptor's own non-zero `hits_addend`, or every hit
//!    under `record_over_limit`) or returned (`is_negative_hits`); see [`HitKind`] and the
//!    store's *Charges and returned hits*;
//! 6. reports each descriptor's most restrictive counter (an over-limit one first, the one that
//!    frees up last; else the one with the fewest hits remaining).
//!
//! Statuses follow envoyproxy/ratelimit: a descriptor with no rule (or an unknown domain) is OK with
//! no limit and `limit_remaining` 0; an `unlimited` rule is OK with `limit_remaining` `u32::MAX`.
//! A rule with `shadow_mode` is counted but reported OK. A rule with `quota_mode` reports
//! `OVER_LIMIT` when over, but as envoyproxy/ratelimit, the overall code is `OVER_LIMIT` only when
//! an ordinary descriptor is over or every quota descriptor of the request is (a shadow one counts
//! as not over). Its counters never deny at the store, so the store records the request's hits on
//! every counter under its limit; when every quota descriptor is over, the request is denied even
//! so, and those hits stay recorded. Under the global shadow mode every counter
//! is a shadow counter: descriptors still report `OVER_LIMIT` truthfully, but the overall code is
//! always OK, so nothing is denied.
//!
//! When the store fails, the failure mode decides: `error` returns [`LimitError::Unavailable`],
//! `allow` answers OK and `deny` answers OVER_LIMIT for every descriptor with a limit (shadow
//! rules and the global shadow mode still never deny). Statuses then carry the configured limit,
//! `limit_remaining` 0 and no reset; no response headers are added.

pub mod envoy_stats;
mod explain;
pub mod limited;
mod metrics;
mod observer;
mod plan;
mod request;
mod reset;
mod response;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::Scratch;
use crate::config::{LiveRules, RuleSet};
use crate::store::key::CounterTag;
use crate::store::{Counter, CounterResult, FailureMode, HitKind, Store, StoreError};
use crate::throttle::Throttle;

pub use explain::{ExplainedCounter, ExplainedDescriptor, Explanation, Outcome};
use limited::LimitedKeys;
pub use metrics::{DecisionLabel, DecisionMetrics, RuleCounters};
pub use observer::Observer;
use plan::{Limited, Plan};
pub use request::{
    Descriptor, LimitError, LimitOverride, Request, RequestLimits, entry_text, entry_text_owned,
    validate,
};
pub use response::{Code, CurrentLimit, DecidingRule, DescriptorStatus, Response};
use response::{better_for_headers, current_limit, headers, most_restrictive, saturate_u32};

/// How the limiter behaves, from the command line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub failure_mode: FailureMode,
    /// Global shadow mode: everything is evaluated and counted, nothing is denied.
    pub shadow_mode: bool,
    /// Global quota mode: every limited descriptor is a quota descriptor, as if each rule had
    /// `quota_mode: true` (envoyproxy/ratelimit's `QUOTA_MODE`).
    pub quota_mode: bool,
    /// Add IETF `RateLimit-*` headers (and `Retry-After` on deny) to responses.
    pub response_headers: bool,
    /// Record every hit, over the limit too (envoyproxy/ratelimit's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`): every counter is charged.
    pub record_over_limit: bool,
    /// Name the rule that decided each descriptor in the answer ([`DescriptorStatus::rule`]), for
    /// the gRPC answer's dynamic metadata (`--response-metadata`).
    pub response_metadata: bool,
    /// Name the rule that decided in each status ([`DescriptorStatus::rule`]): for the dynamic
    /// metadata, and for the decision log.
    pub name_rules: bool,
    pub limits: RequestLimits,
}

/// The transport-neutral rate limiter.
pub struct RateLimiter {
    rules: LiveRules,
    store: Arc<dyn Store>,
    options: Options,
    metrics: Arc<DecisionMetrics>,
    /// The counters denying most now, for `GET /limited`.
    limited: LimitedKeys,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("store", &self.store.kind())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    pub fn new(
        rules: LiveRules,
        store: Arc<dyn Store>,
        options: Options,
        metrics: Arc<DecisionMetrics>,
    ) -> Self {
        RateLimiter {
            rules,
            store,
            options,
            metrics,
            limited: LimitedKeys::default(),
        }
    }

    /// The live rules (for `/rlconfig` and health).
    pub fn rules(&self) -> &LiveRules {
        &self.rules
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn metrics(&self) -> &Arc<DecisionMetrics> {
        &self.metrics
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The counters denying most now (`GET /limited`).
    pub fn limited(&self) -> &LimitedKeys {
        &self.limited
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
            self.metrics.unknown_domain(request.domain);
            return Ok(Response {
                overall: Code::Ok,
                statuses: vec![NO_LIMIT; request.descriptors.len()],
                headers: Vec::new(),
            });
        };

        let (mut plans, mut counters) = (Scratch::new(), Scratch::new());
        self.plan_into(request, domain, &mut plans, &mut counters);
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
            Ok((results, allowed)) => {
                Ok(self.respond(request.domain, &plans, &counters, (&results, allowed)))
            }
            Err(error) => {
                observer.store_failed(&error, self.options.failure_mode);
                self.on_store_error(request.domain, &plans, error)
            }
        }
    }

    /// One store call for all counters (none when there are no counters), timed.
    async fn decide(
        &self,
        counters: &[Counter],
        observer: &mut impl Observer,
    ) -> Result<(Vec<CounterResult>, bool), StoreError> {
        if counters.is_empty() {
            return Ok((Vec::new(), true));
        }
        let started = Instant::now();
        let decided = self.store.decide(counters).await;
        let elapsed = started.elapsed();
        self.metrics.observe_store(elapsed);
        observer.store_call(elapsed);
        let decision = decided?;
        let (results, allowed) = (decision.counters, decision.allowed);
        if results.len() != counters.len() {
            return Err(StoreError::Backend(format!(
                "store answered {} results for {} counters",
                results.len(),
                counters.len()
            )));
        }
        Ok((results, allowed))
    }

    /// Appends one counter per limit of a limited descriptor and returns their range. The
    /// descriptor's `tag` is built once; each limit only adds its window to it. A quota rule's
    /// counters never deny at the store, as a shadow rule's.
    fn push_counters(
        &self,
        counters: &mut Scratch<Counter>,
        mut tag: CounterTag,
        limited: &plan::Limited<'_>,
        debt: plan::Debt,
    ) -> Range<usize> {
        let start = counters.len();
        let (hits, kind) = (limited.hits, limited.kind);
        for limit in limited.limits.iter() {
            let window = limit.window();
            counters.push(Counter {
                key: tag.counter_key(window),
                limit: limit.requests_per_unit,
                window,
                hits,
                shadow: limited.shadow || limited.quota || self.options.shadow_mode,
                precision: plan::counter_precision(limit, kind, hits, debt),
                kind,
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
        (results, allowed): (&[CounterResult], bool),
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
            if code == Code::OverLimit {
                let rule = limited.plain_label_of(chosen - range.start);
                self.limited
                    .deny(&counters[chosen].key, rule, SystemTime::now());
            }
            if let Some(envoy) = self.metrics.envoy_stats() {
                envoy_record(
                    envoy,
                    domain,
                    limited,
                    result,
                    counters[chosen].limit,
                    allowed,
                );
            }
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
                rule: self.rule_of(limited, chosen - range.start),
                shadow: limited.shadow || self.options.shadow_mode,
            });
        }
        let overall = self.overall(plans, &statuses);
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
        // One line per kind every few seconds: a store that fails under load would otherwise
        // write one per request.
        static FAILED: [Throttle; StoreError::KINDS.len()] =
            [const { Throttle::new() }; StoreError::KINDS.len()];
        if let Some(left_out) = FAILED[error.index()].admit() {
            tracing::warn!(
                kind = error.kind(),
                %error,
                failure_mode = %mode,
                left_out,
                "store call failed; the failure mode answered"
            );
        }
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
            overall: self.overall(plans, &statuses),
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
            rule: self.rule_of(limited, 0),
            shadow: limited.shadow || self.options.shadow_mode,
        }
    }

    /// The name of the rule (or limit) that decided, when answers carry it.
    fn rule_of(&self, limited: &Limited<'_>, deciding: usize) -> Option<Box<DecidingRule>> {
        self.options.name_rules.then(|| {
            let rule = limited.label_of(deciding);
            let plain = limited.carries_values().then(|| {
                let plain = limited.plain_label_of(deciding);
                crate::metrics::bounded_to(plain, envoy_stats::MAX_KEY_BYTES).into_owned()
            });
            Box::new(DecidingRule {
                name: crate::metrics::bounded_to(rule, envoy_stats::MAX_KEY_BYTES).into_owned(),
                plain_name: plain,
                metadata: limited.rule.and_then(|rule| rule.metadata.clone()),
            })
        })
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
        // Hits given back are not hits taken: the decision counts, its hits do not.
        let hits = match limited.kind {
            HitKind::Returned => 0,
            _ => limited.hits,
        };
        self.metrics
            .rule(domain, limited.label_of(deciding))
            .record(decision, hits, near_limit);
        self.code_of(limited, over)
    }

    /// OVER_LIMIT when any ordinary descriptor is, or every quota descriptor is (there being
    /// any), unless the global shadow mode is on.
    fn overall(&self, plans: &[Plan<'_>], statuses: &[DescriptorStatus]) -> Code {
        let (mut ordinary_over, mut quotas, mut quotas_over) = (false, 0usize, 0usize);
        for (plan, status) in plans.iter().zip(statuses) {
            let over = status.code == Code::OverLimit;
            match plan {
                Plan::Limited(l) | Plan::OverBudget(l) if l.quota => {
                    quotas += 1;
                    quotas_over += usize::from(over);
                }
                _ => ordinary_over |= over,
            }
        }
        let over = ordinary_over || (quotas > 0 && quotas == quotas_over);
        if over && !self.options.shadow_mode {
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
    rule: None,
    shadow: false,
};

const UNLIMITED: DescriptorStatus = DescriptorStatus {
    code: Code::Ok,
    current_limit: None,
    limit_remaining: u32::MAX,
    duration_until_reset: None,
    rule: None,
    shadow: false,
};

/// Counts one descriptor in envoyproxy/ratelimit's stats (see [`envoy_stats`]), by the counter
/// that decided it. The store reports the hits a counter holds after the decision: with this
/// descriptor's hits when they were recorded (the request admitted and the counter not over, or a
/// charge, which always lands), without them otherwise.
fn envoy_record(
    envoy: &envoy_stats::EnvoyStats,
    domain: &str,
    limited: &Limited<'_>,
    result: &CounterResult,
    limit: u64,
    allowed: bool,
) {
    if limited.kind == HitKind::Returned {
        return;
    }
    let recorded = limited.kind == HitKind::Charged || (allowed && !result.over_limit);
    let before = if recorded {
        result.count.saturating_sub(limited.hits)
    } else {
        result.count
    };
    let key = crate::metrics::bounded_to(limited.envoy_key(), envoy_stats::MAX_KEY_BYTES);
    envoy.rule(domain, &key).record(
        limit,
        envoy.near(limit),
        before,
        limited.hits,
        result.over_limit,
        limited.shadow,
    );
}
