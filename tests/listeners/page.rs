//! The operator page (`GET /` on the operator listener) in a real browser: headless Chromium
//! against the binary, after traffic that denies one key, shows the rule and the key, answers the
//! explain form, and asks nothing of any other address. Also: the rules read without JavaScript,
//! the page's policy forbids other origins, and the data ports do not serve it.

use std::path::Path;
use std::process::Command;

use crate::support::{Slidegate, require_program};

const RULES: &str = "domain: pg
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 2 }
  - key: plan
    value: free
    shadow_mode: true
    rate_limit: { name: free_plan, unit: hour, requests_per_unit: 10 }
";

/// Chromium's DOM of `url` once its scripts ran for a few (virtual) seconds, and every request
/// it made ([`requests`]).
fn render(chromium: &Path, url: &str, dir: &Path) -> (String, Vec<(String, String)>) {
    let net_log = dir.join("net-log.json");
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--log-net-log={}", net_log.display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("</html>"),
        "chromium rendered nothing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dom, requests(&net_log))
}

/// The requests of a Chromium net log as (initiator, URL): the initiator is the page's origin
/// for what a page asked, "not an origin" for the browser's own (updates, time, sync).
fn requests(net_log: &Path) -> Vec<(String, String)> {
    let log: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(net_log).unwrap_or_default())
            .unwrap_or_default();
    let start_job = &log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"];
    let events = log["events"].as_array().cloned().unwrap_or_default();
    events
        .iter()
        .filter(|e| e["type"] == *start_job)
        .map(|e| {
            let field = |name: &str| e["params"][name].as_str().unwrap_or_default().to_owned();
            (field("initiator"), field("url"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_rule_and_the_limited_key_and_explains_in_a_real_browser() {
    let Some(chromium) = require_program("chromium") else {
        return;
    };
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &[]);
    let mallory =
        r#"{"domain":"pg","descriptors":[{"entries":[{"key":"user","value":"mallory"}]}]}"#;
    for _ in 0..4 {
        server.post_json(mallory).await;
    }
    // Over the shadow rule's 10 an hour: shadow-denied, drawn as a line of its own.
    let free = r#"{"domain":"pg","descriptors":[{"entries":[{"key":"plan","value":"free"}]}]}"#;
    for _ in 0..12 {
        server.post_json(free).await;
    }
    let status_url = format!("http://127.0.0.1:{}/status.json", server.admin_port);
    let mut status = serde_json::Value::Null;
    for _ in 0..40 {
        status = reqwest::get(&status_url)
            .await
            .expect("GET /status.json")
            .json()
            .await
            .expect("JSON");
        // A sample every 5 s: the decisions show in the next one.
        let samples = status["history"]["samples"].as_array().cloned();
        let shadow_denied: u64 = (samples.unwrap_or_default().iter())
            .flat_map(|s| s["decisions"].as_array().cloned().unwrap_or_default())
            .map(|d| d["shadowDenied"].as_u64().unwrap_or(0))
            .sum();
        if shadow_denied >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let served = status["config"]["servedChecksum"]
        .as_str()
        .expect("the served checksum")
        .to_owned();

    // Without JavaScript: the rules are in the HTML, under a policy that forbids other origins.
    let page = format!("http://127.0.0.1:{}/", server.admin_port);
    let response = reqwest::get(&page).await.expect("GET /");
    let policy = response.headers()["content-security-policy"]
        .to_str()
        .unwrap_or_default()
        .to_owned();
    assert!(policy.starts_with("default-src 'self'"), "{policy}");
    let html = response.text().await.expect("HTML");
    for shown in [
        "per_user",
        "free_plan",
        "shadow",
        "memory",
        "rules.yaml",
        &served[..12],
    ] {
        assert!(html.contains(shown), "{shown} is not in the page: {html}");
    }
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "{html}"
    );
    let data = format!("http://127.0.0.1:{}/", server.http_port);
    assert_eq!(
        reqwest::get(&data).await.expect("GET").status().as_u16(),
        404
    );

    // In the browser: the list of who is limited, and the explain form asked through the link.
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("{page}#explain=pg&entries=user=mallory");
    let (dom, urls) = render(&chromium, &url, dir.path());
    let limited = dom
        .split("id=\"limited-rows\"")
        .nth(1)
        .and_then(|rest| rest.split("</tbody>").next())
        .unwrap_or_default();
    assert!(
        limited.contains("user=mallory") && limited.contains("per_user"),
        "the limited key is not listed: {dom}"
    );
    let answer = dom
        .split("id=\"explain-answer\"")
        .nth(1)
        .unwrap_or_default();
    assert!(
        answer.contains("OVER_LIMIT · limited · rule per_user · 2 of 2 per 1m held"),
        "the explain form did not answer: {dom}"
    );
    let free_plan = (dom.split("<tr>"))
        .find(|row| row.contains("free_plan"))
        .and_then(|row| row.split("</tr>").next())
        .unwrap_or_default();
    assert!(
        free_plan.contains("class=\"shadow\"") && free_plan.contains("2 shadow-denied"),
        "shadow denies are not drawn: {free_plan}"
    );
    let origin = format!("http://127.0.0.1:{}", server.admin_port);
    let asked: Vec<&String> = urls
        .iter()
        .filter(|(initiator, _)| *initiator == origin)
        .map(|(_, url)| url)
        .collect();
    assert!(
        asked.iter().any(|u| u.ends_with("/status.json"))
            && asked.iter().any(|u| u.ends_with("/limited"))
            && asked.iter().any(|u| u.ends_with("/explain")),
        "the page did not ask its endpoints: {urls:?}"
    );
    for url in &asked {
        assert!(
            url.starts_with(&format!("{origin}/")),
            "the page asked another address: {url}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_counts_the_decisions_of_each_rule_and_names_a_refused_reload() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &[]);
    let (code, _) = server.get("/status.json");
    assert_eq!(code, 404, "/status.json belongs to the operator listener");
    let url = format!("http://127.0.0.1:{}/status.json", server.admin_port);
    let status = || async {
        let answer = reqwest::get(&url).await.expect("GET /status.json");
        answer.json::<serde_json::Value>().await.expect("JSON")
    };
    let mallory =
        r#"{"domain":"pg","descriptors":[{"entries":[{"key":"user","value":"mallory"}]}]}"#;
    for _ in 0..5 {
        server.post_json(mallory).await;
    }
    // A sample every 5 s: the decisions show in the next one.
    let started = std::time::Instant::now();
    loop {
        let answer = status().await;
        let samples = answer["history"]["samples"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let counted = samples
            .iter()
            .flat_map(|s| s["decisions"].as_array().cloned().unwrap_or_default());
        let (allowed, denied) =
            counted
                .filter(|d| d["rule"] == "per_user")
                .fold((0, 0), |(a, d), x| {
                    (
                        a + x["allowed"].as_u64().unwrap_or(0),
                        d + x["denied"].as_u64().unwrap_or(0),
                    )
                });
        if (allowed, denied) == (2, 3) {
            assert_eq!(answer["store"]["kind"], "memory");
            assert_eq!(answer["config"]["stale"], false);
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "per_user: {allowed} allowed, {denied} denied in {answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    // A refused reload: the page names why, and that the files on disk are not served.
    std::fs::write(
        rules.path().join("rules.yaml"),
        "domain: pg\ndescriptors: [oops\n",
    )
    .expect("write bad rules");
    let started = std::time::Instant::now();
    loop {
        let answer = status().await;
        if answer["config"]["stale"] == true {
            let error = answer["config"]["lastError"].as_str().unwrap_or_default();
            assert!(error.contains("rules.yaml"), "{answer}");
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{answer}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
