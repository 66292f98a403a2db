//! Shared by the fuzz targets: the fixture rules and an in-process limiter on a memory store.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use slidegate::config::{RuleSet, load_sources};
use slidegate::limiter::{LimitError, Options, RateLimiter};
use slidegate::metrics::Metrics;
use slidegate::service::OwnedRequest;
use slidegate::store::{ManualClock, MemoryStore};

const FIXTURE: &str = include_str!("../../tests/fixtures/config/good/matching.yaml");

pub fn rules() -> RuleSet {
    load_sources(&[("matching.yaml".to_string(), FIXTURE.to_string())]).expect("fixture loads")
}

pub fn limiter() -> RateLimiter {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
    RateLimiter::new(
        Arc::new(ArcSwap::from_pointee(rules())),
        Arc::new(MemoryStore::new(clock)),
        Options::default(),
        Arc::new(Metrics::new()),
    )
}

/// A decision or a clear INVALID_ARGUMENT; the memory store cannot fail.
pub fn decide(limiter: &RateLimiter, request: &OwnedRequest) {
    match futures::executor::block_on(limiter.should_rate_limit(&request.as_request())) {
        Ok(response) => assert_eq!(response.statuses.len(), request.descriptors.len()),
        Err(LimitError::InvalidArgument(message)) => assert!(!message.is_empty()),
        Err(other) => panic!("{other:?}"),
    }
}
