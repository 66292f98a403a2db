//! What the cluster client needs besides redis-rs's defaults: retries that fit a slot migration
//! into the call's deadline, and a node connection that counts the redirections it is answered.
//!
//! # Slot migrations
//! While `redis-cli --cluster reshard` (or any `CLUSTER SETSLOT ... MIGRATING/IMPORTING` and
//! `MIGRATE`) moves a slot, a command on it meets one of three answers, each of which means
//! Redis ran nothing:
//! - `MOVED`: the slot has a new owner. redis-rs sends the command there at once and refreshes
//!   its slot map.
//! - `ASK`: the slot is migrating and none of the command's keys is left on the source. redis-rs
//!   sends `ASKING` and the command to the target at once.
//! - `TRYAGAIN`: a command of several keys while the slot is migrating, when some of them are
//!   missing on the node asked. The script always names two keys per counter (the counter and
//!   its provisional log, which usually does not exist), so on Redis 7.0 **every** script call on
//!   a migrating slot whose counter exists gets `TRYAGAIN`, from the source and from the target,
//!   until the slot's migration ends (`SETSLOT NODE`): a few milliseconds per slot for
//!   `redis-cli`, which moves the keys of one slot at a time.
//!
//! redis-rs retries `TRYAGAIN` after a random wait of at least `min_retry_wait`, 1.28 s by
//! default: far beyond any sensible `--redis-timeout`, so every call that met one failed. Here
//! the wait starts at about 1 ms and doubles (random in `[1 ms, 2^n ms)`, at most a quarter of
//! the timeout), and the retries go on until the call's deadline: the store's own timeout
//! cancels the call, and redis-rs stops retrying a call nobody waits for. Retrying any of the
//! three is safe for exactness, since Redis ran nothing; a retried call is decided on whichever
//! node holds the counter's keys then, atomically as always.
//!
//! # Counting redirections
//! redis-rs follows redirections inside its cluster connection and reports none of them. It
//! builds that connection over a node connection type of the caller's choosing
//! (`ClusterClient::get_async_generic_connection`, public though not in its docs), so
//! [`Observed`] wraps the usual multiplexed connection and counts the `MOVED`, `ASK` and
//! `TRYAGAIN` replies it passes on: [`redirections`]. The counts are process-wide, because
//! redis-rs creates node connections through a function without state.
//!
//! # Each node's state
//! The same wrapper knows its node's address, so it also keeps that node's
//! `slidegate_redis_node_up` series: 1 once it connects or a reply arrives, 0 when connecting
//! fails or the connection drops or times out. The gauges go where [`report_node_state`] last
//! pointed them (process-wide, as the counts): a node that left the cluster keeps its last value.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::Connect;
use ::redis::{
    AsyncConnectionConfig, Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    ServerErrorKind, Value,
};
use futures::FutureExt;
use prometheus::{IntGauge, IntGaugeVec};

/// The cluster connection the store uses: redis-rs's, over [`Observed`] node connections.
pub type ClusterConnection = ::redis::cluster_async::ClusterConnection<Observed>;

/// Retries of one call (redirections and `TRYAGAIN` included): enough that the call's deadline
/// ends them, not their count. Each wait is drawn at random below its cap, so 16 retries could
/// all draw short waits and end within a few hundred milliseconds while a slot of a thousand
/// keys was still migrating: a call under live resharding failed now and then, well inside its
/// deadline.
const RETRIES: u32 = 64;

/// Sets the retry policy described in the module docs for calls bounded by `timeout`.
pub fn retry_policy(builder: ClusterClientBuilder, timeout: Duration) -> ClusterClientBuilder {
    let quarter = u64::try_from((timeout / 4).as_millis()).unwrap_or(u64::MAX);
    builder
        .retries(RETRIES)
        .min_retry_wait(1)
        .max_retry_wait(quarter.max(2))
        // The wait of retry n is drawn from [min, min(max, 1 ms * 2^n)).
        .retry_wait_formula(1, 2)
}

/// Replies that sent a command elsewhere, or asked for it again, counted since the process
/// started (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Redirections {
    pub moved: u64,
    pub ask: u64,
    pub try_again: u64,
}

