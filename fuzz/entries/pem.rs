//! PEM loading: any bytes as the certificate, key and client CA files (split at NUL bytes)
//! give TLS material or an error naming the file, never a panic. The allow-list is fixed.

use slidegate::server::tls::material::{self, TlsError};
use slidegate::server::tls::{Listener, TlsFiles};

pub fn run(data: &[u8]) {
    let mut parts = data.splitn(3, |b| *b == 0);
    let cert = parts.next().unwrap_or_default().to_vec();
    let key = parts.next().unwrap_or_default().to_vec();
    let ca = parts.next().map(<[u8]>::to_vec);
    let files = TlsFiles {
        listeners: vec![Listener::Grpc],
        cert: "cert.pem".into(),
        key: "key.pem".into(),
        client_ca: ca.as_ref().map(|_| "ca.pem".into()),
        client_sans: vec!["spiffe://cluster.local/ns/a/sa/envoy".into()],
    };
    let mut contents = vec![cert, key];
    contents.extend(ca);
    match material::build(&files, &contents) {
        Ok(material) => {
            assert_eq!(material.grpc.alpn_protocols, [b"h2".to_vec()]);
            assert_eq!(material.http.alpn_protocols.len(), 2);
        }
        Err(TlsError::Read { .. }) => panic!("nothing is read from disk"),
        Err(error) => {
            let message = error.to_string();
            let named = ["cert.pem", "key.pem", "ca.pem"];
            assert!(named.iter().any(|n| message.contains(n)), "{message}");
        }
    }
}
