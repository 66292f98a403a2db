//! statsd-style dotted names turned into Prometheus names and labels, the way
//! prometheus/statsd_exporter v0.26 (`pkg/mapper`, `pkg/exporter`) does it.
//!
//! Why: envoyproxy/ratelimit writes its stats as dotted statsd names
//! (`ratelimit.service.rate_limit.<domain>.<key>.total_hits`) and, with `USE_PROMETHEUS`, hands
//! them to an in-process statsd_exporter whose mapper file (`PROMETHEUS_MAPPER_YAML`, or the
//! embedded default) decides the Prometheus names and labels. Dashboards and alerts written
//! against that service (Envoy Gateway's "Global Ratelimit" dashboard among them) query those
//! mapped names, so a drop-in replacement has to produce the same series from the same mapper
//! file, quirks included.
//!
//! What is reproduced, for the subset slidegate needs:
//! - Glob rules (`match_type: glob`, the default, or `defaults.match_type`): the pattern is
//!   validated like upstream (`*` is a whole dot component). The rules are kept in upstream's
//!   finite-state machine, one tree per metric type, and all glob rules are tried before any
//!   regex rule; the rule earliest in the file wins. The tree is upstream's own, so its quirks
//!   carry over: a rule whose pattern ends where an earlier, longer rule passes through
//!   (`a.b` after `a.b.c`) never matches, and a repeated pattern keeps the first rule but the
//!   position of the last.
//! - Regex rules in file order, matched unanchored (a substring match, like Go's
//!   `FindStringSubmatchIndex`), with `$n`/`${n}`/`$name` expanded like Go's
//!   `Regexp.ExpandString`. Go's `\d`, `\w`, `\s` and `\b` are ASCII-only, so they are
//!   rewritten to ASCII classes before the pattern is given to the `regex` crate.
//! - The expanded name goes through upstream's `EscapeMetricName`; an unmapped name is escaped
//!   the same way and gets no labels.
//!
//! Not reproduced: `defaults.glob_disable_ordering: true` (refused when loading), and the
//! `printf` artefacts of upstream's glob template formatter (a literal `%` in a template that
//! also has captures, `$1` next to `$10`). `ttl`, `buckets`, `quantiles`, `honor_labels`,
//! `summary_options` and `histogram_options` are accepted so that upstream files load, and
//! checked only where upstream refuses a file because of them.
//!
//! The glob rules' state machine is in `matcher`, the expansion of `name` and `labels` templates
//! and the translation of Go's regex syntax in `templates`.

mod matcher;
mod templates;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;
use serde::de::IgnoredAny;

use matcher::Fsm;
pub use templates::escape_metric_name;
use templates::{expand_glob, expand_go, go_regex_to_rust};

/// envoyproxy/ratelimit's `src/stats/prom/default_mapper.yaml`, verbatim: the mapper the
/// service uses when `PROMETHEUS_MAPPER_YAML` is not set.
pub const RATELIMIT_DEFAULT_MAPPER_YAML: &str = include_str!("../statsd_default_mapper.yaml");

/// The line envoyproxy/ratelimit removes from [`RATELIMIT_DEFAULT_MAPPER_YAML`] when
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true` (Envoy Gateway's mounted file lacks it too).
const RESPONSE_TIME_SCALE_LINE: &str = "    scale: 0.001\n";

/// The statsd event types a rule can be restricted to (`match_metric_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricKind {
    Counter,
    Gauge,
    /// A timer or histogram observation (`observer`, or its old name `timer`).
    Observer,
}

impl MetricKind {
    const ALL: [MetricKind; 3] = [MetricKind::Counter, MetricKind::Gauge, MetricKind::Observer];

    fn index(self) -> usize {
        match self {
            MetricKind::Counter => 0,
            MetricKind::Gauge => 1,
            MetricKind::Observer => 2,
        }
    }
}

/// What becomes of one statsd name.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapped {
    /// Discarded: a rule with `action: drop` matched, or the matched rule's name expanded to
    /// the empty string (upstream counts that as an `empty_metric_name` error and drops it).
    Drop,
    /// No rule matched: exported under the escaped statsd name, without labels.
    Unmapped { name: String },
    /// A `map` rule matched.
    Metric {
        /// The expanded `name`, escaped.
        name: String,
        /// The expanded `labels`, sorted by label name. Values are not escaped.
        labels: Vec<(String, String)>,
        /// `scale`: every value of the event is multiplied by it.
        scale: Option<f64>,
        /// `observer_type` (else `timer_type`, else `defaults.observer_type`): `histogram` or
        /// `summary`; only observer events use it. `None` when none is set, which upstream
        /// takes as a summary.
        observer_type: Option<String>,
    },
}

