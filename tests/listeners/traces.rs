//! OpenTelemetry traces from the real binary, received by a collector built on the official OTLP
//! protos (tests/support/otlp.rs): one span per decision over OTLP/gRPC and OTLP/HTTP, the
//! caller's context from W3C `traceparent` and from B3 (gRPC metadata and HTTP headers), the
//! sampling ratio, a dead collector, Redis timings and the failure mode, and the trace context of
//! a real Envoy request carried into slidegate's span.

use std::time::Duration;

use crate::otlp::{Collector, Received};
use crate::support::{RedisServer, Slidegate, descriptor, metric_value, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use tonic::transport::Channel;

/// `user` allows one request per minute for each user.
const RULES: &str = r#"
domain: traced
descriptors:
  - key: user
    rate_limit: { name: one_per_user, unit: minute, requests_per_unit: 1 }
  - key: generic_key
    value: envoy
    rate_limit: { name: through_envoy, unit: minute, requests_per_unit: 1000 }
"#;

/// The caller's context the tests send (W3C and B3 alike).
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// Long enough for a batch (sent 0.5 s after its first span) on a slow, shared machine.
const ARRIVAL: Duration = Duration::from_secs(10);

fn rules_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), RULES).expect("write rules");
    dir
}

fn start(rules: &tempfile::TempDir, args: &[&str]) -> Slidegate {
    Slidegate::start(rules.path(), args)
}

fn user_request(user: &str) -> RateLimitRequest {
    crate::support::request("traced", vec![descriptor(&[("user", user)])])
}

/// `ShouldRateLimit` with `metadata` as gRPC metadata; the answer's overall code.
async fn call_with(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
    metadata: &[(&'static str, &str)],
) -> i32 {
    let mut request = tonic::Request::new(request);
    for (name, value) in metadata {
        request
            .metadata_mut()
            .insert(*name, value.parse().expect("metadata value"));
    }
    match client.should_rate_limit(request).await {
        Ok(answer) => answer.into_inner().overall_code,
        Err(status) => panic!("ShouldRateLimit failed: {status:?}"),
    }
}

fn traceparent(flags: &str) -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-{flags}")
}

fn spans_of_service<'a>(spans: &'a [Received], service: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| s.resource_text("service.name") == Some(service))
        .collect()
}

/// Over OTLP/gRPC: a span per call, child of the caller's `traceparent` span, with the domain,
/// the matched rule, the decision (OK, then OVER_LIMIT for the second call of a one-per-minute
/// limit), the store and its time; B3 in gRPC metadata works the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_become_child_spans_exported_over_otlp_grpc() {
    let collector = Collector::grpc().await;
    let rules = rules_dir();
    let endpoint = collector.endpoint();
    let slidegate = start(
        &rules,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-service-name",
            "rls",
            "--otlp-service-instance-id",
            "pod-1",
        ],
    );
    let mut client = slidegate.client().await;
    let parent = traceparent("01");
    let w3c = [("traceparent", parent.as_str()), ("tracestate", "vendor=1")];
    assert_eq!(call_with(&mut client, user_request("ann"), &w3c).await, 1);
    assert_eq!(call_with(&mut client, user_request("ann"), &w3c).await, 2);
    let b3 = format!("{TRACE_ID}-{PARENT_ID}-1");
    call_with(&mut client, user_request("bob"), &[("b3", b3.as_str())]).await;

    let spans = collector.wait_for(ARRIVAL, |s| s.len() >= 3).await;
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let decisions: Vec<&str> = spans
        .iter()
        .map(|s| s.text("slidegate.decision").unwrap_or("-"))
        .collect();
    assert_eq!(decisions, ["OK", "OVER_LIMIT", "OK"], "{spans:#?}");
    for span in &spans {
        assert_eq!(span.trace_id(), TRACE_ID, "{span:#?}");
        assert_eq!(span.parent_span_id(), PARENT_ID, "{span:#?}");
        assert_eq!(
            span.span.name,
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        );
        // SPAN_KIND_SERVER
        assert_eq!(span.span.kind, 2);
        assert_eq!(span.text("rpc.system"), Some("grpc"));
        assert_eq!(span.text("slidegate.domain"), Some("traced"));
        assert_eq!(span.texts("slidegate.rules"), ["one_per_user"]);
        assert_eq!(span.text("slidegate.store"), Some("memory"));
        assert!(
            matches!(span.attr("slidegate.store.duration"), Some(Value::DoubleValue(d)) if *d > 0.0),
            "{span:#?}"
        );
        assert_eq!(span.resource_text("service.name"), Some("rls"));
        assert_eq!(span.resource_text("service.instance.id"), Some("pod-1"));
    }
    assert_eq!(
        spans[1].texts("slidegate.descriptor_decisions"),
        ["OVER_LIMIT"]
    );
}

