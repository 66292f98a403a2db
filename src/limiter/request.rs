//! The request the transports decode and the bounds it must keep.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::Scratch;
use crate::config::Unit;
use crate::store::StoreError;

/// Bounds on what one request may carry, the same for gRPC, `/json` and `/check`.
///
/// Each bound is answered by who can break it. The proxy's configuration decides how many
/// descriptors and entries a request has, and its domain and keys: a request over those bounds
/// can only come from a misconfigured proxy and is refused (`INVALID_ARGUMENT`, HTTP 400). Values
/// and hits can come from clients (a header, a path, a token count), and a refusal would let them
/// through (Envoy treats an error like an outage and, with `failure_mode_deny: false`, passes the
/// request uncounted). So a long value is counted under its digest, a value that is not UTF-8
/// under its escape ([`entry_text`]), an override with an unknown unit is a limit of 0, and hits
/// over the budget are a deny: no input a client chooses makes a request skip its limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// Longest domain and key (longer: refused); a longer value is counted under its SHA-256
    /// digest instead of its text, so a counter's key stays small and the limit still holds.
    pub max_value_bytes: usize,
    /// What one request may cost the store, summed over its counters as `store::work` counts
    /// it: a log its hits (a check 1), since it keeps every hit (one sorted-set member each in
    /// Redis); a bucket counter its buckets per window plus one, the most a decision reads of it,
    /// whatever its hits (its limit still bounds what is admitted). A limited descriptor past the
    /// budget is `OVER_LIMIT` without being counted, and nothing of the denied request is
    /// recorded.
    pub max_hits: u64,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 32,
            max_value_bytes: 4096,
            max_hits: 4096,
        }
    }
}

impl RequestLimits {
    /// Refuses more than `max_descriptors` (checked while decoding, before the rest is built).
    pub fn check_descriptors(&self, count: usize) -> Result<(), LimitError> {
        if count > self.max_descriptors {
            return Err(LimitError::InvalidArgument(format!(
                "too many descriptors: {count} (at most {} allowed)",
                self.max_descriptors
            )));
        }
        Ok(())
    }

    /// Refuses more than `max_entries` in descriptor `i`.
    pub fn check_entries(&self, i: usize, count: usize) -> Result<(), LimitError> {
        if count > self.max_entries {
            return Err(LimitError::InvalidArgument(format!(
                "descriptors[{i}] has too many entries: {count} (at most {} allowed)",
                self.max_entries
            )));
        }
        Ok(())
    }
}

/// One rate-limit request, borrowed from whatever the transport decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub domain: &'a str,
    pub descriptors: Scratch<Descriptor<'a>>,
    /// Hits for descriptors without their own; 0 means 1.
    pub hits_addend: u64,
    /// A descriptor's own non-zero `hits_addend` is a charge, recorded even where it does not
    /// fit (gRPC: Envoy's response costs, `apply_on_stream_done`). `/check` and `/json` leave it
    /// off: their costs are admitted or refused like any other hits.
    pub costs_are_charges: bool,
}

/// One request descriptor: hierarchical (key, value) entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor<'a> {
    pub entries: Scratch<(&'a str, &'a str)>,
    /// A limit chosen by the client instead of the configured one.
    pub limit: Option<LimitOverride>,
    /// Hits for this descriptor only; `Some(0)` checks without counting.
    pub hits_addend: Option<u64>,
    /// Envoy's `is_negative_hits`: the hits are taken back from the counters (never below zero).
    pub negative_hits: bool,
}

/// Envoy's `RateLimitOverride`. `unit` is `None` when the client sent an unknown unit (`UNKNOWN`,
/// or a number this version does not know): such an override is a limit of 0, so the descriptor
/// is over limit. Envoy reads an override from dynamic metadata, which other filters may build
/// from what a client sent, and a refusal would pass the request uncounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Option<Unit>,
}

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request is malformed (gRPC `INVALID_ARGUMENT`, HTTP 400).
    #[error("{0}")]
    InvalidArgument(String),
    /// The store failed and the failure mode is `error` (gRPC `UNAVAILABLE`, HTTP 503). Shown to
    /// clients without the store's error, which names nodes and internals: that goes to the log
    /// and the metrics.
    #[error("rate-limit store unavailable")]
    Unavailable(StoreError),
}

