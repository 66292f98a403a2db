//! The plan of one request: each descriptor resolved to a rule, its limits and its counters,
//! within the request's budget of hits.

use std::borrow::Cow;
use std::ops::Range;

use super::request::{counted_as_is, counted_value};
use super::{Descriptor, LimitOverride, RateLimiter, Request};
use crate::Scratch;
use crate::config::{DomainRules, Limit, Precision, Rule, RuleMatch, Unit};
use crate::store::form::recorded_in;
use crate::store::key::CounterTag;
use crate::store::work::work;
use crate::store::{Counter, HitKind, MAX_HITS};

/// What one descriptor resolved to before the store call.
pub(super) enum Plan<'a> {
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

pub(super) struct Limited<'a> {
    /// The metrics `rule` label of the descriptor.
    pub(super) label: Cow<'a, str>,
    /// The matched rule (its `name`, path and `metadata`); `None` for a limit override.
    pub(super) rule: Option<&'a Rule>,
    /// A limit's own `name` replaces `label` when that limit decides (not where the rule's
    /// metrics show request values: `detailed_metric`, `value_to_metric`).
    pub(super) own_labels: bool,
    /// In the order of the descriptor's counters.
    pub(super) limits: Cow<'a, [Limit]>,
    pub(super) shadow: bool,
    /// The rule's `quota_mode`: its counters never deny at the store (as a shadow rule's); over
    /// limit, it reports `OVER_LIMIT`, and the request is denied when every quota descriptor is.
    pub(super) quota: bool,
    pub(super) hits: u64,
    /// What its counters do with the hits.
    pub(super) kind: HitKind,
    pub(super) counters: Range<usize>,
}

impl Limited<'_> {
    /// The key of envoyproxy/ratelimit's stats: the rule's path, or where the rule's metrics show
    /// request values the name that shows them; for a limit override, its entries' keys.
    pub(super) fn envoy_key(&self) -> &str {
        if self.own_labels {
            self.rule.map_or("", |rule| &rule.path)
        } else {
            self.label.strip_prefix("override:").unwrap_or(&self.label)
        }
    }

    /// The metrics `rule` label when the limit at `i` decides: its own name where it has one.
    pub(super) fn label_of(&self, i: usize) -> &str {
        match self.limits.get(i).and_then(|l| l.name.as_deref()) {
            Some(name) if self.own_labels => name,
            _ => &self.label,
        }
    }

    /// [`Limited::label_of`] without the request's values, which the metrics name of a rule
    /// with `detailed_metric` or `value_to_metric` carries: such a rule by its own name (or
    /// path). What the operator listener shows beside a counter's entries, whose values
    /// `--operator-hide-values` hides.
    pub(super) fn plain_label_of(&self, i: usize) -> &str {
        match self.rule {
            Some(rule) if self.carries_values() => rule.stats_name(),
            _ => self.label_of(i),
        }
    }

    /// Whether [`Limited::label_of`] carries the request's values (a rule's detailed name).
    pub(super) fn carries_values(&self) -> bool {
        self.rule.is_some() && !self.own_labels
    }
}

