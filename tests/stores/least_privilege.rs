//! slidegate under the least-privileged Redis user that docs/operations.md gives (*A Redis user
//! for slidegate*), through the binary against a real redis-server: its key prefix only, and only
//! the commands it sends, the script's own included (Redis checks a script's commands against the
//! caller's ACL as well). A command slidegate starts to need, or a key outside its prefix, shows
//! in `ACL LOG` and fails this test, and the documented list with it.

use std::time::Duration;

use crate::support::sentinel::{MASTER, SentinelSet};
use crate::support::{RedisCluster, RedisServer, Slidegate, source_files, wait_until};

/// The user's rules after `on >PASSWORD resetchannels`, read from the block of docs/operations.md
/// (*A Redis user for slidegate*), so that the page and this test cannot drift apart.
fn documented_acl() -> Vec<&'static str> {
    let block = section().split("```").nth(1).expect("its code block");
    let rules: Vec<&str> = block
        .split_whitespace()
        .skip_while(|word| *word != "resetchannels")
        .skip(1)
        .collect();
    assert_eq!(rules.first(), Some(&"~slidegate:*"), "{block}");
    assert!(rules.len() > 20, "{block}");
    rules
}

/// The section *A Redis user for slidegate* of docs/operations.md.
fn section() -> &'static str {
    include_str!("../../docs/operations.md")
        .split("### A Redis user for slidegate")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the section in docs/operations.md")
}

/// What a cluster's client adds, as the same section says: reading the slots, and following an
/// `ASK` redirect.
const CLUSTER_ACL: &[&str] = &["+cluster|slots", "+cluster|shards", "+asking"];

const RULES: &str = r#"
domain: acl
descriptors:
  - key: exact
    rate_limit: { unit: minute, requests_per_unit: 2, precision: exact }
  - key: buckets
    rate_limit: { unit: minute, requests_per_unit: 2, precision: 6s }
"#;

const TOKEN: &str = "operator-token";

/// Creates the user on `node`: [`documented_acl`], [`CLUSTER_ACL`] too on a cluster node, and
/// `+client|setinfo` where the server takes it (6.x and 7.2 or later, not 7.0 and 7.1): the client
/// library names itself when it connects, and a refusal would show in `ACL LOG`.
fn create_user(node: &RedisServer, cluster: bool) {
    let mut user = vec![
        "ACL",
        "SETUSER",
        "slidegate",
        "on",
        ">secret",
        "resetchannels",
    ];
    user.extend(documented_acl());
    if cluster {
        for rule in CLUSTER_ACL {
            assert!(section().contains(rule), "{rule} is not on the page");
        }
        user.extend(CLUSTER_ACL);
    }
    assert_eq!(node.cli(&user), "OK");
    let setinfo = node.cli(&["ACL", "SETUSER", "slidegate", "+client|setinfo"]);
    assert!(
        setinfo == "OK" || setinfo.contains("Unknown command"),
        "{setinfo}"
    );
}

/// [`RULES`] in a file of a new directory (which holds it while it lives).
fn rules_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("write rules");
    (dir, rules)
}

/// Three requests for `descriptors` on a limit of two: admitted, admitted, denied.
async fn admits_two(server: &Slidegate, descriptors: &[(&str, &str)]) {
    let codes = [
        code(server, descriptors).await,
        code(server, descriptors).await,
        code(server, descriptors).await,
    ];
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"], "{descriptors:?}");
}

/// `POST /json` for the given descriptors (`key=value` each): the overall code, or the status and
/// body of an answer that is not a decision (a store that refuses the user answers 503).
async fn code(server: &Slidegate, descriptors: &[(&str, &str)]) -> String {
    let descriptors: Vec<String> = descriptors
        .iter()
        .map(|(k, v)| format!(r#"{{"entries":[{{"key":"{k}","value":"{v}"}}]}}"#))
        .collect();
    let body = format!(
        r#"{{"domain":"acl","descriptors":[{}]}}"#,
        descriptors.join(",")
    );
    let answer = reqwest::Client::new()
        .post(server.url("/json"))
        .body(body)
        .send()
        .await
        .expect("POST /json");
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["overallCode"].as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("HTTP {status}: {text}"))
}

/// The names of the Redis commands in `source`, each text after `prefix` up to the closing quote
/// (`redis.call('ZADD'` gives `ZADD`), lowercased.
fn command_names(source: &str, prefix: &str, quote: char) -> Vec<String> {
    source
        .split(prefix)
        .skip(1)
        .filter_map(|rest| rest.split(quote).next())
        .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic()))
        .map(str::to_ascii_lowercase)
        .collect()
}