/// Checks the request against the protocol's rules and the bounds that only a proxy's
/// configuration can break (see [`RequestLimits`]); values and hits are not refused here.
pub fn validate(request: &Request<'_>, limits: &RequestLimits) -> Result<(), LimitError> {
    let invalid = |message: String| Err(LimitError::InvalidArgument(message));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > limits.max_value_bytes {
        return invalid(format!(
            "domain is {} bytes long (at most {} allowed)",
            request.domain.len(),
            limits.max_value_bytes
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    limits.check_descriptors(request.descriptors.len())?;
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return invalid(format!("descriptors[{i}] has no entries"));
        }
        limits.check_entries(i, descriptor.entries.len())?;
        for (j, (key, _)) in descriptor.entries.iter().enumerate() {
            if key.is_empty() {
                return invalid(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                ));
            }
            if key.len() > limits.max_value_bytes {
                return invalid(format!(
                    "descriptors[{i}].entries[{j}].key is {} bytes long (at most {} allowed)",
                    key.len(),
                    limits.max_value_bytes
                ));
            }
        }
    }
    Ok(())
}

/// Marks the digest that stands for a value in a counter key. A value that starts with it is
/// itself counted under its digest, so no value counted as is can name a digest's counter.
pub(super) const DIGEST_MARK: char = '\0';

/// Whether `value` is counted under its own text.
pub(super) fn counted_as_is(value: &str, max_value_bytes: usize) -> bool {
    value.len() <= max_value_bytes && !value.starts_with(DIGEST_MARK)
}

/// The value a counter key holds for `value`: the value itself, or for one longer than
/// `--max-value-bytes` its SHA-256 digest (71 bytes), so a client's long header neither escapes
/// its limit nor makes a counter's key as long as it likes.
pub(super) fn counted_value(value: &str, max_value_bytes: usize) -> Cow<'_, str> {
    if counted_as_is(value, max_value_bytes) {
        return Cow::Borrowed(value);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let mut text = String::with_capacity(8 + 2 * digest.as_ref().len());
    text.push(DIGEST_MARK);
    text.push_str("sha256:");
    for byte in digest.as_ref() {
        // Writing to a String cannot fail.
        let _ = write!(text, "{byte:02x}");
    }
    Cow::Owned(text)
}

/// The text a descriptor's key or value is matched and counted as, from its bytes on the wire.
///
/// Envoy copies header bytes into descriptors unchanged, and a header may carry bytes that are
/// not UTF-8 (obs-text): such a value must still be decided, under a counter of its own, or a
/// client could lift its limit with one byte. Text that is UTF-8 without a NUL stands for
/// itself (borrowed: the common case costs one validation). Anything else becomes its longest
/// such prefix, a NUL ([`DIGEST_MARK`]), then the rest with `\` written `\\` and each byte that
/// is not UTF-8 written `\xNN`. The first NUL of the result marks where the escape starts, and
/// no text that stands for itself holds one, so distinct bytes always give distinct text (and
/// so distinct counters); the prefix is kept so that a wildcard such as `/api/*` still matches
/// `/api/\xff`. A result that starts with the NUL is counted under its digest, like any value
/// starting with [`DIGEST_MARK`].
pub fn entry_text(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.contains(DIGEST_MARK) => Cow::Borrowed(text),
        _ => Cow::Owned(escaped(bytes)),
    }
}

/// [`entry_text`] of bytes already owned: no copy when they stand for themselves. The flag is
/// whether they were escaped.
pub fn entry_text_owned(bytes: Vec<u8>) -> (String, bool) {
    match String::from_utf8(bytes) {
        Ok(text) if !text.contains(DIGEST_MARK) => (text, false),
        Ok(text) => (escaped(text.as_bytes()), true),
        Err(error) => (escaped(error.as_bytes()), true),
    }
}

/// The escaped form of [`entry_text`], for bytes that do not stand for themselves.
fn escaped(bytes: &[u8]) -> String {
    let valid = match std::str::from_utf8(bytes) {
        Ok(text) => text.len(),
        Err(error) => error.valid_up_to(),
    };
    let prefix = bytes[..valid]
        .iter()
        .position(|&b| b == DIGEST_MARK as u8)
        .unwrap_or(valid);
    let mut text = String::with_capacity(bytes.len() + 8);
    // `prefix` ends inside the valid run, at a character boundary (before a NUL or at its end).
    text.push_str(std::str::from_utf8(&bytes[..prefix]).unwrap_or_default());
    text.push(DIGEST_MARK);
    for chunk in bytes[prefix..].utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                text.push('\\');
            }
            text.push(c);
        }
        for byte in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(text, "\\x{byte:02x}");
        }
    }
    text
}
