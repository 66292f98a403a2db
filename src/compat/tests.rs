use super::*;
use crate::settings::Settings;

fn run(vars: &[(&str, &str)]) -> Result<Option<Translation>, CompatError> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    translate(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
}

/// The value of setting `id`, written as its flag takes it.
fn value(translation: &Translation, id: &str) -> Option<String> {
    let setting = translation.settings.iter().find(|s| s.id() == id)?;
    let path = |path: &std::path::PathBuf| path.display().to_string();
    let duration = |d: &std::time::Duration| humantime::format_duration(*d).to_string();
    Some(match &setting.value {
        Value::Config(p)
        | Value::XdsTlsCaFile(p)
        | Value::XdsTlsCertFile(p)
        | Value::XdsTlsKeyFile(p)
        | Value::TlsCertFile(p)
        | Value::TlsKeyFile(p)
        | Value::TlsClientCaFile(p)
        | Value::RedisTlsCaFile(p)
        | Value::RedisTlsCertFile(p)
        | Value::RedisTlsKeyFile(p)
        | Value::PrometheusMapperYaml(p) => path(p),
        Value::PrometheusAddr(addr) => addr.to_string(),
        Value::NearLimitRatio(ratio) => ratio.to_string(),
        Value::XdsServer(s)
        | Value::XdsNodeId(s)
        | Value::XdsTlsServerName(s)
        | Value::RedisUrl(s)
        | Value::RedisSentinelMaster(s)
        | Value::RedisSentinelPassword(s)
        | Value::RedisPrefix(s)
        | Value::LogLevel(s)
        | Value::OtlpEndpoint(s)
        | Value::OtlpServiceName(s)
        | Value::OtlpServiceNamespace(s)
        | Value::OtlpServiceInstanceId(s)
        | Value::PrometheusPath(s) => s.clone(),
        Value::TlsClientSan(list) | Value::RedisCluster(list) | Value::RedisSentinel(list) => {
            list.join(",")
        }
        Value::XdsNodeMetadata(pairs) => {
            let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            pairs.join(",")
        }
        Value::XdsConnectRetryInterval(d)
        | Value::RedisTimeout(d)
        | Value::GrpcMaxConnectionAge(d)
        | Value::GrpcMaxConnectionAgeGrace(d) => duration(d),
        Value::ForceStartWithoutInitialConfig(b)
        | Value::ShadowMode(b)
        | Value::QuotaMode(b)
        | Value::ResponseHeaders(b)
        | Value::ResponseMetadata(b)
        | Value::RecordOverLimit(b)
        | Value::HealthIgnoresStoreOutage(b)
        | Value::PrometheusResponseTimeAsMilliseconds(b) => b.to_string(),
        Value::GrpcAddr(a) | Value::HttpAddr(a) | Value::AdminAddr(a) => a.to_string(),
        Value::TlsListeners(listeners) => {
            let names: Vec<&str> = listeners.iter().map(|l| l.as_str()).collect();
            names.join(",")
        }
        Value::LogFormat(format) => format!("{format:?}").to_lowercase(),
        Value::OtlpProtocol(protocol) => format!("{protocol:?}").to_lowercase(),
        Value::TraceSamplingRatio(ratio) => ratio.to_string(),
    })
}

/// The `serve` settings of `args` (after `slidegate`), with `env` as their `SLIDEGATE_*`
/// variables, then filled from envoyproxy/ratelimit's `compat` variables.
fn settings(args: &[&str], compat: &[(&str, &str)]) -> Result<Settings, clap::Error> {
    use clap::Args as _;
    let command = Settings::augment_args(clap::Command::new("serve"));
    let matches =
        command.try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()))?;
    let mut settings = Settings::from_matches(&matches)?;
    if let Some(translation) = run(compat).expect("valid environment") {
        translation.apply(&mut settings)?;
    }
    settings.check()?;
    Ok(settings)
}

fn error_variable(vars: &[(&str, &str)]) -> &'static str {
    run(vars).expect_err("should be refused").variable
}

#[test]
fn off_without_a_distinctive_variable() {
    assert!(run(&[]).unwrap().is_none());
    assert!(
        run(&[("HOST", "myhost"), ("PORT", "80")])
            .unwrap()
            .is_none()
    );
}

