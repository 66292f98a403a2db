//! `/check`: any header values (split from the input at newlines: domain, hits, deny status,
//! then descriptors) are a request (decided by the limiter) or a 400 message.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use slidegate::service::check;

use super::common;

pub fn run(data: &[u8]) {
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
    match check::parse(&headers, Some("matching"), &common::limits()) {
        Ok(parsed) => common::decide(&parsed.request),
        Err(message) => assert!(!message.is_empty()),
    }
}
