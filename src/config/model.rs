//! The YAML structures as users write them, and how each key is read (see `read`).
//!
//! Every field is optional here: a key may be missing, null, merged in from an alias or given
//! twice, and whether a missing key is an error is for `validate` to say, with the field path.
//! Unknown keys are errors: a misspelled `ratelimit:` must stop the load, not silently drop a
//! limit.
//!
//! Strings are read from any YAML scalar as written (`value: 200` is the string `"200"`), as in
//! envoyproxy/ratelimit, whose Go structs also take scalars as strings.

use serde::de::MapAccess;

use super::read::{Cx, Findings, Record, merge_record};

/// Takes the plain fields `$other` sets (replacing) and merges the record fields; the names of
/// fields set on both sides.
macro_rules! merge_fields {
    ($self:ident, $other:ident; plain: $($plain:ident),*; records: $($record:ident),*) => {{
        let mut both = Vec::new();
        $(
            if $other.$plain.is_some() {
                if $self.$plain.is_some() {
                    both.push(stringify!($plain));
                }
                $self.$plain = $other.$plain;
            }
        )*
        $(
            if $self.$record.is_some() && $other.$record.is_some() {
                both.push(stringify!($record));
            }
            merge_record(&mut $self.$record, $other.$record);
        )*
        both
    }};
}

/// One rule file: one domain.
#[derive(Debug, Default)]
pub(super) struct FileModel {
    pub domain: Option<String>,
    /// Entries that were not maps are `None` (reported while reading), so others keep their index.
    pub descriptors: Option<Vec<Option<DescriptorModel>>>,
}

impl Record for FileModel {
    const EXPECTING: &'static str = "a rule file: a map with `domain` and `descriptors`";
    const FIELDS: &'static [&'static str] = &["domain", "descriptors"];

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        map: &mut A,
        cx: &Cx<'_>,
    ) -> Result<bool, A::Error> {
        match name {
            "domain" => self.domain = cx.text(map)?,
            "descriptors" => self.descriptors = cx.list(map)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn merge(&mut self, other: Self) -> Vec<&'static str> {
        merge_fields!(self, other; plain: domain, descriptors; records:)
    }

    fn check_required(&self, _at: &str, findings: &mut Findings) {
        if self.domain.is_none() && !findings.unreadable.contains("domain") {
            findings.errors.push("missing field `domain`".to_owned());
        }
    }
}

/// One descriptor node.
#[derive(Debug, Default)]
pub(super) struct DescriptorModel {
    pub key: Option<String>,
    pub value: Option<String>,
    pub rate_limit: Option<RateLimitModel>,
    /// Extension: several limits on one descriptor.
    pub rate_limits: Option<Vec<Option<RateLimitModel>>>,
    pub shadow_mode: Option<bool>,
    /// envoyproxy/ratelimit's quota descriptors: over limit, they deny only when every quota
    /// descriptor of the request is (see `Rule::quota_mode`).
    pub quota_mode: Option<bool>,
    pub detailed_metric: Option<bool>,
    pub value_to_metric: Option<bool>,
    pub share_threshold: Option<bool>,
    pub descriptors: Option<Vec<Option<DescriptorModel>>>,
    /// Returned in answers' dynamic metadata (`--response-metadata`), as envoyproxy/ratelimit
    /// returns it with `RESPONSE_DYNAMIC_METADATA`; any YAML value here, checked by `validate`.
    pub metadata: Option<serde_json::Value>,
}

