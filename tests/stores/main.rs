//! The stores against real Redis (standalone, Cluster, Sentinel) and the memory store: counting,
//! precision, failures, resharding and health.

#[path = "../support/restartable_redis.rs"]
mod restartable_redis;
// Every binary compiles all of the shared support and uses part of it (the repository checks
// start no Redis, the store tests no slidegate process).
#[allow(dead_code, unused_imports)]
#[path = "../support/mod.rs"]
mod support;

mod alone_alike;
mod auth;
mod bucket_cost;
mod buckets_steady;
mod carry;
mod charged_log_bound;
mod charges;
mod clock_steps;
mod concurrency;
mod connections;
mod deny_cache;
mod faults_client_certificate;
mod faults_cluster;
mod faults_fixture;
mod faults_redis_frozen;
mod faults_redis_killed;
mod faults_reload;
mod faults_sigterm;
mod guarantee;
mod interleavings;
mod least_privilege;
mod memory_per_hit;
mod precision;
mod redis_health;
mod reshard;
mod script_health;
mod sentinel;
mod shapes;
mod stale;
mod store;
mod store_mode;
mod store_model;
mod suite_fixture;
mod take_back;