impl RateLimiter {
    /// Resolves every descriptor to a plan, and the counters of all limited ones.
    pub(super) fn plan<'a>(
        &self,
        request: &'a Request<'_>,
        domain: &'a DomainRules,
    ) -> (Scratch<Plan<'a>>, Scratch<Counter>) {
        let (mut plans, mut counters) = (Scratch::new(), Scratch::new());
        self.plan_into(request, domain, &mut plans, &mut counters);
        (plans, counters)
    }

    /// [`RateLimiter::plan`] into the caller's (empty) lists: the decision's path keeps them in
    /// its own future, where returning them would copy both (inline lists, some hundreds of
    /// bytes) once more.
    pub(super) fn plan_into<'a>(
        &self,
        request: &'a Request<'_>,
        domain: &'a DomainRules,
        plans: &mut Scratch<Plan<'a>>,
        counters: &mut Scratch<Counter>,
    ) {
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
        counters.reserve(request.descriptors.len());
        let mut budget = self.options.limits.max_hits;
        plans.extend(
            request
                .descriptors
                .iter()
                .zip(matches)
                .map(|(descriptor, matched)| {
                    let hits = descriptor_hits(request, descriptor);
                    let kind = self.hit_kind(request, descriptor);
                    let is_replaced =
                        |m: &RuleMatch<'_>| replacing.iter().any(|name| m.rule.is_named(name));
                    match (descriptor.limit, matched) {
                        (Some(limit), _) => {
                            let mut limited = override_plan(descriptor, limit, hits, kind);
                            limited.quota = self.options.quota_mode;
                            self.admit(counters, &mut budget, limited, || {
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
                                rule: Some(m.rule),
                                own_labels: !m.rule.detailed_metric && !m.rule.value_to_metric,
                                limits: Cow::Borrowed(&m.rule.limits),
                                shadow: m.rule.shadow_mode,
                                quota: m.rule.quota_mode || self.options.quota_mode,
                                hits,
                                kind,
                                counters: 0..0,
                            };
                            self.admit(counters, &mut budget, limited, || self.match_tag(&m))
                        }
                    }
                }),
        );
        // A request that an over-budget descriptor denies must admit nothing, as any denied
        // request: its other counters are only checked (charges and returns still land).
        let denied = plans
            .iter()
            .any(|p| matches!(p, Plan::OverBudget(l) if !l.shadow && !l.quota));
        if denied && !self.options.shadow_mode {
            counters
                .iter_mut()
                .filter(|c| c.kind == HitKind::Admitted)
                .for_each(|c| c.hits = 0);
        }
    }

    /// What a descriptor's hits do: returned for `is_negative_hits`; charged under
    /// `record_over_limit`, or for a descriptor's own non-zero cost where the transport says
    /// those are charges (gRPC); otherwise admitted.
    pub(super) fn hit_kind(&self, request: &Request<'_>, descriptor: &Descriptor<'_>) -> HitKind {
        let own_cost = descriptor.hits_addend.is_some_and(|h| h > 0);
        if descriptor.negative_hits {
            HitKind::Returned
        } else if self.options.record_over_limit || (request.costs_are_charges && own_cost) {
            HitKind::Charged
        } else {
            HitKind::Admitted
        }
    }

    /// Gives a limited descriptor its counters when its cost ([`budget_cost`]) fits in the
    /// request's `budget`, or plans it over limit.
    pub(super) fn admit<'a>(
        &self,
        counters: &mut Scratch<Counter>,
        budget: &mut u64,
        mut limited: Limited<'a>,
        tag: impl FnOnce() -> CounterTag,
    ) -> Plan<'a> {
        // A charge lands: where its logs would cost more than what is left of the budget, in
        // buckets, as few as it takes.
        let forms = match limited.kind {
            HitKind::Charged => &[Debt::None, Debt::Buckets, Debt::OneBucket][..],
            _ => &[Debt::None][..],
        };
        let fitting = forms.iter().find_map(|&debt| {
            let cost = budget_cost(&limited.limits, limited.hits, limited.kind, debt);
            (cost <= *budget).then_some((debt, cost))
        });
        // A charge lands even where its cheapest form does not fit (a bucket limit's buckets
        // cost the same in every form): it takes what is left of the budget, so the request's
        // later descriptors are over budget instead.
        let (debt, cost) = match fitting {
            Some(fits) => fits,
            None if limited.kind == HitKind::Charged => (Debt::OneBucket, *budget),
            None => return Plan::OverBudget(limited),
        };
        *budget -= cost;
        limited.counters = self.push_counters(counters, tag(), &limited, debt);
        Plan::Limited(limited)
    }

    /// The counter tag of a matched descriptor, with its long values replaced by their digests
    /// ([`counted_value`]).
    pub(super) fn match_tag(&self, m: &RuleMatch<'_>) -> CounterTag {
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
    pub(super) fn override_tag(&self, domain: &str, entries: &[(&str, &str)]) -> CounterTag {
        let max = self.options.limits.max_value_bytes;
        let values: Scratch<Cow<'_, str>> =
            entries.iter().map(|(_, v)| counted_value(v, max)).collect();
        let counted = entries.iter().zip(&values);
        CounterTag::new(
            domain,
            counted.map(|(&(key, _), value)| (key, value.as_ref())),
        )
    }
}