/// A mapper file that statsd_exporter would refuse, or one using what is not reproduced.
#[derive(Debug, thiserror::Error)]
pub enum MapperError {
    #[error("statsd mapper: the YAML does not parse: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("statsd mapper: defaults: {0}")]
    Defaults(String),
    #[error("statsd mapper: mapping {index} (match {pattern:?}): {problem}")]
    Mapping {
        /// Position in `mappings`, from 0.
        index: usize,
        pattern: String,
        problem: MappingProblem,
    },
}

/// Why one mapping is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MappingProblem {
    #[error(
        "invalid glob: each dot-separated part must be `*` or a name of letters, digits, `_` and `-` (the first not starting with a digit)"
    )]
    InvalidGlob,
    #[error("invalid regex: {0}")]
    InvalidRegex(String),
    #[error("no metric name (`name` is required, also with `action: drop`)")]
    MissingName,
    #[error("invalid metric name {0:?}: only letters, digits, `_` and `$n`/`${{n}}` captures")]
    InvalidName(String),
    #[error(
        "invalid label name {0:?}: it must match ^[a-zA-Z_][a-zA-Z0-9_]+$ (at least two characters)"
    )]
    InvalidLabelName(String),
    #[error("unknown match_type {0:?} (glob or regex)")]
    UnknownMatchType(String),
    #[error("unknown action {0:?} (map or drop)")]
    UnknownAction(String),
    #[error("unknown match_metric_type {0:?} (counter, gauge, observer or timer)")]
    UnknownMetricType(String),
    #[error("unknown observer_type/timer_type {0:?} (histogram or summary)")]
    UnknownObserverType(String),
    #[error("{0}")]
    Conflict(&'static str),
}

/// A loaded mapper file.
#[derive(Debug, Clone)]
pub struct Mapper {
    rules: Vec<Rule>,
    /// The glob rules, as upstream's state machine.
    fsm: Fsm,
    /// Indexes into `rules` of the regex rules, in file order.
    regex_rules: Vec<usize>,
}

#[derive(Debug, Clone)]
struct Rule {
    matcher: Matcher,
    /// The `name` template, before expansion.
    name: String,
    /// Label name and value template, sorted by name.
    labels: Vec<(String, String)>,
    drop: bool,
    kind: Option<MetricKind>,
    scale: Option<f64>,
    observer_type: Option<String>,
    /// `help`: parsed and kept; the HELP text is not part of [`Mapped`].
    #[allow(dead_code)]
    help: Option<String>,
}

#[derive(Debug, Clone)]
enum Matcher {
    /// The number of `*` in the pattern: `$n` beyond it expands to nothing.
    Glob {
        stars: usize,
    },
    Regex(Regex),
}

// ---------------------------------------------------------------------------------------------
// The file

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    defaults: Option<RawDefaults>,
    mappings: Option<Vec<RawMapping>>,
}

/// `defaults`: the keys slidegate does not use are accepted so that upstream files load.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawDefaults {
    observer_type: Option<String>,
    timer_type: Option<String>,
    match_type: Option<String>,
    glob_disable_ordering: Option<bool>,
    ttl: Option<IgnoredAny>,
    buckets: Option<IgnoredAny>,
    quantiles: Option<IgnoredAny>,
    summary_options: Option<IgnoredAny>,
    histogram_options: Option<IgnoredAny>,
}

/// One entry of `mappings`: every key statsd_exporter v0.26 reads, so that a key it does not
/// know (most likely a typo such as `lables`, which it would silently ignore) is refused here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RawMapping {
    #[serde(rename = "match")]
    pattern: Option<String>,
    name: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    match_type: Option<String>,
    action: Option<String>,
    match_metric_type: Option<String>,
    observer_type: Option<String>,
    timer_type: Option<String>,
    scale: Option<f64>,
    help: Option<String>,
    honor_labels: Option<bool>,
    ttl: Option<IgnoredAny>,
    buckets: Option<IgnoredAny>,
    quantiles: Option<IgnoredAny>,
    summary_options: Option<RawSummaryOptions>,
    histogram_options: Option<RawHistogramOptions>,
}

/// Only whether `quantiles` is given matters (upstream refuses it twice); the rest is accepted.
#[derive(Deserialize)]
struct RawSummaryOptions {
    quantiles: Option<IgnoredAny>,
}

/// Only whether `buckets` is given matters (upstream refuses it twice); the rest is accepted.
#[derive(Deserialize)]
struct RawHistogramOptions {
    buckets: Option<IgnoredAny>,
}

#[derive(Clone, Copy, PartialEq)]
enum MatchType {
    Glob,
    Regex,
}

/// Upstream's `MatchType.UnmarshalYAML`: the empty string means glob.
fn parse_match_type(s: &str) -> Option<MatchType> {
    match s {
        "" | "glob" => Some(MatchType::Glob),
        "regex" => Some(MatchType::Regex),
        _ => None,
    }
}

