//! Counters reset by an operator (`DELETE /counters`), and every replica hearing of it.
//!
//! Clearing a counter is two `DEL`s (the counter, in whatever form it is, and its provisional log;
//! the same hash tag, so one slot). What makes it hard is the deny cache: a replica that saw the
//! counter full denies it locally until the reset it remembers, without asking Redis. So a clear
//! also `INCR`s a **reset generation** (`prefix + "resets"`), and every replica with a deny cache
//! reads it every [`POLL_EVERY`], off the request path. When it changed, the replica clears its
//! whole deny cache and refuses to remember answers read before (the cache's epoch). A cleared key
//! is therefore admitted by every replica at most `POLL_EVERY` plus one `GET` (within the store's
//! timeout) after the clear: 500 ms is the documented bound.
//!
//! Why polling rather than pub/sub: a subscription is a connection of its own that redis-rs does
//! not follow through Cluster slot moves or Sentinel failovers, and a message missed while it
//! reconnects would leave a cache stale for a whole window; a poll that fails simply tries again.
//! Ten `GET`s a second per replica cost Redis nothing measurable, and the request path pays one
//! atomic load per store call for the epoch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::{Cmd, FromRedisValue};

use super::script::PROVISIONAL_SUFFIX;
use super::{Cluster, Conn, RedisStore};
use crate::store::{CounterKey, StoreError};

/// How often each replica reads the reset generation.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// The generation this replica last read; [`UNREAD`] before the first read.
pub(super) struct Generation(AtomicU64);

const UNREAD: u64 = u64::MAX;

impl Default for Generation {
    fn default() -> Self {
        Generation(AtomicU64::new(UNREAD))
    }
}

impl RedisStore {
    /// The key of the reset generation.
    fn resets_key(&self) -> String {
        format!("{}resets", self.shared.prefix)
    }

    /// Deletes `keys` in every form, bumps the reset generation and clears this replica's deny
    /// cache; whether each key held anything.
    pub(super) async fn clear_keys(&self, keys: &[CounterKey]) -> Result<Vec<bool>, StoreError> {
        let mut cleared = Vec::with_capacity(keys.len());
        for key in keys {
            let key = self.redis_key(key);
            let del = ::redis::cmd("DEL")
                .arg(&key)
                .arg(format!("{key}{PROVISIONAL_SUFFIX}"))
                .clone();
            cleared.push(self.command::<i64>(&del).await? > 0);
        }
        self.command::<i64>(::redis::cmd("INCR").arg(self.resets_key()))
            .await?;
        if let Some(cache) = &self.deny_cache {
            cache.clear();
        }
        Ok(cleared)
    }

    /// Reads the reset generation; clears the deny cache when it moved since the last read.
    async fn follow_resets(&self) {
        let Some(cache) = &self.deny_cache else {
            return;
        };
        let Ok(read) = self
            .command::<Option<u64>>(::redis::cmd("GET").arg(self.resets_key()))
            .await
        else {
            // Redis is not answering: neither are the requests that would use the cache.
            return;
        };
        let now = read.unwrap_or(0);
        let before = self.resets.0.swap(now, Ordering::SeqCst);
        if before != UNREAD && before != now {
            cache.clear();
        }
    }

    /// One command on this thread's connection, under the store's timeout.
    pub(super) async fn command<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, StoreError> {
        let run = async {
            let queried = match &self.conn {
                Conn::Standalone(lanes) => cmd.query_async(&mut lanes.get().conn.clone()).await,
                Conn::Sentinel(lanes) => cmd.query_async(&mut lanes.get().conn.clone()).await,
                Conn::Cluster(cluster) => {
                    let Cluster { client, lanes } = &**cluster;
                    let lane = self.cluster_lane(client, lanes.get()).await?;
                    cmd.query_async(&mut lane.conn.clone()).await
                }
            };
            queried.map_err(|e| self.error(e))
        };
        self.with_timeout(self.shared.timeout, run).await
    }
}

/// Reads the reset generation every [`POLL_EVERY`] until the store is dropped (nothing to do
/// without a deny cache).
pub(super) fn spawn_follower(store: &Arc<RedisStore>) {
    if store.deny_cache.is_none() {
        return;
    }
    let store: Weak<RedisStore> = Arc::downgrade(store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(store) = store.upgrade() else {
                return;
            };
            store.follow_resets().await;
        }
    });
}
