//! `GET /status.json`: what the operator page shows, in one answer: the rules, the reload state,
//! the store's health, and the decisions of the last minutes per rule.
//!
//! The decisions come from a bounded ring of samples ([`History`]): every [`SAMPLE_EVERY`] a task
//! reads the registry's own counters (`slidegate_decisions_total`, the store's call time and
//! errors) and keeps what moved since the previous sample, for [`SAMPLES`] samples. It reads what
//! `/metrics` serves, off the request path, so a decision costs nothing more; its size is bounded
//! by the rule labels the metrics already cap.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use prometheus::proto::MetricFamily;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::config::RuleSet;
use crate::metrics::{Metrics, OVERFLOW_RULE, bounded_label};
use crate::service::http_routes::AppState;

/// How often the ring takes a sample.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples kept: five minutes.
pub const SAMPLES: usize = 60;

/// What moved in one [`SAMPLE_EVERY`].
#[derive(Clone, Debug, Default)]
struct Sample {
    /// Unix milliseconds at the end of the sample.
    at: u64,
    /// (domain, rule) → allowed, denied, shadow-denied decisions.
    decisions: Vec<((String, String), [u64; 3])>,
    store_calls: u64,
    store_seconds: f64,
    store_errors: u64,
}

/// The ring of samples, and the totals the last one was measured from.
#[derive(Debug, Default)]
pub struct History {
    totals: Totals,
    samples: VecDeque<Sample>,
}

#[derive(Clone, Debug, Default)]
struct Totals {
    decisions: HashMap<(String, String), [u64; 3]>,
    store_calls: u64,
    store_seconds: f64,
    store_errors: u64,
}

impl Totals {
    fn read(families: &[MetricFamily]) -> Totals {
        let mut totals = Totals::default();
        for family in families {
            match family.name() {
                "slidegate_decisions_total" => {
                    for metric in family.get_metric() {
                        let label = |name: &str| {
                            metric
                                .get_label()
                                .iter()
                                .find(|l| l.name() == name)
                                .map(|l| l.value().to_owned())
                                .unwrap_or_default()
                        };
                        let slot = match label("decision").as_str() {
                            "allowed" => 0,
                            "denied" => 1,
                            _ => 2,
                        };
                        let counts = totals
                            .decisions
                            .entry((label("domain"), label("rule")))
                            .or_default();
                        counts[slot] += metric.get_counter().get_value() as u64;
                    }
                }
                "slidegate_store_duration_seconds" => {
                    for metric in family.get_metric() {
                        let histogram = metric.get_histogram();
                        totals.store_calls += histogram.get_sample_count();
                        totals.store_seconds += histogram.get_sample_sum();
                    }
                }
                "slidegate_store_errors_total" => {
                    for metric in family.get_metric() {
                        totals.store_errors += metric.get_counter().get_value() as u64;
                    }
                }
                _ => {}
            }
        }
        totals
    }
}

impl History {
    /// Takes a sample of `families` at `at`.
    fn sample(&mut self, families: &[MetricFamily], at: SystemTime) {
        let now = Totals::read(families);
        let before = std::mem::replace(&mut self.totals, now.clone());
        let mut decisions: Vec<((String, String), [u64; 3])> = now
            .decisions
            .into_iter()
            .filter_map(|(rule, counts)| {
                let was = before.decisions.get(&rule).copied().unwrap_or_default();
                let moved: [u64; 3] = std::array::from_fn(|i| counts[i].saturating_sub(was[i]));
                (moved != [0; 3]).then_some((rule, moved))
            })
            .collect();
        decisions.sort();
        self.samples.push_back(Sample {
            at: super::unix_millis(at),
            decisions,
            store_calls: now.store_calls.saturating_sub(before.store_calls),
            store_seconds: (now.store_seconds - before.store_seconds).max(0.0),
            store_errors: now.store_errors.saturating_sub(before.store_errors),
        });
        while self.samples.len() > SAMPLES {
            self.samples.pop_front();
        }
    }

