//! The `slidegate` binary and its listeners: gRPC and HTTP services, hostile clients (and the
//! attacker `bench/scripts/bench-attacks` runs), Unix sockets, TLS, reloads, traces and the xDS
//! rule source.

#[path = "../support/otlp.rs"]
mod otlp;
// Every binary compiles all of the shared support and uses part of it (the repository checks
// start no Redis, the store tests no slidegate process).
#[allow(dead_code, unused_imports)]
#[path = "../support/mod.rs"]
mod support;

mod age;
mod attack;
mod byte_values;
mod charges;
mod counters;
mod decision_log;
mod eg_translator;
mod empty_rules;
mod endpoints;
mod explain;
mod guarantee;
mod hidden_values;
mod hostile;
mod http_bounds;
mod limited;
mod log_watch;
mod memory_budget;
mod metrics_docs;
mod page;
mod ratelimit_prometheus;
mod reload;
mod repeated_calls;
mod response_metadata;
mod rlqs;
mod rlqs_bounds;
mod service_bench;
mod service_cli;
mod service_fixture;
mod service_grpc;
mod service_http;
mod service_operator;
mod service_redis;
mod service_shutdown;
mod start_log;
mod tls;
mod tls_identity;
mod traces;
mod unix;
mod xds;
