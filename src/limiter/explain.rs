//! What a request would get and why, counting nothing (`POST /explain` on the operator listener).
//!
//! The request is planned exactly as [`RateLimiter::should_rate_limit`] plans it (the same rules,
//! `replaces`, overrides, hit budget and counters), then the store is asked what each counter
//! holds ([`Store::peek`](crate::store::Store::peek), never the Redis deny cache). Nothing is
//! recorded, charged or taken back, and no decision metric moves: an operator can ask as often as
//! they like without changing what clients get.
//!
//! Whether a counter would be over limit is computed from what it holds: the request's hits (and
//! those an earlier descriptor of the request adds to the same counter) do not fit when
//! `held + hits > limit`, as the store decides it; returned hits are never over. The overall code
//! is all or nothing as for a real request (quota descriptors and the global shadow mode
//! included).

use std::sync::Arc;
use std::time::Duration;

use super::plan::{Limited, Plan, descriptor_hits};
use super::{Code, LimitError, NO_LIMIT, RateLimiter, Request, validate};
use crate::config::{Rule, RuleSet, TraceStep};
use crate::store::{CounterKey, HitKind, Precision};

/// The explanation of one request.
#[derive(Clone, Debug)]
pub struct Explanation {
    /// Whether the request's domain has rules (without, every descriptor is OK with no limit).
    pub domain_known: bool,
    /// What the request would be answered now: all or nothing over its descriptors.
    pub overall: Code,
    pub descriptors: Vec<ExplainedDescriptor>,
}

/// What one descriptor resolved to, and what its counters hold.
#[derive(Clone, Debug)]
pub struct ExplainedDescriptor {
    /// The hits the request asks of it (its own `hits_addend`, else the request's, at least 1).
    pub hits: u64,
    /// What those hits would do: admitted, charged (recorded whatever), or returned.
    pub kind: HitKind,
    /// How its entries go down the rule tree; empty for a limit override or an unknown domain.
    pub trace: Vec<TraceStep>,
    /// The rule its entries match (also when `unlimited` or replaced); `None` for no rule and for
    /// a limit override.
    pub rule: Option<Arc<Rule>>,
    pub outcome: Outcome,
    /// OVER_LIMIT when it would be over an enforced limit (a shadow rule reports OK).
    pub code: Code,
    /// One per limit, in the rule's order; empty unless [`Outcome::Limited`].
    pub counters: Vec<ExplainedCounter>,
}

/// How a descriptor is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No rule matches (or the domain has none): OK, nothing counted.
    NoRule,
    /// The matched rule is `unlimited`: OK, nothing counted.
    Unlimited,
    /// Another rule of the request names this one in its `replaces` (their names here): OK,
    /// its counters untouched.
    Replaced { by: Vec<String> },
    /// Its counters decide; `by_override` when the request's limit override replaced the lookup.
    Limited { by_override: bool },
    /// Its hits do not fit in what is left of the request's hit budget: over limit without a
    /// counter (`--max-hits`).
    OverBudget,
}

/// One counter of a limited descriptor.
#[derive(Clone, Debug)]
pub struct ExplainedCounter {
    /// The counter's key (the Redis key without the prefix).
    pub key: CounterKey,
    /// The limit's own `name`, if it has one.
    pub name: Option<String>,
    pub limit: u64,
    pub window: Duration,
    pub precision: Precision,
    /// Never denies: a shadow or quota rule's, or under the global shadow mode.
    pub shadow: bool,
    /// Hits its window holds now.
    pub held: u64,
    /// `limit - held`, saturating.
    pub remaining: u64,
    /// When its oldest hit leaves the window (zero when it holds none); for a counter holding
    /// more than its limit, when one hit fits.
    pub reset_after: Duration,
    /// Whether the request's hits would not fit.
    pub over: bool,
}