/// Over OTLP/HTTP (protobuf): `/json` with a single `b3` header and `/check` with the multi
/// `x-b3-*` headers are child spans of the caller's, with the HTTP status answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_carry_b3_and_are_exported_over_otlp_http() {
    let collector = Collector::http().await;
    let rules = rules_dir();
    let endpoint = collector.endpoint();
    let slidegate = start(
        &rules,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "http",
            "--check-domain",
            "traced",
        ],
    );
    let http = reqwest::Client::new();
    let json = serde_json::json!({
        "domain": "traced",
        "descriptors": [{ "entries": [{ "key": "user", "value": "cy" }] }]
    });
    let answer = http
        .post(slidegate.url("/json"))
        .header("b3", format!("{TRACE_ID}-{PARENT_ID}-1"))
        .json(&json)
        .send()
        .await
        .expect("POST /json");
    assert_eq!(answer.status(), 200);
    let answer = http
        .get(slidegate.url("/check"))
        .header("x-ratelimit-descriptor", "user=cy")
        .header("x-b3-traceid", TRACE_ID)
        .header("x-b3-spanid", PARENT_ID)
        .header("x-b3-sampled", "1")
        .send()
        .await
        .expect("GET /check");
    assert_eq!(answer.status(), 429);

    let spans = collector.wait_for(ARRIVAL, |s| s.len() >= 2).await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let names: Vec<&str> = spans.iter().map(|s| s.span.name.as_str()).collect();
    assert_eq!(names, ["POST /json", "GET /check"]);
    for (span, status) in spans.iter().zip([200, 429]) {
        assert_eq!(span.trace_id(), TRACE_ID, "{span:#?}");
        assert_eq!(span.parent_span_id(), PARENT_ID, "{span:#?}");
        assert!(
            matches!(
                span.attr("http.response.status_code"),
                Some(Value::IntValue(s)) if *s == status
            ),
            "{span:#?}"
        );
        assert_eq!(span.texts("slidegate.rules"), ["one_per_user"]);
        assert_eq!(span.resource_text("service.name"), Some("slidegate"));
    }
}

/// With a sampling ratio of 0, calls without a caller's decision and calls whose caller did not
/// sample make no span; a caller that sampled still gets its span (parent-based sampling), and
/// it is the only one the collector receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratio_zero_exports_nothing_but_follows_a_sampling_caller() {
    let collector = Collector::grpc().await;
    let rules = rules_dir();
    let endpoint = collector.endpoint();
    let slidegate = start(
        &rules,
        &["--otlp-endpoint", &endpoint, "--trace-sampling-ratio", "0"],
    );
    let mut client = slidegate.client().await;
    let unsampled = traceparent("00");
    for i in 0..20 {
        let user = format!("u{i}");
        call_with(&mut client, user_request(&user), &[]).await;
        let metadata = [("traceparent", unsampled.as_str())];
        call_with(&mut client, user_request(&user), &metadata).await;
    }
    let sampled = traceparent("01");
    call_with(
        &mut client,
        user_request("last"),
        &[("traceparent", sampled.as_str())],
    )
    .await;
    let spans = collector.wait_for(ARRIVAL, |s| !s.is_empty()).await;
    // Spans leave in the order they ended: anything sampled before would be here too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spans = if spans.is_empty() {
        spans
    } else {
        collector.spans()
    };
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0].trace_id(), TRACE_ID);
}