/// Upstream's `ObserverType.UnmarshalYAML`: an explicit empty string means summary.
fn parse_observer_type(s: &str) -> Option<&'static str> {
    match s {
        "histogram" => Some("histogram"),
        "" | "summary" => Some("summary"),
        _ => None,
    }
}

/// A glob pattern (upstream's `metricLineRE`): the first part may not start with a digit.
static GLOB_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\*|[a-zA-Z_][a-zA-Z0-9_\-]*)(\.\*|\.[a-zA-Z0-9_][a-zA-Z0-9_\-]*)*$")
        .expect("constant pattern")
});

/// A `name` template (upstream's `metricNameRE`).
static NAME_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([a-zA-Z_]|\$\{?[0-9]+\}?)([a-zA-Z0-9_]|\$\{?[0-9]+\}?)*$")
        .expect("constant pattern")
});

/// A label name (upstream's `labelNameRE`; note the `+`: one character is refused).
static LABEL_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-zA-Z_][a-zA-Z0-9_]+$").expect("constant pattern"));

impl Mapper {
    /// Loads a statsd_exporter mapper file, refusing what statsd_exporter v0.26 refuses.
    pub fn from_yaml(text: &str) -> Result<Mapper, MapperError> {
        // An empty file (or one of comments only) is an empty mapper upstream.
        let raw: Option<RawFile> = serde_yaml::from_str(text)?;
        let raw = raw.unwrap_or(RawFile {
            defaults: None,
            mappings: None,
        });
        let defaults = raw.defaults.unwrap_or_default();
        let default_match = match defaults.match_type.as_deref() {
            None => MatchType::Glob,
            Some(s) => parse_match_type(s)
                .ok_or_else(|| MapperError::Defaults(format!("unknown match_type {s:?}")))?,
        };
        if defaults.glob_disable_ordering == Some(true) {
            return Err(MapperError::Defaults(
                "glob_disable_ordering: true is not supported (the earliest glob rule wins)".into(),
            ));
        }
        let default_observer = match defaults.observer_type.or(defaults.timer_type) {
            None => None,
            Some(s) => Some(parse_observer_type(&s).ok_or_else(|| {
                MapperError::Defaults(format!("unknown observer_type/timer_type {s:?}"))
            })?),
        };

        let mut mapper = Mapper {
            rules: Vec::new(),
            fsm: Fsm::new(),
            regex_rules: Vec::new(),
        };
        for (index, m) in raw.mappings.unwrap_or_default().into_iter().enumerate() {
            let pattern = m.pattern.clone().unwrap_or_default();
            let fail = |problem| MapperError::Mapping {
                index,
                pattern: pattern.clone(),
                problem,
            };
            let rule = build_rule(m, default_match, default_observer).map_err(fail)?;
            if let Matcher::Glob { .. } = rule.matcher {
                mapper.fsm.add(&pattern, rule.kind, mapper.rules.len());
            } else {
                mapper.regex_rules.push(mapper.rules.len());
            }
            mapper.rules.push(rule);
        }
        Ok(mapper)
    }

    /// envoyproxy/ratelimit's default mapper ([`RATELIMIT_DEFAULT_MAPPER_YAML`]).
    pub fn ratelimit_default() -> Mapper {
        Mapper::from_yaml(RATELIMIT_DEFAULT_MAPPER_YAML).expect("the embedded default mapper loads")
    }