    /// The samples, each rule's decisions under its label, or under `(hidden)` for a label that
    /// is not `shown` (one made of a request's values), added together.
    fn to_json(&self, shown: &dyn Fn(&str, &str) -> bool) -> Value {
        let samples: Vec<Value> = self
            .samples
            .iter()
            .map(|s| {
                let mut merged: BTreeMap<(&str, &str), [u64; 3]> = BTreeMap::new();
                for ((domain, rule), counts) in &s.decisions {
                    let rule = if shown(domain, rule) {
                        rule.as_str()
                    } else {
                        "(hidden)"
                    };
                    let sum = merged.entry((domain.as_str(), rule)).or_default();
                    for (sum, count) in sum.iter_mut().zip(counts) {
                        *sum += count;
                    }
                }
                let decisions: Vec<Value> = merged
                    .iter()
                    .map(|((domain, rule), [allowed, denied, shadow])| {
                        json!({"domain": domain, "rule": rule, "allowed": allowed,
                               "denied": denied, "shadowDenied": shadow})
                    })
                    .collect();
                let mean_ms = if s.store_calls == 0 {
                    Value::Null
                } else {
                    json!(s.store_seconds * 1000.0 / s.store_calls as f64)
                };
                json!({"at": s.at, "decisions": decisions, "storeCalls": s.store_calls,
                       "storeMeanMs": mean_ms, "storeErrors": s.store_errors})
            })
            .collect();
        json!({"everySeconds": SAMPLE_EVERY.as_secs(), "samples": samples})
    }
}

/// Samples `metrics` into `history` every [`SAMPLE_EVERY`] until `stop`.
pub fn spawn_sampler(
    metrics: Arc<Metrics>,
    history: Arc<Mutex<History>>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first sample only sets the totals the next ones are measured from.
        let mut first = true;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let families = metrics.gather();
            let mut history = history.lock();
            history.sample(&families, SystemTime::now());
            if std::mem::take(&mut first) {
                history.samples.clear();
            }
        }
    });
}

pub(super) fn handler(
    state: &AppState,
    history: &Mutex<History>,
    reset_enabled: bool,
    hide_values: bool,
) -> Value {
    let loaded = state.front.limiter().rules().load();
    let rules: Vec<Value> = loaded
        .rules()
        .into_iter()
        .map(|rule| {
            let limits: Vec<Value> = rule
                .limits
                .iter()
                .map(|l| {
                    json!({"requestsPerUnit": l.requests_per_unit, "unit": l.unit.as_str(),
                           "window": humantime::format_duration(l.window()).to_string(),
                           "precision": l.precision.to_string(), "name": l.name})
                })
                .collect();
            json!({"domain": rule.domain, "path": rule.path, "name": rule.name,
                   "limits": limits, "unlimited": rule.unlimited, "shadow": rule.shadow_mode,
                   "quota": rule.quota_mode, "replaces": rule.replaces, "source": &*rule.source})
        })
        .collect();
    // Only where values are hidden: the set is built for each answer.
    let plain = hide_values.then(|| PlainLabels::of(&loaded));
    let config = state.config_status.load();
    let families = state.front.metrics().gather();
    let nodes: Vec<Value> = families
        .iter()
        .filter(|f| f.name() == "slidegate_redis_node_up")
        .flat_map(|f| f.get_metric())
        .map(|m| {
            let node = m.get_label().first().map(|l| l.value()).unwrap_or_default();
            json!({"node": node, "up": m.get_gauge().get_value() >= 1.0})
        })
        .collect();
    let store = state.front.limiter().store();
    json!({
        "rules": rules,
        "config": {
            "loadedAt": humantime::format_rfc3339_seconds(config.loaded_at).to_string(),
            "servedChecksum": config.served.to_string(),
            "onDiskChecksum": config.on_disk.map(|c| c.to_string()),
            "stale": config.is_stale(),
            "lastError": config.last_error.as_deref(),
        },
        "store": {"kind": store.kind(), "serving": state.health.is_serving(), "nodes": nodes},
        "history": history.lock().to_json(&|domain, label| {
            plain.as_ref().is_none_or(|plain| plain.is_shown(domain, label))
        }),
        "resetEnabled": reset_enabled,
        "hideValues": hide_values,
    })
}

/// The metrics `rule` labels made of configuration alone, per domain: the rules' and limits'
/// names (or paths) as the metrics bound them, overrides' keys and the overflow label; not the
/// names of rules with `detailed_metric` or `value_to_metric`, which carry a request's values.
struct PlainLabels<'a>(HashSet<(&'a str, Cow<'a, str>)>);

impl<'a> PlainLabels<'a> {
    fn of(rules: &'a RuleSet) -> PlainLabels<'a> {
        let names = rules.rules().into_iter().flat_map(|rule| {
            let limits = rule.limits.iter().filter_map(|l| l.name.as_deref());
            let names = [rule.stats_name(), rule.path.as_str()]
                .into_iter()
                .chain(limits);
            names.map(|name| (rule.domain.as_str(), bounded_label(name)))
        });
        PlainLabels(names.collect())
    }

    fn is_shown(&self, domain: &str, label: &str) -> bool {
        label == OVERFLOW_RULE
            || label.starts_with("override:")
            || self.0.contains(&(domain, Cow::Borrowed(label)))
    }
}