/// The hits a descriptor asks: its own `hits_addend`, else the request's (at least 1). Capped, so
/// that no sum of hits can wrap (see [`MAX_HITS`]).
pub(super) fn descriptor_hits(request: &Request<'_>, descriptor: &Descriptor<'_>) -> u64 {
    descriptor
        .hits_addend
        .unwrap_or(request.hits_addend.max(1))
        .min(MAX_HITS)
}

/// What a descriptor's counters cost of the request's hit budget ([`RequestLimits::max_hits`]):
/// the store's work for each ([`work`]) in the form its hits are recorded in
/// ([`counter_precision`]): the hits it stores on each exact log (at least 1, so the budget also
/// bounds the number of counters), its buckets per window plus one for a bucket counter, whatever
/// its hits, and 1 for each counter that hits are returned to (taking back costs at most what was
/// stored, which paid already).
pub(super) fn budget_cost(limits: &[Limit], hits: u64, kind: HitKind, debt: Debt) -> u64 {
    limits.iter().fold(0u64, |sum, limit| {
        let cost = match kind {
            HitKind::Returned => 1,
            _ => work(
                counter_precision(limit, kind, hits, debt),
                limit.window(),
                hits,
            ),
        };
        sum.saturating_add(cost)
    })
}

/// Where a charge whose logs do not fit in what is left of the request's budget goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Debt {
    /// Its own form: the budget takes the charge as it is.
    None,
    /// Every charged log in [`Precision::for_debt`]'s buckets.
    Buckets,
    /// Every charged log in one bucket of its window (2 of the budget): the whole charge denies
    /// for up to twice the window, where even a sixtieth of it does not fit.
    OneBucket,
}

/// The form a limit's counter is recorded in ([`recorded_in`]): a charge too large for a log in
/// buckets, and the charged logs of a [`Debt`] in its buckets.
pub(super) fn counter_precision(limit: &Limit, kind: HitKind, hits: u64, debt: Debt) -> Precision {
    let window = limit.window();
    match (limit.precision, kind, debt) {
        (Precision::Exact, HitKind::Charged, Debt::Buckets) => Precision::for_debt(window),
        (Precision::Exact, HitKind::Charged, Debt::OneBucket) => Precision::Buckets(window),
        _ => recorded_in(limit.precision, kind, limit.requests_per_unit, window, hits),
    }
}

/// A descriptor with a limit override: one counter on the request's entries, never shadow,
/// no name (as in envoyproxy/ratelimit).
pub(super) fn override_plan<'a>(
    descriptor: &Descriptor<'_>,
    limit: LimitOverride,
    hits: u64,
    kind: HitKind,
) -> Limited<'a> {
    // An override without a known unit is decided as a limit of 0 (over limit), never refused:
    // see `LimitOverride`.
    let (requests_per_unit, unit) = match limit.unit {
        Some(unit) => (u64::from(limit.requests_per_unit), unit),
        None => (0, Unit::Second),
    };
    let limit = Limit {
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        precision: Precision::automatic(requests_per_unit, unit.duration()),
        name: None,
    };
    Limited {
        label: Cow::Owned(override_label(&descriptor.entries)),
        rule: None,
        own_labels: false,
        limits: Cow::Owned(vec![limit]),
        shadow: false,
        quota: false,
        hits,
        kind,
        counters: 0..0,
    }
}

/// The metrics label of an override: the entry keys joined with `.`, like a rule path (keys come
/// from the proxy's configuration; values, which clients choose, are left out).
pub(super) fn override_label(entries: &[(&str, &str)]) -> String {
    let mut label = String::from("override:");
    for (i, (key, _)) in entries.iter().enumerate() {
        if i > 0 {
            label.push('.');
        }
        label.push_str(key);
    }
    label
}
