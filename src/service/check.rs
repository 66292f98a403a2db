//! `/check`: a rate-limit decision from request headers, for nginx `auth_request` and forward-auth
//! proxies (Traefik `forwardAuth`, Caddy `forward_auth`, ...). Any method; the body is ignored.
//!
//! Request headers:
//!
//! | header | meaning |
//! |---|---|
//! | `x-ratelimit-domain` | the domain; without it, `--check-domain` (else 400) |
//! | `x-ratelimit-descriptor` | one descriptor; repeat the header for several (at least one) |
//! | `x-ratelimit-hits` | hits for every descriptor (default 1; 0 checks without counting) |
//! | `x-ratelimit-deny-status` | `429` (default) or `403`, the status of a deny |
//!
//! A descriptor is a list of `key=value` entries separated by `,` or `&`, in order (the first entry
//! is the top level of the rule tree): `x-ratelimit-descriptor: user_id=alice,path=%2Flogin`. Keys
//! and values are percent-decoded (`%2C` is a literal comma, `%3D` a literal `=`, `%25` a `%`; `+`
//! stays `+`); spaces and tabs around entries are ignored (no other whitespace: `carol` and
//! `carol` followed by U+00A0 are two values). Header bytes and decoded bytes are UTF-8 (`josé`
//! raw or as `jos%C3%A9`); bytes that are not UTF-8 (`/x%FF`, or raw obs-text) are counted under
//! an escape of their own bytes, as over gRPC (`crate::limiter::entry_text`): distinct bytes
//! never share a counter.
//! An entry without `=` or with invalid percent-encoding (`%zz`, `%4`) is a 400: only a proxy
//! that passes text unescaped sends one. Send each descriptor as its own header line: a proxy
//! that folds repeated headers into one comma-separated line would merge them into one
//! descriptor.
//!
//! `x-ratelimit-domain`, `x-ratelimit-hits` and `x-ratelimit-deny-status` are read once: when a
//! request repeats one, the first is used. None of these headers may come from the client: a
//! proxy must set them itself and drop the client's (see docs/nginx.md on forward-auth proxies).
//!
//! Responses:
//!
//! - allowed: `200`, with `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` and
//!   `RateLimit-Policy` headers (unless `--response-headers=false`);
//! - denied: `429` with `Retry-After` and the same headers; with `x-ratelimit-deny-status: 403`,
//!   `403` plus the marker header `x-ratelimit-over: 1` and the same `Retry-After`/`RateLimit-*`
//!   headers. nginx's `auth_request` treats every status but 2xx, 401 and 403 as an error, so
//!   behind nginx ask for 403 and turn it into a 429 where the marker is set:
//!
//! ```nginx
//! location = /_ratelimit {
//!     internal;
//!     proxy_pass http://127.0.0.1:8080/check;
//!     proxy_pass_request_body off;
//!     proxy_set_header Content-Length "";
//!     proxy_set_header x-ratelimit-domain edge;
//!     proxy_set_header x-ratelimit-descriptor "remote_address=$remote_addr";
//!     proxy_set_header x-ratelimit-deny-status 403;
//! }
//! location / {
//!     auth_request /_ratelimit;
//!     auth_request_set $rl_over $upstream_http_x_ratelimit_over;
//!     auth_request_set $rl_retry $upstream_http_retry_after;
//!     error_page 403 = @ratelimited;
//!     proxy_pass http://backend;
//! }
//! location @ratelimited {
//!     if ($rl_over) { add_header Retry-After $rl_retry always; return 429; }
//!     return 403;
//! }
//! ```
//!
//! - bad headers: `400` with a message; store failure under `--failure-mode error`: `503` (nginx
//!   turns it into a 500, and then its own error handling applies).

use std::borrow::Cow;

use axum::http::HeaderMap;
use percent_encoding::percent_decode;

use super::{OwnedDescriptor, OwnedRequest};
use crate::limiter::{RequestLimits, entry_text, entry_text_owned};

pub const DOMAIN_HEADER: &str = "x-ratelimit-domain";
pub const DESCRIPTOR_HEADER: &str = "x-ratelimit-descriptor";
pub const HITS_HEADER: &str = "x-ratelimit-hits";
pub const DENY_STATUS_HEADER: &str = "x-ratelimit-deny-status";
/// Set to `1` on a 403 deny, so a proxy can tell a rate-limit deny from any other 403.
pub const OVER_HEADER: &str = "x-ratelimit-over";

/// The status a deny is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyStatus {
    /// 429 Too Many Requests (the default).
    TooManyRequests,
    /// 403 Forbidden plus `x-ratelimit-over: 1`, for nginx `auth_request`.
    Forbidden,
}

/// A decoded `/check` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckRequest {
    pub request: OwnedRequest,
    pub deny_status: DenyStatus,
    /// Entries whose key or value was escaped (see [`crate::limiter::entry_text`]).
    pub escaped: usize,
}

