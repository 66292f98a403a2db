//! What a decision shows, for whoever consumes it besides the transport's answer.
//!
//! The limiter answers with a [`Response`](crate::limiter::Response) and tells an
//! [`Observer`](crate::limiter::Observer) what it saw on the way (the domain, the rules, the store
//! call). Two consumers read that today, both from here, so that neither the limiter nor the
//! transports know them and [`crate::telemetry`] knows nothing of the limiter:
//! - [`span`]: the trace span of a sampled request;
//! - [`metadata`]: the `dynamic_metadata` of a `ShouldRateLimit` answer (`--response-metadata`);
//! - [`log`]: a line per decision (`--log-decisions`).

pub mod log;
pub mod metadata;
pub mod span;

use crate::limiter::Code;

/// A code as Envoy's proto names it, as spans and metadata show it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}