impl Record for DescriptorModel {
    const EXPECTING: &'static str = "a descriptor: a map with `key` and optionally `value`, \
        `rate_limit`, `rate_limits`, `shadow_mode`, `quota_mode`, `detailed_metric`, \
        `value_to_metric`, `share_threshold`, `descriptors`, `metadata`";
    const FIELDS: &'static [&'static str] = &[
        "key",
        "value",
        "rate_limit",
        "rate_limits",
        "shadow_mode",
        "quota_mode",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "descriptors",
        "metadata",
    ];

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        map: &mut A,
        cx: &Cx<'_>,
    ) -> Result<bool, A::Error> {
        match name {
            "key" => self.key = cx.text(map)?,
            "value" => self.value = cx.text(map)?,
            "rate_limit" => {
                let rate_limit = cx.record(map)?;
                merge_record(&mut self.rate_limit, rate_limit);
            }
            "rate_limits" => self.rate_limits = cx.list(map)?,
            "shadow_mode" => self.shadow_mode = cx.flag(map)?,
            "quota_mode" => self.quota_mode = cx.flag(map)?,
            "detailed_metric" => self.detailed_metric = cx.flag(map)?,
            "value_to_metric" => self.value_to_metric = cx.flag(map)?,
            "share_threshold" => self.share_threshold = cx.flag(map)?,
            "descriptors" => self.descriptors = cx.list(map)?,
            "metadata" => self.metadata = Some(map.next_value::<serde_json::Value>()?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn merge(&mut self, other: Self) -> Vec<&'static str> {
        merge_fields!(self, other;
            plain: key, value, rate_limits, shadow_mode, quota_mode, detailed_metric, value_to_metric,
                share_threshold, descriptors, metadata;
            records: rate_limit)
    }

    fn check_required(&self, at: &str, findings: &mut Findings) {
        let key = super::read::child(at, "key");
        if self.key.is_none() && !findings.unreadable.contains(&key) {
            findings.errors.push(format!("{at}: missing field `key`"));
        }
    }
}

/// A `rate_limit` (or one entry of `rate_limits`).
#[derive(Debug, Default)]
pub(super) struct RateLimitModel {
    /// Kept as text so that a bad unit gets a message listing the units.
    pub unit: Option<String>,
    pub requests_per_unit: Option<u64>,
    /// Extension: the window is this many units.
    pub unit_multiplier: Option<u64>,
    pub unlimited: Option<bool>,
    pub name: Option<String>,
    pub replaces: Option<Vec<Option<ReplacesModel>>>,
    /// Extension: `exact` (the sliding log) or a bucket width such as `1m`. Kept as text so that a
    /// bad value gets a message of its own.
    pub precision: Option<String>,
}

impl Record for RateLimitModel {
    const EXPECTING: &'static str =
        "a rate limit: a map with `unit` and `requests_per_unit` (or `unlimited: true`)";
    const FIELDS: &'static [&'static str] = &[
        "unit",
        "requests_per_unit",
        "unit_multiplier",
        "unlimited",
        "name",
        "replaces",
        "precision",
    ];

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        map: &mut A,
        cx: &Cx<'_>,
    ) -> Result<bool, A::Error> {
        match name {
            "unit" => self.unit = cx.text(map)?,
            "requests_per_unit" => self.requests_per_unit = cx.count(map)?,
            "unit_multiplier" => self.unit_multiplier = cx.count(map)?,
            "unlimited" => self.unlimited = cx.flag(map)?,
            "name" => self.name = cx.text(map)?,
            "replaces" => self.replaces = cx.list(map)?,
            "precision" => self.precision = cx.text(map)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn merge(&mut self, other: Self) -> Vec<&'static str> {
        merge_fields!(self, other;
            plain: unit, requests_per_unit, unit_multiplier, unlimited, name, replaces, precision;
            records:)
    }
}

/// One entry of `replaces`.
#[derive(Debug, Default)]
pub(super) struct ReplacesModel {
    pub name: Option<String>,
}

impl Record for ReplacesModel {
    const EXPECTING: &'static str = "a map `{name: ...}`";
    const FIELDS: &'static [&'static str] = &["name"];

    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        map: &mut A,
        cx: &Cx<'_>,
    ) -> Result<bool, A::Error> {
        match name {
            "name" => self.name = cx.text(map)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn merge(&mut self, other: Self) -> Vec<&'static str> {
        merge_fields!(self, other; plain: name; records:)
    }

    fn check_required(&self, at: &str, findings: &mut Findings) {
        let name = super::read::child(at, "name");
        if self.name.is_none() && !findings.unreadable.contains(&name) {
            findings.errors.push(format!("{at}: missing field `name`"));
        }
    }
}
