//! The YAML structures as users write them.
//!
//! Every struct denies unknown fields: a misspelled `ratelimit:` or an envoyproxy/ratelimit feature
//! slidegate does not implement (`quota_mode`) must stop the load, not silently drop a limit.
//! Semantic checks (units, empty keys, duplicates, ...) live in `validate`, so that these types stay
//! a plain picture of the file and serde's errors keep their field paths.
//!
//! Strings are read from any YAML scalar (`value: 200` is the string `"200"`), as in
//! envoyproxy/ratelimit, whose Go structs also take scalars as strings.

use serde::Deserialize;

/// One rule file: one domain.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rule file: a map with `domain` and `descriptors`"
)]
pub(super) struct FileModel {
    pub domain: String,
    /// `Option` so that an empty `descriptors:` (YAML null) is accepted like an empty list.
    #[serde(default)]
    pub descriptors: Option<Vec<DescriptorModel>>,
}

/// One descriptor node.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a descriptor: a map with `key` and optionally `value`, `rate_limit`, `rate_limits`, \
                 `shadow_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`, `descriptors`"
)]
pub(super) struct DescriptorModel {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub rate_limit: Option<RateLimitModel>,
    /// Extension: several limits on one descriptor.
    #[serde(default)]
    pub rate_limits: Option<Vec<RateLimitModel>>,
    #[serde(default)]
    pub shadow_mode: bool,
    #[serde(default)]
    pub detailed_metric: bool,
    #[serde(default)]
    pub value_to_metric: bool,
    #[serde(default)]
    pub share_threshold: bool,
    #[serde(default)]
    pub descriptors: Option<Vec<DescriptorModel>>,
}

/// A `rate_limit` (or one entry of `rate_limits`).
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rate limit: a map with `unit` and `requests_per_unit` (or `unlimited: true`)"
)]
pub(super) struct RateLimitModel {
    /// Kept as text so that a bad unit gets our message listing the units, not serde's.
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    pub requests_per_unit: Option<u64>,
    /// Extension: the window is this many units.
    #[serde(default)]
    pub unit_multiplier: Option<u64>,
    #[serde(default)]
    pub unlimited: bool,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub replaces: Option<Vec<ReplacesModel>>,
    /// Extension: `exact` (the sliding log) or a bucket width such as `1m`. Kept as text so that a
    /// bad value gets our message.
    #[serde(default)]
    pub precision: Option<String>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a map `{name: ...}`")]
pub(super) struct ReplacesModel {
    pub name: String,
}
