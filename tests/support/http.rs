//! HTTP clients without a client library: a blocking HTTP/1.1 `GET` (usable inside `wait_until`
//! on any thread) and the same over TLS with a client certificate.

use std::time::Duration;

use super::Pair;

/// The status code of a raw HTTP/1.1 response (`HTTP/1.1 429 ...`), 0 when there is none.
pub fn http_status(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A minimal blocking HTTP/1.1 `GET` to 127.0.0.1:`port` (no client library, so it works inside
/// `wait_until` on any thread): (status, body), or (0, "") on any error.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let attempt = || -> std::io::Result<(u16, String)> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw);
        let status = http_status(&text);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    };
    attempt().unwrap_or((0, String::new()))
}

/// A blocking HTTPS exchange (HTTP/1.1) on a new connection: the server's leaf certificate and
/// the response.
pub fn https_get(
    port: u16,
    server_ca: &str,
    client: &Pair,
    path: &str,
) -> std::io::Result<(Vec<u8>, String)> {
    use std::io::{Read, Write};
    let config = tls_client_config(server_ca, client, b"http/1.1");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let connection = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
    let socket = std::net::TcpStream::connect(("127.0.0.1", port))?;
    socket.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut tls = rustls::StreamOwned::new(connection, socket);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    // A server that closes without close_notify ends the read with an error after the body.
    let _ = tls.read_to_end(&mut raw);
    let leaf = tls
        .conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    Ok((leaf, String::from_utf8_lossy(&raw).into_owned()))
}

/// A rustls client configuration trusting `server_ca`, presenting `client`, offering `alpn`.
pub fn tls_client_config(
    server_ca: &str,
    client: &Pair,
    alpn: &[u8],
) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in rustls::pki_types::CertificateDer::pem_slice_iter(server_ca.as_bytes()) {
        roots.add(ca.expect("ca pem")).expect("root");
    }
    let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(client.cert.as_bytes())
        .map(|c| c.expect("cert pem"))
        .collect();
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_slice(client.key.as_bytes()).expect("key pem");
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client cert");
    config.alpn_protocols = vec![alpn.to_vec()];
    std::sync::Arc::new(config)
}
