//! The effective settings, logged once at start.

use super::{DEFAULT_CONFIG, LOG_TARGET, Settings};

impl Settings {
    /// Logs the settings in force (passwords redacted), one line, before anything starts: what a
    /// reader of the log needs to tell how this process was configured.
    pub fn log_effective(&self) {
        let (rules, listen, store) = (&self.rules, &self.listen, &self.store);
        let (requests, server, telemetry) = (&self.requests, &self.server, &self.telemetry);
        let (redis_url, redis_cluster, redis_sentinel) = store.redacted();
        let config = rules.config.as_deref();
        // Plain text, no Rust debug forms: `tls=grpc,http` or `off`, durations as `50ms`.
        let tls = match listen.tls_cert_file {
            Some(_) => (listen.tls_listeners.iter().map(|l| l.as_str()))
                .collect::<Vec<_>>()
                .join(","),
            None => "off".to_owned(),
        };
        let human = |d: std::time::Duration| humantime::format_duration(d).to_string();
        tracing::info!(
            target: LOG_TARGET,
            version = env!("CARGO_PKG_VERSION"),
            config = %config.unwrap_or(std::path::Path::new(DEFAULT_CONFIG)).display(),
            xds_server = rules.xds_server.as_deref().unwrap_or("-"),
            xds_node_id = %rules.xds_node_id,
            grpc_addr = %listen.grpc_addr,
            http_addr = %listen.http_addr,
            admin_addr = %listen.admin_addr,
            tls = %tls,
            mtls = listen.tls_client_ca_file.is_some(),
            store = store.kind(),
            redis_url = redis_url.as_deref().unwrap_or("-"),
            redis_cluster = %redis_cluster,
            redis_sentinel = %redis_sentinel,
            redis_sentinel_master = store.redis_sentinel_master.as_deref().unwrap_or("-"),
            redis_timeout = %human(store.redis_timeout),
            redis_prefix = %store.redis_prefix,
            failure_mode = %requests.failure_mode,
            shadow_mode = requests.shadow_mode,
            quota_mode = requests.quota_mode,
            response_headers = requests.response_headers,
            response_metadata = requests.response_metadata,
            check_domain = requests.check_domain.as_deref().unwrap_or("-"),
            max_descriptors = requests.max_descriptors,
            max_entries = requests.max_entries,
            max_value_bytes = requests.max_value_bytes,
            max_hits = requests.max_hits,
            max_body_bytes = requests.max_body_bytes,
            drain_timeout = %human(server.drain_timeout),
            max_connections = server.max_connections,
            max_connections_per_peer = server.max_connections_per_peer,
            handshake_timeout = %human(server.handshake_timeout),
            idle_timeout = %human(server.idle_timeout),
            body_timeout = %human(server.body_timeout),
            keepalive_interval = %human(server.keepalive_interval),
            max_buffered_bytes = server.max_buffered_bytes,
            otlp_endpoint = telemetry.otlp_endpoint.as_deref().unwrap_or("-"),
            trace_sampling_ratio = telemetry.trace_sampling_ratio,
            log_decisions = self.logging.log_decisions.as_str(),
            operator_hide_values = listen.operator_hide_values,
            admin_token = listen.admin_token_file.is_some(),
            "starting slidegate"
        );
    }
}
