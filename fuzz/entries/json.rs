//! `POST /json`: any body is a request (decided by the limiter) or a 400 message.

use super::common;

pub fn run(data: &[u8]) {
    match slidegate::service::json::parse_request(data, &common::limits()) {
        Ok(request) => common::decide(&request),
        Err(message) => assert!(!message.is_empty()),
    }
}
