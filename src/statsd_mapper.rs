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

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// envoyproxy/ratelimit's `src/stats/prom/default_mapper.yaml`, verbatim: the mapper the
/// service uses when `PROMETHEUS_MAPPER_YAML` is not set.
pub const RATELIMIT_DEFAULT_MAPPER_YAML: &str = include_str!("statsd_default_mapper.yaml");

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

// ---------------------------------------------------------------------------------------------
// Glob rules: upstream's `pkg/mapper/fsm`

/// One tree of states per metric type, built exactly as upstream's `FSM.AddState` builds it,
/// because which rule wins (and which never can) follows from that construction.
#[derive(Debug, Clone)]
struct Fsm {
    states: Vec<State>,
}

#[derive(Debug, Clone, Default)]
struct State {
    transitions: HashMap<String, usize>,
    /// The fewest and most dot parts left after this state, over the patterns through it.
    min_left: usize,
    max_left: usize,
    /// The rule that created this state as its last part. Upstream sets it only when it
    /// creates the state, so a later pattern ending at an existing state does not get it.
    result: Option<usize>,
    /// The position of the last rule that ended here; the lowest wins.
    priority: usize,
}

impl Fsm {
    /// The roots, one per [`MetricKind`], are states 0, 1 and 2.
    fn new() -> Fsm {
        Fsm {
            states: vec![State::default(); MetricKind::ALL.len()],
        }
    }

    fn add(&mut self, pattern: &str, kind: Option<MetricKind>, rule: usize) {
        let fields: Vec<&str> = pattern.split('.').collect();
        let roots: Vec<usize> = match kind {
            None => MetricKind::ALL.iter().map(|k| k.index()).collect(),
            Some(k) => vec![k.index()],
        };
        for root in roots {
            let mut at = root;
            for (i, field) in fields.iter().enumerate() {
                let left = fields.len() - i - 1;
                at = match self.states[at].transitions.get(*field) {
                    Some(&next) => {
                        let s = &mut self.states[next];
                        s.max_left = s.max_left.max(left);
                        s.min_left = s.min_left.min(left);
                        next
                    }
                    None => {
                        let next = self.states.len();
                        self.states.push(State {
                            min_left: left,
                            max_left: left,
                            result: (left == 0).then_some(rule),
                            ..State::default()
                        });
                        self.states[at]
                            .transitions
                            .insert((*field).to_owned(), next);
                        next
                    }
                };
            }
            self.states[at].priority = rule;
        }
    }

    /// Upstream's `FSM.GetMapping` with ordering on: every path is searched (the exact part
    /// before `*`), and the final state with the lowest priority wins. The captures are a
    /// fixed array written at each `*` step and copied whole, as upstream does.
    fn lookup<'n>(&self, fields: &[&'n str], kind: MetricKind) -> Option<(usize, Vec<&'n str>)> {
        let mut search = Search {
            fsm: self,
            fields,
            captures: vec![""; fields.len()],
            best: None,
        };
        search.from(kind.index(), 0, 0);
        let (state, captures) = search.best?;
        Some((self.states[state].result?, captures))
    }
}

struct Search<'f, 'n> {
    fsm: &'f Fsm,
    fields: &'f [&'n str],
    captures: Vec<&'n str>,
    /// The winning final state so far and its captures.
    best: Option<(usize, Vec<&'n str>)>,
}

impl<'n> Search<'_, 'n> {
    /// Tries the transitions out of `state` for field `i`; `capture` is the next capture slot.
    fn from(&mut self, state: usize, i: usize, capture: usize) {
        let fsm = self.fsm;
        let transitions = &fsm.states[state].transitions;
        let field = self.fields[i];
        let left = self.fields.len() - i - 1;
        let fits = |s: usize| {
            let s = &fsm.states[s];
            s.min_left <= left && left <= s.max_left
        };
        let exact = transitions.get(field).copied().filter(|&s| fits(s));
        let star = transitions.get("*").copied().filter(|&s| fits(s));
        // A part that is literally `*` takes the exact transition first without capturing,
        // as upstream does.
        if let Some(next) = exact {
            self.visit(next, i, capture);
        }
        if let Some(next) = star {
            self.captures[capture] = field;
            self.visit(next, i, capture + 1);
        }
    }

    fn visit(&mut self, state: usize, i: usize, capture: usize) {
        let fsm = self.fsm;
        let s = &fsm.states[state];
        if s.result.is_some() && i + 1 == self.fields.len() {
            let better = match &self.best {
                None => true,
                Some((b, _)) => fsm.states[*b].priority > s.priority,
            };
            if better {
                self.best = Some((state, self.captures.clone()));
            }
            return;
        }
        if i + 1 < self.fields.len() && !s.transitions.is_empty() {
            self.from(state, i + 1, capture);
        }
    }
}

