//! Connecting to Redis: TLS with a private CA and with client certificates (standalone and
//! Cluster), passwords kept out of every message, and reconnecting to a restarted server.

use std::time::{Duration, Instant};

use crate::store::{PREFIX, cluster_options, counter, redis_options, two_slots};
use crate::support::{RedisServer, TlsRedisCluster, TlsRedisServer};
use slidegate::store::{ClientCertFiles, Counter, RedisOptions, RedisStore, Store, redact_url};

// ---------------------------------------------------------------------------------------------
// TLS and authentication.

fn probe() -> Counter {
    counter("probe", "a", 10, Duration::from_secs(10), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_and_a_password() {
    let Some(tls) = TlsRedisServer::start(&["--requirepass", "tls-s3cret"]) else {
        return;
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        ..redis_options(tls.url(Some("tls-s3cret")))
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    store.ping().await.expect("ping over TLS");
    let d = store.decide(&[probe()]).await.expect("decide over TLS");
    assert!(d.allowed && d.counters[0].count == 1);

    // Without trusting the CA the handshake fails: an error, no panic, no password.
    let untrusted = RedisStore::connect(&redis_options(tls.url(Some("tls-s3cret"))))
        .await
        .expect("options are fine");
    let err = untrusted.decide(&[probe()]).await.unwrap_err();
    assert!(err.is_unreachable(), "{err:?}");
    assert!(!err.to_string().contains("tls-s3cret"), "{err}");

    // Wrong password over TLS.
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        ..redis_options(tls.url(Some("wrong-pass")))
    };
    let wrong = RedisStore::connect(&opts).await.expect("options are fine");
    let err = wrong.decide(&[probe()]).await.unwrap_err();
    assert!(!err.to_string().contains("wrong-pass"), "{err}");
}

/// A server started with `tls-auth-clients yes`: with the client certificate the store decides;
/// without it every call fails with a connection error (no panic), and a key that does not
/// parse is refused when the store is built, naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate() {
    let Some(tls) = TlsRedisServer::start(&["--tls-auth-clients", "yes"]) else {
        return;
    };
    let client_cert = ClientCertFiles {
        cert: tls.client_cert_file.clone(),
        key: tls.client_key_file.clone(),
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        tls_client_cert: Some(client_cert.clone()),
        ..redis_options(tls.url(None))
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    store.ping().await.expect("ping with a client certificate");
    let d = store.decide(&[probe()]).await.expect("decide");
    assert!(d.allowed && d.counters[0].count == 1);

    let anonymous = RedisOptions {
        tls_ca_file: Some(tls.ca_file.clone()),
        ..redis_options(tls.url(None))
    };
    let store = RedisStore::connect(&anonymous)
        .await
        .expect("options are fine");
    for _ in 0..2 {
        let err = store.decide(&[probe()]).await.unwrap_err();
        assert!(err.is_unreachable(), "{err:?}");
    }
    assert!(store.ping().await.is_err());

    let unparsable = RedisOptions {
        tls_client_cert: Some(ClientCertFiles {
            key: tls.ca_file.clone(),
            ..client_cert.clone()
        }),
        ..opts.clone()
    };
    let err = RedisStore::connect(&unparsable)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("private key"), "{err}");
    let missing = RedisOptions {
        tls_client_cert: Some(ClientCertFiles {
            cert: "/nonexistent/client.pem".into(),
            ..client_cert
        }),
        ..opts
    };
    let err = RedisStore::connect(&missing).await.unwrap_err().to_string();
    assert!(err.contains("client certificate file"), "{err}");
}

/// A TLS cluster whose nodes require client certificates (`tls-auth-clients yes`): the
/// certificate is presented to every node the store reaches (seeds and those it learns from the
/// slot map); without it, an error and no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_with_a_client_certificate() {
    let Some(tls) = TlsRedisCluster::start(&["--tls-auth-clients", "yes"]) else {
        return;
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca.ca_file.clone()),
        tls_client_cert: Some(ClientCertFiles {
            cert: tls.ca.client_cert_file.clone(),
            key: tls.ca.client_key_file.clone(),
        }),
        ..cluster_options(tls.urls())
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    store.ping().await.expect("ping with a client certificate");
    let w = Duration::from_secs(60);
    let mut nodes = Vec::new();
    for i in 0.. {
        let c = counter("mtls", &format!("k{i}"), 3, w, 1);
        let key = format!("{PREFIX}{}", c.key.as_str());
        let port = tls.cluster.node_for(&key).port;
        if nodes.contains(&port) {
            continue;
        }
        nodes.push(port);
        assert!(store.decide(&[c]).await.expect("decide").allowed);
        assert_eq!(tls.cluster.node_for(&key).cli(&["ZCARD", &key]), "1");
        if nodes.len() == 3 {
            break;
        }
    }

    let anonymous = RedisOptions {
        tls_ca_file: Some(tls.ca.ca_file.clone()),
        ..cluster_options(tls.urls())
    };
    let failed = match RedisStore::connect(&anonymous).await {
        Err(_) => true,
        Ok(store) => store.decide(&[probe()]).await.is_err(),
    };
    assert!(
        failed,
        "a cluster requiring client certificates was used without one"
    );
}

