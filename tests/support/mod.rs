//! Shared test support, one topic per file: real programs (redis-server, ...) started on free
//! ports and killed on drop, the slidegate binary as a process, clients for its listeners, and a
//! certificate authority. Every test binary includes this module; what only one binary needs
//! lives beside its tests.
//!
//! In CI (`CI=true`) a missing program fails the test; on a developer machine the test is skipped
//! with a message, because `scripts/test` installs everything and is the supported way to run tests.

mod certs;
mod grpc;
mod http;
mod metrics;
mod process;
mod programs;
mod redis;
pub mod reshard;
pub mod sentinel;
mod slidegate;
mod sources;

pub use certs::{Ca, CertFiles, Pair};
pub use grpc::{
    RawAnswer, call, descriptor, grpc_frame, raw_call, raw_connection, raw_should_rate_limit,
    request,
};
pub use http::{http_get, http_status, https_get, tls_client_config};
pub use metrics::{metric_sum, metric_value, promtool_check_metrics};
pub use process::{
    KillOnDrop, free_port, on_a_free_port, rss_kib, send_signal, try_spawn_listening, wait_until,
};
pub use programs::{envoy_program, redis_server_program, require_program, run_ok};
pub use redis::{
    RedisCluster, RedisServer, TlsRedisCluster, TlsRedisServer, command_calls, redis_cli,
    redis_server_command, redis_server_major,
};
pub use slidegate::{Slidegate, bench_command, slidegate_command};
pub use sources::source_files;
