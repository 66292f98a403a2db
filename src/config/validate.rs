//! From the YAML model to the matching tree, checking everything the reading cannot.
//!
//! Every check reports the field path (`descriptors[0].rate_limit.unit`) and keeps going, so one
//! run of `check-config` shows every problem of a file instead of the first one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use super::model::{DescriptorModel, FileModel, RateLimitModel};
use super::read::Findings;
use super::tree::{DomainRules, Level, Node, Pattern, Slot};
use super::{
    ConfigError, ConfigWarning, Limit, MAX_METADATA_BYTES, MAX_METADATA_DEPTH, Precision, Rule,
    RuleMetadata, Unit,
};

// The longest window accepted is the longest the stores hold; longer ones are certainly typos.
use crate::store::MAX_WINDOW;

/// One file's domain, compiled.
pub(super) struct Compiled {
    pub domain: String,
    pub rules: DomainRules,
    pub list: Vec<Arc<Rule>>,
}

/// What compiling one file gave: its domain unless there were errors, and every error and
/// warning, those found while reading included.
pub(super) struct FileOutcome {
    pub compiled: Option<Compiled>,
    pub errors: Vec<ConfigError>,
    pub warnings: Vec<ConfigWarning>,
}

/// Checks and compiles one file's model. `file` names the file in errors and in `Rule::source`;
/// `findings` are what reading it found.
pub(super) fn compile(file: &Arc<str>, model: FileModel, findings: Findings) -> FileOutcome {
    let mut compiler = Compiler {
        file: file.clone(),
        domain: model.domain.clone().unwrap_or_default(),
        errors: Vec::new(),
        warnings: Vec::new(),
        unreadable: findings.unreadable,
        rules: Vec::new(),
    };
    for message in findings.errors {
        compiler.errors.push(compiler.at_file(message));
    }
    for message in findings.notes {
        let warning = compiler.at_file(message);
        compiler.warnings.push(ConfigWarning {
            file: warning.file,
            message: warning.message,
        });
    }
    if model.domain.as_deref() == Some("") {
        compiler.error(
            "domain",
            "empty domain; every rule file needs a non-empty `domain`",
        );
    }
    let root = compiler.level(model.descriptors.unwrap_or_default(), "", "", false);
    compiler.check_replaces();
    let compiled = compiler.errors.is_empty().then(|| Compiled {
        domain: compiler.domain,
        rules: DomainRules::new(root),
        list: compiler.rules.into_iter().map(|(_, rule)| rule).collect(),
    });
    FileOutcome {
        compiled,
        errors: compiler.errors,
        warnings: compiler.warnings,
    }
}

struct Compiler {
    file: Arc<str>,
    domain: String,
    errors: Vec<ConfigError>,
    warnings: Vec<ConfigWarning>,
    /// Paths whose value could not be read (already reported): no "missing" errors for them.
    unreadable: HashSet<String>,
    /// Each rule with the location of its limit, for the `replaces` check.
    rules: Vec<(String, Arc<Rule>)>,
}

