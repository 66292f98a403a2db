//! The Rate Limit Quota Service (RLQS) through a real Envoy and examples/envoy-rlqs.yaml:
//! Envoy sorts requests into buckets (`{user: <x-user-id>}`, else `{team: <x-team>}`), opens one
//! `StreamRateLimitQuotas` stream to slidegate's gRPC port, and enforces the token buckets
//! slidegate assigns. slidegate reads the filter's `domain` as a rule-file domain and a bucket
//! id's entries as a descriptor's.
//!
//! What Envoy 1.40 does (see the example's comments): a user bucket denies until its first
//! assignment arrives (`no_assignment_behavior: DENY_ALL`), so a new user's first request is a
//! 429 answered at once and the next ones, a round trip later, are decided by the assignment; a
//! team bucket lets requests through until then (`ALLOW_ALL`). Envoy reports every 5 s, keeps
//! its assignments while the stream is broken, and reopens the stream on its next report.
//!
//! The guarantee checked: one user is admitted at most the rule's N per window W (here 10 per
//! 10 s), over any stretch of W or less. The assertions leave room for timing (a debug build on
//! a busy machine), never for more than N.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::fixtures::{
    Envoy, Slidegate, Upstream, cluster_stat, example, get_with_raw_headers, read_example, rewrite,
    sleep_until, test_dir, try_http, write_config,
};
use crate::support::{envoy_program, free_port, metric_value};

/// The rule of every test: 10 requests per 10 s for each user; teams have no rule.
const RULES: &str = "\
domain: rlqs
descriptors:
  - key: user
    rate_limit: { unit: second, unit_multiplier: 10, requests_per_unit: 10 }
";

/// The rule's N (per window W = 10 s).
const LIMIT: usize = 10;

/// The pace of the steady requests: one every 100 ms, each waiting for its answer.
const PACE: Duration = Duration::from_millis(100);

/// Starts the upstream, slidegate on `RULES` (memory store) and Envoy with the example.
fn start(dir: &Path, envoy_bin: &Path) -> (Upstream, Slidegate, Envoy) {
    let config = write_config(dir, RULES);
    let upstream = Upstream::start();
    let slidegate = Slidegate::start(dir, &config, None, "sg");
    let envoy = rlqs_envoy(
        envoy_bin,
        dir,
        "envoy",
        slidegate.grpc_port,
        upstream.port,
        &[],
    );
    (upstream, slidegate, envoy)
}

/// Envoy with examples/envoy-rlqs.yaml, its ports rewritten to free ones, slidegate on
/// `grpc_port`, and the `extra` rewrites.
pub(crate) fn rlqs_envoy(
    program: &Path,
    dir: &Path,
    name: &str,
    grpc_port: u16,
    upstream: u16,
    extra: &[(&str, String)],
) -> Envoy {
    let port = free_port();
    let admin_port = free_port();
    let mut pairs = vec![
        ("port_value: 10000", format!("port_value: {port}")),
        ("port_value: 9901", format!("port_value: {admin_port}")),
        ("port_value: 8000", format!("port_value: {upstream}")),
        ("port_value: 8081", format!("port_value: {grpc_port}")),
    ];
    pairs.extend(extra.iter().cloned());
    let config = rewrite(&read_example("envoy-rlqs.yaml"), &pairs);
    Envoy::launch(program, dir, name, &config, port, admin_port)
}

/// One GET through Envoy: its status, 0 when the exchange failed.
pub(crate) fn get(port: u16, headers: &[(&str, &str)]) -> u16 {
    try_http(port, "GET", "/hello", headers, "").map_or(0, |r| r.status)
}

/// `count` GETs, one every [`PACE`] (each waiting for its answer): their statuses.
fn steady(port: u16, headers: &[(&str, &str)], count: u32) -> Vec<u16> {
    let start = Instant::now();
    (0..count)
        .map(|i| {
            sleep_until(start + PACE * i);
            get(port, headers)
        })
        .collect()
}

