//! The memory store's budget through the binary: a flood of distinct 4 KiB values under
//! `--memory-max-bytes 16MiB` grows RSS by less than twice the budget, the flood's new counters
//! are decided over limit once the budget is reached, a tenant over its limit stays over and a
//! tenant under it is still served.

use crate::support::{Slidegate, descriptor, metric_value, request};

const RULES: &str = r#"
domain: mem
descriptors:
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: flood
    rate_limit: { unit: minute, requests_per_unit: 1000 }
"#;

/// Flood calls, each of 64 new counters.
const CALLS: usize = 2000;

/// OK and OVER_LIMIT in the response's `Code`.
const OK: i32 = 1;
const OVER: i32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_values_stays_within_the_budget() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &["--memory-max-bytes", "32MiB"]);
    let mut client = server.client().await;
    let mut code = async |entries: &[(&str, &str)]| {
        let answer = client
            .should_rate_limit(request("mem", vec![descriptor(entries)]))
            .await
            .expect("answer");
        answer.into_inner().overall_code
    };
    for _ in 0..3 {
        assert_eq!(code(&[("tenant", "over")]).await, OK);
    }
    assert_eq!(code(&[("tenant", "over")]).await, OVER);
    assert_eq!(code(&[("tenant", "under")]).await, OK);
    let rss_before = server.rss_kib();

    // 1,100 calls of 64 distinct 4 KiB values each: 290 MB of counters if all were kept verbatim,
    // about 21 MB under their compact keys (some 300 bytes per counter).
    let padding = "v".repeat(4080);
    let mut flood_client = server.client().await;
    let mut refused_calls = 0;
    for call in 0..CALLS {
        let descriptors = (0..64)
            .map(|i| descriptor(&[("flood", &format!("{call:05}-{i:03}-{padding}"))]))
            .collect();
        let answer = flood_client
            .should_rate_limit(request("mem", descriptors))
            .await
            .expect("a flood call is answered");
        refused_calls += usize::from(answer.into_inner().overall_code == OVER);
    }
    let grown_mib = server.rss_kib().saturating_sub(rss_before) / 1024;
    let (_, metrics) = server.get("/metrics");
    let held = metric_value(&metrics, "slidegate_memory_store_bytes");
    let max = metric_value(&metrics, "slidegate_memory_store_max_bytes");
    let refused = metric_value(&metrics, "slidegate_memory_store_refused_total");
    eprintln!(
        "flood: {refused_calls} of {CALLS} calls refused, {held} bytes held of {max}, RSS +{grown_mib} MiB"
    );
    assert_eq!(max, 32.0 * 1024.0 * 1024.0);
    assert!(
        refused_calls > 100 && refused >= refused_calls as f64,
        "{refused_calls} calls refused\n{metrics}"
    );
    assert!(held < max + 1024.0 * 1024.0, "held {held} of {max}");
    assert!(
        grown_mib < 64,
        "RSS grew by {grown_mib} MiB under a 32 MiB budget"
    );

    assert!(
        server
            .log()
            .contains("memory store at its budget (--memory-max-bytes)"),
        "{}",
        server.log()
    );

    // The tenant over its limit stays over; the one under it is still served.
    assert_eq!(code(&[("tenant", "over")]).await, OVER);
    assert_eq!(code(&[("tenant", "under")]).await, OK);
}