#[test]
fn istio_sample() {
    let t = run(&[
        ("LOG_LEVEL", "debug"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis:6379"),
        ("USE_STATSD", "false"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("HOST", "::"),
        ("GRPC_HOST", "::"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "config").as_deref(),
        Some("/data/ratelimit/config")
    );
    assert_eq!(
        value(&t, "redis_url").as_deref(),
        Some("redis://redis:6379")
    );
    assert_eq!(value(&t, "http_addr").as_deref(), Some("[::]:8080"));
    assert_eq!(value(&t, "grpc_addr").as_deref(), Some("[::]:8081"));
    assert_eq!(value(&t, "response_headers").as_deref(), Some("false"));
    assert_eq!(
        value(&t, "log_level").as_deref(),
        Some("warn,slidegate=debug")
    );
    assert_eq!(t.unhonoured, vec![]);
}

/// Envoy Gateway's rate-limit Deployment: rules over xDS with mutual TLS; its runtime
/// directory variables are read and unused, as there.
#[test]
fn envoy_gateway_xds() {
    let t = run(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "xds_server").as_deref(),
        Some("https://envoy-gateway:18001")
    );
    assert_eq!(value(&t, "xds_node_id").as_deref(), Some("envoy-ratelimit"));
    assert_eq!(
        value(&t, "xds_tls_ca_file").as_deref(),
        Some("/certs/ca.crt")
    );
    assert_eq!(
        value(&t, "xds_tls_cert_file").as_deref(),
        Some("/certs/tls.crt")
    );
    assert_eq!(
        value(&t, "xds_tls_key_file").as_deref(),
        Some("/certs/tls.key")
    );
    assert_eq!(
        value(&t, "force_start_without_initial_config").as_deref(),
        Some("true")
    );
    assert_eq!(
        value(&t, "config"),
        None,
        "--config beside --xds-server is refused"
    );
    assert_eq!(t.unhonoured, vec![]);

    let plain = run(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap().unwrap();
    assert_eq!(
        value(&plain, "xds_server").as_deref(),
        Some("http://localhost:18000")
    );
    let no_tls = run(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(value(&no_tls, "xds_tls_ca_file"), None);
    assert_eq!(
        no_tls.unhonoured.first().map(|u| u.variable),
        Some("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
    );
    assert_eq!(
        error_variable(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")]),
        "CONFIG_TYPE"
    );
}

#[test]
fn redis_variants() {
    let t = run(&[
        ("REDIS_URL", "a:1, b:2"),
        ("REDIS_TYPE", "CLUSTER"),
        ("REDIS_TLS", "true"),
        ("REDIS_AUTH", "user:p@ss"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "redis_cluster").as_deref(),
        Some("rediss://user:p%40ss@a:1,rediss://user:p%40ss@b:2")
    );
    let t = run(&[("REDIS_URL", "/run/redis.sock"), ("REDIS_AUTH", "secret")])
        .unwrap()
        .unwrap();
    assert_eq!(
        value(&t, "redis_url").as_deref(),
        Some("redis+unix:///run/redis.sock?pass=secret")
    );
}

#[test]
fn redis_sentinel_maps_master_sentinels_and_both_passwords() {
    let t = run(&[
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster, s1:26379,s2:26379"),
        ("REDIS_AUTH", "p@ss"),
        ("REDIS_SENTINEL_AUTH", "sentinel-secret"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "redis_sentinel_master").as_deref(),
        Some("mymaster")
    );
    assert_eq!(
        value(&t, "redis_sentinel").as_deref(),
        Some("s1:26379,s2:26379")
    );
    assert_eq!(
        value(&t, "redis_url").as_deref(),
        Some("redis://:p%40ss@primary")
    );
    assert_eq!(
        value(&t, "redis_sentinel_password").as_deref(),
        Some("sentinel-secret")
    );
    assert_eq!(value(&t, "redis_cluster"), None);
    assert!(t.unhonoured.is_empty(), "{:?}", t.unhonoured);

    // TLS: to the sentinels and to the primary; no password, no URL needed without TLS.
    let t = run(&[
        ("REDIS_TYPE", "SENTINEL"),
        ("REDIS_URL", "m,s1:1"),
        ("REDIS_TLS", "true"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "redis_sentinel").as_deref(),
        Some("rediss://s1:1")
    );
    assert_eq!(value(&t, "redis_url").as_deref(), Some("rediss://primary"));
    let t = run(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m,s1:1")])
        .unwrap()
        .unwrap();
    assert_eq!(value(&t, "redis_url"), None);

    // A master name and at least one sentinel, each host:port.
    for url in ["mymaster", "s1:26379,s2:26379", "m,s1", ",s1:1"] {
        assert_eq!(
            error_variable(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", url)]),
            "REDIS_URL",
            "{url}"
        );
    }
    // The sentinels' password means nothing without Sentinel: named in the warning.
    let t = run(&[("REDIS_URL", "a:1"), ("REDIS_SENTINEL_AUTH", "x")])
        .unwrap()
        .unwrap();
    assert_eq!(
        t.unhonoured.first().map(|u| u.variable),
        Some("REDIS_SENTINEL_AUTH")
    );
}

#[test]
fn redis_client_certificate_maps_onto_its_flags() {
    let t = run(&[
        ("REDIS_URL", "a:1"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", "/tls/ca.pem"),
        ("REDIS_TLS_CLIENT_CERT", "/tls/client.pem"),
        ("REDIS_TLS_CLIENT_KEY", "/tls/client.key"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "redis_tls_ca_file").as_deref(),
        Some("/tls/ca.pem")
    );
    assert_eq!(
        value(&t, "redis_tls_cert_file").as_deref(),
        Some("/tls/client.pem")
    );
    assert_eq!(
        value(&t, "redis_tls_key_file").as_deref(),
        Some("/tls/client.key")
    );
    assert!(t.unhonoured.iter().all(|u| !u.variable.contains("CLIENT")));
    // A certificate without its key cannot be presented: refuse to start, naming the missing one.
    assert_eq!(
        error_variable(&[("REDIS_URL", "a:1"), ("REDIS_TLS_CLIENT_CERT", "/c.pem")]),
        "REDIS_TLS_CLIENT_KEY"
    );
}

#[test]
fn malformed_values_name_their_variable() {
    assert_eq!(error_variable(&[("REDIS_URL", "redis")]), "REDIS_URL");
    assert_eq!(error_variable(&[("REDIS_URL", "redis:x")]), "REDIS_URL");
    for url in [
        "redis://a",
        "redis://a:1/x",
        "redis://a:1?tls=1",
        "redis://u:p@",
        "http://a:1",
    ] {
        assert_eq!(error_variable(&[("REDIS_URL", url)]), "REDIS_URL", "{url}");
    }
    let cluster = [("REDIS_TYPE", "cluster"), ("REDIS_URL", "redis://a:1/2")];
    assert_eq!(error_variable(&cluster), "REDIS_URL");
    assert_eq!(
        error_variable(&[("REDIS_URL", "a:1"), ("PORT", "80a")]),
        "PORT"
    );
    assert_eq!(error_variable(&[("GRPC_PORT", "70000")]), "GRPC_PORT");
    assert_eq!(error_variable(&[("USE_STATSD", "nope")]), "USE_STATSD");
    assert_eq!(
        error_variable(&[("REDIS_URL", "a:1"), ("REDIS_TIMEOUT", "soon")]),
        "REDIS_TIMEOUT"
    );
    assert_eq!(
        error_variable(&[("LOG_LEVEL", "loud"), ("USE_STATSD", "false")]),
        "LOG_LEVEL"
    );
    assert_eq!(
        error_variable(&[("REDIS_URL", "a:1"), ("REDIS_TYPE", "replicated")]),
        "REDIS_TYPE"
    );
}

#[test]
fn tracing_variables_map_onto_the_trace_flags() {
    let t = run(&[
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("TRACING_SAMPLING_RATE", "0.25"),
        ("TRACING_SERVICE_NAMESPACE", "edge"),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(t.unhonoured, vec![]);
    assert_eq!(
        value(&t, "otlp_endpoint").as_deref(),
        Some("http://otel:4317")
    );
    assert_eq!(value(&t, "otlp_protocol").as_deref(), Some("grpc"));
    assert_eq!(value(&t, "trace_sampling_ratio").as_deref(), Some("0.25"));
    assert_eq!(value(&t, "otlp_service_name").as_deref(), Some("RateLimit"));
    assert_eq!(value(&t, "otlp_service_namespace").as_deref(), Some("edge"));
    assert_eq!(
        value(&t, "otlp_service_instance_id").as_deref(),
        Some("pod-1")
    );

    // envoyproxy/ratelimit's defaults: HTTP to a local collector, every request sampled.
    let t = run(&[("TRACING_ENABLED", "true")]).unwrap().unwrap();
    assert_eq!(
        value(&t, "otlp_endpoint").as_deref(),
        Some("http://localhost:4318")
    );
    assert_eq!(value(&t, "otlp_protocol").as_deref(), Some("http"));
    assert_eq!(value(&t, "trace_sampling_ratio").as_deref(), Some("1"));
    let t = run(&[
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "collector:4318/v1/traces",
        ),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "otlp_endpoint").as_deref(),
        Some("http://collector:4318/v1/traces")
    );

    // Off: read, honoured (as there, they do nothing), no trace flag set.
    let t = run(&[
        ("TRACING_ENABLED", "false"),
        ("TRACING_SAMPLING_RATE", "0.5"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(t.unhonoured, vec![]);
    assert_eq!(value(&t, "otlp_endpoint"), None);

    for (variable, value) in [
        ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
        ("TRACING_SAMPLING_RATE", "2"),
        ("TRACING_SAMPLING_RATE", "often"),
    ] {
        assert_eq!(
            error_variable(&[("TRACING_ENABLED", "true"), (variable, value)]),
            variable
        );
    }
    assert_eq!(
        error_variable(&[("TRACING_ENABLED", "yes please")]),
        "TRACING_ENABLED"
    );
}

#[test]
fn unhonoured_variables_are_named() {
    let t = run(&[
        ("USE_STATSD", "true"),
        ("DEBUG_PORT", "6070"),
        ("NEAR_LIMIT_RATIO", "0.9"),
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ("LIMIT_LIMIT_HEADER", "ratelimit-limit"),
        ("LIMIT_RESET_HEADER", "X-Reset"),
        ("REDIS_TYPE", "cluster"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(value(&t, "admin_addr").as_deref(), Some("0.0.0.0:6070"));
    let names: Vec<&str> = t.unhonoured.iter().map(|u| u.variable).collect();
    assert_eq!(
        names,
        vec![
            "REDIS_TYPE",
            "LIMIT_RESET_HEADER",
            "USE_STATSD",
            "NEAR_LIMIT_RATIO"
        ]
    );
    assert!(t.unhonoured[0].why.contains("REDIS_URL is not set"));
}

/// Every setting the environment can give is a `serve` flag with that id, which is what decides
/// whether the user gave it; the table in `value.rs` makes each one set that field.
#[test]
fn every_setting_the_environment_gives_is_a_serve_flag() {
    use clap::Args as _;
    let command = Settings::augment_args(clap::Command::new("serve"));
    for id in SETTING_IDS {
        assert!(
            command.get_arguments().any(|arg| arg.get_id() == *id),
            "no serve flag {id}"
        );
    }
    // The TLS listener settings among them (a hand-kept list once left them out).
    let t = run(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
        ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
        ("GRPC_CLIENT_TLS_CACERT", "/tls/ca.pem"),
        ("GRPC_CLIENT_TLS_SAN", "spiffe://a,b.example"),
    ])
    .unwrap()
    .unwrap();
    let ids: Vec<&str> = t.settings.iter().map(Setting::id).collect();
    for id in [
        "tls_cert_file",
        "tls_key_file",
        "tls_listeners",
        "tls_client_ca_file",
        "tls_client_san",
    ] {
        assert!(
            ids.contains(&id) && SETTING_IDS.contains(&id),
            "{id}: {ids:?}"
        );
    }
    assert_eq!(
        value(&t, "tls_client_san").as_deref(),
        Some("spiffe://a,b.example")
    );
    assert_eq!(value(&t, "tls_listeners").as_deref(), Some("grpc"));
}

/// A flag on the command line wins over the environment, and so does a default the user spelled
/// out; a setting left at its default takes the environment's value.
#[test]
fn the_environment_fills_only_what_the_user_left_at_its_default() {
    let compat = [
        ("REDIS_URL", "a:1"),
        ("REDIS_TIMEOUT", "20ms"),
        ("SHADOW_MODE", "true"),
        ("QUOTA_MODE", "true"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
        ("GRPC_PORT", "9000"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/env/cert.pem"),
        ("GRPC_SERVER_TLS_KEY", "/env/key.pem"),
    ];
    let s = settings(&[], &compat).unwrap();
    assert_eq!(s.store.redis_url.as_deref(), Some("redis://a:1"));
    assert_eq!(s.store.redis_timeout, std::time::Duration::from_millis(20));
    assert!(s.requests.shadow_mode);
    assert!(s.requests.quota_mode);
    assert!(s.requests.response_metadata);
    assert_eq!(s.listen.grpc_addr.to_string(), "0.0.0.0:9000");
    assert_eq!(
        s.listen.tls_listeners,
        vec![crate::server::tls::Listener::Grpc]
    );
    // envoyproxy/ratelimit's default where slidegate's differs.
    assert!(!s.requests.response_headers);

    let s = settings(
        &[
            "--redis-url=redis://b:2",
            "--redis-timeout=50ms",
            "--shadow-mode=false",
            "--grpc-addr=127.0.0.1:1",
            "--response-headers",
        ],
        &compat,
    )
    .unwrap();
    assert_eq!(s.store.redis_url.as_deref(), Some("redis://b:2"));
    assert_eq!(s.store.redis_timeout, std::time::Duration::from_millis(50));
    assert!(!s.requests.shadow_mode);
    assert_eq!(s.listen.grpc_addr.to_string(), "127.0.0.1:1");
    assert!(s.requests.response_headers);
    // What the user did not give still comes from the environment.
    assert_eq!(
        s.listen.tls_cert_file.as_deref(),
        Some(std::path::Path::new("/env/cert.pem"))
    );
    // A flag that needs another (`--tls-listeners` needs `--tls-cert-file`) is satisfied by the
    // environment's files; without them the start is refused, naming what is missing.
    let s = settings(&["--tls-listeners=grpc,http,admin"], &compat).unwrap();
    assert_eq!(s.listen.tls_listeners.len(), 3);
    assert!(s.listen.tls_files().is_some());
    let ca = settings(&["--tls-client-ca-file=/ca.pem"], &compat).unwrap();
    assert!(
        ca.listen
            .tls_files()
            .is_some_and(|files| files.client_ca.is_some())
    );
    for alone in [
        &["--tls-listeners=grpc,http,admin"][..],
        &["--tls-cert-file=/c.pem"],
        &["--tls-key-file=/k.pem"],
        &["--tls-client-ca-file=/ca.pem"],
        &["--tls-client-san=a"],
    ] {
        let error = settings(alone, &[("REDIS_URL", "a:1")]).unwrap_err();
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{alone:?}"
        );
    }
}

/// `--redis-sentinel` and `--redis-cluster` exclude each other wherever each came from.
#[test]
fn sentinel_and_cluster_from_either_side_conflict() {
    let sentinel = [("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m,s1:1")];
    let error = settings(&["--redis-cluster=redis://c:1"], &sentinel).unwrap_err();
    assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
    let cluster = [("REDIS_TYPE", "cluster"), ("REDIS_URL", "c:1,c:2")];
    let given = ["--redis-sentinel=s1:1", "--redis-sentinel-master=m"];
    let error = settings(&given, &cluster).unwrap_err();
    assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
    assert!(settings(&given, &sentinel).is_ok());
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false` records every hit (`--record-over-limit`);
/// `true` or unset keeps slidegate's default.
#[test]
fn stop_cache_key_increment_maps_to_record_over_limit() {
    for (given, expected) in [("false", Some("true")), ("true", Some("false"))] {
        let t = run(&[
            ("REDIS_URL", "127.0.0.1:6379"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", given),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "record_over_limit").as_deref(),
            expected,
            "{given}"
        );
        assert!(t.unhonoured.is_empty(), "{:?}", t.unhonoured);
    }
    let t = run(&[("REDIS_URL", "127.0.0.1:6379")]).unwrap().unwrap();
    assert_eq!(value(&t, "record_over_limit"), None);
}

/// `REDIS_URL` in every form radix (envoyproxy/ratelimit's client) dials, and `rediss://`.
#[test]
fn redis_url_forms() {
    let url = |vars: &[(&str, &str)]| value(&run(vars).unwrap().unwrap(), "redis_url");
    let cases = [
        ("h:1", "redis://h:1"),
        ("redis://h:1", "redis://h:1"),
        ("REDIS://h:1/", "redis://h:1"),
        ("redis://user:pass@h:1/3", "redis://user:pass@h:1/3"),
        ("redis://:p%40ss@h:1", "redis://:p%40ss@h:1"),
        ("redis://h:1?db=2&password=x", "redis://:x@h:1/2"),
        ("redis://h:1?username=u&password=x", "redis://u:x@h:1"),
        ("rediss://h:1/0", "rediss://h:1/0"),
        ("redis://[::1]:6379", "redis://[::1]:6379"),
    ];
    for (given, expected) in cases {
        assert_eq!(
            url(&[("REDIS_URL", given)]).as_deref(),
            Some(expected),
            "{given}"
        );
    }
    // REDIS_AUTH fills what the URL leaves out; the URL's own credentials win.
    let auth = [("REDIS_URL", "redis://h:1/4"), ("REDIS_AUTH", "pw")];
    assert_eq!(url(&auth).as_deref(), Some("redis://:pw@h:1/4"));
    let both = [("REDIS_URL", "redis://u:a@h:1"), ("REDIS_AUTH", "b")];
    assert_eq!(url(&both).as_deref(), Some("redis://u:a@h:1"));
    // REDIS_TLS=true makes a redis:// URL TLS, as radix's TLS dialer would.
    let tls = [("REDIS_URL", "redis://h:1/1"), ("REDIS_TLS", "true")];
    assert_eq!(url(&tls).as_deref(), Some("rediss://h:1/1"));
    let t = run(&[
        ("REDIS_TYPE", "cluster"),
        ("REDIS_URL", "redis://:p@a:1,redis://b:2/0"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "redis_cluster").as_deref(),
        Some("redis://:p@a:1,redis://b:2/0")
    );
}

/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true` is honoured with a warning: `#insecure` on every
/// TLS URL of the store, the primary's and the sentinels' included.
#[test]
fn skipping_hostname_verification_warns() {
    let t = run(&[
        ("REDIS_URL", "h:1"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "redis_url").as_deref(),
        Some("rediss://h:1#insecure")
    );
    assert_eq!(
        t.warnings[0].variable,
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"
    );
    assert!(t.unhonoured.is_empty());
    let t = run(&[
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "m,s:1"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "redis_sentinel").as_deref(),
        Some("rediss://s:1#insecure")
    );
    assert_eq!(
        value(&t, "redis_url").as_deref(),
        Some("rediss://primary#insecure")
    );
    let t = run(&[
        ("REDIS_URL", "h:1"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false"),
    ])
    .unwrap()
    .unwrap();
    assert!(t.warnings.is_empty());
}

/// Envoy Gateway's metrics variables: its listener, mapping file and near-limit ratio.
#[test]
fn use_prometheus_serves_its_metrics_where_its_environment_says() {
    let t = run(&[
        ("USE_STATSD", "false"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ("NEAR_LIMIT_RATIO", "0.9"),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        value(&t, "prometheus_addr").as_deref(),
        Some("0.0.0.0:19001")
    );
    assert_eq!(
        value(&t, "prometheus_mapper_yaml").as_deref(),
        Some("/etc/statsd-exporter/conf.yaml")
    );
    assert_eq!(value(&t, "near_limit_ratio").as_deref(), Some("0.9"));
    assert!(t.unhonoured.is_empty(), "{:?}", t.unhonoured);
    // Without USE_PROMETHEUS=true its variables are named as unused.
    let t = run(&[("PROMETHEUS_ADDR", ":19001")]).unwrap().unwrap();
    assert_eq!(value(&t, "prometheus_addr"), None);
    assert_eq!(t.unhonoured[0].variable, "PROMETHEUS_ADDR");
    let bad = run(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", "nowhere")]);
    assert!(bad.is_err());
}
