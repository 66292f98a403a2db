//! `POST /json`: any body is a request (decided by the limiter) or a 400 message.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use slidegate::limiter::RateLimiter;

mod common;

static LIMITER: LazyLock<RateLimiter> = LazyLock::new(common::limiter);

fuzz_target!(|data: &[u8]| {
    match slidegate::service::json::parse_request(data) {
        Ok(request) => common::decide(&LIMITER, &request),
        Err(message) => assert!(!message.is_empty()),
    }
});
