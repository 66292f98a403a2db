//! Hostile input: what a client (or a broken deploy) can throw at slidegate.
//!
//! - Property tests (proptest, bounded case counts so CI runs them in seconds) of every parser a
//!   client or an operator feeds: the YAML rule loader, the descriptor matcher, the `/json` body
//!   parser, the `/check` header parser, and the limiter behind them. They never panic, and every
//!   rejection is a clear, non-empty message.
//! - Abusive requests to the real binary: thousands of descriptors, huge values, deep entries,
//!   empty keys, bad percent-encoding, oversized gRPC messages and HTTP bodies, huge `hits_addend`.
//! - Key and label injection: descriptor values built to collide with other counters' Redis keys,
//!   and metric label values that would break the exposition format or its cardinality.
//! - Memory: a million client keys through the memory store, then idle.
//! - Secrets: Redis passwords never appear in logs, endpoints, metrics or error messages.
//! - Exhaustion: one client (idle, slow, flooding, half-sending) must not starve the others.
//! - The fuzz targets' corpora (`fuzz/corpus/<target>/`), replayed on stable through the same
//!   entry points libFuzzer runs (`fuzz/entries/`).

mod corpus;
mod exhaustion;
mod keys;
mod parsers;
mod requests;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};

/// Cases per property: enough to find shallow bugs on every CI run, fast in a debug build.
/// `PROPTEST_CASES=N` runs more (a longer fuzzing session).
const CASES: u32 = 256;

pub(super) fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

pub(super) use exhaustion::{
    SHOULD_RATE_LIMIT, closed_within, flood, grpc_request, h2_connection, h2_frame,
    send_as_window_allows,
};

const RULES: &str = r#"
domain: hostile
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 2 }
    descriptors:
      - key: k2
        rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: plain
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: detailed
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 1000 }
  - key: big
    rate_limit: { unit: hour, requests_per_unit: 1000000000, precision: exact }
  - key: window
    rate_limit: { unit: second, requests_per_unit: 1000 }
"#;

struct Rules {
    dir: tempfile::TempDir,
}

impl Rules {
    fn new() -> Rules {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
        Rules { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.to_string(),
        value: value.to_string(),
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    crate::support::request("hostile", descriptors)
}