static MOVED: AtomicU64 = AtomicU64::new(0);
static ASK: AtomicU64 = AtomicU64::new(0);
static TRY_AGAIN: AtomicU64 = AtomicU64::new(0);

/// The redirections every cluster connection of this process was answered so far.
pub fn redirections() -> Redirections {
    Redirections {
        moved: MOVED.load(Ordering::Relaxed),
        ask: ASK.load(Ordering::Relaxed),
        try_again: TRY_AGAIN.load(Ordering::Relaxed),
    }
}

/// Counts `value` if it is a `MOVED`, `ASK` or `TRYAGAIN` reply.
fn observe(value: &Value) {
    let Value::ServerError(error) = value else {
        return;
    };
    let counter = match error.kind() {
        Some(ServerErrorKind::Moved) => &MOVED,
        Some(ServerErrorKind::Ask) => &ASK,
        Some(ServerErrorKind::TryAgain) => &TRY_AGAIN,
        _ => return,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Where node connections keep their state (see the module docs); none until a store sets it.
static NODE_STATE: Mutex<Option<IntGaugeVec>> = Mutex::new(None);

/// Makes node connections opened from now on keep their state in `gauges` (by `node` label).
pub fn report_node_state(gauges: IntGaugeVec) {
    *NODE_STATE.lock().unwrap_or_else(PoisonError::into_inner) = Some(gauges);
}

/// The state gauge of the node at `addr`, if a store asked for them.
fn node_gauge(addr: &str) -> Option<IntGauge> {
    let gauges = NODE_STATE.lock().unwrap_or_else(PoisonError::into_inner);
    gauges.as_ref().map(|g| g.with_label_values(&[addr]))
}

/// Whether `error` means the node could not be reached (rather than it answering an error).
fn unreachable(error: &RedisError) -> bool {
    error.is_timeout() || super::classify::connection_lost(error)
}

/// A connection to one cluster node that counts the redirections it is answered and keeps the
/// node's state gauge.
#[derive(Clone)]
pub struct Observed {
    conn: MultiplexedConnection,
    state: Option<IntGauge>,
}

impl Observed {
    fn seen<T>(&self, result: &Result<T, RedisError>) {
        if let Some(gauge) = &self.state {
            let up = i64::from(!matches!(result, Err(e) if unreachable(e)));
            // Read first: every reply would otherwise write the line all cores read.
            if gauge.get() != up {
                gauge.set(up);
            }
        }
    }
}

impl ConnectionLike for Observed {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        async move {
            let result = self.conn.req_packed_command(cmd).await;
            self.seen(&result);
            let value = result?;
            observe(&value);
            Ok(value)
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        async move {
            let result = self.conn.req_packed_commands(pipeline, offset, count).await;
            self.seen(&result);
            let values = result?;
            values.iter().for_each(observe);
            Ok(values)
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

impl Connect for Observed {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        async move {
            let info = info.into_connection_info()?;
            let state = node_gauge(&info.addr().to_string());
            let result = MultiplexedConnection::connect_with_config(info, config).await;
            if let Some(gauge) = &state {
                gauge.set(i64::from(result.is_ok()));
            }
            result.map(|conn| Observed { conn, state })
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_redirections_and_nothing_else() {
        let before = redirections();
        let reply = |text: &str| {
            ::redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).expect("a reply")
        };
        observe(&reply("MOVED 3999 127.0.0.1:6381"));
        observe(&reply("ASK 3999 127.0.0.1:6381"));
        observe(&reply("ASK 3999 127.0.0.1:6381"));
        observe(&reply(
            "TRYAGAIN Multiple keys request during rehashing of slot",
        ));
        observe(&reply("NOSCRIPT No matching script"));
        observe(&Value::Okay);
        let after = redirections();
        // Other tests may count meanwhile (the counters are process-wide): at least these.
        assert!(after.moved > before.moved, "{after:?}");
        assert!(after.ask >= before.ask + 2, "{after:?}");
        assert!(after.try_again > before.try_again, "{after:?}");
    }
}