/// Redis Cluster over TLS (`tls-cluster yes`, a private CA): seeds given as `rediss://` URLs,
/// every node reached over TLS, counters on different slots decided and stored on their nodes;
/// without trusting the CA, an error and no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_with_a_private_ca() {
    let Some(tls) = TlsRedisCluster::start(&[]) else {
        return;
    };
    let opts = RedisOptions {
        tls_ca_file: Some(tls.ca.ca_file.clone()),
        ..cluster_options(tls.urls())
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    assert_eq!(store.kind(), "redis-cluster");
    store.ping().await.expect("ping over TLS");
    // One counter on each node. The store knows only the TLS seeds: a plain port in the slot
    // map, or a node it could not reach over TLS, would fail these calls.
    let w = Duration::from_secs(60);
    let mut by_node: Vec<(u16, Counter)> = Vec::new();
    for i in 0.. {
        let c = counter("tls", &format!("k{i}"), 3, w, 1);
        let node = tls.cluster.node_for(&format!("{PREFIX}{}", c.key.as_str()));
        if !by_node.iter().any(|(port, _)| *port == node.port) {
            by_node.push((node.port, c));
        }
        if by_node.len() == 3 {
            break;
        }
    }
    for (port, c) in &by_node {
        for _ in 0..3 {
            assert!(
                store
                    .decide(std::slice::from_ref(c))
                    .await
                    .expect("decide")
                    .allowed
            );
        }
        let d = store.decide(std::slice::from_ref(c)).await.expect("decide");
        assert!(!d.allowed, "a fourth hit on a limit of 3 (node {port})");
        let key = format!("{PREFIX}{}", c.key.as_str());
        assert_eq!(tls.cluster.node_for(&key).cli(&["ZCARD", &key]), "3");
    }
    // Counters on two slots in one request.
    let (a, b) = two_slots("tls-xslot", 3, 3, w);
    let d = store.decide(&[a, b]).await.expect("decide across slots");
    assert!(d.allowed);

    let untrusted = cluster_options(tls.urls());
    let failed = match RedisStore::connect(&untrusted).await {
        Err(_) => true,
        Ok(store) => store.decide(&[probe()]).await.is_err(),
    };
    assert!(
        failed,
        "a cluster over TLS was used without trusting its CA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_in_the_url_and_never_in_messages() {
    let Some(server) = RedisServer::start_with(&["--requirepass", "hunter2-secret"]) else {
        return;
    };
    let url = format!("redis://:hunter2-secret@127.0.0.1:{}", server.port);
    let store = RedisStore::connect(&redis_options(url.clone()))
        .await
        .expect("connect");
    assert!(store.decide(&[probe()]).await.expect("decide").allowed);
    assert!(!format!("{store:?}").contains("hunter2"), "{store:?}");
    assert!(!format!("{:?}", redis_options(url.clone())).contains("hunter2"));
    assert!(!redact_url(&url).contains("hunter2"));

    let wrong_url = format!("redis://default:hunter3-wrong@127.0.0.1:{}/0", server.port);
    let wrong = RedisStore::connect(&redis_options(wrong_url))
        .await
        .expect("options are fine");
    for _ in 0..2 {
        let err = wrong.decide(&[probe()]).await.unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(!text.contains("hunter3"), "{text}");
        let ping = wrong.ping().await.unwrap_err();
        assert!(!format!("{ping} {ping:?}").contains("hunter3"));
    }
    assert!(!format!("{wrong:?}").contains("hunter3"));

    // Keys carry the prefix and the counter key; beside them the node's clock.
    let keys = server.cli(&["-a", "hunter2-secret", "--no-auth-warning", "KEYS", "*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            format!("{PREFIX}clock"),
            format!("{PREFIX}{{probe:k=a}}10000")
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_is_an_error_and_a_restarted_one_works_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let port = server.port;
    let opts = RedisOptions {
        timeout: Duration::from_millis(500),
        ..redis_options(server.url())
    };
    let store = RedisStore::connect(&opts).await.expect("connect");
    assert!(store.decide(&[probe()]).await.expect("decide").allowed);
    drop(server);
    let started = Instant::now();
    let err = store.decide(&[probe()]).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "bounded by the timeout"
    );
    assert!(err.is_unreachable(), "{err:?}");
    // A new server on the same port: the connection manager reconnects by itself.
    let _again = RedisServer::spawn(&["--port", &port.to_string()], port).expect("restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.decide(&[probe()]).await.is_err() {
        assert!(Instant::now() < deadline, "store did not reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
