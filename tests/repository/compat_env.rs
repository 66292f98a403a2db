//! More of envoyproxy/ratelimit's environment, each row run with the binary: `REDIS_URL` as a
//! URL with credentials and a database, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`, and the gRPC
//! TLS files of `GRPC_SERVER_TLS_*` satisfying a TLS flag given on the command line.

use std::path::Path;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use super::compat::{ConfigMapVolume, ISTIO_RULES, Started, ratelimit};
use crate::support::{Ca, RedisServer, TlsRedisServer, free_port};

/// The rule directory and listener ports of a run, with `extra` added.
fn env_with(
    root: &Path,
    ports: [u16; 3],
    extra: &[(&'static str, String)],
) -> Vec<(&'static str, String)> {
    ConfigMapVolume::create(root.join("ratelimit/config"), ISTIO_RULES);
    let [http, grpc, debug] = ports;
    let mut env = vec![
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("PORT", http.to_string()),
        ("GRPC_PORT", grpc.to_string()),
        ("DEBUG_PORT", debug.to_string()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
    ];
    env.extend(extra.iter().cloned());
    env
}

/// `REDIS_URL=redis://user:password@host:port/db`: the counters land in that database, reached
/// as that ACL user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_with_credentials_and_a_database() {
    let acl = [
        "--user", "default", "off", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all",
    ];
    let Some(redis) = RedisServer::start_with(&acl) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = [free_port(), free_port(), free_port()];
    let url = format!("redis://alice:s3cret@127.0.0.1:{}/3", redis.port);
    let env = env_with(&dir.path().join("data"), ports, &[("REDIS_URL", url)]);
    let server = Started::start(
        ratelimit(dir.path(), &env),
        dir.path().join("log"),
        ports[0],
        ports[1],
    );
    assert_eq!(server.decide("/").await, Code::Ok, "{}", server.log());
    assert_eq!(server.decide("/").await, Code::OverLimit);
    let as_alice = ["--user", "alice", "--pass", "s3cret", "--no-auth-warning"];
    let keys = |db: &str| {
        let mut args = as_alice.to_vec();
        args.extend(["-n", db, "DBSIZE"]);
        redis.cli(&args)
    };
    assert_ne!(
        keys("3"),
        "0",
        "no counters in database 3:\n{}",
        server.log()
    );
    assert_eq!(keys("0"), "0");
}

/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true`: a Redis reached at an address its certificate
/// does not name is used, with a warning at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tls_without_hostname_verification_warns_and_connects() {
    // The certificate names localhost and 127.0.0.1; 127.0.0.2 is the same machine.
    let Some(redis) = TlsRedisServer::start(&["--bind", "127.0.0.1", "127.0.0.2"]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = [free_port(), free_port(), free_port()];
    let extra = [
        ("REDIS_URL", format!("127.0.0.2:{}", redis.server.port)),
        ("REDIS_TLS", "true".to_string()),
        ("REDIS_TLS_CACERT", redis.ca_file.display().to_string()),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true".to_string()),
        // The first call on each worker's connection does the TLS handshake.
        ("REDIS_TIMEOUT", "2s".to_string()),
    ];
    let env = env_with(&dir.path().join("data"), ports, &extra);
    let server = Started::start(
        ratelimit(dir.path(), &env),
        dir.path().join("log"),
        ports[0],
        ports[1],
    );
    assert_eq!(server.decide("/").await, Code::Ok, "{}", server.log());
    assert_eq!(
        server.decide("/").await,
        Code::OverLimit,
        "{}",
        server.log()
    );
    let log = server.log();
    let warning = log
        .lines()
        .find(|line| line.contains("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"));
    assert!(warning.is_some_and(|line| line.contains("WARN")), "{log}");
}

/// `--tls-listeners` given on the command line needs a certificate: the one from
/// `GRPC_SERVER_TLS_CERT`/`_KEY` counts.
#[test]
fn a_tls_flag_is_satisfied_by_the_environments_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("compat");
    let pair = ca.server();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, &pair.cert).expect("cert");
    std::fs::write(&key, &pair.key).expect("key");
    let ports = [free_port(), free_port(), free_port()];
    let extra = [
        ("GRPC_SERVER_USE_TLS", "true".to_string()),
        ("GRPC_SERVER_TLS_CERT", cert.display().to_string()),
        ("GRPC_SERVER_TLS_KEY", key.display().to_string()),
    ];
    let env = env_with(&dir.path().join("data"), ports, &extra);
    let mut command = ratelimit(dir.path(), &env);
    command.args(["serve", "--tls-listeners=grpc,admin"]);
    let server = Started::start(command, dir.path().join("log"), ports[0], ports[1]);
    // The operator listener serves TLS with the environment's certificate.
    let client = ca.client("spiffe://test/client");
    let answer = crate::support::https_get(ports[2], &ca.pem, &client, "/healthcheck");
    let (_, text) = answer.unwrap_or_else(|e| panic!("{e}:\n{}", server.log()));
    assert!(text.starts_with("HTTP/1.1 200"), "{text}\n{}", server.log());
}
