//! The stores against real Redis (standalone, Cluster, Sentinel) and the memory store: counting,
//! precision, failures, resharding and health.

#[path = "../support/restartable_redis.rs"]
mod restartable_redis;
#[path = "../support/mod.rs"]
mod support;

mod faults;
mod precision;
mod redis_health;
mod reshard;
mod sentinel;
mod store;
