//! Response costs through a real Envoy: `apply_on_stream_done` with the cost taken from a
//! response header (`hits_addend.format: "%RESP(x-cost)%"`), checked with 0 hits before each
//! request, as Envoy Gateway's `cost.response` configures it. The charge lands after the response
//! even where it does not fit, so the budget bites: with 1000 an hour and 800 per response, the
//! third request is denied. On the memory store and on Redis. And `is_negative_hits` over gRPC:
//! hits taken back, never below zero.

use std::time::Duration;

use crate::support::{
    KillOnDrop, RedisServer, Slidegate, descriptor, free_port, http_get, request, wait_until,
};
use envoy_types::pb::google::protobuf::UInt64Value;

const RULES: &str = r#"
domain: budget
descriptors:
  - key: generic_key
    value: tokens
    rate_limit: { unit: hour, requests_per_unit: 1000 }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
"#;

/// Envoy: a route to slidegate's own `/healthcheck` as the upstream, its responses given
/// `x-cost: 800` (Envoy evaluates per-route rate limits only on routes to a cluster), a check of 0 hits on the request path
/// and the response's cost on stream done (`RateLimitPerRoute`, where Envoy supports
/// `hits_addend`).
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
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route: { cluster: upstream, prefix_rewrite: /healthcheck }
                response_headers_to_add:
                - header: { key: x-cost, value: "800" }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{ generic_key: { descriptor_value: tokens } }]
                      hits_addend: { number: 0 }
                    - actions: [{ generic_key: { descriptor_value: tokens } }]
                      hits_addend: { format: "%RESP(x-cost)%" }
                      apply_on_stream_done: true
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: budget
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
"#;

/// What the counter has left, from a check of 0 hits over `/json`: `(code, limitRemaining)`.
async fn remaining(slidegate: &Slidegate) -> (String, u64) {
    let body = r#"{"domain":"budget","descriptors":[{"entries":[{"key":"generic_key","value":"tokens"}],"hitsAddend":0}]}"#;
    let v = slidegate.post_json(body).await;
    let status = &v["statuses"][0];
    let code = status["code"].as_str().unwrap_or_default().to_string();
    (code, status["limitRemaining"].as_u64().unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_response_costs_land_after_the_response_and_the_budget_bites() {
    let Some(envoy) = crate::support::envoy_program() else {
        return;
    };
    let redis = RedisServer::start();
    let mut stores = vec![("memory", Vec::new())];
    if let Some(redis) = &redis {
        stores.push(("redis", vec!["--redis-url".to_string(), redis.url()]));
    }
    for (store, args) in stores {
        let rules = tempfile::tempdir().expect("tempdir");
        std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let slidegate = Slidegate::start(rules.path(), &args);
        let dir = tempfile::tempdir().expect("tempdir");
        let (port, admin) = (free_port(), free_port());
        let config = ENVOY_CONFIG
            .replace("LISTENER_PORT", &port.to_string())
            .replace("ADMIN_PORT", &admin.to_string())
            .replace("SLIDEGATE_GRPC", &slidegate.grpc_port.to_string())
            .replace("SLIDEGATE_HTTP", &slidegate.http_port.to_string());
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).expect("write envoy config");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log");
        let _envoy = KillOnDrop(
            std::process::Command::new(&envoy)
                .arg("-c")
                .arg(&config_path)
                .args(["--disable-hot-restart", "--concurrency", "1"])
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn envoy"),
        );
        let envoy_log =
            || std::fs::read_to_string(dir.path().join("envoy.log")).unwrap_or_default();
        let ready = wait_until(Duration::from_secs(60), || {
            http_get(admin, "/ready").0 == 200
        });
        assert!(ready, "envoy did not start:\n{}", envoy_log());

        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        // What the counter must have left once each served request's charge has landed.
        let mut expected = [(Some("OK"), 200), (Some("OVER_LIMIT"), 0)].into_iter();
        for round in 0..4 {
            let answer = client
                .get(format!("http://127.0.0.1:{port}/"))
                .send()
                .await
                .expect("request through envoy");
            let status = answer.status().as_u16();
            statuses.push(status);
            if status != 200 {
                continue;
            }
            assert_eq!(answer.headers()["x-cost"], "800");
            // The charge is sent after the response, without waiting: wait for it to land.
            let Some((code, left)) = expected.next() else {
                panic!("[{store}] round {round} served: {statuses:?}");
            };
            let mut seen;
            let landed = {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                loop {
                    seen = remaining(&slidegate).await;
                    if (Some(seen.0.as_str()), seen.1) == (code, left)
                        || std::time::Instant::now() > deadline
                    {
                        break (Some(seen.0.as_str()), seen.1) == (code, left);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            assert!(
                landed,
                "[{store}] round {round}: the counter shows {seen:?}, not {code:?} {left}; \
                 slidegate:\n{}\nenvoy:\n{}",
                slidegate.log(),
                envoy_log()
            );
        }
        eprintln!("[{store}] four rounds through Envoy: {statuses:?}");
        assert_eq!(statuses, [200, 200, 429, 429], "[{store}]\n{}", envoy_log());
    }
}

/// Envoy's `is_negative_hits` over gRPC: the hits are taken back (a concurrency limit's release),
/// never below zero, where slidegate used to refuse the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_hits_over_grpc_give_hits_back() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let slidegate = Slidegate::start(rules.path(), &[]);
    let mut client = slidegate.client().await;
    let hits = |n: u64, negative: bool| {
        let mut d = descriptor(&[("user", "u")]);
        d.hits_addend = Some(UInt64Value { value: n });
        d.is_negative_hits = negative;
        request("budget", vec![d])
    };
    let mut call = async |r| {
        let answer = client
            .should_rate_limit(r)
            .await
            .expect("answer")
            .into_inner();
        (answer.overall_code, answer.statuses[0].limit_remaining)
    };
    // 1 = OK, 2 = OVER_LIMIT. Plain requests (no descriptor cost) fill the limit.
    let one = request("budget", vec![descriptor(&[("user", "u")])]);
    for left in [2, 1, 0] {
        assert_eq!(call(one.clone()).await, (1, left));
    }
    assert_eq!(call(one.clone()).await.0, 2);
    assert_eq!(call(hits(2, true)).await, (1, 2), "two hits given back");
    assert_eq!(call(hits(100, true)).await, (1, 3), "never below zero");
    for left in [2, 1, 0] {
        assert_eq!(call(one.clone()).await, (1, left));
    }
    assert_eq!(call(one).await.0, 2);
}