impl Compiler {
    fn at_file(&self, message: String) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            message,
        }
    }

    fn error(&mut self, at: &str, message: impl Display) {
        self.errors.push(self.at_file(format!("{at}: {message}")));
    }

    fn warn(&mut self, at: &str, message: impl Display) {
        self.warnings.push(ConfigWarning {
            file: self.file.to_string(),
            message: format!("{at}: {message}"),
        });
    }

    /// A missing value, unless it was there but unreadable (and so already reported).
    fn missing(&mut self, at: &str, message: impl Display) {
        if !self.unreadable.contains(at) {
            self.error(at, message);
        }
    }

    /// Compiles the descriptors of one level. `at` is the parent's location ("" at the root),
    /// `parent_path` its stats path, `value_to_metric` whether a parent asked for runtime values.
    /// Entries that were not maps are `None`, already reported.
    fn level(
        &mut self,
        descriptors: Vec<Option<DescriptorModel>>,
        at: &str,
        parent_path: &str,
        value_to_metric: bool,
    ) -> Level {
        let mut level = Level::default();
        let mut seen: HashMap<(String, Option<String>), String> = HashMap::new();
        // `key: a_b` and `key: a, value: b` are different nodes with the same path `a_b`, so
        // their metrics would merge; envoyproxy/ratelimit rejects them as one composite key.
        let mut segments: HashMap<String, String> = HashMap::new();
        let mut keys: BTreeMap<String, String> = BTreeMap::new();
        for (i, descriptor) in descriptors.into_iter().enumerate() {
            let Some(descriptor) = descriptor else {
                continue;
            };
            let loc = if at.is_empty() {
                format!("descriptors[{i}]")
            } else {
                format!("{at}.descriptors[{i}]")
            };
            let key = descriptor.key.clone().unwrap_or_default();
            let value = descriptor.value.clone().filter(|v| !v.is_empty());
            keys.entry(key.clone()).or_insert_with(|| loc.clone());
            let identity = (key, value);
            let duplicate_of = seen.get(&identity).cloned();
            let (key, slot, node) = self.descriptor(descriptor, &loc, parent_path, value_to_metric);
            if let Some(first) = duplicate_of {
                self.duplicate(&loc, &identity, &first);
                continue;
            }
            seen.insert(identity.clone(), loc.clone());
            if let Some(first) = segments.insert(node.segment.clone(), loc.clone()) {
                let segment = &node.segment;
                self.error(
                    &loc,
                    format!(
                        "has the same path `{segment}` as {first} (key and value are joined \
                         with `_` in metrics names); rename one of the keys"
                    ),
                );
                continue;
            }
            if level.insert(&key, slot, node).is_err() {
                // Unreachable given `seen`, but a duplicate must never silently replace a node.
                self.duplicate(&loc, &identity, "an earlier descriptor");
            }
        }
        self.joined_keys(&keys);
        level
    }

    /// envoyproxy/ratelimit looks a request entry up as `key_value` joined with `_`: where one
    /// key of a level is another plus `_` and more (`user` and `user_id`), a request entry of the
    /// shorter key can match the longer key's descriptors there (`user` = `id_bob` finds
    /// `user_id` = `bob`). slidegate matches key and value separately; say where the two differ.
    fn joined_keys(&mut self, keys: &BTreeMap<String, String>) {
        let mut found = Vec::new();
        for (short, short_at) in keys {
            let prefix = format!("{short}_");
            for (long, long_at) in keys.range(prefix.clone()..) {
                if !long.starts_with(&prefix) {
                    break;
                }
                let rest = &long[prefix.len()..];
                found.push((
                    long_at.clone(),
                    format!(
                        "key `{long}` is key `{short}` (at {short_at}) plus `_{rest}`: \
                         envoyproxy/ratelimit matches `key_value` joined with `_`, so there a \
                         request entry `{short}` = `{rest}_...` matches this descriptor; slidegate \
                         matches key and value separately and does not"
                    ),
                ));
            }
        }
        for (at, message) in found {
            self.warn(&at, message);
        }
    }

    fn duplicate(&mut self, loc: &str, (key, value): &(String, Option<String>), first: &str) {
        let what = match value {
            Some(value) => format!("key `{key}` with value `{value}`"),
            None => format!("key `{key}` without a value"),
        };
        self.error(
            loc,
            format!("duplicate descriptor: {what} is already defined at {first} on this level"),
        );
    }

    /// Compiles one descriptor node (and its children).
    fn descriptor(
        &mut self,
        descriptor: DescriptorModel,
        loc: &str,
        parent_path: &str,
        parent_value_to_metric: bool,
    ) -> (String, Slot, Node) {
        let DescriptorModel {
            key,
            value,
            rate_limit,
            rate_limits,
            shadow_mode,
            quota_mode,
            detailed_metric,
            value_to_metric,
            share_threshold,
            descriptors,
            metadata,
        } = descriptor;
        let shadow_mode = shadow_mode.unwrap_or(false);
        let quota_mode = quota_mode.unwrap_or(false);
        let detailed_metric = detailed_metric.unwrap_or(false);
        let value_to_metric = value_to_metric.unwrap_or(false);
        let share_threshold = share_threshold.unwrap_or(false);
        // A missing key was reported while reading.
        let key_given = key.is_some();
        let key = key.unwrap_or_default();
        if key_given && key.is_empty() {
            self.error(
                &format!("{loc}.key"),
                "empty key; every descriptor needs a non-empty `key`",
            );
        }
        // An empty value is no value, as in envoyproxy/ratelimit (`key_` would never match).
        let value = value.filter(|v| !v.is_empty());
        if value.is_none() && key.ends_with('*') {
            self.warn(
                &format!("{loc}.key"),
                "`*` in a key is a plain character here; envoyproxy/ratelimit reads a key ending \
                 in `*` without a value as a wildcard over other keys (`key_value` joined)",
            );
        }
        let pattern = value.as_deref().and_then(Pattern::new);
        if share_threshold && pattern.is_none() {
            self.error(
                &format!("{loc}.share_threshold"),
                "only allowed with a wildcard `value` (one containing `*`): it makes every value \
                 the pattern matches share one counter",
            );
        }
        let segment = match &value {
            Some(value) => format!("{key}_{value}"),
            None => key.clone(),
        };
        let path = if parent_path.is_empty() {
            segment.clone()
        } else {
            format!("{parent_path}.{segment}")
        };
        let value_to_metric_on_path = parent_value_to_metric || value_to_metric;
        let rule_flags = RuleFlags {
            shadow_mode,
            quota_mode,
            detailed_metric,
            value_to_metric: value_to_metric_on_path,
        };
        let metadata = metadata.and_then(|m| self.metadata(m, &format!("{loc}.metadata")));
        let limits = (rate_limit, rate_limits);
        let rule = self.rule(limits, metadata, loc, &path, rule_flags);
        let children = self.level(
            descriptors.unwrap_or_default(),
            loc,
            &path,
            value_to_metric_on_path,
        );
        let slot = match (value, pattern) {
            (_, Some(pattern)) => Slot::Wildcard(pattern),
            (Some(value), None) => Slot::Exact(value),
            (None, None) => Slot::KeyOnly,
        };
        let node = Node {
            segment,
            rule,
            value_to_metric,
            share_threshold,
            children,
        };
        (key, slot, node)
    }

    /// Compiles the `rate_limit`/`rate_limits` of a node into a rule, if it has one.
    ///
    /// With `rate_limits`, each entry may have its own `name` (distinct ones); `replaces` belongs
    /// to the descriptor, not to one window, and may be given on at most one entry (any one), so
    /// there is never a question of which wins.
    fn rule(
        &mut self,
        (rate_limit, rate_limits): (Option<RateLimitModel>, Option<Vec<Option<RateLimitModel>>>),
        metadata: Option<RuleMetadata>,
        loc: &str,
        path: &str,
        flags: RuleFlags,
    ) -> Option<Arc<Rule>> {
        let (models, base, several) = match (rate_limit, rate_limits) {
            (Some(_), Some(_)) => {
                self.error(
                    loc,
                    "both `rate_limit` and `rate_limits`; put every limit in `rate_limits`",
                );
                return None;
            }
            (Some(one), None) => (vec![Some(one)], format!("{loc}.rate_limit"), false),
            (None, Some(list)) if list.is_empty() => {
                self.error(
                    &format!("{loc}.rate_limits"),
                    "empty list; give at least one limit or remove `rate_limits`",
                );
                return None;
            }
            (None, Some(list)) => (list, format!("{loc}.rate_limits"), true),
            (None, None) => {
                let unreadable = ["rate_limit", "rate_limits"]
                    .iter()
                    .any(|field| self.unreadable.contains(&format!("{loc}.{field}")));
                if unreadable {
                    return None;
                }
                self.flags_without_limit(loc, flags);
                return None;
            }
        };
        let errors_before = self.errors.len();
        let mut status = RuleStatus::default();
        let mut limits: Vec<(String, Limit)> = Vec::new();
        for (i, model) in models.into_iter().enumerate() {
            let Some(model) = model else {
                continue;
            };
            let at = if several {
                format!("{base}[{i}]")
            } else {
                base.clone()
            };
            self.name_and_replaces(&model, &at, &mut status);
            if model.unlimited == Some(true) {
                self.unlimited(&model, &at, several);
                status.unlimited = true;
            } else if let Some(mut limit) = self.limit(&model, &at) {
                limit.name = model.name.clone().filter(|name| !name.is_empty());
                limits.push((at, limit));
            }
        }
        self.check_windows(&limits);
        if let Some(at) = &status.replaces_at
            && let Some((name, _)) = status
                .names
                .iter()
                .find(|(name, _)| status.replaces.contains(name))
        {
            self.error(
                &format!("{at}.replaces"),
                format!("names this rule itself (`{name}`); a rule cannot replace itself"),
            );
        }
        if self.errors.len() > errors_before {
            return None;
        }
        let rule = Arc::new(Rule {
            domain: self.domain.clone(),
            path: path.to_owned(),
            name: status.names.into_iter().next().map(|(name, _)| name),
            limits: limits.into_iter().map(|(_, limit)| limit).collect(),
            unlimited: status.unlimited,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            detailed_metric: flags.detailed_metric,
            value_to_metric: flags.value_to_metric,
            replaces: status.replaces,
            source: self.file.clone(),
            depth: loc.matches("descriptors[").count(),
            metadata: metadata.map(Arc::new),
        });
        let at = status.replaces_at.unwrap_or(base);
        self.rules.push((at, rule.clone()));
        Some(rule)
    }

    /// A node's `metadata`: a map (or null, for none), bounded in size and depth. On a node
    /// without a limit it acts on nothing, as in envoyproxy/ratelimit, and is accepted.
    fn metadata(&mut self, metadata: serde_json::Value, at: &str) -> Option<RuleMetadata> {
        let map = match metadata {
            serde_json::Value::Null => return None,
            serde_json::Value::Object(map) => map,
            other => {
                self.error(
                    at,
                    format!("expected a map of names to values, got `{other}`"),
                );
                return None;
            }
        };
        match metadata_bounds(&map) {
            Ok(()) => Some(map),
            Err(problem) => {
                self.error(at, problem);
                None
            }
        }
    }

    /// Flags of a node without a limit act on nothing: envoyproxy/ratelimit accepts them (and
    /// Envoy Gateway sets `shadow_mode` on every node of a shadow rule's chain), so they load,
    /// with a warning that `check-config` shows.
    fn flags_without_limit(&mut self, loc: &str, flags: RuleFlags) {
        let set = [
            ("shadow_mode", flags.shadow_mode),
            ("quota_mode", flags.quota_mode),
            ("detailed_metric", flags.detailed_metric),
        ];
        for (field, _) in set.into_iter().filter(|(_, on)| *on) {
            self.warn(
                &format!("{loc}.{field}"),
                "has no effect without `rate_limit` or `rate_limits` on the same descriptor \
                 (it is not inherited by the descriptors below)",
            );
        }
    }

    fn name_and_replaces(&mut self, model: &RateLimitModel, at: &str, status: &mut RuleStatus) {
        if let Some(name) = &model.name {
            if let Some((_, first)) = status.names.iter().find(|(other, _)| other == name) {
                let first = first.clone();
                self.error(
                    &format!("{at}.name"),
                    format!(
                        "`{name}` is already the name of {first}; each limit of a descriptor \
                         needs its own name"
                    ),
                );
            } else if name.is_empty() {
                self.error(
                    &format!("{at}.name"),
                    "empty name; remove it or give a name",
                );
            } else {
                status.names.push((name.clone(), at.to_owned()));
            }
        }
        if let Some(replaces) = &model.replaces {
            if let Some(first) = &status.replaces_at {
                let first = first.clone();
                self.error(
                    &format!("{at}.replaces"),
                    format!("`replaces` is already given at {first}; give it once per descriptor"),
                );
                return;
            }
            for (j, entry) in replaces.iter().enumerate() {
                // A missing name or an entry that is not a map was reported while reading.
                match entry.as_ref().and_then(|entry| entry.name.as_ref()) {
                    Some(name) if name.is_empty() => self.error(
                        &format!("{at}.replaces[{j}].name"),
                        "empty name; `replaces` entries must name a rule",
                    ),
                    Some(name) => status.replaces.push(name.clone()),
                    None => {}
                }
            }
            status.replaces_at = Some(at.to_owned());
        }
    }

    /// `unlimited: true` takes no limit fields: a window or count next to it would be ignored.
    fn unlimited(&mut self, model: &RateLimitModel, at: &str, several: bool) {
        if several {
            self.error(
                &format!("{at}.unlimited"),
                "only allowed in a single `rate_limit`, not in `rate_limits`",
            );
        }
        let conflicting = [
            ("unit", model.unit.is_some()),
            ("requests_per_unit", model.requests_per_unit.is_some()),
            ("unit_multiplier", model.unit_multiplier.is_some()),
            ("precision", model.precision.is_some()),
        ];
        for (field, present) in conflicting {
            if present {
                self.error(
                    &format!("{at}.{field}"),
                    "must not be set with `unlimited: true` (an unlimited rule has no limit)",
                );
            }
        }
    }

    fn limit(&mut self, model: &RateLimitModel, at: &str) -> Option<Limit> {
        let unit = match model.unit.as_deref() {
            None => {
                self.missing(
                    &format!("{at}.unit"),
                    format!("missing `unit` (one of {UNITS}), or set `unlimited: true`"),
                );
                None
            }
            Some(text) => {
                let unit = parse_unit(text);
                if unit.is_none() {
                    self.error(
                        &format!("{at}.unit"),
                        format!("unknown unit {text:?} (expected one of {UNITS})"),
                    );
                }
                unit
            }
        };
        let requests_per_unit = match model.requests_per_unit {
            None => {
                self.missing(
                    &format!("{at}.requests_per_unit"),
                    "missing `requests_per_unit` (use `unlimited: true` for no limit)",
                );
                None
            }
            Some(n) if n > u64::from(u32::MAX) => {
                self.error(
                    &format!("{at}.requests_per_unit"),
                    format!("{n} is too large (at most {}, Envoy's uint32)", u32::MAX),
                );
                None
            }
            Some(n) => Some(n),
        };
        let unit_multiplier = match model.unit_multiplier {
            None => Some(1),
            Some(0) => {
                self.error(
                    &format!("{at}.unit_multiplier"),
                    "must be at least 1 (the window is `unit_multiplier` units)",
                );
                None
            }
            Some(n) => Some(n),
        };
        let mut limit = Limit {
            requests_per_unit: requests_per_unit?,
            unit: unit?,
            unit_multiplier: unit_multiplier?,
            precision: Precision::Exact,
            name: None,
        };
        let too_long = u32::try_from(limit.unit_multiplier)
            .ok()
            .and_then(|n| limit.unit.duration().checked_mul(n))
            .is_none_or(|window| window > MAX_WINDOW);
        if too_long {
            self.error(
                &format!("{at}.unit_multiplier"),
                "the window is longer than 100 years",
            );
            return None;
        }
        limit.precision = match model.precision.as_deref() {
            None => Precision::automatic(limit.requests_per_unit, limit.window()),
            Some(text) => self.precision(text, limit.window(), &format!("{at}.precision"))?,
        };
        Some(limit)
    }

    /// `exact`, or a bucket width that divides the window into at most
    /// [`Precision::MAX_BUCKETS`] whole microsecond buckets.
    fn precision(&mut self, text: &str, window: Duration, at: &str) -> Option<Precision> {
        if text.trim().eq_ignore_ascii_case("exact") {
            return Some(Precision::Exact);
        }
        let problem = match humantime::parse_duration(text.trim()) {
            Err(_) if text.trim().starts_with('-') => {
                "a bucket width must be more than zero".to_owned()
            }
            Err(e) => {
                format!("{text:?} is neither `exact` nor a bucket width such as `1s` or `1m` ({e})")
            }
            Ok(width) if width.is_zero() => "a bucket width must be more than zero".to_owned(),
            Ok(width) if width.subsec_nanos() % 1_000 != 0 => {
                format!("{text:?} is not a whole number of microseconds")
            }
            Ok(width) if !window.as_nanos().is_multiple_of(width.as_nanos()) => format!(
                "{text:?} does not divide the window ({}) into whole buckets",
                humantime::format_duration(window)
            ),
            Ok(width)
                if window.as_nanos() / width.as_nanos() > u128::from(Precision::MAX_BUCKETS) =>
            {
                format!(
                    "{text:?} makes {} buckets of the window ({}); at most {} are allowed",
                    window.as_nanos() / width.as_nanos(),
                    humantime::format_duration(window),
                    Precision::MAX_BUCKETS
                )
            }
            Ok(width) => return Some(Precision::Buckets(width)),
        };
        self.error(at, problem);
        None
    }

    /// The window is part of the counter's identity: two limits of one descriptor with the same
    /// window would count into one counter.
    fn check_windows(&mut self, limits: &[(String, Limit)]) {
        for (i, (at, limit)) in limits.iter().enumerate() {
            if let Some((first, _)) = limits[..i]
                .iter()
                .find(|(_, other)| other.window() == limit.window())
            {
                self.error(
                    at,
                    format!(
                        "same window ({}) as {first}; each limit of a descriptor needs its own \
                         window, because the window identifies the counter",
                        humantime::format_duration(limit.window())
                    ),
                );
            }
        }
    }

    /// Every `replaces` must name a rule of this domain: a typo would otherwise silently leave
    /// both limits in force.
    fn check_replaces(&mut self) {
        let names: HashSet<&str> = self
            .rules
            .iter()
            .flat_map(|(_, rule)| {
                let limits = rule.limits.iter().filter_map(|l| l.name.as_deref());
                rule.name.as_deref().into_iter().chain(limits)
            })
            .collect();
        let mut unknown = Vec::new();
        for (at, rule) in &self.rules {
            for name in &rule.replaces {
                if !names.contains(name.as_str()) {
                    unknown.push((format!("{at}.replaces"), name.clone()));
                }
            }
        }
        for (at, name) in unknown {
            self.error(
                &at,
                format!("names `{name}`, but no rule of this domain has that `name`"),
            );
        }
    }
}