/// Upstream's glob `TemplateFormatter`: each `\$\{?([a-zA-Z0-9_$]+)\}?` is replaced by capture
/// n when the group is a number from 1 to the number of `*`, and by nothing otherwise (so
/// `$1_total` is the named reference `1_total`, which is empty).
fn expand_glob(template: &str, captures: &[&str], stars: usize) -> String {
    let is_ref = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let body = after.strip_prefix('{').unwrap_or(after);
        let len = body.find(|c| !is_ref(c)).unwrap_or(body.len());
        let (group, tail) = if len > 0 {
            (&body[..len], &body[len..])
        } else {
            // `\{?` gives the brace back, and a brace is no reference: no match at this `$`.
            let len = after.find(|c| !is_ref(c)).unwrap_or(after.len());
            (&after[..len], &after[len..])
        };
        if group.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        let tail = tail.strip_prefix('}').unwrap_or(tail);
        if let Ok(n) = group.parse::<usize>()
            && (1..=stars).contains(&n)
        {
            out.push_str(captures.get(n - 1).copied().unwrap_or(""));
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// Regex rules: Go's regexp

/// Go's `Regexp.ExpandString`: `$$` is `$`; `$name` or `${name}` takes the longest run of
/// letters, digits and `_`; a number (no leading zero) is a group index, anything else a group
/// name; an unknown or unmatched group is empty; a malformed reference leaves the `$`.
fn expand_go(template: &str, re: &Regex, caps: &regex::Captures<'_>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
            continue;
        }
        let Some((name, after)) = go_template_name(rest) else {
            out.push('$');
            continue;
        };
        rest = after;
        let group = match go_group_number(name) {
            Some(n) => caps.get(n),
            None => re
                .capture_names()
                .position(|n| n == Some(name))
                .and_then(|i| caps.get(i)),
        };
        if let Some(g) = group {
            out.push_str(g.as_str());
        }
    }
    out.push_str(rest);
    out
}

/// Go's `extract`: the reference name after a `$`, and the text after it.
fn go_template_name(s: &str) -> Option<(&str, &str)> {
    let (body, brace) = match s.strip_prefix('{') {
        Some(b) => (b, true),
        None => (s, false),
    };
    let len = body
        .find(|c: char| !(c.is_alphabetic() || c.is_numeric() || c == '_'))
        .unwrap_or(body.len());
    if len == 0 {
        return None;
    }
    let (name, after) = body.split_at(len);
    if brace {
        return after.strip_prefix('}').map(|a| (name, a));
    }
    Some((name, after))
}

/// Go's group number: ASCII digits, no leading zero, below 10^8 (else it is a name).
fn go_group_number(name: &str) -> Option<usize> {
    if !name.bytes().all(|b| b.is_ascii_digit()) || (name.len() > 1 && name.starts_with('0')) {
        return None;
    }
    name.parse::<usize>().ok().filter(|&n| n < 100_000_000)
}

