//! A `redis://` target: no server in between. Every call is a decision of slidegate's own Redis
//! store, run in the generator (one connection per `--connections`, the deny cache off; the calls
//! a thread has in flight share script calls, as in a server), with every descriptor one counter
//! of [`DIRECT_LIMIT`] hits per [`DIRECT_WINDOW`], the rule `bench/scripts/bench` gives the gRPC
//! runs. The same workers, pacing and key space then measure the raw round trip of the script at
//! a given load: the baseline that a gRPC run against slidegate's Redis store is compared with.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use slidegate::store::{
    Counter, CounterKey, Precision, RedisOptions, RedisStore, Store, StoreError,
};

/// Hits per window of every counter of a `redis://` target: the rule `bench/scripts/bench`
/// gives the gRPC runs (and its `redis-benchmark` runs of the script).
pub const DIRECT_LIMIT: u64 = 100;
/// The window of every counter of a `redis://` target.
pub const DIRECT_WINDOW: Duration = Duration::from_secs(1);

/// slidegate's Redis store with one connection, opened now on the current runtime (so that its
/// driver runs here), and no deny cache: every call goes to Redis.
pub async fn direct_store(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
    let options = RedisOptions {
        url: url.to_string(),
        timeout,
        deny_cache: 0,
        connections: 1,
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&options).await?;
    store.ping().await?;
    Ok(store)
}

/// The counters slidegate would decide for `request` under a rule of [`DIRECT_LIMIT`] per
/// [`DIRECT_WINDOW`] on each of its descriptors: the same keys, limits and hits.
pub fn direct_counters(request: &RateLimitRequest) -> Vec<Counter> {
    let hits = u64::from(request.hits_addend.max(1));
    let key_of = |d: &RateLimitDescriptor| {
        let entries = d.entries.iter();
        CounterKey::new(
            &request.domain,
            entries.map(|e| (e.key.as_str(), e.value.as_str())),
            DIRECT_WINDOW,
        )
    };
    request
        .descriptors
        .iter()
        .map(|d| Counter {
            key: key_of(d),
            limit: DIRECT_LIMIT,
            window: DIRECT_WINDOW,
            hits,
            shadow: false,
            precision: Precision::Exact,
            kind: slidegate::store::HitKind::Admitted,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{request_template, set_values};

    /// A `redis://` target decides the counters slidegate would for the same request under the
    /// `bench/scripts/bench` rule: one per descriptor, keyed by the domain and the descriptor's entries.
    #[test]
    fn direct_counters_are_the_servers() {
        let mut request = request_template("bench", "client", 2, 0);
        set_values(&mut request, |position| position as u64 + 7);
        let counters = direct_counters(&request);
        assert_eq!(counters.len(), 2);
        assert_eq!(counters[1].key.as_str(), "{bench:client=1-8}1000");
        assert!(counters.iter().all(|c| c.hits == 1
            && c.limit == DIRECT_LIMIT
            && c.window == DIRECT_WINDOW
            && !c.shadow));
    }
}
