//! A trace span as the limiter's observer, and ended with the answer.

use std::fmt::Display;
use std::time::Duration;

use super::code_name;
use crate::limiter::{Observer, Response};
use crate::store::{FailureMode, StoreError};
use crate::telemetry::DecisionSpan;

impl Observer for DecisionSpan {
    const WANTS_RULES: bool = true;

    fn domain(&mut self, domain: &str) {
        self.record_domain(domain);
    }

    fn rule(&mut self, label: &str) {
        self.record_rule(label);
    }

    fn store_call(&mut self, elapsed: Duration) {
        self.record_store_call(elapsed);
    }

    fn store_failed(&mut self, error: &StoreError, mode: FailureMode) {
        self.record_store_failure(error.kind(), mode.as_str());
    }
}

/// Ends `span` with the limiter's `result` (an error also when the request did not decode) and
/// the status the transport answered (gRPC code or HTTP status).
pub fn end(span: DecisionSpan, result: Result<&Response, &dyn Display>, status: u16) {
    let decided = result.map(|response| {
        let descriptors = response.statuses.iter().map(|s| code_name(s.code));
        (code_name(response.overall), descriptors)
    });
    span.end(decided, status);
}