/// Decodes the headers within `limits` (descriptors and entries are counted before they are
/// decoded); the error is a message for the client (400).
pub fn parse(
    headers: &HeaderMap,
    default_domain: Option<&str>,
    limits: &RequestLimits,
) -> Result<CheckRequest, String> {
    let domain = match headers.get(DOMAIN_HEADER) {
        Some(value) => entry_text(trim(value.as_bytes())).into_owned(),
        None => default_domain
            .ok_or_else(|| {
                format!("no domain: send the {DOMAIN_HEADER} header (or start the server with --check-domain)")
            })?
            .to_string(),
    };
    let values = headers.get_all(DESCRIPTOR_HEADER);
    limits
        .check_descriptors(values.iter().count())
        .map_err(|e| e.to_string())?;
    let mut descriptors = Vec::new();
    let mut escaped = 0;
    for (i, value) in values.iter().enumerate() {
        let pieces = pieces(value.as_bytes()).count();
        limits.check_entries(i, pieces).map_err(|e| e.to_string())?;
        let (descriptor, escapes) = descriptor(value.as_bytes())
            .map_err(|e| format!("{DESCRIPTOR_HEADER} #{}: {e}", i + 1))?;
        descriptors.push(descriptor);
        escaped += escapes;
    }
    let hits_addend = match headers.get(HITS_HEADER) {
        None => 1,
        Some(value) => text(value)
            .parse::<u64>()
            .map_err(|_| format!("{HITS_HEADER} must be a non-negative integer"))?,
    };
    // `x-ratelimit-hits: 0` means "check only" for every descriptor, unlike a request-level 0 in
    // the gRPC protocol (which means 1): set it per descriptor.
    for d in &mut descriptors {
        d.hits_addend = Some(hits_addend);
    }
    let deny_status = match headers.get(DENY_STATUS_HEADER) {
        None => DenyStatus::TooManyRequests,
        Some(value) => match text(value).as_ref() {
            "429" => DenyStatus::TooManyRequests,
            "403" => DenyStatus::Forbidden,
            other => {
                return Err(format!(
                    "{DENY_STATUS_HEADER} must be 429 or 403, not {other:?}"
                ));
            }
        },
    };
    Ok(CheckRequest {
        request: OwnedRequest {
            domain,
            descriptors,
            hits_addend: 1,
        },
        deny_status,
        escaped,
    })
}

/// A header's text without HTTP whitespace around it, for the headers that hold numbers: UTF-8,
/// with U+FFFD for bytes that are not (they cannot make a number anyway).
fn text(value: &axum::http::HeaderValue) -> Cow<'_, str> {
    String::from_utf8_lossy(trim(value.as_bytes()))
}

/// `bytes` without the HTTP whitespace (SP, HTAB) around them: only what HTTP itself ignores,
/// so that no two distinct values become one.
fn trim(bytes: &[u8]) -> &[u8] {
    let http_space = |b: &u8| matches!(b, b' ' | b'\t');
    let start = bytes
        .iter()
        .position(|b| !http_space(b))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !http_space(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end.max(start)]
}

/// The non-empty `,`/`&`-separated entries of a descriptor header, trimmed.
fn pieces(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| matches!(b, b',' | b'&'))
        .map(trim)
        .filter(|piece| !piece.is_empty())
}

/// One descriptor header: `k1=v1,k2=v2` or `k1=v1&k2=v2`, and how many entries were escaped.
fn descriptor(value: &[u8]) -> Result<(OwnedDescriptor, usize), String> {
    let mut entries = Vec::new();
    let mut escaped = 0;
    for (j, piece) in pieces(value).enumerate() {
        let Some(at) = piece.iter().position(|&b| b == b'=') else {
            return Err(format!(
                "entry {} ({:?}) is not key=value",
                j + 1,
                String::from_utf8_lossy(piece)
            ));
        };
        let (key, key_escaped) = entry_text_owned(decode(trim(&piece[..at]))?);
        let (value, value_escaped) = entry_text_owned(decode(trim(&piece[at + 1..]))?);
        escaped += usize::from(key_escaped || value_escaped);
        entries.push((key, value));
    }
    let descriptor = OwnedDescriptor {
        entries,
        ..OwnedDescriptor::default()
    };
    Ok((descriptor, escaped))
}

