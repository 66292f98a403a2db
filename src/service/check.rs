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
//! stays `+`); whitespace around entries is ignored. Header bytes and decoded bytes are UTF-8
//! (`josé` raw or as `jos%C3%A9`); bytes that are not UTF-8 (`/x%FF`) are taken with U+FFFD in
//! their place, so such values still count (they may share a counter, which is only stricter).
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
use percent_encoding::percent_decode_str;

use super::{OwnedDescriptor, OwnedRequest};
use crate::limiter::RequestLimits;

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
}

/// Decodes the headers within `limits` (descriptors and entries are counted before they are
/// decoded); the error is a message for the client (400).
pub fn parse(
    headers: &HeaderMap,
    default_domain: Option<&str>,
    limits: &RequestLimits,
) -> Result<CheckRequest, String> {
    let domain = match headers.get(DOMAIN_HEADER) {
        Some(value) => text(value).trim().to_string(),
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
    for (i, value) in values.iter().enumerate() {
        let entries = value.as_bytes().split(|b| matches!(b, b',' | b'&'));
        let pieces = entries.filter(|p| !p.trim_ascii().is_empty()).count();
        limits.check_entries(i, pieces).map_err(|e| e.to_string())?;
        let value = text(value);
        descriptors
            .push(descriptor(&value).map_err(|e| format!("{DESCRIPTOR_HEADER} #{}: {e}", i + 1))?);
    }
    let hits_addend = match headers.get(HITS_HEADER) {
        None => 1,
        Some(value) => text(value)
            .trim()
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
        Some(value) => match text(value).trim() {
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
    })
}

/// A header's text: UTF-8, with U+FFFD for bytes that are not.
fn text(value: &axum::http::HeaderValue) -> Cow<'_, str> {
    String::from_utf8_lossy(value.as_bytes())
}

/// One descriptor header: `k1=v1,k2=v2` or `k1=v1&k2=v2`.
fn descriptor(value: &str) -> Result<OwnedDescriptor, String> {
    let mut entries = Vec::new();
    for (j, piece) in value.split([',', '&']).enumerate() {
        let piece = piece.trim();
        if piece.is_empty() {
            continue;
        }
        let (key, value) = piece
            .split_once('=')
            .ok_or_else(|| format!("entry {} ({piece:?}) is not key=value", j + 1))?;
        entries.push((decode(key.trim())?, decode(value.trim())?));
    }
    Ok(OwnedDescriptor {
        entries,
        ..OwnedDescriptor::default()
    })
}

/// Strict percent-decoding: every `%` must start a two-digit hex escape. Decoded bytes that are
/// not UTF-8 become U+FFFD.
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    for (i, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'%') {
        let escape = bytes.get(i + 1..i + 3);
        if !escape.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            return Err(format!("invalid percent-encoding in {text:?}"));
        }
    }
    Ok(percent_decode_str(text).decode_utf8_lossy().into_owned())
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

    #[test]
    fn takes_utf8_and_marks_other_bytes() {
        let mut h = headers(&[(DOMAIN_HEADER, "edge")]);
        for raw in [
            &b"user_id=jos\xc3\xa9"[..],
            b"path=/caf%C3%A9",
            b"path=/x%FF",
            b"path=/y\xff",
        ] {
            match HeaderValue::from_bytes(raw) {
                Ok(v) => h.append(DESCRIPTOR_HEADER, v),
                Err(e) => panic!("{e}"),
            };
        }
        let r = parse(&h, None, &limits())
            .unwrap_or_else(|e| panic!("{e}"))
            .request;
        let values: Vec<&str> = r
            .descriptors
            .iter()
            .map(|d| d.entries[0].1.as_str())
            .collect();
        assert_eq!(
            values,
            ["jos\u{e9}", "/caf\u{e9}", "/x\u{fffd}", "/y\u{fffd}"]
        );
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