/// The flags of a node that end up on its rule.
#[derive(Clone, Copy)]
struct RuleFlags {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    /// `value_to_metric` on this node or any parent.
    value_to_metric: bool,
}

/// What the entries of one `rate_limit`/`rate_limits` gave so far.
#[derive(Default)]
struct RuleStatus {
    /// The names given so far, each with where.
    names: Vec<(String, String)>,
    replaces: Vec<String>,
    /// Location of the `rate_limit` entry with `replaces`.
    replaces_at: Option<String>,
    unlimited: bool,
}

const UNITS: &str = "second, minute, hour, day, week, month, year";

/// Case-insensitive, like envoyproxy/ratelimit (which upper-cases and looks up the proto enum).
fn parse_unit(text: &str) -> Option<Unit> {
    Unit::ALL
        .into_iter()
        .find(|unit| unit.as_str().eq_ignore_ascii_case(text))
}

/// Why a rule's `metadata` cannot be kept: over [`MAX_METADATA_BYTES`] as JSON or
/// [`MAX_METADATA_DEPTH`] levels deep.
pub(super) fn metadata_bounds(map: &RuleMetadata) -> Result<(), String> {
    let bytes = serde_json::to_vec(map).map_or(usize::MAX, |json| json.len());
    if bytes > MAX_METADATA_BYTES {
        return Err(format!(
            "{bytes} bytes as JSON, more than {MAX_METADATA_BYTES}: it is copied into every \
             answer the rule lets through"
        ));
    }
    if 1 + map.values().map(depth).max().unwrap_or(0) > MAX_METADATA_DEPTH {
        return Err(format!("nested more than {MAX_METADATA_DEPTH} levels deep"));
    }
    Ok(())
}

/// How many maps and lists deep `value` nests (a scalar is 0).
fn depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        serde_json::Value::Array(list) => 1 + list.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}