impl RateLimiter {
    /// Explains `request` without counting it; see the module docs. Fails as a request would:
    /// [`LimitError::InvalidArgument`] for a request the limits refuse, and
    /// [`LimitError::Unavailable`] when the store cannot answer (whatever `--failure-mode` says:
    /// an explanation without the counts would mislead).
    pub async fn explain(&self, request: &Request<'_>) -> Result<Explanation, LimitError> {
        validate(request, &self.options.limits)?;
        let rules = self.rules.load_full();
        let rules: &RuleSet = &rules;
        let Some(domain) = rules.domain(request.domain) else {
            let descriptors = request
                .descriptors
                .iter()
                .map(|d| ExplainedDescriptor {
                    hits: descriptor_hits(request, d),
                    kind: self.hit_kind(request, d),
                    trace: Vec::new(),
                    rule: None,
                    outcome: Outcome::NoRule,
                    code: Code::Ok,
                    counters: Vec::new(),
                })
                .collect();
            return Ok(Explanation {
                domain_known: false,
                overall: Code::Ok,
                descriptors,
            });
        };
        let (plans, counters) = self.plan(request, domain);
        let held = self
            .store
            .peek(&counters)
            .await
            .map_err(LimitError::Unavailable)?;
        let matched: Vec<Option<Arc<Rule>>> = request
            .descriptors
            .iter()
            .map(|d| match d.limit {
                Some(_) => None,
                None => domain.match_entries(&d.entries).map(|m| Arc::clone(m.rule)),
            })
            .collect();

        // The hits each counter's earlier namings in this request would add before it.
        let mut pending: Vec<(&CounterKey, u64)> = Vec::new();
        let mut descriptors = Vec::with_capacity(plans.len());
        let mut statuses = Vec::with_capacity(plans.len());
        for ((descriptor, plan), rule) in request.descriptors.iter().zip(&plans).zip(&matched) {
            let trace = match descriptor.limit {
                Some(_) => Vec::new(),
                None => domain.trace(&descriptor.entries),
            };
            let mut explained = ExplainedDescriptor {
                hits: descriptor_hits(request, descriptor),
                kind: self.hit_kind(request, descriptor),
                trace,
                rule: rule.clone(),
                outcome: Outcome::NoRule,
                code: Code::Ok,
                counters: Vec::new(),
            };
            let mut status = NO_LIMIT;
            match plan {
                Plan::NoRule => {}
                Plan::Unlimited { .. } => explained.outcome = Outcome::Unlimited,
                Plan::Replaced => {
                    explained.outcome = Outcome::Replaced {
                        by: replacing(rule.as_deref(), &matched),
                    };
                }
                Plan::OverBudget(limited) => {
                    explained.outcome = Outcome::OverBudget;
                    explained.code = self.code_of(limited, true);
                }
                Plan::Limited(limited) => {
                    explained.outcome = Outcome::Limited {
                        by_override: limited.rule.is_none(),
                    };
                    let mut over = false;
                    for (i, limit) in limited.counters.clone().zip(limited.limits.iter()) {
                        let (counter, result) = (&counters[i], &held[i]);
                        let hits = match limited.kind {
                            HitKind::Returned => 0,
                            _ => limited.hits,
                        };
                        let before = pending
                            .iter()
                            .filter(|(key, _)| **key == counter.key)
                            .fold(0u64, |sum, (_, h)| sum.saturating_add(*h));
                        let counter_over = limited.kind != HitKind::Returned
                            && result.count.saturating_add(before).saturating_add(hits)
                                > counter.limit;
                        pending.push((&counter.key, hits));
                        over |= counter_over;
                        explained.counters.push(ExplainedCounter {
                            key: counter.key.clone(),
                            name: limit.name.clone(),
                            limit: counter.limit,
                            window: counter.window,
                            precision: counter.precision,
                            shadow: counter.shadow,
                            held: result.count,
                            remaining: result.remaining,
                            reset_after: result.reset_after,
                            over: counter_over,
                        });
                    }
                    explained.code = self.code_of(limited, over);
                }
            }
            status.code = explained.code;
            statuses.push(status);
            descriptors.push(explained);
        }
        Ok(Explanation {
            domain_known: true,
            overall: self.overall(&plans, &statuses),
            descriptors,
        })
    }

    /// A limited descriptor's code: over limit only when its rule enforces (a shadow rule
    /// reports OK; the global shadow mode acts on the overall code).
    pub(super) fn code_of(&self, limited: &Limited<'_>, over: bool) -> Code {
        if over && !limited.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        }
    }
}

/// The names under which the request's other matched rules replace `rule`.
fn replacing(rule: Option<&Rule>, matched: &[Option<Arc<Rule>>]) -> Vec<String> {
    let Some(rule) = rule else {
        return Vec::new();
    };
    matched
        .iter()
        .flatten()
        .filter(|other| other.replaces.iter().any(|name| rule.is_named(name)))
        .map(|other| other.name.clone().unwrap_or_else(|| other.path.clone()))
        .collect()
}
