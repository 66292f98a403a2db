//! Rule configuration: envoyproxy/ratelimit-compatible YAML files with sliding-window extensions.
//!
//! - `read`: YAML as envoyproxy/ratelimit's parser (yaml.v2, YAML 1.1) reads it, every departure
//!   from a strict reading a warning.
//! - `model`: the YAML structures as written by users (unknown keys rejected).
//! - `validate`/`load`: files or a directory into a [`RuleSet`], every error naming file and field.
//! - `tree`: the compiled descriptor-matching tree (a map per level, so cost does not grow with
//!   the number of rules).
//! - `reload`: watching the files and SIGHUP; all-or-nothing swaps of the live [`RuleSet`].
//! - `source`: where rules come from (the files, or a control plane over xDS).
//!
//! The format is envoyproxy/ratelimit's (one file = one `domain`, nested `descriptors` with
//! `key`, `value`, `rate_limit`, `shadow_mode`, `quota_mode`, `detailed_metric`,
//! `value_to_metric`, `share_threshold`), so its files load unchanged. Extensions:
//! - `unit_multiplier: N` in a rate limit: the window is N units (`unit: second`,
//!   `unit_multiplier: 30` is a 30-second window).
//! - `rate_limits: [...]` instead of `rate_limit`: several limits on one descriptor, over limit
//!   when any is. Each needs its own window (the window identifies the counter). Each may carry
//!   its own `name` (distinct within the descriptor): the metrics label and reported name when
//!   that limit decides, and a target of `replaces`, which replaces the whole rule. `replaces`
//!   describes the descriptor and may appear on at most one entry. `unlimited` only exists in a
//!   single `rate_limit`.
//! - `precision: exact` or `precision: DURATION` in a rate limit: the exact sliding log, or buckets of
//!   that width (the window a whole multiple of it, at most [`Precision::MAX_BUCKETS`] of them).
//!   Without it, [`Precision::automatic`] chooses by the limit. `unlimited` takes none.
//! - `*` in a `value` matches any run of characters anywhere (envoyproxy/ratelimit only supports
//!   a trailing `*`, which means the same here).
//!
//! Unknown keys are errors, as in the reference. Stricter than the reference, because a silently
//! ignored line is a limit that does not apply: `replaces` naming no rule of the domain is an
//! error too. Flags on a node without a limit (`shadow_mode`, `quota_mode`, `detailed_metric`)
//! load, with a warning, as the reference accepts them. YAML is read as the
//! reference's parser reads it (YAML 1.1, see `read`), with a warning for each difference from a
//! strict reading.
//!
//! A [`Rule`] holds no counters. Counters are identified by (domain, entries as matched, window)
//! in the store, so a reload that keeps a rule's path and window keeps its counts, and a reload
//! never has to migrate state.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use crate::store::Precision;

mod checksum;
mod error;
pub mod explain;
mod follow;
mod load;
pub mod metrics;
mod model;
mod read;
pub mod reload;
pub mod source;
mod tree;
mod validate;

pub use checksum::Checksum;
pub use error::{ConfigError, ConfigErrors, ConfigWarning};
pub use load::{Checked, MAX_RULE_FILE_BYTES, check_path, load_path, load_sources};
pub use tree::{BucketOrder, DomainRules, MAX_ORDER_VISITS, RuleMatch, RuleSet, TraceStep};

/// The unit of a limit, as in envoyproxy/ratelimit. Month is 30 days, year 365 days.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The length of one unit.
    pub fn duration(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        })
    }

    /// Upper-case name as written in Envoy's protos (`SECOND`, `MINUTE`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// One sliding-window limit: `requests_per_unit` per `unit_multiplier` units.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    pub requests_per_unit: u64,
    pub unit: Unit,
    /// Window length in units (extension; 1 in envoyproxy/ratelimit files).
    pub unit_multiplier: u64,
    /// How its counters remember hits: `precision` in the file, else [`Precision::automatic`].
    pub precision: Precision,
    /// The limit's own `name` (an entry of `rate_limits`, or the single `rate_limit`): its metrics
    /// `rule` label and the name reported when it decides, and a target of `replaces`.
    pub name: Option<String>,
}

