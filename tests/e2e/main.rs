//! End to end: the files in `examples/` as shipped, with real Envoy, nginx, Prometheus and Redis.

#[path = "../support/mod.rs"]
mod support;

mod e2e;