    /// The default mapper as envoyproxy/ratelimit uses it with
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=true`: without `scale: 0.001` on
    /// `response_time`, which is also what Envoy Gateway mounts.
    pub fn ratelimit_default_milliseconds() -> Mapper {
        let text = RATELIMIT_DEFAULT_MAPPER_YAML.replacen(RESPONSE_TIME_SCALE_LINE, "", 1);
        Mapper::from_yaml(&text).expect("the embedded default mapper loads")
    }

    /// Maps one statsd name of the given type: glob rules first, then regex rules.
    pub fn map(&self, name: &str, kind: MetricKind) -> Mapped {
        let matched = self
            .match_glob(name, kind)
            .or_else(|| self.match_regex(name, kind));
        let Some((rule, expanded_name, labels)) = matched else {
            return Mapped::Unmapped {
                name: escape_metric_name(name),
            };
        };
        if rule.drop || expanded_name.is_empty() {
            return Mapped::Drop;
        }
        Mapped::Metric {
            name: escape_metric_name(&expanded_name),
            labels,
            scale: rule.scale,
            observer_type: rule.observer_type.clone(),
        }
    }

    fn match_glob(&self, name: &str, kind: MetricKind) -> Option<Expanded<'_>> {
        let fields: Vec<&str> = name.split('.').collect();
        let (index, captures) = self.fsm.lookup(&fields, kind)?;
        let rule = &self.rules[index];
        let stars = match rule.matcher {
            Matcher::Glob { stars } => stars,
            Matcher::Regex(_) => 0,
        };
        let expand = |template: &str| expand_glob(template, &captures, stars);
        let labels = rule
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), expand(v)))
            .collect();
        Some((rule, expand(&rule.name), labels))
    }

    fn match_regex(&self, name: &str, kind: MetricKind) -> Option<Expanded<'_>> {
        self.regex_rules.iter().find_map(|&index| {
            let rule = &self.rules[index];
            let Matcher::Regex(re) = &rule.matcher else {
                return None;
            };
            let caps = re.captures(name)?;
            if rule.kind.is_some_and(|k| k != kind) {
                return None;
            }
            let labels = rule
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), expand_go(v, re, &caps)))
                .collect();
            Some((rule, expand_go(&rule.name, re, &caps), labels))
        })
    }
}

/// A matched rule, its expanded name and its expanded labels.
type Expanded<'a> = (&'a Rule, String, Vec<(String, String)>);

/// Checks one mapping the way upstream's `InitFromYAMLString` does, and compiles it.
fn build_rule(
    m: RawMapping,
    default_match: MatchType,
    default_observer: Option<&'static str>,
) -> Result<Rule, MappingProblem> {
    let labels: Vec<(String, String)> = m.labels.unwrap_or_default().into_iter().collect();
    if let Some((k, _)) = labels.iter().find(|(k, _)| !LABEL_RE.is_match(k)) {
        return Err(MappingProblem::InvalidLabelName(k.clone()));
    }
    let name = m.name.unwrap_or_default();
    if name.is_empty() {
        return Err(MappingProblem::MissingName);
    }
    if !NAME_RE.is_match(&name) {
        return Err(MappingProblem::InvalidName(name));
    }
    let match_type = match m.match_type.as_deref() {
        None => default_match,
        Some(s) => {
            parse_match_type(s).ok_or_else(|| MappingProblem::UnknownMatchType(s.to_owned()))?
        }
    };
    let drop = match m.action.as_deref() {
        None | Some("" | "map") => false,
        Some("drop") => true,
        Some(s) => return Err(MappingProblem::UnknownAction(s.to_owned())),
    };
    let kind = match m.match_metric_type.as_deref() {
        None => None,
        Some("counter") => Some(MetricKind::Counter),
        Some("gauge") => Some(MetricKind::Gauge),
        Some("observer" | "timer") => Some(MetricKind::Observer),
        Some(s) => return Err(MappingProblem::UnknownMetricType(s.to_owned())),
    };
    // observer_type wins over the deprecated timer_type, and either over the default.
    let parse = |s: String| parse_observer_type(&s).ok_or(MappingProblem::UnknownObserverType(s));
    let timer_type = m.timer_type.map(parse).transpose()?;
    let observer_type = m.observer_type.map(parse).transpose()?;
    let observer_type = observer_type.or(timer_type).or(default_observer);

    let pattern = m.pattern.unwrap_or_default();
    let matcher = match match_type {
        MatchType::Glob => {
            if !GLOB_RE.is_match(&pattern) {
                return Err(MappingProblem::InvalidGlob);
            }
            Matcher::Glob {
                stars: pattern.split('.').filter(|f| *f == "*").count(),
            }
        }
        MatchType::Regex => Regex::new(&go_regex_to_rust(&pattern))
            .map(Matcher::Regex)
            .map_err(|e| MappingProblem::InvalidRegex(e.to_string()))?,
    };

    let legacy_quantiles = m.quantiles.is_some();
    let legacy_buckets = m.buckets.is_some();
    if m.summary_options
        .as_ref()
        .is_some_and(|o| o.quantiles.is_some())
        && legacy_quantiles
    {
        return Err(MappingProblem::Conflict(
            "quantiles is given both at the top level and in summary_options",
        ));
    }
    if m.histogram_options
        .as_ref()
        .is_some_and(|o| o.buckets.is_some())
        && legacy_buckets
    {
        return Err(MappingProblem::Conflict(
            "buckets is given both at the top level and in histogram_options",
        ));
    }
    if observer_type == Some("histogram") && m.summary_options.is_some() {
        return Err(MappingProblem::Conflict(
            "a histogram observer cannot have summary_options",
        ));
    }
    if observer_type == Some("summary") && m.histogram_options.is_some() {
        return Err(MappingProblem::Conflict(
            "a summary observer cannot have histogram_options",
        ));
    }

    Ok(Rule {
        matcher,
        name,
        labels,
        drop,
        kind,
        scale: m.scale,
        observer_type: observer_type.map(str::to_owned),
        help: m.help,
    })
}
