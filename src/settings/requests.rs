//! What a decision does and what one request may carry.

use clap::builder::BoolishValueParser;

use crate::config::RuleSet;
use crate::limiter::{Options, RequestLimits};
use crate::store::FailureMode;

/// Largest HTTP request body by default (`--max-body-bytes`).
const DEFAULT_MAX_BODY_BYTES: usize =
    crate::server::limits::ServerLimits::DEFAULT_HTTP_MAX_BODY_BYTES;

#[derive(clap::Args, Debug, Clone)]
pub struct RequestSettings {
    /// What to answer when the store fails: `error` (gRPC UNAVAILABLE / HTTP 503, the proxy's
    /// failure policy decides), `allow` (fail open) or `deny` (fail closed).
    #[arg(long, env = "SLIDEGATE_FAILURE_MODE", default_value_t = FailureMode::default())]
    pub failure_mode: FailureMode,
    /// Evaluate and count everything but never deny (try limits on real traffic).
    #[arg(long, env = "SLIDEGATE_SHADOW_MODE", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub shadow_mode: bool,
    /// Make every limited descriptor a quota descriptor, as `quota_mode: true` on every rule
    /// would (envoyproxy/ratelimit's QUOTA_MODE): over its limit a descriptor reports OVER_LIMIT,
    /// but the request is denied only when every one of its limited descriptors is over.
    #[arg(long, env = "SLIDEGATE_QUOTA_MODE", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub quota_mode: bool,
    /// Add IETF RateLimit-Limit/-Remaining/-Reset/-Policy headers (and Retry-After on deny) to
    /// answers; `--response-headers=false` turns them off (and saves about 1 µs of CPU per call
    /// when nothing reads them).
    #[arg(long, env = "SLIDEGATE_RESPONSE_HEADERS", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub response_headers: bool,
    /// Put the decision in every gRPC answer's dynamic metadata, which Envoy's ratelimit filter
    /// keeps under `envoy.filters.http.ratelimit` for the access log
    /// (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:rule)%`) and later filters: the overall
    /// code, the rule that decided with its limit, window, remaining and shadow flag, each
    /// descriptor's, and envoyproxy/ratelimit's fields (domain, entries, the rules' `metadata`).
    #[arg(long, env = "SLIDEGATE_RESPONSE_METADATA", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub response_metadata: bool,
    /// Record every hit, also of a request that is denied and over the limit, as
    /// envoyproxy/ratelimit does with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false. Off: a
    /// request that does not fit records nothing, except a charge (a gRPC descriptor's own
    /// hits_addend, such as Envoy's response costs), which always lands.
    #[arg(long, env = "SLIDEGATE_RECORD_OVER_LIMIT", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub record_over_limit: bool,
    /// Domain of /check requests that send no `x-ratelimit-domain` header.
    #[arg(long, env = "SLIDEGATE_CHECK_DOMAIN")]
    pub check_domain: Option<String>,
    /// Most descriptors one request may carry; more is refused (INVALID_ARGUMENT / 400): only a
    /// proxy's configuration decides how many it sends.
    #[arg(long, env = "SLIDEGATE_MAX_DESCRIPTORS", default_value_t = RequestLimits::default().max_descriptors)]
    pub max_descriptors: usize,
    /// Most entries one descriptor may carry; more is refused, as for --max-descriptors.
    #[arg(long, env = "SLIDEGATE_MAX_ENTRIES", default_value_t = RequestLimits::default().max_entries)]
    pub max_entries: usize,
    /// Longest domain or entry key, in bytes (longer is refused). A longer entry value, which a
    /// client can choose, is not refused: it is counted under its SHA-256 digest.
    #[arg(long, env = "SLIDEGATE_MAX_VALUE_BYTES", default_value_t = RequestLimits::default().max_value_bytes)]
    pub max_value_bytes: usize,
    /// Most hits one request may add to limits kept as exact logs, summed over its counters
    /// (`hits_addend`, `x-ratelimit-hits`; a log checked with 0 hits counts 1). A sliding log
    /// stores every hit, so this bounds the store's work for one request (and for one Redis script
    /// call). Limits kept as buckets (`precision`) take any number of hits, each bucket counter
    /// counting its buckets per window plus one, the most a decision reads of it. A limited
    /// descriptor past it is answered over limit, and the request records nothing.
    #[arg(long, env = "SLIDEGATE_MAX_HITS", default_value_t = RequestLimits::default().max_hits)]
    pub max_hits: u64,
    /// Largest HTTP request body, in bytes (larger: 413).
    #[arg(long, env = "SLIDEGATE_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
}

impl RequestSettings {
    /// The limiter's options.
    pub fn options(&self) -> Options {
        Options {
            failure_mode: self.failure_mode,
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            response_headers: self.response_headers,
            record_over_limit: self.record_over_limit,
            response_metadata: self.response_metadata,
            name_rules: self.response_metadata,
            limits: RequestLimits {
                max_descriptors: self.max_descriptors,
                max_entries: self.max_entries,
                max_value_bytes: self.max_value_bytes,
                max_hits: self.max_hits,
            },
        }
    }
}

/// One message per rule deeper than `max_entries` (`--max-entries`): no request can reach it,
/// since a descriptor with more entries is refused.
pub fn unreachable_rules(rules: &RuleSet, max_entries: usize) -> Vec<String> {
    rules
        .rules()
        .into_iter()
        .filter(|rule| rule.depth > max_entries)
        .map(|rule| {
            format!(
                "{}: rule {} of domain {} is {} levels deep, but a request carries at most \
                 {max_entries} entries per descriptor (--max-entries): it can never match",
                rule.source, rule.path, rule.domain, rule.depth
            )
        })
        .collect()
}
