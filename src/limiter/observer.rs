//! What a decision shows beyond its answer, for whoever traces it.

use std::time::Duration;

use crate::store::{FailureMode, StoreError};

/// What a decision shows beyond its [`Response`](super::Response), for a trace span
/// (`service::decision::span`). Every method does nothing by default; `()` is the observer of an
/// untraced request.
pub trait Observer {
    /// Whether [`Observer::rule`] wants the matched rules (the loop over them is skipped if not).
    const WANTS_RULES: bool = false;

    /// The request's domain, before anything is decided.
    fn domain(&mut self, _domain: &str) {}

    /// A matched rule, by its metrics label (its `name`, or its descriptor path), once per
    /// descriptor that matched one.
    fn rule(&mut self, _label: &str) {}

    /// The store call of the request (one round trip for Redis) took `elapsed`.
    fn store_call(&mut self, _elapsed: Duration) {}

    /// The store call failed, and `mode` answers.
    fn store_failed(&mut self, _error: &StoreError, _mode: FailureMode) {}
}

impl Observer for () {}
