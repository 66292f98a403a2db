//! Redis named in the wrong mode, the real `slidegate` binary against real servers: a node of a
//! 3-node Redis Cluster named as a standalone server (`--redis-url`), and a standalone server
//! named as a cluster (`--redis-cluster`).
//!
//! Every call to a cluster node named as a standalone server fails: it names the node's clock
//! beside its counters, two hash slots, which a cluster node refuses (`CROSSSLOT`), and a counter
//! of another node's slot is answered `MOVED`. A cluster client cannot start on a standalone
//! server ("cluster support disabled"). Before the store knew either, the first went on SERVING
//! and the second counted as an outage, SERVING with `--health-ignores-store-outage` and under
//! envoyproxy/ratelimit's environment; every request was answered by the failure mode (Envoy's
//! default lets them all through), with only a warning saying why.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::support::{RedisCluster, RedisServer, Slidegate, descriptor, metric_value};

const RULES: &str = r#"
domain: node
descriptors:
  - key: client
    rate_limit: { unit: minute, requests_per_unit: 2 }
"#;

/// The overall code of one call for `client=value`, or the gRPC error.
async fn call(server: &Slidegate, value: &str) -> Result<Code, tonic::Status> {
    let request = crate::support::request("node", vec![descriptor(&[("client", value)])]);
    server
        .client()
        .await
        .should_rate_limit(request)
        .await
        .map(|r| r.into_inner().overall_code())
}

fn rules() -> tempfile::TempDir {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    rules
}

/// Health SERVING, and three calls on one counter of a limit of two: allowed, allowed, denied.
async fn serves_and_decides(server: &Slidegate) {
    assert_eq!(server.get("/healthcheck").0, 200, "{}", server.log());
    let codes = [
        call(server, "a").await.expect("decided"),
        call(server, "a").await.expect("decided"),
        call(server, "a").await.expect("decided"),
    ];
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
}

/// One node of a 3-node cluster as `--redis-url` (with `--health-ignores-store-outage`, which
/// keeps health SERVING through an outage), then the same cluster as `--redis-cluster`.
///
/// Proves: health is NOT_SERVING from the start (the health probe finds the cluster node before
/// any request), a call fails (UNAVAILABLE) rather than being decided, the log has one `ERROR`
/// that names `--redis-cluster`, and the failures are counted as an incompatible store. Named as
/// a cluster, the same nodes decide (two allowed, the third denied) and health is SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_named_as_a_standalone_redis_is_not_serving_and_says_why() {
    let Some(cluster) = RedisCluster::start() else {
        return;
    };
    let rules = rules();

    let node = cluster.nodes[0].url();
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &node, "--health-ignores-store-outage"],
    );
    assert_eq!(server.get("/healthcheck").0, 503, "{}", server.log());
    for value in ["a", "b", "c", "d"] {
        let status = call(&server, value).await.expect_err("decided");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    let log = server.log();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("--redis-cluster"))
        .collect();
    assert!(
        !errors.is_empty(),
        "an error naming --redis-cluster:\n{log}"
    );
    assert!(
        errors.iter().any(|l| l.contains("node of a Redis Cluster")),
        "{log}"
    );
    let (_, metrics) = server.get("/metrics");
    assert!(
        metric_value(
            &metrics,
            r#"slidegate_store_errors_total{kind="incompatible"}"#
        ) >= 4.0,
        "{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            r#"slidegate_redis_calls_total{result="incompatible"}"#
        ),
        4.0,
        "{metrics}"
    );
    drop(server);

    let nodes = cluster.urls().join(",");
    let server = Slidegate::start(rules.path(), &["--redis-cluster", &nodes]);
    serves_and_decides(&server).await;
}

/// A standalone Redis named by `--redis-cluster` (with `--health-ignores-store-outage`), then by
/// `--redis-url`.
///
/// Proves: NOT_SERVING from the start although outages are ignored (this one does not pass by
/// itself), a call fails (UNAVAILABLE), and the log has an `ERROR` that names `--redis-url`.
/// Named by `--redis-url`, the same server decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_redis_named_as_a_cluster_is_not_serving_and_says_why() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = rules();

    let server = Slidegate::start(
        rules.path(),
        &[
            "--redis-cluster",
            &redis.url(),
            "--health-ignores-store-outage",
        ],
    );
    assert_eq!(server.get("/healthcheck").0, 503, "{}", server.log());
    let status = call(&server, "a").await.expect_err("decided");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let log = server.log();
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("not a node of a Redis Cluster")
            && l.contains("--redis-url")),
        "an error naming --redis-url:\n{log}"
    );
    drop(server);

    let server = Slidegate::start(rules.path(), &["--redis-url", &redis.url()]);
    serves_and_decides(&server).await;
}
