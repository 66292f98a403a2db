//! Shared by the targets: the fixture rules and an in-process limiter on a memory store.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use slidegate::config::{RuleSet, load_sources};
use slidegate::limiter::{DecisionMetrics, LimitError, Options, RateLimiter, RequestLimits};
use slidegate::service::OwnedRequest;
use slidegate::store::{ManualClock, MemoryStore};

const FIXTURE: &str = include_str!("../../tests/fixtures/config/good/matching.yaml");

pub fn rules() -> RuleSet {
    load_sources(&[("matching.yaml".to_string(), FIXTURE.to_string())]).expect("fixture loads")
}

/// One limiter for every input of a run, on a clock that does not move.
pub static LIMITER: LazyLock<RateLimiter> = LazyLock::new(|| {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
    RateLimiter::new(
        Arc::new(ArcSwap::from_pointee(rules())),
        Arc::new(MemoryStore::new(clock)),
        Options::default(),
        Arc::new(DecisionMetrics::default()),
    )
});

/// The request limits the binary applies by default.
pub fn limits() -> RequestLimits {
    RequestLimits::default()
}

/// A decision with one status per descriptor, or a clear INVALID_ARGUMENT; the memory store
/// cannot fail.
pub fn decide(request: &OwnedRequest) {
    match futures::executor::block_on(LIMITER.should_rate_limit(&request.as_request())) {
        Ok(response) => assert_eq!(response.statuses.len(), request.descriptors.len()),
        Err(LimitError::InvalidArgument(message)) => assert!(!message.is_empty()),
        Err(other) => panic!("{other:?}"),
    }
}
