//! The behaviour suite's fixture (`store`): one store (memory, standalone Redis or Redis Cluster,
//! with or without the deny cache) plus what is needed to look behind it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{PREFIX, cluster_options, redis_options};
use crate::support::{RedisCluster, RedisServer};
use slidegate::store::{Clock, Counter, Decision, ManualClock, MemoryStore, RedisStore, Store};

// ---------------------------------------------------------------------------------------------
// The fixture: one store plus what is needed to look behind it.

pub(crate) enum Backend {
    Memory(Arc<ManualClock>),
    Redis(RedisServer),
    Cluster(RedisCluster),
}

pub(crate) struct Fixture {
    pub(crate) name: &'static str,
    store: Arc<dyn Store>,
    pub(crate) backend: Backend,
    /// The store answers some denials from its local deny cache (other counters then unknown).
    pub(crate) cached: bool,
    started: Instant,
}

impl Fixture {
    pub(crate) fn memory() -> Fixture {
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1_800_000_000)));
        let store = Arc::new(MemoryStore::new(clock.clone()));
        Fixture {
            name: "memory",
            store,
            backend: Backend::Memory(clock),
            cached: false,
            started: Instant::now(),
        }
    }

    pub(crate) async fn redis(deny_cache: bool) -> Option<Fixture> {
        let server = RedisServer::start()?;
        let mut opts = redis_options(server.url());
        if deny_cache {
            opts.deny_cache = 1000;
        }
        let store = RedisStore::connect(&opts).await.expect("connect");
        assert_eq!(store.kind(), "redis");
        store.ping().await.expect("ping");
        assert_eq!(store.deny_cache().is_some(), deny_cache);
        Some(Fixture {
            name: if deny_cache { "redis+cache" } else { "redis" },
            store: Arc::new(store),
            backend: Backend::Redis(server),
            cached: deny_cache,
            started: Instant::now(),
        })
    }

    pub(crate) async fn cluster(deny_cache: bool) -> Option<Fixture> {
        let cluster = RedisCluster::start()?;
        let mut opts = cluster_options(cluster.urls());
        if deny_cache {
            opts.deny_cache = 1000;
        }
        let store = RedisStore::connect(&opts).await.expect("connect");
        assert_eq!(store.kind(), "redis-cluster");
        store.ping().await.expect("ping");
        assert_eq!(store.deny_cache().is_some(), deny_cache);
        Some(Fixture {
            name: if deny_cache {
                "cluster+cache"
            } else {
                "cluster"
            },
            store: Arc::new(store),
            backend: Backend::Cluster(cluster),
            cached: deny_cache,
            started: Instant::now(),
        })
    }

    /// The store's notion of elapsed time: the manual clock, or real time.
    pub(crate) fn now(&self) -> Duration {
        match &self.backend {
            Backend::Memory(clock) => clock.now(),
            _ => self.started.elapsed(),
        }
    }

    pub(crate) async fn sleep(&self, d: Duration) {
        match &self.backend {
            Backend::Memory(clock) => clock.advance(d),
            _ => tokio::time::sleep(d).await,
        }
    }

    pub(crate) async fn decide(&self, counters: &[Counter]) -> Decision {
        let d = self
            .store
            .decide(counters)
            .await
            .unwrap_or_else(|e| panic!("[{}] decide failed: {e}", self.name));
        assert_eq!(d.counters.len(), counters.len());
        d
    }

    /// Decides and returns the time bounds within which the store decided.
    pub(crate) async fn timed(&self, counters: &[Counter]) -> (Decision, Duration, Duration) {
        let before = self.now();
        let d = self.decide(counters).await;
        (d, before, self.now())
    }

    /// `redis-cli` on the node that holds `counter` (the key appended to `args`); `None` for memory.
    pub(crate) fn cli(&self, args: &[&str], counter: &Counter) -> Option<String> {
        self.cli_key(args, &format!("{PREFIX}{}", counter.key.as_str()))
    }

    /// `redis-cli` on the node that holds `key` (appended to `args`); `None` for memory.
    pub(crate) fn cli_key(&self, args: &[&str], key: &str) -> Option<String> {
        let mut all: Vec<&str> = args.to_vec();
        all.push(key);
        match &self.backend {
            Backend::Memory(..) => None,
            Backend::Redis(server) => Some(server.cli(&all)),
            Backend::Cluster(cluster) => Some(cluster.node_for(key).cli(&all)),
        }
    }

    pub(crate) fn real_time(&self) -> bool {
        !matches!(self.backend, Backend::Memory(..))
    }
}

/// `lo <= v <= hi` with a readable message.
#[track_caller]
pub(crate) fn assert_within(what: &str, v: Duration, lo: Duration, hi: Duration) {
    assert!(
        lo <= v && v <= hi,
        "{what}: {v:?} not within [{lo:?}, {hi:?}]"
    );
}
