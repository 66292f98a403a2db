//! What the operator sees: `/rlconfig` listing every rule, `/metrics` matching the calls made
//! (checked by promtool), reloads counted in the metrics, and the operator listener
//! (`--admin-addr`) keeping metrics and rules off the data port.

use std::time::Duration;

use crate::service_fixture::{RULE_COUNT, RULES, Server, get_text_blocking, limit};
use crate::support::{Slidegate, call, descriptor, promtool_check_metrics, request, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlconfig_lists_every_rule() {
    let server = Server::start(&[]);
    let r = server.get("/rlconfig").await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), RULE_COUNT, "{text}");
    // The header says the served files are the ones on disk.
    assert!(text.starts_with("# loaded_at: "), "{text}");
    assert!(text.contains("\n# stale: false\n"), "{text}");
    let line = |path: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("test {path}:")))
            .copied()
            .unwrap_or_else(|| panic!("no rule {path} in\n{text}"))
    };
    assert!(line("user").contains("3 per MINUTE") && line("user").contains("name=per_user"));
    assert!(line("window").contains("10 per 30 SECOND (window 30s, exact)"));
    assert!(line("free").contains("unlimited"));
    assert!(line("shadow").contains("shadow_mode"));
    assert!(line("specific").contains("replaces=general"));
    assert!(line("two").contains("2 per SECOND") && line("two").contains("5 per MINUTE"));
    assert!(
        line("user").contains("rules.yaml"),
        "the source file is shown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_calls_made() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("user", "m")])]);
    for _ in 0..4 {
        call(&mut client, req.clone()).await; // 3 allowed, 1 denied
    }
    call(
        &mut client,
        request("unknown", vec![descriptor(&[("user", "m")])]),
    )
    .await;
    call(
        &mut client,
        request("test", vec![descriptor(&[("nothing", "m")])]),
    )
    .await;
    let mut hits = request("test", vec![descriptor(&[("window", "m")])]);
    hits.hits_addend = 4;
    call(&mut client, hits).await;
    let body = r#"{"domain":"test","descriptors":[{"entries":[{"key":"free","value":"m"}]}]}"#;
    let http = reqwest::Client::new();
    let r = http
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("json");
    assert_eq!(r.status(), 200);
    for _ in 0..2 {
        let r = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "test")
            .header("x-ratelimit-descriptor", "shadow=m")
            .send()
            .await
            .expect("check");
        assert_eq!(r.status(), 200);
    }

    let m = server.metrics().await;
    let d = |decision: &str, rule: &str| {
        m.get(&format!(
            r#"slidegate_decisions_total{{decision="{decision}",domain="test",rule="{rule}"}}"#
        ))
    };
    assert_eq!(d("allowed", "per_user"), 3.0);
    assert_eq!(d("denied", "per_user"), 1.0);
    assert_eq!(d("allowed", "window"), 1.0);
    assert_eq!(d("allowed", "free"), 1.0);
    assert_eq!(d("allowed", "shadow"), 1.0);
    assert_eq!(d("shadow_denied", "shadow"), 1.0);
    assert_eq!(
        m.get(r#"slidegate_hits_total{decision="allowed",domain="test",rule="window"}"#),
        4.0
    );
    assert_eq!(
        m.get(r#"slidegate_hits_total{decision="denied",domain="test",rule="per_user"}"#),
        1.0
    );
    // 3 of 3 used is over 80 %; 4 of 10 is not.
    assert_eq!(
        m.get(r#"slidegate_near_limit_total{domain="test",rule="per_user"}"#),
        1.0
    );
    assert_eq!(
        m.get(r#"slidegate_near_limit_total{domain="test",rule="window"}"#),
        0.0
    );
    assert_eq!(
        m.get(r#"slidegate_unknown_domain_total{domain="unknown"}"#),
        1.0
    );
    assert_eq!(m.get(r#"slidegate_no_rule_total{domain="test"}"#), 1.0);
    assert_eq!(
        m.sum(
            "slidegate_request_duration_seconds_count",
            r#"transport="grpc""#
        ),
        7.0
    );
    assert_eq!(
        m.sum(
            "slidegate_request_duration_seconds_count",
            r#"transport="json""#
        ),
        1.0
    );
    // By code: the fourth call on `user` was denied; nothing was malformed, the store never failed.
    let by_code = |code: &str| {
        m.sum(
            "slidegate_request_duration_seconds_count",
            &format!("code=\"{code}\""),
        )
    };
    assert_eq!(by_code("OVER_LIMIT"), 1.0);
    assert_eq!(by_code("OK"), 9.0);
    assert_eq!(by_code("INVALID_ARGUMENT") + by_code("UNAVAILABLE"), 0.0);
    assert_eq!(
        m.sum(
            "slidegate_request_duration_seconds_count",
            r#"transport="check""#
        ),
        2.0
    );
    // Store calls: 4 (user) + 1 (window) + 2 (shadow); none for unknown, no-rule and unlimited.
    assert_eq!(m.get("slidegate_store_duration_seconds_count"), 7.0);
    assert_eq!(
        m.get(r#"slidegate_store_errors_total{kind="timeout"}"#),
        0.0
    );
    assert_eq!(m.get(r#"slidegate_failure_mode_total{mode="error"}"#), 0.0);
    assert_eq!(m.get("slidegate_rules_loaded"), RULE_COUNT as f64);
    assert_eq!(
        m.get(r#"slidegate_config_reloads_total{result="success"}"#),
        0.0
    );
    assert_eq!(
        m.get(&format!(
            r#"slidegate_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        )),
        1.0
    );
    assert!(m.0.contains("# HELP slidegate_decisions_total"));
    assert!(m.0.contains("# TYPE slidegate_request_duration_seconds histogram"));

    promtool_check_metrics(server.dir.path(), &m.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_update_rules_and_metrics() {
    let server = Server::start(&[]);
    let extra =
        format!("{RULES}  - key: added\n    rate_limit: {{ unit: hour, requests_per_unit: 1 }}\n");
    std::fs::write(server.rules_file(), extra).expect("rewrite rules");
    let reloaded = wait_until(Duration::from_secs(10), || {
        let text = get_text_blocking(&server.url("/metrics"));
        text.contains("slidegate_config_reloads_total{result=\"success\"} 1")
    });
    assert!(reloaded, "no reload seen; log:\n{}", server.log());
    let m = server.metrics().await;
    assert_eq!(m.get("slidegate_rules_loaded"), (RULE_COUNT + 1) as f64);
    let text = server.get("/rlconfig").await.text().await.expect("body");
    assert!(text.contains("test added: 1 per HOUR"), "{text}");
    let mut client = server.client().await;
    let r = call(
        &mut client,
        request("test", vec![descriptor(&[("added", "x")])]),
    )
    .await;
    assert_eq!(limit(&r.statuses[0]), Some((String::new(), 1, Unit::Hour)));

    // A bad file: counted as a failure, the previous rules stay.
    std::fs::write(server.rules_file(), "domain: test\ndescriptors: [{ key: x, rate_limit: { unit: fortnight, requests_per_unit: 1 } }]\n")
        .expect("rewrite rules");
    let failed = wait_until(Duration::from_secs(10), || {
        get_text_blocking(&server.url("/metrics"))
            .contains("slidegate_config_reloads_total{result=\"failure\"} 1")
    });
    assert!(failed, "no failed reload seen; log:\n{}", server.log());
    let m = server.metrics().await;
    assert_eq!(m.get("slidegate_rules_loaded"), (RULE_COUNT + 1) as f64);
    assert_eq!(server.get("/healthcheck").await.status(), 200);
}

/// The rules and the metrics are served only on the operator listener (`--admin-addr`): a
/// client of the HTTP port reaches `/json`, `/check` and `/healthcheck`, and gets 404 for
/// `/metrics` and `/rlconfig`; the operator listener serves those (and `/healthcheck`) and
/// nothing that spends quota.
#[test]
fn the_operator_listener_keeps_metrics_and_rules_off_the_data_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let server = Slidegate::start(&rules, &[]);
    let admin = |path: &str| crate::support::http_get(server.admin_port, path);
    let data = |path: &str| crate::support::http_get(server.http_port, path);
    assert!(
        wait_until(Duration::from_secs(10), || admin("/healthcheck").0 == 200),
        "operator listener: {}",
        server.log()
    );
    let (status, metrics) = admin("/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("slidegate_build_info"), "{metrics}");
    assert_eq!(admin("/rlconfig").0, 200);
    assert_eq!(
        admin("/check").0,
        404,
        "the operator listener spends no quota"
    );
    assert_eq!(data("/metrics").0, 404, "metrics on the data port");
    assert_eq!(data("/rlconfig").0, 404, "rules on the data port");
    assert_eq!(data("/healthcheck").0, 200);
    assert_ne!(data("/check").0, 404, "/check on the data port");
}
