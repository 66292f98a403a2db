//! `/metrics` against `docs/metrics.md`, through the binary: every family served is documented,
//! and the families an alert reads exist from start, at zero (a `rate()` needs a series before
//! the first event), with the serving state as a gauge.

use std::collections::BTreeSet;

use crate::support::Slidegate;

/// The families a `/metrics` text serves (`# TYPE name kind` lines).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_served_is_documented_and_alerts_have_series_from_start() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let server = Slidegate::start(&config, &[]);
    let (_, at_start) = server.get("/metrics");
    for series in [
        "slidegate_connections_refused_total{listener=\"grpc\",reason=\"max_connections\"} 0",
        "slidegate_connections_refused_total{listener=\"admin\",reason=\"max_connections_per_peer\"} 0",
        "slidegate_tls_handshake_failures_total{listener=\"http\",reason=\"handshake_timeout\"} 0",
        "slidegate_serving 1",
        "slidegate_store_up{store=\"memory\"} 1",
        "slidegate_config_reloads_total{result=\"failure\"} 0",
    ] {
        assert!(at_start.contains(series), "{series} is not served at start");
    }

    // After a decision of each kind, every family served is in docs/metrics.md.
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}]}]}"#;
    server.post_json(body).await;
    server
        .post_json(r#"{"domain":"unknown","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#)
        .await;
    let (_, text) = server.get("/metrics");
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
    )
    .expect("docs/metrics.md");
    let undocumented: Vec<String> = families(&text)
        .into_iter()
        .filter(|family| {
            // Histograms are documented by their family name; process_* are the standard ones.
            !family.starts_with("process_") && !docs.contains(&format!("`{family}`"))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
}