/// Every command the store's scripts run and its code sends, found in the source: each must be
/// allowed by the documented user, as `+name` or a subcommand of it (`+config|get`). The live
/// tests below send real traffic, but not down every path (a counter carried between a log and
/// buckets, returned hits, a long bucket scan); this catches a command any path starts to need.
///
/// Proves: the documented list covers all of them, and that this check finds the commands at all
/// (the ones every decision runs are among them).
#[test]
fn every_command_the_store_can_send_is_in_the_documented_user() {
    let acl = documented_acl();
    let allowed = |name: &str| {
        acl.iter().any(|rule| {
            rule.strip_prefix('+').is_some_and(|rule| {
                rule == name || rule.strip_prefix(name).is_some_and(|r| r.starts_with('|'))
            })
        })
    };
    let store = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store");
    let mut found = Vec::new();
    for path in source_files(&store, "lua") {
        let text = std::fs::read_to_string(&path).expect("read a script");
        for prefix in ["redis.call('", "redis.pcall('"] {
            found.extend(
                command_names(&text, prefix, '\'')
                    .into_iter()
                    .map(|n| (n, path.clone())),
            );
        }
    }
    for path in source_files(&store.join("redis"), "rs") {
        let text = std::fs::read_to_string(&path).expect("read a source file");
        found.extend(
            command_names(&text, "cmd(\"", '"')
                .into_iter()
                .map(|n| (n, path.clone())),
        );
    }
    let names: std::collections::BTreeSet<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "zadd",
        "zremrangebyscore",
        "hincrby",
        "pexpire",
        "evalsha",
        "time",
    ] {
        assert!(
            names.contains(expected),
            "{expected} not found in {names:?}"
        );
    }
    let missing: Vec<String> = found
        .iter()
        .filter(|(name, _)| !allowed(name))
        .map(|(name, path)| format!("{name} ({})", path.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "commands the documented Redis user (docs/operations.md) does not allow: {missing:?}"
    );
}

