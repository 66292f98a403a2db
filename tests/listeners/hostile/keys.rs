//! Key and label injection, memory under a million client keys, and secrets that never leak.

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{
    RedisServer, Slidegate, call, descriptor, promtool_check_metrics, rss_kib, wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use slidegate::metrics::{MAX_RULE_LABELS, OVERFLOW_RULE};
use slidegate::store::{Counter, CounterKey, ManualClock, MemoryStore, Precision};
use tonic::transport::Channel;

use super::{Rules, request};

// ---------------------------------------------------------------------------------------------
// Key injection

/// Descriptor values built to collide with another counter's Redis key (the separators `:` `=`
/// `%`, hash-tag braces, newlines, glob characters, the prefix itself), against a real Redis.
///
/// Proves: every descriptor gets its own counter (each allows exactly its limit of 2, then
/// denies), Redis holds exactly one key per descriptor under the prefix, each with its own 2 hits,
/// and every key's hash tag is intact (one `{`, one `}`, nothing raw from the values).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_values_cannot_reach_another_counter() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new();
    let server = Slidegate::start(
        rules.path(),
        &[
            "--redis-url",
            &redis.url(),
            "--redis-prefix",
            "sg:",
            "--redis-timeout",
            "2s",
        ],
    );
    assert!(wait_until(Duration::from_secs(10), || server
        .get("/healthcheck")
        .0
        == 200));
    let sets: Vec<Vec<(&str, &str)>> = vec![
        vec![("k", "a:k2=b")],
        vec![("k", "a"), ("k2", "b")],
        vec![("k", "a"), ("k2", "b:k3=c")],
        vec![("k", "a=b")],
        vec![("k", "a"), ("k2", "=b")],
        vec![("k", "a}60000")],
        vec![("k", "a}60000{")],
        vec![("k", "{hostile:k=x}")],
        vec![("k", "x")],
        vec![("k", "x}60000")],
        vec![("k", "sg:{hostile:k=x}60000")],
        vec![("k", "%3A")],
        vec![("k", ":")],
        vec![("k", "%")],
        vec![("k", "%25")],
        vec![("k", "a\nb")],
        vec![("k", "a\r\nb")],
        vec![("k", "a b")],
        vec![("k", "a\u{0}b")],
        vec![("k", "*")],
        vec![("k", "?")],
        vec![("k", "[a]")],
        vec![("k", "ü")],
        vec![("k", "%C3%BC")],
        vec![("k", "")],
    ];
    let mut client = server.client().await;
    for round in 0..3 {
        for set in &sets {
            let r = call(&mut client, request(vec![descriptor(set)])).await;
            let status = &r.statuses[0];
            if round < 2 {
                assert_eq!(
                    r.overall_code(),
                    Code::Ok,
                    "{set:?} round {round}: shares a counter"
                );
                assert_eq!(status.limit_remaining, 1 - round, "{set:?}");
            } else {
                assert_eq!(r.overall_code(), Code::OverLimit, "{set:?}");
            }
        }
    }
    // Counter keys: not the notice board where the server posts who it denies (`GET /limited`),
    // nor the node's clock.
    let keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", "*"])
        .lines()
        .filter(|key| !key.starts_with("sg:board:") && *key != "sg:clock")
        .map(str::to_string)
        .collect();
    let unique: BTreeSet<&String> = keys.iter().collect();
    assert_eq!(unique.len(), sets.len(), "{keys:#?}");
    for key in &unique {
        assert!(key.starts_with("sg:{hostile:k="), "{key:?}");
        assert_eq!(key.matches('{').count(), 1, "{key:?}");
        assert_eq!(key.matches('}').count(), 1, "{key:?}");
        assert!(!key.contains(['\n', '\r', ' ', '\0']), "{key:?}");
        assert_eq!(redis.cli(&["ZCARD", key]), "2", "{key:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Metric labels

/// Values end up in metric labels only for `detailed_metric` rules. Values with `"`, `\`,
/// newlines, braces and non-ASCII still give a valid exposition (`promtool check metrics`); 2 000
/// distinct values on a plain rule give one label set; 10 100 distinct values on a detailed rule
/// are capped at MAX_RULE_LABELS label sets, the rest counted under `rule="overflow"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_labels_are_escaped_and_bounded() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let mut client = server.client().await;
    let nasty = [
        "a\"b",
        "c\\d",
        "e\nf",
        "g}h",
        "i{j",
        "k=l,m",
        "ü",
        "\u{7f}",
        "sp ace",
        "\\n",
        "\"",
        "",
        "# HELP x",
        "x 1\nfake_metric 2",
    ];
    for value in nasty {
        call(
            &mut client,
            request(vec![descriptor(&[("detailed", value)])]),
        )
        .await;
        call(&mut client, request(vec![descriptor(&[("plain", value)])])).await;
    }
    let (_, text) = server.get("/metrics");
    assert!(!text.contains("\nfake_metric"), "a value injected a line");
    promtool_check_metrics(server.dir.path(), &text);
    let labels_before = text
        .lines()
        .filter(|l| l.starts_with("slidegate_near_limit_total{"))
        .count();

    for batch in 0..(2000 / 50) {
        let descriptors = (0..50)
            .map(|i| descriptor(&[("plain", &format!("p{batch}-{i}"))]))
            .collect();
        call(&mut client, request(descriptors)).await;
    }
    for batch in 0..(10_100 / 50) {
        let descriptors = (0..50)
            .map(|i| descriptor(&[("detailed", &format!("d{batch}-{i}"))]))
            .collect();
        call(&mut client, request(descriptors)).await;
    }
    let (_, text) = server.get("/metrics");
    let rules_of = |family: &str| -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for line in text.lines().filter(|l| l.starts_with(family)) {
            if let Some(rule) = line
                .split("rule=\"")
                .nth(1)
                .and_then(|r| r.split("\"}").next())
            {
                *out.entry(rule.to_string()).or_default() += 1;
            }
        }
        out
    };
    let decisions = rules_of("slidegate_decisions_total{");
    assert_eq!(
        decisions.get("plain"),
        Some(&3),
        "one label set (3 decisions) for the plain rule"
    );
    assert!(
        !decisions.keys().any(|r| r.starts_with("p0-")),
        "a plain value leaked into a label"
    );
    let detailed = decisions
        .keys()
        .filter(|r| r.starts_with("detailed"))
        .count();
    eprintln!("{} rule labels; {detailed} detailed", decisions.len());
    assert!(
        decisions.len() <= MAX_RULE_LABELS + 1,
        "{}",
        decisions.len()
    );
    assert!(decisions.contains_key(OVERFLOW_RULE));
    let overflow = text
        .lines()
        .find(|l| l.starts_with(&format!(r#"slidegate_decisions_total{{decision="allowed",domain="hostile",rule="{OVERFLOW_RULE}"}}"#)))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    // Every (domain, rule) pair seen before the cap keeps its series; the rest share one.
    assert_eq!(
        overflow,
        (10_100 + labels_before - MAX_RULE_LABELS) as f64,
        "{labels_before} label sets before"
    );
    promtool_check_metrics(server.dir.path(), &text);
}

// ---------------------------------------------------------------------------------------------
// Memory

/// A million distinct client keys through the memory store (driven in-process with a manual
/// clock: a million gRPC calls would take minutes in a debug build), a 1 s window. While their
/// windows last the store holds them all; once the clock passes the window, the sweeper task the
/// binary runs (here every 20 ms) brings the store back to its empty size: idle memory returns to
/// the baseline, measured by the store's own accounting.
#[test]
fn a_million_client_keys_are_swept_once_idle() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let clock = Arc::new(ManualClock::new(Duration::from_secs(1_700_000_000)));
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let empty = store.stats();
    let window = Duration::from_secs(1);
    let started = Instant::now();
    for i in 0..1_000_000u32 {
        let counter = Counter {
            key: CounterKey::new("hostile", [("client", i.to_string().as_str())], window),
            limit: 10,
            window,
            hits: 1,
            shadow: false,
            precision: Precision::Exact,
            kind: slidegate::store::HitKind::Admitted,
        };
        assert!(store.decide_now(&[counter]).allowed);
        if i % 1000 == 0 {
            clock.advance(Duration::from_micros(100));
        }
    }
    let full = store.stats();
    eprintln!(
        "1 000 000 keys in {:?}: {full:?} ({} bytes per key); process RSS {:?} KiB",
        started.elapsed(),
        full.heap_bytes / 1_000_000,
        rss_kib(std::process::id())
    );
    assert_eq!(full.counters, 1_000_000);
    assert!(full.heap_bytes > 50_000_000);

    clock.advance(window);
    let _sweeper = {
        let _guard = runtime.enter();
        store.spawn_sweeper(Duration::from_millis(20))
    };
    let swept = wait_until(Duration::from_secs(30), || store.stats().counters == 0);
    let idle = store.stats();
    eprintln!(
        "idle: {idle:?} (empty store: {empty:?}); process RSS {:?} KiB",
        rss_kib(std::process::id())
    );
    assert!(swept, "{idle:?}");
    assert_eq!(idle.hits, 0);
    assert!(
        idle.heap_bytes <= empty.heap_bytes + 64 * 1024,
        "idle {idle:?} vs empty {empty:?}"
    );
}

/// Over the wire: two waves of 100 000 distinct keys each (50 descriptors per call) on a rule with
/// a 1 s window, separated by an idle period in which the binary's sweeper (every 30 s) drops the
/// expired counters.
///
/// Proves: the first wave's counters are released when idle: the second wave of new keys reuses
/// that memory instead of adding to it (without the sweep it would add as much again). The
/// allocator (mimalloc) keeps freed pages for reuse, so resident memory need not fall to the
/// baseline (with `MIMALLOC_PURGE_DELAY=0` about half the growth went back to the OS); the memory
/// store's own accounting returning to empty is shown in-process above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_over_the_wire_are_released_when_idle() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let started = Instant::now();
    let mut client = server.client().await;
    call(
        &mut client,
        request(vec![descriptor(&[("window", "warm")])]),
    )
    .await;
    let baseline = server.rss_kib();
    let keys = 100_000;
    let wave = |client: RateLimitServiceClient<Channel>, name: &'static str| async move {
        let mut client = client;
        for batch in 0..keys / 50 {
            let descriptors = (0..50)
                .map(|i| descriptor(&[("window", &format!("{name}-{batch}-{i}"))]))
                .collect();
            call(&mut client, request(descriptors)).await;
        }
        client
    };
    let client = wave(client, "first").await;
    let peak = server.rss_kib();
    let grew = peak.saturating_sub(baseline);
    eprintln!("RSS {baseline} KiB at start, {peak} KiB after {keys} keys");
    assert!(grew > 5 * 1024, "{keys} keys took only {grew} KiB");
    // The sweeper's first tick comes 30 s after start; the windows ended long before.
    let tick = Duration::from_secs(32);
    if started.elapsed() < tick {
        tokio::time::sleep(tick - started.elapsed()).await;
    }
    let idle = server.rss_kib();
    let _client = wave(client, "second").await;
    let second = server.rss_kib();
    eprintln!("RSS {idle} KiB when idle, {second} KiB after {keys} new keys");
    assert!(
        second < peak + grew / 3,
        "the second wave added to the first: {second} KiB (first peak {peak} KiB, growth {grew} KiB)"
    );
}

// ---------------------------------------------------------------------------------------------
// Secrets

/// A Redis password (`--requirepass`), given in the URL, and a wrong one: neither appears in
/// slidegate's stderr at debug level (text and JSON logs), in `/rlconfig`, in `/metrics`, or in the
/// errors returned to clients over gRPC, `/json` and `/check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_passwords_never_leak() {
    let Some(redis) = RedisServer::start_with(&["--requirepass", "s3cret-pw"]) else {
        return;
    };
    let rules = Rules::new();
    let right = format!("redis://:s3cret-pw@127.0.0.1:{}", redis.port);
    let wrong = format!("redis://:wr0ng-pw-zz@127.0.0.1:{}", redis.port);
    let secrets = ["s3cret-pw", "wr0ng-pw-zz"];
    let good = Slidegate::start(
        rules.path(),
        &[
            "--redis-url",
            &right,
            "--log-level",
            "debug",
            "--redis-timeout",
            "2s",
        ],
    );
    let bad = Slidegate::start(
        rules.path(),
        &[
            "--redis-url",
            &wrong,
            "--log-level",
            "debug",
            "--log-format",
            "json",
        ],
    );
    let bad_cluster = Slidegate::start(
        rules.path(),
        &["--redis-cluster", &wrong, "--log-level", "trace"],
    );
    assert!(
        wait_until(Duration::from_secs(10), || good.get("/healthcheck").0
            == 200),
        "{}",
        good.log()
    );
    let mut c = good.client().await;
    let r = call(&mut c, request(vec![descriptor(&[("plain", "s")])])).await;
    assert_eq!(r.statuses[0].limit_remaining, 999, "served from Redis");

    let http = reqwest::Client::new();
    let mut seen = String::new();
    for server in [&bad, &bad_cluster] {
        let mut c = server.client().await;
        let status = c
            .should_rate_limit(request(vec![descriptor(&[("plain", "s")])]))
            .await
            .expect_err("wrong password");
        assert_eq!(status.code(), tonic::Code::Unavailable);
        seen.push_str(status.message());
        let json = http
            .post(server.url("/json"))
            .body(
                r#"{"domain":"hostile","descriptors":[{"entries":[{"key":"plain","value":"s"}]}]}"#,
            )
            .send()
            .await
            .expect("json");
        assert_eq!(json.status(), 503);
        seen.push_str(&json.text().await.expect("body"));
        let check = http
            .get(server.url("/check"))
            .header("x-ratelimit-domain", "hostile")
            .header("x-ratelimit-descriptor", "plain=s")
            .send()
            .await
            .expect("check");
        assert_eq!(check.status(), 503);
        seen.push_str(&check.text().await.expect("body"));
    }
    eprintln!("errors returned to clients: {seen}");
    assert!(seen.contains("store"), "{seen}");
    // Give the health checkers time to log their failures too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for server in [&good, &bad, &bad_cluster] {
        for path in ["/rlconfig", "/metrics", "/healthcheck"] {
            seen.push_str(&server.get(path).1);
        }
        seen.push_str(&server.log());
    }
    assert!(
        bad.log().contains("WARN") || bad.log().contains("\"level\":\"WARN\""),
        "{}",
        bad.log()
    );
    for secret in secrets {
        assert!(!seen.contains(secret), "{secret} leaked:\n{seen}");
    }
    assert!(
        good.log().contains("redis://:***@127.0.0.1"),
        "{}",
        good.log()
    );

    // Settings refused at startup (a URL that does not parse; cluster seeds with different
    // passwords): the error hides the passwords too.
    for redis_args in [
        vec!["--redis-url", "redis://:s3cret-pw@[::1"],
        vec![
            "--redis-cluster",
            "redis://:s3cret-pw@127.0.0.1:1,redis://:wr0ng-pw-zz@127.0.0.1:2",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .args(["serve", "--config"])
            .arg(rules.path())
            .args(&redis_args)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(["--log-level", "trace"])
            .env_remove("RUST_LOG")
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("***"), "{stderr}");
        for secret in secrets {
            assert!(!stderr.contains(secret), "{stderr}");
        }
    }
}
