//! envoyproxy/ratelimit's Prometheus metrics through the binary, under its environment as Envoy
//! Gateway sets it (`USE_STATSD=false`, `USE_PROMETHEUS=true`, `PROMETHEUS_ADDR=:PORT`, its own
//! mapping file in `PROMETHEUS_MAPPER_YAML`): after traffic through rules shaped as Envoy
//! Gateway writes them, the listener serves `ratelimit_service_rate_limit_*` with the domain and
//! key labels its dashboard queries, counted as envoyproxy/ratelimit counts, and nothing else;
//! a real Prometheus scraping that listener answers every `ratelimit_service_*` query of Envoy
//! Gateway's dashboard for the rate-limit service with data.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{
    KillOnDrop, Slidegate, descriptor, free_port, http_get, metric_value, request, require_program,
    wait_until,
};

/// The rule an Envoy Gateway `BackendTrafficPolicy` with one global rule becomes: a header match
/// on the route, then the rule's own level (key = value), 3 per minute.
const KEY1: &str = "httproute/default/http-ratelimit/rule/0/match/0/ratelimit_example";
const KEY2: &str = "rule-0-match-0";

fn rules() -> tempfile::TempDir {
    let rules = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "domain: default/eg/http\ndescriptors:\n  - key: {KEY1}\n    value: {KEY1}\n    \
         descriptors:\n      - key: {KEY2}\n        value: {KEY2}\n        \
         rate_limit: {{ unit: minute, requests_per_unit: 3 }}\n"
    );
    std::fs::write(rules.path().join("rules.yaml"), text).expect("write rules");
    rules
}

/// `n` calls through the rule, on one connection.
async fn call_rule(server: &Slidegate, n: usize) {
    let mut client = server.client().await;
    for _ in 0..n {
        client
            .should_rate_limit(request(
                "default/eg/http",
                vec![descriptor(&[(KEY1, KEY1), (KEY2, KEY2)])],
            ))
            .await
            .expect("answer");
    }
}