/// GETs one every [`PACE`] until one is allowed, for at most `within`: their statuses.
fn until_allowed(port: u16, headers: &[(&str, &str)], within: Duration) -> Vec<u16> {
    let deadline = Instant::now() + within;
    let mut statuses = Vec::new();
    while Instant::now() < deadline {
        let next = Instant::now() + PACE;
        statuses.push(get(port, headers));
        if statuses.last() == Some(&200) {
            break;
        }
        sleep_until(next);
    }
    statuses
}

fn allowed(statuses: &[u16]) -> usize {
    statuses.iter().filter(|s| **s == 200).count()
}

/// Every status is Envoy's allow (the upstream's 200) or the filter's 429: no failed exchange,
/// no 5xx.
pub(crate) fn assert_decided(what: &str, statuses: &[u16]) {
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{what}: only 200s and 429s expected: {statuses:?}"
    );
}

/// One user's requests, steadily over 4 s: the first is denied (no assignment yet), then the
/// assignment admits some and at most the rule's N. Another user has a bucket of their own.
#[test]
fn rlqs_one_users_limit_holds() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("rlqs_user_limit");
    let (_upstream, _slidegate, envoy) = start(&dir, &envoy_bin);

    let alice = steady(envoy.port, &[("x-user-id", "alice")], 40);
    assert_decided("alice", &alice);
    assert_eq!(
        alice[0], 429,
        "DENY_ALL until the first assignment: a new user's first request is denied at once: \
         {alice:?}"
    );
    let admitted = allowed(&alice);
    assert!(
        admitted >= 1,
        "the first assignment never arrived (or admits nothing): {alice:?}"
    );
    assert!(
        admitted <= LIMIT,
        "{admitted} of alice's requests admitted within 4 s, over the rule's {LIMIT} per 10 s: \
         {alice:?}"
    );

    // bob: his own bucket, with its own first denial and its own assignment.
    let bob = until_allowed(envoy.port, &[("x-user-id", "bob")], Duration::from_secs(5));
    assert_decided("bob", &bob);
    assert_eq!(bob.first(), Some(&429), "bob's first request: {bob:?}");
    assert_eq!(
        bob.last(),
        Some(&200),
        "bob has a bucket of his own, with quota although alice used hers: {bob:?}"
    );
}

/// A bucket that matches no rule (a team) gets ALLOW_ALL: every request passes, with the
/// example's ALLOW_ALL fallback and, once the assignment has arrived, with a DENY_ALL fallback
/// too (which shows that the pass comes from slidegate's assignment, and that the assignment
/// outlives Envoy's 5 s report).
#[test]
fn rlqs_bucket_without_a_rule_is_allowed() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("rlqs_no_rule");
    let (upstream, slidegate, envoy) = start(&dir, &envoy_bin);

    let blue = steady(envoy.port, &[("x-team", "blue")], 30);
    assert!(
        blue.iter().all(|s| *s == 200),
        "team blue matches no rule: {blue:?}"
    );
    // The requests were reported: Envoy opened its RLQS stream to slidegate.
    let clusters = envoy.admin("/clusters");
    let streams = cluster_stat(&clusters, "slidegate", slidegate.grpc_port, "rq_total");
    assert!(
        streams.is_some_and(|n| n >= 1),
        "no RLQS stream to slidegate ({streams:?}):\n{clusters}"
    );

    // The same with the team fallback turned to DENY_ALL: only the requests before the first
    // assignment are denied.
    let strict = rlqs_envoy(
        &envoy_bin,
        &dir,
        "envoy-strict",
        slidegate.grpc_port,
        upstream.port,
        &[(
            "fallback_rate_limit: { blanket_rule: ALLOW_ALL }",
            "fallback_rate_limit: { blanket_rule: DENY_ALL }".to_string(),
        )],
    );
    let red = [("x-team", "red")];
    let first = until_allowed(strict.port, &red, Duration::from_secs(5));
    assert_decided("team red before its assignment", &first);
    assert_eq!(
        first.last(),
        Some(&200),
        "no ALLOW_ALL assignment for team red: {first:?}"
    );
    // 6 s: across Envoy's next report.
    let red = steady(strict.port, &red, 60);
    assert!(
        red.iter().all(|s| *s == 200),
        "team red, after its ALLOW_ALL assignment: {red:?}"
    );
}

