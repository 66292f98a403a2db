//! The settings the environment can give, each naming its field of [`Settings`].
//!
//! One table makes the [`Value`] variants, the identifier each one answers to and the field it
//! sets, so that a value cannot name a setting that does not exist (it would not compile), and its
//! identifier, which says whether the user gave that setting ([`crate::settings::Given`]), is the
//! field's name, which clap uses as the flag's id.

use std::path::PathBuf;
use std::time::Duration;

use crate::server::socket::Address;
use crate::server::tls::Listener;
use crate::settings::{LogFormat, Settings};
use crate::telemetry::Protocol;

macro_rules! values {
    ($($variant:ident($ty:ty) => $group:ident.$field:ident,)*) => {
        /// A value for one of slidegate's settings.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Value {
            $($variant($ty),)*
        }

        impl Value {
            /// The setting's identifier: its field's name, the `serve` flag's with `_` for `-`.
            pub fn id(&self) -> &'static str {
                match self {
                    $(Value::$variant(_) => stringify!($field),)*
                }
            }

            /// Sets the field of `settings` this value is for.
            pub(super) fn set(self, settings: &mut Settings) {
                match self {
                    $(Value::$variant(value) => settings.$group.$field = value.into(),)*
                }
            }
        }

        /// Every setting identifier a [`Value`] can have.
        pub const SETTING_IDS: &[&str] = &[$(stringify!($field),)*];
    };
}

values! {
    Config(PathBuf) => rules.config,
    XdsServer(String) => rules.xds_server,
    XdsNodeId(String) => rules.xds_node_id,
    XdsNodeMetadata(Vec<(String, String)>) => rules.xds_node_metadata,
    XdsConnectRetryInterval(Duration) => rules.xds_connect_retry_interval,
    XdsTlsCaFile(PathBuf) => rules.xds_tls_ca_file,
    XdsTlsCertFile(PathBuf) => rules.xds_tls_cert_file,
    XdsTlsKeyFile(PathBuf) => rules.xds_tls_key_file,
    XdsTlsServerName(String) => rules.xds_tls_server_name,
    ForceStartWithoutInitialConfig(bool) => rules.force_start_without_initial_config,
    GrpcAddr(Address) => listen.grpc_addr,
    HttpAddr(Address) => listen.http_addr,
    AdminAddr(Address) => listen.admin_addr,
    TlsCertFile(PathBuf) => listen.tls_cert_file,
    TlsKeyFile(PathBuf) => listen.tls_key_file,
    TlsClientCaFile(PathBuf) => listen.tls_client_ca_file,
    TlsClientSan(Vec<String>) => listen.tls_client_san,
    TlsListeners(Vec<Listener>) => listen.tls_listeners,
    GrpcMaxConnectionAge(Duration) => server.grpc_max_connection_age,
    GrpcMaxConnectionAgeGrace(Duration) => server.grpc_max_connection_age_grace,
    PrometheusAddr(std::net::SocketAddr) => telemetry.prometheus_addr,
    PrometheusPath(String) => telemetry.prometheus_path,
    PrometheusMapperYaml(PathBuf) => telemetry.prometheus_mapper_yaml,
    PrometheusResponseTimeAsMilliseconds(bool) => telemetry.prometheus_response_time_as_milliseconds,
    NearLimitRatio(f32) => telemetry.near_limit_ratio,
    RedisUrl(String) => store.redis_url,
    RedisCluster(Vec<String>) => store.redis_cluster,
    RedisSentinel(Vec<String>) => store.redis_sentinel,
    RedisSentinelMaster(String) => store.redis_sentinel_master,
    RedisSentinelPassword(String) => store.redis_sentinel_password,
    RedisTimeout(Duration) => store.redis_timeout,
    RedisPrefix(String) => store.redis_prefix,
    RedisTlsCaFile(PathBuf) => store.redis_tls_ca_file,
    RedisTlsCertFile(PathBuf) => store.redis_tls_cert_file,
    RedisTlsKeyFile(PathBuf) => store.redis_tls_key_file,
    HealthIgnoresStoreOutage(bool) => store.health_ignores_store_outage,
    ShadowMode(bool) => requests.shadow_mode,
    QuotaMode(bool) => requests.quota_mode,
    ResponseHeaders(bool) => requests.response_headers,
    ResponseMetadata(bool) => requests.response_metadata,
    RecordOverLimit(bool) => requests.record_over_limit,
    LogFormat(LogFormat) => logging.log_format,
    LogLevel(String) => logging.log_level,
    OtlpEndpoint(String) => telemetry.otlp_endpoint,
    OtlpProtocol(Protocol) => telemetry.otlp_protocol,
    OtlpServiceName(String) => telemetry.otlp_service_name,
    OtlpServiceNamespace(String) => telemetry.otlp_service_namespace,
    OtlpServiceInstanceId(String) => telemetry.otlp_service_instance_id,
    TraceSamplingRatio(f64) => telemetry.trace_sampling_ratio,
}