/// Rewrites what Go's RE2 syntax means differently from the `regex` crate: Go's `\d`, `\w`,
/// `\s` (and their negations) and `\b`/`\B` are ASCII-only, where the crate's are Unicode; a
/// `[` inside a class is a literal in Go and a nested class in the crate, as are `&&` and
/// `~~`; and Go's `\Q...\E` quotes text. Everything else is passed through, so a pattern Go
/// refuses is mostly refused here too.
fn go_regex_to_rust(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.char_indices().peekable();
    let mut in_class = false;
    // Right after `[` or `[^`, where `]` is a literal.
    let mut class_start = false;
    while let Some((at, c)) = chars.next() {
        let was_start = std::mem::take(&mut class_start);
        match c {
            '\\' => {
                let Some((_, e)) = chars.next() else {
                    out.push('\\');
                    break;
                };
                let replacement = match (e, in_class) {
                    ('d', false) => Some("[0-9]"),
                    ('D', false) => Some("[^0-9]"),
                    ('w', false) => Some("[0-9A-Za-z_]"),
                    ('W', false) => Some("[^0-9A-Za-z_]"),
                    ('s', false) => Some(r"[\t\n\f\r ]"),
                    ('S', false) => Some(r"[^\t\n\f\r ]"),
                    ('b', false) => Some(r"(?-u:\b)"),
                    ('B', false) => Some(r"(?-u:\B)"),
                    ('d', true) => Some("0-9"),
                    ('w', true) => Some("0-9A-Za-z_"),
                    ('s', true) => Some(r"\t\n\f\r "),
                    ('D', true) => Some("[^0-9]"),
                    ('W', true) => Some("[^0-9A-Za-z_]"),
                    ('S', true) => Some(r"[^\t\n\f\r ]"),
                    _ => None,
                };
                if let Some(r) = replacement {
                    out.push_str(r);
                } else if e == 'Q' && !in_class {
                    let from = at + 2;
                    let quoted = match pattern[from..].find(r"\E") {
                        Some(len) => &pattern[from..from + len],
                        None => &pattern[from..],
                    };
                    out.push_str(&regex::escape(quoted));
                    // Skip the quoted text and the `\E`.
                    let end = from + quoted.len() + 2;
                    while chars.peek().is_some_and(|&(i, _)| i < end) {
                        chars.next();
                    }
                } else {
                    out.push('\\');
                    out.push(e);
                }
            }
            '[' if !in_class => {
                out.push('[');
                in_class = true;
                class_start = true;
                if let Some((_, '^')) = chars.peek() {
                    chars.next();
                    out.push('^');
                }
            }
            '[' => {
                // A POSIX class such as `[:alpha:]` is the only `[` that means something.
                let rest = &pattern[at..];
                match rest.strip_prefix("[:").and_then(|r| r.find(":]")) {
                    Some(len) => {
                        let end = at + 2 + len + 2;
                        out.push_str(&pattern[at..end]);
                        while chars.peek().is_some_and(|&(i, _)| i < end) {
                            chars.next();
                        }
                    }
                    None => out.push_str(r"\["),
                }
            }
            ']' if in_class && was_start => out.push_str(r"\]"),
            ']' if in_class => {
                out.push(']');
                in_class = false;
            }
            '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Upstream's `EscapeMetricName`: `_` before a leading digit, and `_` for each character outside
/// `[A-Za-z0-9_]`, except that a `-` right after a `-` is dropped, so a run of dashes becomes
/// one `_` (`with---dashes` → `with_dashes`).
pub fn escape_metric_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        out.push('_');
    }
    let mut prev = None;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && prev == Some('-')) {
            out.push('_');
        }
        prev = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const EG_FIXTURE: &str =
        include_str!("../tests/fixtures/statsd/envoy_gateway_statsd_conf.yaml");
    const DEFAULT_FIXTURE: &str = include_str!("../tests/fixtures/statsd/default_mapper.yaml");

    fn metric(name: &str, labels: &[(&str, &str)]) -> Mapped {
        metric_with(name, labels, None, None)
    }

    fn metric_with(
        name: &str,
        labels: &[(&str, &str)],
        scale: Option<f64>,
        observer_type: Option<&str>,
    ) -> Mapped {
        Mapped::Metric {
            name: name.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            scale,
            observer_type: observer_type.map(str::to_owned),
        }
    }

    fn unmapped(name: &str) -> Mapped {
        Mapped::Unmapped {
            name: name.to_owned(),
        }
    }

    fn load(text: &str) -> Mapper {
        match Mapper::from_yaml(text) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    fn refused(text: &str) -> MapperError {
        match Mapper::from_yaml(text) {
            Ok(_) => panic!("loaded: {text}"),
            Err(e) => e,
        }
    }

    fn problem(text: &str) -> (usize, MappingProblem) {
        match refused(text) {
            MapperError::Mapping { index, problem, .. } => (index, problem),
            e => panic!("not a mapping error: {e}"),
        }
    }

    /// The names of the facts file's worked examples, through a mapper that should treat them
    /// like envoyproxy/ratelimit's default.
    fn check_ratelimit_names(m: &Mapper) {
        use MetricKind::*;
        let hist = Some("histogram");
        assert_eq!(
            m.map("ratelimit.service.rate_limit.d.a.total_hits", Counter),
            metric_with(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "d"), ("key1", "a")],
                None,
                hist
            )
        );
        for stat in [
            "near_limit",
            "over_limit",
            "total_hits",
            "within_limit",
            "shadow_mode",
        ] {
            assert_eq!(
                m.map(
                    &format!("ratelimit.service.rate_limit.d.a_v.b.{stat}"),
                    Counter
                ),
                metric_with(
                    &format!("ratelimit_service_rate_limit_{stat}"),
                    &[("domain", "d"), ("key1", "a_v"), ("key2", "b")],
                    None,
                    hist
                )
            );
        }
        // Deeper levels are dropped: only key1 and key2 remain.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.k1_v1.k2_v2.k3_v3.total_hits",
                Counter
            ),
            metric_with(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "d"), ("key1", "k1_v1"), ("key2", "k2_v2")],
                None,
                hist
            )
        );
        // A dotted value adds a component: `a_v1.2` is key1 `a_v1`, key2 `2`.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.a_v1.2.within_limit",
                Counter
            ),
            metric_with(
                "ratelimit_service_rate_limit_within_limit",
                &[("domain", "d"), ("key1", "a_v1"), ("key2", "2")],
                None,
                hist
            )
        );
        // Envoy Gateway's real key, as on its dashboard.
        let key1 = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example_httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example";
        assert_eq!(
            m.map(
                &format!(
                    "ratelimit.service.rate_limit.default/eg/http.{key1}.rule-0-match-0_rule-0-match-0.over_limit"
                ),
                Counter
            ),
            metric_with(
                "ratelimit_service_rate_limit_over_limit",
                &[
                    ("domain", "default/eg/http"),
                    ("key1", key1),
                    ("key2", "rule-0-match-0_rule-0-match-0")
                ],
                None,
                hist
            )
        );
        // The unanchored over_limit regex also takes over_limit_with_local_cache at depth 2.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.a.b.over_limit_with_local_cache",
                Counter
            ),
            metric_with(
                "ratelimit_service_rate_limit_over_limit",
                &[("domain", "d"), ("key1", "a"), ("key2", "b")],
                None,
                hist
            )
        );
        // ...but not at depth 1, where neither glob nor regex fits.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.a.over_limit_with_local_cache",
                Counter
            ),
            unmapped("ratelimit_service_rate_limit_d_a_over_limit_with_local_cache")
        );
        assert_eq!(
            m.map("ratelimit_server.ShouldRateLimit.total_requests", Counter),
            metric(
                "ratelimit_service_total_requests",
                &[("grpc_method", "ShouldRateLimit")]
            )
        );
        // match_metric_type: counter, so a gauge of that name is not mapped.
        assert_eq!(
            m.map("ratelimit_server.ShouldRateLimit.total_requests", Gauge),
            unmapped("ratelimit_server_ShouldRateLimit_total_requests")
        );
        assert_eq!(
            m.map(
                "ratelimit.service.call.should_rate_limit.redis_error",
                Counter
            ),
            metric(
                "ratelimit_service_should_rate_limit_error",
                &[("err_type", "redis_error")]
            )
        );
        assert_eq!(
            m.map("ratelimit.service.config_load_success", Counter),
            metric("ratelimit_service_config_load_success", &[])
        );
        assert_eq!(
            m.map("ratelimit.service.config_load_error", Counter),
            metric("ratelimit_service_config_load_error", &[])
        );
        assert_eq!(
            m.map("ratelimit.service.global_shadow_mode", Counter),
            unmapped("ratelimit_service_global_shadow_mode")
        );
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.default/eg/http.domain_not_found",
                Counter
            ),
            unmapped("ratelimit_service_rate_limit_default_eg_http_domain_not_found")
        );
        assert_eq!(
            m.map("ratelimit.go.heapAlloc", Gauge),
            unmapped("ratelimit_go_heapAlloc")
        );
        // EXTRA_TAGS suffixes stop the globs from matching.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.d.a.total_hits.__env=prod",
                Counter
            ),
            unmapped("ratelimit_service_rate_limit_d_a_total_hits___env_prod")
        );
    }

    #[test]
    fn default_mapper_maps_the_worked_examples() {
        let m = Mapper::ratelimit_default();
        check_ratelimit_names(&m);
        assert_eq!(
            m.map(
                "ratelimit_server.ShouldRateLimit.response_time",
                MetricKind::Observer
            ),
            metric_with(
                "ratelimit_service_response_time_seconds",
                &[("grpc_method", "ShouldRateLimit")],
                Some(0.001),
                Some("histogram")
            )
        );
    }

    #[test]
    fn envoy_gateway_file_maps_the_same_names_without_the_scale() {
        assert_eq!(
            EG_FIXTURE,
            RATELIMIT_DEFAULT_MAPPER_YAML.replacen(RESPONSE_TIME_SCALE_LINE, "", 1)
        );
        for m in [load(EG_FIXTURE), Mapper::ratelimit_default_milliseconds()] {
            check_ratelimit_names(&m);
            assert_eq!(
                m.map(
                    "ratelimit_server.ShouldRateLimit.response_time",
                    MetricKind::Observer
                ),
                metric_with(
                    "ratelimit_service_response_time_seconds",
                    &[("grpc_method", "ShouldRateLimit")],
                    None,
                    Some("histogram")
                )
            );
        }
    }

    #[test]
    fn the_embedded_default_is_the_fixture() {
        assert_eq!(RATELIMIT_DEFAULT_MAPPER_YAML, DEFAULT_FIXTURE);
        check_ratelimit_names(&load(DEFAULT_FIXTURE));
    }

    #[test]
    fn drop_rules_drop() {
        let m = load(
            r#"
mappings:
  - match: "noisy.*"
    name: dropped
    action: drop
  - match: "\\.debug$"
    match_type: regex
    name: dropped
    action: drop
  - match: "noisy.*.x"
    name: kept_$1
"#,
        );
        assert_eq!(m.map("noisy.a", MetricKind::Counter), Mapped::Drop);
        assert_eq!(m.map("x.y.debug", MetricKind::Gauge), Mapped::Drop);
        assert_eq!(
            m.map("noisy.a.x", MetricKind::Counter),
            metric("kept_a", &[])
        );
    }

    #[test]
    fn regex_rules_match_a_substring_in_file_order() {
        let m = load(
            r#"
mappings:
  - match: "b\\.(\\w+)\\.c"
    match_type: regex
    name: "first_${1}"
    labels:
      whole: "$0"
      missing: "$7"
      named: "$word"
  - match: "(?P<word>[a-z]+)"
    match_type: regex
    name: "second"
    labels:
      named: "$word"
      dollar: "$$1"
"#,
        );
        assert_eq!(
            m.map("a.b.xy.c.d", MetricKind::Counter),
            metric(
                "first_xy",
                &[("missing", ""), ("named", ""), ("whole", "b.xy.c")]
            )
        );
        assert_eq!(
            m.map("9.abc.", MetricKind::Counter),
            metric("second", &[("dollar", "$1"), ("named", "abc")])
        );
        // Go's \w is ASCII: the é ends the group, so the first rule does not match.
        assert_eq!(
            m.map("b.xé.c", MetricKind::Counter),
            metric("second", &[("dollar", "$1"), ("named", "b")])
        );
    }

    #[test]
    fn globs_win_over_regexes_and_the_earliest_glob_wins() {
        let m = load(
            r#"
defaults:
  match_type: regex
mappings:
  - match: "a\\.b"
    name: regex_rule
  - match: "a.*"
    match_type: glob
    name: star_$1
  - match: "*.b"
    match_type: glob
    name: later_$1
"#,
        );
        assert_eq!(m.map("a.b", MetricKind::Counter), metric("star_b", &[]));
        assert_eq!(m.map("x.b", MetricKind::Counter), metric("later_x", &[]));
        assert_eq!(
            m.map("zz.a.b.zz", MetricKind::Counter),
            metric("regex_rule", &[])
        );
    }

    #[test]
    fn globs_need_the_same_number_of_parts_and_star_takes_an_empty_part() {
        let m = load(
            "mappings:\n  - match: \"a.*.c\"\n    name: \"n\"\n    labels: {xx: \"$1\", yy: \"${1}z\", ww: \"$1_total\"}\n",
        );
        assert_eq!(
            m.map("a..c", MetricKind::Counter),
            metric("n", &[("ww", ""), ("xx", ""), ("yy", "z")])
        );
        assert_eq!(
            m.map("a.b/c=d.c", MetricKind::Counter),
            metric("n", &[("ww", ""), ("xx", "b/c=d"), ("yy", "b/c=dz")])
        );
        assert_eq!(m.map("a.b.c.d", MetricKind::Counter), unmapped("a_b_c_d"));
        assert_eq!(m.map("a.c", MetricKind::Counter), unmapped("a_c"));
    }

    #[test]
    fn upstream_tree_quirks_are_kept() {
        // `a.b` ends at a state `a.b.c` created: upstream never gives it a result.
        let m = load(
            "mappings:\n  - match: a.b.c\n    name: long\n    match_metric_type: counter\n  - match: a.b\n    name: short\n",
        );
        assert_eq!(m.map("a.b", MetricKind::Counter), unmapped("a_b"));
        assert_eq!(m.map("a.b", MetricKind::Gauge), metric("short", &[]));
        // A repeated pattern keeps the first rule but the position of the last.
        let m = load(
            "mappings:\n  - match: a.*\n    name: first\n  - match: \"*.b\"\n    name: second\n  - match: a.*\n    name: third\n",
        );
        assert_eq!(m.map("a.b", MetricKind::Counter), metric("second", &[]));
        assert_eq!(m.map("a.c", MetricKind::Counter), metric("first", &[]));
        // A part that is literally `*` goes down the exact transition first, which captures
        // nothing, and that path is kept: `$1` is empty.
        let m = load("mappings:\n  - match: a.*.c\n    name: n\n    labels: {part: \"$1\"}\n");
        assert_eq!(
            m.map("a.*.c", MetricKind::Counter),
            metric("n", &[("part", "")])
        );
        assert_eq!(
            m.map("a.b.c", MetricKind::Counter),
            metric("n", &[("part", "b")])
        );
    }

    #[test]
    fn names_are_escaped_like_upstream() {
        for (name, escaped) in [
            ("clean", "clean"),
            ("0starts_with_digit", "_0starts_with_digit"),
            ("with--doubledash", "with_doubledash"),
            ("with---multiple-dashes", "with_multiple_dashes"),
            ("with.dot", "with_dot"),
            ("with😱emoji", "with_emoji"),
            ("with.*.multiple", "with___multiple"),
            ("test.web-server.foo.bar", "test_web_server_foo_bar"),
            ("", ""),
        ] {
            assert_eq!(escape_metric_name(name), escaped, "{name}");
        }
        let m = load(
            "mappings:\n  - match: \"*.x\"\n    name: \"$1_x\"\n  - match: \"*.y\"\n    name: \"${1}_y\"\n",
        );
        // `$1_x` is the reference `1_x`, which is empty: the name is empty, so dropped.
        assert_eq!(m.map("a.x", MetricKind::Counter), Mapped::Drop);
        assert_eq!(m.map("9-a.y", MetricKind::Counter), metric("_9_a_y", &[]));
    }

    #[test]
    fn observer_type_and_scale_are_kept() {
        let m = load(
            r#"
defaults:
  observer_type: summary
  ttl: 10s
  buckets: [1, 2]
mappings:
  - match: a.*
    name: a
    timer_type: histogram
    scale: 2.5
    help: "A's help"
    ttl: 1m
    buckets: [0.1]
  - match: b.*
    name: b
    timer_type: histogram
    observer_type: summary
  - match: c.*
    name: c
    match_metric_type: timer
"#,
        );
        assert_eq!(
            m.map("a.x", MetricKind::Observer),
            metric_with("a", &[], Some(2.5), Some("histogram"))
        );
        assert_eq!(
            m.map("b.x", MetricKind::Observer),
            metric_with("b", &[], None, Some("summary"))
        );
        assert_eq!(
            m.map("c.x", MetricKind::Observer),
            metric_with("c", &[], None, Some("summary"))
        );
        assert_eq!(m.map("c.x", MetricKind::Counter), unmapped("c_x"));
    }

    #[test]
    fn empty_files_are_empty_mappers() {
        for text in ["", "# nothing\n", "mappings:\n", "mappings: []\n"] {
            assert_eq!(load(text).map("a.b", MetricKind::Gauge), unmapped("a_b"));
        }
    }

    #[test]
    fn invalid_mappings_are_refused_by_index() {
        let two = |second: &str| format!("mappings:\n  - match: ok.*\n    name: ok\n{second}");
        let cases = [
            (
                "  - match: \"foo*.bar\"\n    name: x\n",
                MappingProblem::InvalidGlob,
            ),
            (
                "  - match: \"1a.b\"\n    name: x\n",
                MappingProblem::InvalidGlob,
            ),
            (
                "  - match: \"a.b\"\n    name: x\n    labels: {k: v}\n",
                MappingProblem::InvalidLabelName("k".into()),
            ),
            ("  - match: \"a.b\"\n", MappingProblem::MissingName),
            (
                "  - match: \"a.b\"\n    name: \"x.y\"\n",
                MappingProblem::InvalidName("x.y".into()),
            ),
            (
                "  - match: \"a.b\"\n    name: x\n    match_type: fuzzy\n",
                MappingProblem::UnknownMatchType("fuzzy".into()),
            ),
            (
                "  - match: \"a.b\"\n    name: x\n    action: keep\n",
                MappingProblem::UnknownAction("keep".into()),
            ),
            (
                "  - match: \"a.b\"\n    name: x\n    match_metric_type: histo\n",
                MappingProblem::UnknownMetricType("histo".into()),
            ),
            (
                "  - match: \"a.b\"\n    name: x\n    timer_type: bars\n",
                MappingProblem::UnknownObserverType("bars".into()),
            ),
            (
                "  - match: \"a.b\"\n    name: x\n    observer_type: histogram\n    summary_options: {}\n",
                MappingProblem::Conflict("a histogram observer cannot have summary_options"),
            ),
        ];
        for (second, want) in cases {
            assert_eq!(problem(&two(second)), (1, want), "{second}");
        }
        let (index, p) = problem(&two(
            "  - match: \"a(b\"\n    match_type: regex\n    name: x\n",
        ));
        assert_eq!(index, 1);
        assert!(matches!(p, MappingProblem::InvalidRegex(_)), "{p:?}");
        let text = refused(&two("  - match: \"foo*\"\n    name: x\n")).to_string();
        assert!(
            text.contains("mapping 1") && text.contains("\"foo*\""),
            "{text}"
        );
        assert!(text.contains("invalid glob"), "{text}");
    }

    #[test]
    fn yaml_and_defaults_errors() {
        let e = refused("mappings:\n  - match: a.b\n    name: x\n    lables: {}\n");
        assert!(matches!(e, MapperError::Yaml(_)), "{e}");
        assert!(e.to_string().contains("lables"), "{e}");
        let e = refused("mappings: [");
        assert!(matches!(e, MapperError::Yaml(_)), "{e}");
        let e = refused("mappings:\n  - match: a.b\n    name: x\n    scale: lots\n");
        assert!(matches!(e, MapperError::Yaml(_)), "{e}");
        let e = refused("defaults:\n  match_type: fuzzy\n");
        assert!(matches!(e, MapperError::Defaults(_)), "{e}");
        let e = refused("defaults:\n  glob_disable_ordering: true\n");
        assert!(matches!(e, MapperError::Defaults(_)), "{e}");
    }

    #[test]
    fn go_regex_syntax_is_rewritten() {
        assert_eq!(
            go_regex_to_rust(r"a\d[\w-]\s"),
            r"a[0-9][0-9A-Za-z_-][\t\n\f\r ]"
        );
        assert_eq!(go_regex_to_rust(r"[]a[b&&c]"), r"[\]a\[b\&\&c]");
        assert_eq!(go_regex_to_rust(r"[[:alpha:]\D]"), r"[[:alpha:][^0-9]]");
        assert_eq!(go_regex_to_rust(r"\Qa.b\E.c"), r"a\.b.c");
        for p in [r"\bx\B", r"[^\S]", r"\pL\p{Greek}", r"(?i)x"] {
            assert!(Regex::new(&go_regex_to_rust(p)).is_ok(), "{p}");
        }
    }
}