fn mapper_file() -> String {
    format!(
        "{}/tests/fixtures/statsd/envoy_gateway_statsd_conf.yaml",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// slidegate under Envoy Gateway's environment, its Prometheus listener on `port`, after 5 calls
/// through the rule (3 per minute).
async fn envoy_gateway_slidegate(rules: &tempfile::TempDir, port: u16) -> Slidegate {
    let addr = format!(":{port}");
    let mapper = mapper_file();
    let server = Slidegate::start_with_env(
        rules.path(),
        &[],
        &[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &addr),
            ("PROMETHEUS_MAPPER_YAML", &mapper),
        ],
    );
    call_rule(&server, 5).await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_serves_its_metrics_under_its_names() {
    let rules = rules();
    let port = free_port();
    let server = envoy_gateway_slidegate(&rules, port).await;
    let (status, text) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{}", server.log());
    let series = |stat: &str| {
        format!(
            "ratelimit_service_rate_limit_{stat}{{domain=\"default/eg/http\",key1=\"{KEY1}_{KEY1}\",key2=\"{KEY2}_{KEY2}\"}}"
        )
    };
    // 5 hits on a limit of 3 (near limit at 2): 3 within, the third near, 2 over.
    for (stat, value) in [
        ("total_hits", 5.0),
        ("within_limit", 3.0),
        ("near_limit", 1.0),
        ("over_limit", 2.0),
    ] {
        assert_eq!(metric_value(&text, &series(stat)), value, "{stat}\n{text}");
    }
    assert_eq!(
        metric_value(
            &text,
            r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#
        ),
        5.0,
        "{text}"
    );
    assert!(
        text.contains("ratelimit_service_config_load_success"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE ratelimit_service_response_time_seconds histogram"),
        "{text}"
    );
    assert!(
        !text.contains("slidegate_"),
        "only envoyproxy/ratelimit's names\n{text}"
    );
    assert_eq!(
        http_get(port, "/rlconfig").0,
        404,
        "nothing else on that listener"
    );
    // slidegate's own metrics stay on the operator listener.
    assert!(
        server
            .get("/metrics")
            .1
            .contains("slidegate_decisions_total")
    );
}

/// A mapping file that does not load stops the start, naming it.
#[test]
fn a_mapping_file_that_does_not_load_stops_the_start() {
    let rules = rules();
    let bad = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(bad.path(), "mappings:\n  - match: \"a.*b\"\n    name: x\n").expect("write");
    let out = crate::support::slidegate_command()
        .args(["serve", "--config"])
        .arg(rules.path())
        .args([
            "--prometheus-addr",
            "127.0.0.1:0",
            "--prometheus-mapper-yaml",
        ])
        .arg(bad.path())
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .output()
        .expect("run slidegate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("does not load"), "{stderr}");
}

/// The `ratelimit_service_*` queries of Envoy Gateway's "Global Ratelimit" dashboard
/// (`charts/gateway-addons-helm/dashboards/global-ratelimit.json`, its `DefaultDomain` variable
/// `default/eg/http`), and the rate its documentation shows.
fn dashboard_queries() -> Vec<String> {
    let labels =
        format!("domain=\"default/eg/http\", key1=\"{KEY1}_{KEY1}\", key2=\"{KEY2}_{KEY2}\"");
    let mut queries: Vec<String> = ["total_hits", "near_limit", "over_limit"]
        .iter()
        .map(|stat| format!("ratelimit_service_rate_limit_{stat}{{{labels}}}"))
        .collect();
    queries.push(
        "sum(rate(ratelimit_service_rate_limit_total_hits[5m])) by (domain, key1, key2)".into(),
    );
    // Its memory panels; the label comes from the scrape's relabelling of the pod's labels.
    for memory in ["resident", "virtual"] {
        queries.push(format!(
            "(process_{memory}_memory_bytes{{app_kubernetes_io_component=\"ratelimit\"}})/1000000"
        ));
    }
    queries
}

/// Percent-encodes a query for a URL.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_dashboard_queries_return_data_through_prometheus() {
    let Some(prometheus) = require_program("prometheus") else {
        return;
    };
    let rules = rules();
    let port = free_port();
    let _server = envoy_gateway_slidegate(&rules, port).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ratelimit\n    \
         static_configs:\n      - targets: [\"127.0.0.1:{port}\"]\n        \
         labels: {{ app_kubernetes_io_component: ratelimit }}\n"
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).expect("write config");
    let web = free_port();
    let child = Command::new(prometheus)
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn prometheus");
    let _prometheus = KillOnDrop(child);
    for query in dashboard_queries() {
        let path = format!("/api/v1/query?query={}", url_encode(&query));
        let mut last = String::new();
        let answered = wait_until(Duration::from_secs(30), || {
            let (status, body) = http_get(web, &path);
            last = body;
            status == 200 && last.contains("\"value\":[")
        });
        assert!(answered, "{query}: no data; last answer {last}");
    }
}

/// A mapping file of one's own: its names and labels, its `drop`, and what it leaves unmapped
/// served escaped, as statsd_exporter serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_file_of_ones_own_names_the_metrics() {
    let rules = rules();
    let dir = tempfile::tempdir().expect("tempdir");
    let mapper = dir.path().join("mapper.yaml");
    std::fs::write(
        &mapper,
        "mappings:\n  \
         - match: \"ratelimit.service.rate_limit.*.*.*.total_hits\"\n    \
           name: \"hits_by_rule\"\n    labels:\n      tenant: \"$1\"\n      rule: \"$3\"\n  \
         - match: \"ratelimit.service.rate_limit.*.*.*.within_limit\"\n    name: \"dropped\"\n    \
           action: drop\n",
    )
    .expect("write mapper");
    let port = free_port();
    let mapper = mapper.display().to_string();
    let server = Slidegate::start(
        rules.path(),
        &[
            "--prometheus-addr",
            &format!("127.0.0.1:{port}"),
            "--prometheus-mapper-yaml",
            &mapper,
        ],
    );
    call_rule(&server, 1).await;
    let (status, text) = http_get(port, "/metrics");
    assert_eq!(status, 200);
    let mapped = format!(r#"hits_by_rule{{rule="{KEY2}_{KEY2}",tenant="default/eg/http"}}"#);
    assert_eq!(metric_value(&text, &mapped), 1.0, "{text}");
    assert!(!text.contains("within_limit"), "dropped\n{text}");
    // Unmapped: the statsd name escaped, without labels.
    assert!(
        text.contains("ratelimit_service_config_load_success 1"),
        "{text}"
    );
}
