//! Fault tests: Redis over TLS requiring a client certificate, with slidegate given one and
//! without: decided by Redis, or answered by the failure mode with the reason logged.

use std::time::Duration;

use crate::faults_fixture::{DOMAIN, RULES, Rules, healthy, server_alive};
use crate::support::{Slidegate, TlsRedisServer, wait_until};

/// Redis over TLS with `tls-auth-clients yes`. Proves: slidegate given `--redis-tls-cert-file`
/// and `--redis-tls-key-file` (as `SLIDEGATE_*` variables) is healthy and decides by Redis (the
/// third call on a limit of 2 is denied); one without them stays up, answers by its failure mode
/// (`allow`: 200, and so stays SERVING) and logs why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_requiring_a_client_certificate() {
    let Some(redis) = TlsRedisServer::start(&["--tls-auth-clients", "yes"]) else {
        return;
    };
    let rules = Rules::new(RULES);
    let url = redis.url(None);
    let ca = redis.ca_file.to_string_lossy().into_owned();
    let common = [
        "--redis-url",
        &url,
        "--redis-tls-ca-file",
        &ca,
        "--redis-timeout",
        "500ms",
        "--failure-mode",
        "allow",
    ];
    let cert = redis.client_cert_file.to_string_lossy().into_owned();
    let key = redis.client_key_file.to_string_lossy().into_owned();
    let with_cert = Slidegate::start_with_env(
        &rules.dir(),
        &common,
        &[
            ("SLIDEGATE_REDIS_TLS_CERT_FILE", &cert),
            ("SLIDEGATE_REDIS_TLS_KEY_FILE", &key),
        ],
    );
    let without = Slidegate::start(&rules.dir(), &common);

    assert!(
        wait_until(Duration::from_secs(10), || healthy(&with_cert)),
        "not healthy with a client certificate:\n{}",
        with_cert.log()
    );
    let http = reqwest::Client::new();
    let check = async |server: &Slidegate| {
        let mut answers = Vec::new();
        for _ in 0..3 {
            let response = http
                .get(server.url("/check"))
                .header("x-ratelimit-domain", DOMAIN)
                .header("x-ratelimit-descriptor", "tight=mtls")
                .send()
                .await
                .expect("GET /check");
            answers.push(response.status().as_u16());
        }
        answers
    };
    let answers = check(&with_cert).await;
    assert_eq!(answers, [200, 200, 429], "{}", with_cert.log());

    // rustls names the server's refusal.
    let refused = wait_until(Duration::from_secs(5), || {
        without.log().contains("CertificateRequired")
    });
    assert!(refused, "no reason logged:\n{}", without.log());
    let answers = check(&without).await;
    assert_eq!(answers, [200, 200, 200], "failure mode allow");
    // Readiness stays: under `allow` the replica answers every request (the store errors alert).
    assert_eq!(without.get("/healthcheck").0, 200);
    assert!(server_alive(&without), "{}", without.log());
    let log = without.log();
    assert!(!log.contains("panicked"), "{log}");
}