/// A collector that is not there (nothing listens on its port) costs spans, never calls: every
/// call is answered, over gRPC and HTTP, and the lost spans are counted as failed exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_does_not_fail_calls() {
    let rules = rules_dir();
    for protocol in ["grpc", "http"] {
        let nowhere = format!("http://127.0.0.1:{}", crate::support::free_port());
        let slidegate = start(
            &rules,
            &["--otlp-endpoint", &nowhere, "--otlp-protocol", protocol],
        );
        let mut client = slidegate.client().await;
        for i in 0..50 {
            let started = std::time::Instant::now();
            let code = call_with(&mut client, user_request(&format!("u{i}")), &[]).await;
            assert_eq!(code, 1, "{protocol}: call {i}");
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{protocol}: call {i} took {:?}",
                started.elapsed()
            );
        }
        let failed = wait_until(ARRIVAL, || {
            let (_, text) = slidegate.get("/metrics");
            metric_value(&text, "slidegate_trace_spans_total{outcome=\"failed\"}") >= 50.0
        });
        let (_, text) = slidegate.get("/metrics");
        assert!(failed, "{protocol}: spans not counted as failed:\n{text}");
        assert_eq!(
            metric_value(&text, "slidegate_trace_spans_total{outcome=\"exported\"}"),
            0.0
        );
    }
}

/// On Redis the span holds the store's round trip; with Redis gone, the failure mode that
/// answered and the kind of error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_round_trips_and_the_failure_mode_are_in_the_span() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let collector = Collector::grpc().await;
    let rules = rules_dir();
    let endpoint = collector.endpoint();
    let url = redis.url();
    let slidegate = start(
        &rules,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--redis-url",
            &url,
            "--redis-timeout",
            "200ms",
            "--failure-mode",
            "allow",
        ],
    );
    let mut client = slidegate.client().await;
    assert_eq!(call_with(&mut client, user_request("dee"), &[]).await, 1);
    drop(redis);
    assert_eq!(call_with(&mut client, user_request("eve"), &[]).await, 1);

    let spans = collector.wait_for(ARRIVAL, |s| s.len() >= 2).await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    for span in &spans {
        assert_eq!(span.text("slidegate.store"), Some("redis"));
        assert!(
            matches!(span.attr("slidegate.store.duration"), Some(Value::DoubleValue(d)) if *d > 0.0),
            "{span:#?}"
        );
    }
    assert_eq!(spans[0].text("slidegate.failure_mode"), None);
    assert_eq!(spans[1].text("slidegate.failure_mode"), Some("allow"));
    assert!(
        matches!(
            spans[1].text("error.type"),
            Some("connection" | "refused" | "timeout")
        ),
        "{:#?}",
        spans[1]
    );
    assert_eq!(spans[1].text("slidegate.decision"), Some("OK"));
}

