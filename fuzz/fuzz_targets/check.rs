//! `/check`: any header values (split from the input at newlines: domain, hits, deny status, then
//! descriptors) are a request (decided by the limiter) or a 400 message.
#![no_main]

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use slidegate::limiter::RateLimiter;
use slidegate::service::check;

mod common;

static LIMITER: LazyLock<RateLimiter> = LazyLock::new(common::limiter);

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    let names = [
        check::DOMAIN_HEADER,
        check::HITS_HEADER,
        check::DENY_STATUS_HEADER,
    ];
    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
        let name = names.get(i).copied().unwrap_or(check::DESCRIPTOR_HEADER);
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(HeaderName::from_static(name), value);
        }
    }
    match check::parse(&headers, Some("matching")) {
        Ok(parsed) => common::decide(&LIMITER, &parsed.request),
        Err(message) => assert!(!message.is_empty()),
    }
});