impl Limit {
    /// The sliding window's length.
    pub fn window(&self) -> Duration {
        self.unit
            .duration()
            .saturating_mul(self.unit_multiplier.min(u32::MAX as u64) as u32)
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unit_multiplier == 1 {
            write!(f, "{} per {}", self.requests_per_unit, self.unit.as_str())
        } else {
            write!(
                f,
                "{} per {} {}",
                self.requests_per_unit,
                self.unit_multiplier,
                self.unit.as_str()
            )
        }
    }
}

/// A compiled rule: the `rate_limit`/`rate_limits` of one descriptor node and its flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The domain the rule belongs to.
    pub domain: String,
    /// Path in the config, e.g. `remote_address` or `key_value.subkey` (the envoyproxy/ratelimit
    /// stats key without the domain).
    pub path: String,
    /// `rate_limit.name`, or with `rate_limits` the first entry's `name`, if set: the descriptor's
    /// metrics name (see [`Limit::name`] for each limit's own).
    pub name: Option<String>,
    /// The limits; empty when `unlimited`. With several, the descriptor is over limit when any is.
    pub limits: Vec<Limit>,
    pub unlimited: bool,
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's `quota_mode`: over its limit, the descriptor reports `OVER_LIMIT`,
    /// but the request is denied only when no other descriptor lets it through, that is when
    /// every quota descriptor of the request is over (or an ordinary limit is). Its counters never
    /// deny at the store, like a shadow rule's.
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// `value_to_metric` on this rule's node or any node above it: the metrics name then carries
    /// the request's values at the levels that asked for them (see [`RuleMatch::stats_name`]).
    pub value_to_metric: bool,
    /// Names of rules this one replaces for a request that matches both.
    pub replaces: Vec<String>,
    /// Where the rule was defined (file path), for `/rlconfig` and errors.
    pub source: Arc<str>,
    /// Levels from the root to the rule's node: the entries a descriptor needs to reach it
    /// (`check-config` warns about rules deeper than `--max-entries`).
    pub depth: usize,
    /// The node's `metadata`, returned in answers' dynamic metadata (`--response-metadata`).
    pub metadata: Option<Arc<RuleMetadata>>,
}

/// A rule's `metadata`: a map of any JSON values, at most [`MAX_METADATA_BYTES`] as JSON and
/// [`MAX_METADATA_DEPTH`] levels deep.
pub type RuleMetadata = serde_json::Map<String, serde_json::Value>;

/// The longest a rule's `metadata` may be, written as JSON: it is copied into every answer that
/// the rule lets through.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// The deepest a rule's `metadata` may nest (maps and lists).
pub const MAX_METADATA_DEPTH: usize = 16;

impl Rule {
    /// The name used in metrics when no runtime value is involved: `name` if set, else `path`.
    pub fn stats_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.path)
    }

    /// Whether `name` names this rule: its `name` or any of its limits' (what `replaces` matches).
    pub fn is_named(&self, name: &str) -> bool {
        self.name.as_deref() == Some(name)
            || self.limits.iter().any(|l| l.name.as_deref() == Some(name))
    }
}

/// One line for `/rlconfig` and logs: domain, path, limits with windows and representations, flags,
/// source. E.g. `edge user_id.path: 2 per 30 SECOND (window 30s, exact) name=per_user_path
/// [config/slidegate.yaml]`, or `(window 1day, buckets of 24m)` for a bucket counter.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: ", self.domain, self.path)?;
        if self.unlimited {
            f.write_str("unlimited")?;
        }
        for (i, limit) in self.limits.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{limit} (window {}, {}",
                humantime::format_duration(limit.window()),
                limit.precision
            )?;
            match &limit.name {
                Some(name) if self.limits.len() > 1 => write!(f, ", name={name})")?,
                _ => f.write_str(")")?,
            }
        }
        // With several limits, each limit's name is shown with it.
        if let Some(name) = self.name.as_ref().filter(|_| self.limits.len() <= 1) {
            write!(f, " name={name}")?;
        }
        if !self.replaces.is_empty() {
            write!(f, " replaces={}", self.replaces.join(","))?;
        }
        let flags = [
            (self.shadow_mode, " shadow_mode"),
            (self.quota_mode, " quota_mode"),
            (self.detailed_metric, " detailed_metric"),
            (self.value_to_metric, " value_to_metric"),
        ];
        for (set, flag) in flags {
            if set {
                f.write_str(flag)?;
            }
        }
        write!(f, " [{}]", self.source)
    }
}

/// The live rules, swapped atomically on reload: readers get either the old or the new set.
pub type LiveRules = Arc<arc_swap::ArcSwap<RuleSet>>;
