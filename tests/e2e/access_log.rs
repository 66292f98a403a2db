//! Envoy's access log as examples/envoy.yaml writes it: with `--response-metadata`, slidegate's
//! answers carry the deciding rule in their dynamic metadata, which Envoy keeps under
//! `envoy.filters.http.ratelimit`, so each request's line names the rule that admitted or denied
//! it, with the code and what remains. Without the flag the fields print Envoy's `-`.
//!
//! Through the real Envoy and the example's descriptors: `x-user-id` and the path make the
//! descriptor `[user_id, path]`, `x-api-key` the descriptor `[api_key]`. The requests for one
//! user differ only in their query string, which the rule's path leaves out (one counter) and the
//! log line keeps (one line per request).

use std::collections::HashMap;
use std::path::Path;

use crate::fixtures::{Envoy, Slidegate, Upstream, http_get, test_dir, write_config};
use crate::support::envoy_program;

const RULES: &str = "\
domain: edge
descriptors:
  - key: user_id
    descriptors:
      - key: path
        rate_limit: { name: per_user, unit: minute, requests_per_unit: 2 }
  - key: api_key
    rate_limit: { name: per_key, unit: minute, requests_per_unit: 100 }
";

/// Alice's `/hello?n=1`, `/hello?n=2`, ... through `envoy` until a 429 (at most 5); the
/// statuses.
fn alice_until_denied(envoy: &Envoy) -> Vec<u16> {
    let mut statuses = Vec::new();
    for n in 1..=5 {
        let r = http_get(
            envoy.port,
            &format!("/hello?n={n}"),
            &[("x-user-id", "alice")],
        );
        statuses.push(r.status);
        if r.status == 429 {
            break;
        }
    }
    statuses
}

/// The line's `name=value` words after the request (`rule`, `code`, `remaining`).
fn fields(line: &str) -> HashMap<&str, &str> {
    let after_request = line.rsplit_once('"').map_or(line, |(_, rest)| rest);
    after_request
        .split_whitespace()
        .filter_map(|word| word.split_once('='))
        .collect()
}

/// Asserts the line's rule, code and remaining.
fn assert_decision(line: &str, rule: &str, code: &str, remaining: &str) {
    let fields = fields(line);
    let got = ["rule", "code", "remaining"].map(|k| fields.get(k).copied().unwrap_or("(none)"));
    assert_eq!(got, [rule, code, remaining], "access-log line: {line}");
}

/// Starts the demo upstream, slidegate on `RULES` with `flags`, and Envoy (examples/envoy.yaml).
fn start(dir: &Path, envoy_bin: &Path, flags: &[&str]) -> (Upstream, Slidegate, Envoy) {
    let config = write_config(dir, RULES);
    let upstream = Upstream::start();
    let slidegate = Slidegate::start_with_flags(dir, &config, "sg", flags);
    let envoy = Envoy::start(envoy_bin, dir, &[slidegate.grpc_port], upstream.port);
    (upstream, slidegate, envoy)
}

/// The 429's line names the rule that denied it and the 200s' lines the rule that admitted them.
#[test]
fn envoy_access_log_names_the_rule_that_decided() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("envoy_access_log");
    let (_upstream, _slidegate, envoy) = start(&dir, &envoy_bin, &["--response-metadata"]);

    assert_eq!(alice_until_denied(&envoy), [200, 200, 429]);
    let key = http_get(envoy.port, "/key", &[("x-api-key", "k1")]);
    assert_eq!(key.status, 200, "{key:?}");

    let denied = envoy.access_log_line("GET", "/hello?n=3");
    println!("429: {denied}");
    assert!(denied.contains("\" 429 RL "), "{denied}");
    assert_decision(&denied, "per_user", "OVER_LIMIT", "0");

    let first = envoy.access_log_line("GET", "/hello?n=1");
    println!("200: {first}");
    assert!(first.contains("\" 200 - "), "{first}");
    assert_decision(&first, "per_user", "OK", "1");
    let second = envoy.access_log_line("GET", "/hello?n=2");
    assert_decision(&second, "per_user", "OK", "0");
    // Another rule admits another descriptor, under its own name.
    let key = envoy.access_log_line("GET", "/key");
    println!("200: {key}");
    assert_decision(&key, "per_key", "OK", "99");
}

/// Without `--response-metadata` the answers carry no metadata: the same decisions, and the
/// fields print `-`.
#[test]
fn envoy_access_log_prints_dashes_without_response_metadata() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("envoy_access_log_without_metadata");
    let (_upstream, _slidegate, envoy) = start(&dir, &envoy_bin, &[]);

    assert_eq!(alice_until_denied(&envoy), [200, 200, 429]);
    let denied = envoy.access_log_line("GET", "/hello?n=3");
    assert!(denied.contains("\" 429 RL "), "{denied}");
    assert_decision(&denied, "-", "-", "-");
    let allowed = envoy.access_log_line("GET", "/hello?n=1");
    assert!(allowed.contains("\" 200 - "), "{allowed}");
    assert_decision(&allowed, "-", "-", "-");
}
