//! Who may connect under mutual TLS, through the real binary: the client SAN allow-list matches
//! each entry against SANs of its own type only (URI, DNS name with TLS's wildcards, IP
//! address), a bad entry stops the start with the entry named, and a changed client CA closes
//! the connections verified under the previous one.

use std::time::Duration;

use rcgen::SanType;
use rcgen::string::Ia5String;

use crate::support::{Ca, Slidegate, slidegate_command, wait_until};
use crate::tls::{
    ALLOWED, SecretVolume, call, call_as, channel, metrics, path_str, pem_files, rules,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

fn uri(text: &str) -> SanType {
    SanType::URI(Ia5String::try_from(text).expect("ia5"))
}

fn dns(text: &str) -> SanType {
    SanType::DnsName(Ia5String::try_from(text).expect("ia5"))
}

fn ip(text: &str) -> SanType {
    SanType::IpAddress(text.parse().expect("ip"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sans_match_entries_of_their_own_type_only() {
    let ca = Ca::new("slidegate test CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let [cert, key, client_ca] = pem_files(dir.path(), &ca.server(), &ca);
    let rules = rules();
    let sans = format!("{ALLOWED},envoy.internal,10.0.0.7,a.mesh.internal");
    let slidegate = Slidegate::start(
        rules.path(),
        &[
            "--tls-cert-file",
            path_str(&cert),
            "--tls-key-file",
            path_str(&key),
            "--tls-client-ca-file",
            path_str(&client_ca),
            "--tls-client-san",
            &sans,
        ],
    );
    let port = slidegate.grpc_port;

    for (who, san) in [
        ("a URI SAN on the list", uri(ALLOWED)),
        ("a DNS SAN on the list", dns("envoy.internal")),
        ("a DNS SAN in another case", dns("Envoy.Internal")),
        ("an IP SAN on the list", ip("10.0.0.7")),
        (
            "a wildcard DNS SAN over a listed name",
            dns("*.mesh.internal"),
        ),
    ] {
        let client = ca.client_with(vec![san]);
        let answer = call_as(port, &ca.pem, Some(&client)).await;
        assert_eq!(answer, Ok(Code::Ok), "{who}: {}", slidegate.log());
    }
    let refused = [
        ("a listed DNS name as a URI SAN", uri("envoy.internal")),
        ("a listed URI as a DNS SAN", dns(ALLOWED)),
        ("a listed IP address as a DNS SAN", dns("10.0.0.7")),
        ("another IP SAN", ip("10.0.0.8")),
        ("a wildcard over two labels", dns("*.b.mesh.internal")),
        ("a wildcard over a top-level domain", dns("*.internal")),
    ];
    for (who, san) in refused.clone() {
        let client = ca.client_with(vec![san]);
        let answer = call_as(port, &ca.pem, Some(&client)).await;
        assert!(answer.is_err(), "{who} got an answer: {answer:?}");
    }
    let counted = wait_until(Duration::from_secs(5), || {
        let text = metrics(&slidegate);
        crate::tls::refused(&text, "grpc", "san_not_allowed") >= refused.len() as f64
    });
    assert!(counted, "{}", metrics(&slidegate));
}

#[test]
fn a_client_san_entry_of_no_type_stops_the_start_naming_it() {
    let ca = Ca::new("slidegate test CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let [cert, key, client_ca] = pem_files(dir.path(), &ca.server(), &ca);
    let rules = rules();
    let out = slidegate_command()
        .arg("serve")
        .arg("--config")
        .arg(rules.path())
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .args(["--tls-cert-file", path_str(&cert)])
        .args(["--tls-key-file", path_str(&key)])
        .args(["--tls-client-ca-file", path_str(&client_ca)])
        .args(["--tls-client-san", "envoy.internal,edge proxy"])
        .output()
        .expect("run slidegate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(
        stderr.contains(r#"--tls-client-san entry "edge proxy""#),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_client_ca_closes_connections_verified_under_the_old_one() {
    let old_ca = Ca::new("old client CA");
    let new_ca = Ca::new("new client CA");
    let server = old_ca.server();
    let mut volume = SecretVolume::new(&server, &old_ca.pem);
    let rules = rules();
    let slidegate = volume.serve(rules.path());
    let port = slidegate.grpc_port;
    let old_client = old_ca.client(ALLOWED);
    let open = channel(port, &old_ca.pem, Some(&old_client))
        .await
        .expect("connect");
    assert_eq!(call(open.clone()).await, Ok(Code::Ok));

    // The same server certificate; the client CA bundle now holds only the new CA.
    volume.swap(&server, &new_ca.pem);
    let started = std::time::Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(10) {
        if call(open.clone()).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        closed,
        "a connection verified under the removed CA still gets answers:\n{}",
        slidegate.log()
    );
    eprintln!("closed {:?} after the swap", started.elapsed());
    let new_client = new_ca.client(ALLOWED);
    assert_eq!(
        call_as(port, &old_ca.pem, Some(&new_client)).await,
        Ok(Code::Ok),
        "a client of the new CA"
    );
    assert!(
        slidegate.log().contains("the client CAs changed"),
        "{}",
        slidegate.log()
    );
}