/// A Redis user with only the documented rules, and slidegate on it: decisions on an exact log and on buckets
/// (each alone and both in one request), the deny cache's reset poll, the health probe, `/limited`
/// (this replica's note on the shared board) and `DELETE /counters`, for a few seconds.
///
/// Proves: every decision is right and health is SERVING, and Redis refused nothing (`ACL LOG`
/// empty): the documented user is enough. A user without one of the script's commands (`ZADD`)
/// is refused, logged, and not serving, so the check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slidegate_needs_no_more_than_the_documented_redis_user() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    create_user(&redis, false);
    let (dir, rules) = rules_file();
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).expect("write token");
    let url = format!("redis://slidegate:secret@127.0.0.1:{}", redis.port);
    let token_arg = token.to_string_lossy().into_owned();
    let server = Slidegate::start(
        &rules,
        &["--redis-url", &url, "--admin-token-file", &token_arg],
    );
    assert_eq!(server.get("/healthcheck").0, 200, "{}", server.log());

    for descriptors in [
        &[("exact", "a")][..],
        &[("buckets", "b")],
        &[("exact", "c"), ("buckets", "c")],
    ] {
        admits_two(&server, descriptors).await;
    }
    // This replica's note on the board (posted every 2 s once something is denied), then
    // /limited reads the board.
    assert!(
        wait_until(Duration::from_secs(10), || !redis
            .cli(&["HGETALL", "slidegate:board:limited"])
            .is_empty()),
        "no note on the board:\n{}",
        server.log()
    );
    let (status, limited) = server.get("/limited");
    assert_eq!(status, 200, "{limited}");
    let cleared = reqwest::Client::new()
        .delete(format!("http://127.0.0.1:{}/counters", server.admin_port))
        .bearer_auth(TOKEN)
        .body(r#"{"domain":"acl","descriptors":[{"entries":[{"key":"exact","value":"a"}]}]}"#)
        .send()
        .await
        .expect("DELETE /counters");
    assert_eq!(cleared.status().as_u16(), 200);
    assert_eq!(code(&server, &[("exact", "a")]).await, "OK", "cleared");
    // A few more health probes and reset polls.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.get("/healthcheck").0, 200, "{}", server.log());
    assert_eq!(
        redis.cli(&["ACL", "LOG"]),
        "",
        "Redis refused slidegate's user something:\n{}",
        server.log()
    );
    drop(server);

    // Without ZADD the script is refused: the check above can fail.
    assert_eq!(redis.cli(&["ACL", "SETUSER", "slidegate", "-zadd"]), "OK");
    let server = Slidegate::start(&rules, &["--redis-url", &url]);
    let failed = reqwest::Client::new()
        .post(server.url("/json"))
        .body(r#"{"domain":"acl","descriptors":[{"entries":[{"key":"exact","value":"z"}]}]}"#)
        .send()
        .await
        .expect("POST /json");
    assert_eq!(failed.status().as_u16(), 503, "decided without ZADD");
    assert!(
        wait_until(Duration::from_secs(10), || !redis
            .cli(&["ACL", "LOG"])
            .is_empty()),
        "nothing refused without ZADD"
    );
}

/// The same on a 3-node cluster, the user on every node with the documented rules and
/// [`CLUSTER_ACL`]:
/// requests of one counter, and requests of two whose counters live in different slots (decided
/// in a call per slot; a deny in one slot takes back the hits the other recorded).
///
/// Proves: the decisions are right (two admitted, the third denied; a counter whose hits were
/// taken back still admits two) and no node refused anything (`ACL LOG` empty on each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_needs_no_more_than_the_documented_redis_user() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    for node in &cluster.nodes {
        create_user(node, true);
    }
    let (_dir, rules) = rules_file();
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://slidegate:secret@127.0.0.1:{}", n.port))
        .collect();
    // No deny cache: the request with a full counter must reach the other slots.
    let nodes = nodes.join(",");
    let server = Slidegate::start(
        &rules,
        &["--redis-cluster", &nodes, "--redis-deny-cache", "0"],
    );
    assert_eq!(server.get("/healthcheck").0, 200, "{}", server.log());
    for descriptors in [
        &[("exact", "a")][..],
        &[("buckets", "b")],
        &[("exact", "c"), ("buckets", "d")],
        &[("exact", "e"), ("exact", "f"), ("buckets", "g")],
    ] {
        admits_two(&server, descriptors).await;
    }
    // A counter full in one slot denies the request, and the hits its counters of other slots
    // recorded are taken back (a log's by ZREM, buckets' by the take-back script): each still
    // admits two.
    assert_eq!(code(&server, &[("exact", "h")]).await, "OK");
    assert_eq!(code(&server, &[("exact", "h")]).await, "OK");
    let denied = code(&server, &[("exact", "h"), ("exact", "i"), ("buckets", "j")]).await;
    assert_eq!(denied, "OVER_LIMIT");
    admits_two(&server, &[("exact", "i")]).await;
    admits_two(&server, &[("buckets", "j")]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(server.get("/healthcheck").0, 200, "{}", server.log());
    for node in &cluster.nodes {
        assert_eq!(
            node.cli(&["ACL", "LOG"]),
            "",
            "node {} refused slidegate's user something:\n{}",
            node.port,
            server.log()
        );
    }
}

/// The same through Sentinel, the user on the primary the sentinels name: slidegate asks it
/// `ROLE` before using it.
///
/// Proves: the decisions are right and the primary refused nothing (`ACL LOG` empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_needs_no_more_than_the_documented_redis_user() {
    let Some(set) = SentinelSet::start() else {
        return;
    };
    let Some(primary) = &set.primary else {
        panic!("no primary");
    };
    create_user(primary, false);
    let (_dir, rules) = rules_file();
    let sentinels = set.addrs();
    let url = format!("redis://slidegate:secret@{MASTER}");
    let args = [
        "--redis-sentinel",
        &sentinels,
        "--redis-sentinel-master",
        MASTER,
        "--redis-url",
        &url,
    ];
    let server = Slidegate::start(&rules, &args);
    assert_eq!(server.get("/healthcheck").0, 200, "{}", server.log());
    for descriptors in [&[("exact", "a")][..], &[("buckets", "b")]] {
        admits_two(&server, descriptors).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        primary.cli(&["ACL", "LOG"]),
        "",
        "the primary refused slidegate's user something:\n{}",
        server.log()
    );
}