/// Strict percent-decoding: every `%` must start a two-digit hex escape. The bytes are kept as
/// they are ([`entry_text_owned`] makes them text).
fn decode(text: &[u8]) -> Result<Vec<u8>, String> {
    for (i, _) in text.iter().enumerate().filter(|(_, b)| **b == b'%') {
        let escape = text.get(i + 1..i + 3);
        if !escape.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            return Err(format!(
                "invalid percent-encoding in {:?}",
                String::from_utf8_lossy(text)
            ));
        }
    }
    Ok(percent_decode(text).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            match HeaderValue::from_str(value) {
                Ok(v) => {
                    map.append(*name, v);
                }
                Err(e) => panic!("{e}"),
            }
        }
        map
    }

    fn limits() -> RequestLimits {
        RequestLimits {
            max_descriptors: 4,
            max_entries: 3,
            ..RequestLimits::default()
        }
    }

    #[test]
    fn counts_before_decoding() {
        let descriptor = (DESCRIPTOR_HEADER, "k=v");
        let h = headers(&[
            (DOMAIN_HEADER, "d"),
            descriptor,
            descriptor,
            descriptor,
            descriptor,
            descriptor,
        ]);
        let refused = parse(&h, None, &limits()).map(|c| c.request);
        assert!(refused.is_err_and(|e| e.contains("too many descriptors: 5")));
    }

    #[test]
    fn decodes_descriptors_in_order() {
        let h = headers(&[
            (DOMAIN_HEADER, "edge"),
            (DESCRIPTOR_HEADER, "user_id=alice, path=%2Flogin%2C%3Dx"),
            (DESCRIPTOR_HEADER, "remote_address=10.0.0.1&plan=a+b"),
            (HITS_HEADER, "0"),
            (DENY_STATUS_HEADER, "403"),
        ]);
        let parsed = parse(&h, None, &limits()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.deny_status, DenyStatus::Forbidden);
        let r = parsed.request;
        assert_eq!(r.domain, "edge");
        assert_eq!(
            r.descriptors[0].entries,
            vec![
                ("user_id".into(), "alice".into()),
                ("path".into(), "/login,=x".into())
            ]
        );
        assert_eq!(
            r.descriptors[1].entries,
            vec![
                ("remote_address".into(), "10.0.0.1".into()),
                ("plan".into(), "a+b".into())
            ]
        );
        assert!(r.descriptors.iter().all(|d| d.hits_addend == Some(0)));
    }

    /// The values of each descriptor header's first entry.
    fn first_values(raws: &[&[u8]]) -> (Vec<String>, usize) {
        let mut h = headers(&[(DOMAIN_HEADER, "edge")]);
        for raw in raws {
            match HeaderValue::from_bytes(raw) {
                Ok(v) => h.append(DESCRIPTOR_HEADER, v),
                Err(e) => panic!("{e}"),
            };
        }
        let parsed = parse(&h, None, &RequestLimits::default()).unwrap_or_else(|e| panic!("{e}"));
        let values = parsed
            .request
            .descriptors
            .iter()
            .map(|d| d.entries[0].1.clone())
            .collect();
        (values, parsed.escaped)
    }

    #[test]
    fn takes_utf8_and_escapes_other_bytes() {
        let (values, escaped) = first_values(&[
            b"user_id=jos\xc3\xa9",
            b"path=/caf%C3%A9",
            b"path=/x%FF",
            b"path=/y\xff",
        ]);
        assert_eq!(
            values,
            ["jos\u{e9}", "/caf\u{e9}", "/x\0\\xff", "/y\0\\xff"]
        );
        assert_eq!(escaped, 2);
    }

    #[test]
    fn distinct_bytes_never_share_a_counter() {
        let raws: [&[u8]; 8] = [
            b"user=carol",
            b"user=carol\xc2\xa0",
            b"user=e\xff",
            b"user=e\xfe",
            b"user=f%FF",
            b"user=f%C0",
            b"user=\tcarol ",
            b"user=carol%20",
        ];
        let (values, _) = first_values(&raws);
        let distinct: std::collections::HashSet<&String> = values.iter().collect();
        // Only the one with spaces and tabs around it is `carol` again.
        assert_eq!(values[6], "carol");
        assert_eq!(distinct.len(), raws.len() - 1, "{values:?}");
    }

    #[test]
    fn default_domain_and_errors() {
        let h = headers(&[(DESCRIPTOR_HEADER, "k=v")]);
        assert_eq!(
            parse(&h, Some("dflt"), &limits()).map(|c| c.request.domain),
            Ok("dflt".into())
        );
        assert!(parse(&h, None, &limits()).is_err_and(|e| e.contains("no domain")));
        for (name, value, expected) in [
            (DESCRIPTOR_HEADER, "k=%zz", "invalid percent-encoding"),
            (DESCRIPTOR_HEADER, "k=%4", "invalid percent-encoding"),
            (DESCRIPTOR_HEADER, "novalue", "not key=value"),
            (HITS_HEADER, "-1", "non-negative integer"),
            (DENY_STATUS_HEADER, "500", "must be 429 or 403"),
            (DESCRIPTOR_HEADER, "a=1,b=2,c=3&d=4", "too many entries: 4"),
        ] {
            let h = headers(&[(DOMAIN_HEADER, "d"), (name, value)]);
            match parse(&h, None, &limits()) {
                Err(message) => {
                    assert!(message.contains(expected), "{message:?} lacks {expected:?}")
                }
                Ok(r) => panic!("accepted {r:?}"),
            }
        }
    }
}