/// A real Envoy with its OpenTelemetry tracer (exporting to the same collector) and the
/// rate-limit filter: a request carrying `traceparent` becomes Envoy's span, Envoy's call to
/// slidegate a child span of it whose context Envoy sends in the call's metadata, and slidegate's
/// span a child of that call: one trace from the client through Envoy into slidegate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_carries_the_request_trace_into_slidegate() {
    let Some(envoy) = crate::support::envoy_program() else {
        return;
    };
    let collector = Collector::grpc().await;
    let rules = rules_dir();
    let endpoint = collector.endpoint();
    let slidegate = start(&rules, &["--otlp-endpoint", &endpoint]);
    let dir = tempfile::tempdir().expect("tempdir");
    let port = crate::support::free_port();
    let admin = crate::support::free_port();
    let config = ENVOY_CONFIG
        .replace("LISTENER_PORT", &port.to_string())
        .replace("ADMIN_PORT", &admin.to_string())
        .replace("SLIDEGATE_GRPC", &slidegate.grpc_port.to_string())
        .replace("SLIDEGATE_HTTP", &slidegate.http_port.to_string())
        .replace("COLLECTOR", &collector.port.to_string());
    let config_path = dir.path().join("envoy.yaml");
    std::fs::write(&config_path, config).expect("write envoy config");
    let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log");
    let _envoy = crate::support::KillOnDrop(
        std::process::Command::new(envoy)
            .arg("-c")
            .arg(&config_path)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn envoy"),
    );
    let ready = wait_until(Duration::from_secs(60), || {
        crate::support::http_get(admin, "/ready").0 == 200
    });
    let envoy_log = || std::fs::read_to_string(dir.path().join("envoy.log")).unwrap_or_default();
    assert!(ready, "envoy did not start:\n{}", envoy_log());

    let answer = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/"))
        .header("traceparent", traceparent("01"))
        .send()
        .await
        .expect("request through envoy");
    assert_eq!(answer.status(), 200, "{}", envoy_log());

    // Envoy flushes its spans every 5 s.
    let spans = collector
        .wait_for(Duration::from_secs(20), |s| {
            !spans_of_service(s, "slidegate").is_empty() && spans_of_service(s, "envoy").len() >= 2
        })
        .await;
    let ours = spans_of_service(&spans, "slidegate");
    let envoys = spans_of_service(&spans, "envoy");
    assert_eq!(ours.len(), 1, "{spans:#?}");
    let span = ours[0];
    assert_eq!(span.trace_id(), TRACE_ID, "{spans:#?}");
    assert_eq!(span.texts("slidegate.rules"), ["through_envoy"]);
    // Its parent is Envoy's span of the rate-limit call, itself in the request's trace.
    let parent = envoys
        .iter()
        .find(|e| e.span_id() == span.parent_span_id())
        .unwrap_or_else(|| panic!("no Envoy span is slidegate's parent: {spans:#?}"));
    assert_eq!(parent.trace_id(), TRACE_ID);
    assert!(parent.span.name.contains("ShouldRateLimit"), "{parent:#?}");
    let request_span = envoys
        .iter()
        .find(|e| e.span_id() == parent.parent_span_id())
        .unwrap_or_else(|| panic!("the call's span has no parent from Envoy: {spans:#?}"));
    assert_eq!(request_span.parent_span_id(), PARENT_ID);
}

/// Envoy: the rate-limit filter (domain `traced`, descriptor `generic_key=envoy`) in front of
/// slidegate's own `/healthcheck` as the upstream, and the OpenTelemetry tracer sending Envoy's
/// spans to the test collector. The tracing block of the connection manager is all it takes for
/// Envoy to put `traceparent` on its rate-limit calls (docs/traces.md).
const ENVOY_CONFIG: &str = r#"
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: ADMIN_PORT } }
static_resources:
  listeners:
  - name: ingress
    address: { socket_address: { address: 127.0.0.1, port_value: LISTENER_PORT } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress_http
          tracing:
            provider:
              name: envoy.tracers.opentelemetry
              typed_config:
                "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                grpc_service:
                  envoy_grpc: { cluster_name: collector }
                  timeout: 1s
                service_name: envoy
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route:
                  cluster: upstream
                  prefix_rewrite: /healthcheck
                  rate_limits:
                  - actions:
                    - generic_key: { descriptor_value: envoy }
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: traced
              timeout: 2s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: { cluster_name: ratelimit }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: SLIDEGATE_HTTP } } }
  - name: ratelimit
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: ratelimit
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: SLIDEGATE_GRPC } } }
  - name: collector
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: collector
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: COLLECTOR } } }
"#;
