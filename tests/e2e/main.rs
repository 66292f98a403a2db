//! End to end: the files in `examples/` as shipped, with real Envoy, nginx, Prometheus and Redis.

// Every binary compiles all of the shared support and uses part of it (the repository checks
// start no Redis, the store tests no slidegate process).
#[allow(dead_code, unused_imports)]
#[path = "../support/mod.rs"]
mod support;

mod access_log;
mod e2e;
mod fixtures;
mod rlqs;
mod rlqs_demand;