/// A user id that is not UTF-8 (a header's obs-text byte, which Envoy copies into the bucket id
/// as it is): slidegate reads the report holding it and answers its other buckets, so the stream
/// keeps serving them (a user who comes after, across Envoy's next full report, is assigned).
/// The bucket itself is not answered, since Envoy cannot read an answer naming it (its gRPC
/// client refuses the message and closes the stream): it keeps the example's `DENY_ALL`, and
/// slidegate counts it.
#[test]
fn rlqs_a_user_id_that_is_not_utf8_breaks_no_stream() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("rlqs_obs_text");
    let (_upstream, slidegate, envoy) = start(&dir, &envoy_bin);
    let bob = || get_with_raw_headers(envoy.port, "/hello", b"x-user-id: b\xf6b\r\n");

    // 6 s of b\xf6b, across Envoy's 5 s report: denied throughout (no assignment can reach it).
    let start = Instant::now();
    let bobs: Vec<u16> = (0..12)
        .map(|i| {
            sleep_until(start + PACE * 5 * i);
            bob()
        })
        .collect();
    assert!(bobs.iter().all(|s| *s == 429), "b\\xf6b: {bobs:?}");

    // The stream still answers the other buckets: a new user is assigned.
    let carol = until_allowed(
        envoy.port,
        &[("x-user-id", "carol")],
        Duration::from_secs(12),
    );
    assert_decided("carol", &carol);
    assert_eq!(
        carol.last(),
        Some(&200),
        "the stream stopped answering after a user id that is not UTF-8: {carol:?}"
    );
    let metrics = try_http(slidegate.admin_port, "GET", "/metrics", &[], "")
        .expect("metrics")
        .body;
    assert!(
        metric_value(
            &metrics,
            "slidegate_rlqs_buckets_refused_total{reason=\"not_utf8\"}"
        ) >= 1.0,
        "{metrics}"
    );
}

/// slidegate restarting: Envoy keeps enforcing the assignment it has while the stream is
/// broken, reopens the stream to the restarted slidegate (same port) on its next report, and
/// the user is still limited afterwards.
#[test]
fn rlqs_envoy_keeps_limiting_across_a_slidegate_restart() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("rlqs_restart");
    let (_upstream, mut slidegate, envoy) = start(&dir, &envoy_bin);
    let alice = [("x-user-id", "alice")];

    let first = until_allowed(envoy.port, &alice, Duration::from_secs(5));
    assert_eq!(
        first.last(),
        Some(&200),
        "alice's first assignment: {first:?}"
    );

    // slidegate gone: alice's token bucket stays in force (some pass, not all).
    slidegate.stop();
    let outage = steady(envoy.port, &alice, 15);
    assert_decided("alice while slidegate is down", &outage);
    assert!(
        allowed(&outage) >= 1,
        "Envoy dropped alice's assignment when the stream broke: {outage:?}"
    );
    assert!(
        allowed(&outage) < outage.len(),
        "alice unlimited while slidegate is down: {outage:?}"
    );

    // Back on the same port: a new user's bucket gets its assignment once Envoy has reopened
    // the stream (on its next report, within 5 s).
    slidegate.restart(&dir, "sg-restarted");
    let carol = until_allowed(
        envoy.port,
        &[("x-user-id", "carol")],
        Duration::from_secs(15),
    );
    assert_decided("carol", &carol);
    assert_eq!(
        carol.last(),
        Some(&200),
        "Envoy did not reopen its RLQS stream to the restarted slidegate: {carol:?}"
    );

    // alice is still limited: some of her requests pass, not all.
    let after = steady(envoy.port, &alice, 30);
    assert_decided("alice after the restart", &after);
    let admitted = allowed(&after);
    assert!(
        admitted >= 1,
        "alice gets nothing after the restart: {after:?}"
    );
    assert!(
        admitted < after.len(),
        "alice unlimited after the restart: {after:?}"
    );
}

#[test]
fn envoy_rlqs_example_is_valid() {
    let Some(envoy) = envoy_program() else { return };
    let out = std::process::Command::new(envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(example("envoy-rlqs.yaml"))
        .output()
        .expect("run envoy");
    assert!(
        out.status.success(),
        "envoy --mode validate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
