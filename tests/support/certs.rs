//! The tests' one certificate authority: [`Ca`] issues server and client certificates as PEM in
//! memory; [`CertFiles`] writes a new CA with a server and a client certificate to files, for
//! what reads files (redis-server's and slidegate's TLS flags).

use std::path::PathBuf;

/// A private CA that issues certificates for the tests.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("ca key");
        let cert = params.self_signed(&key).expect("ca cert");
        Ca {
            issuer: rcgen::Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// The server's certificate, for `localhost` and 127.0.0.1.
    pub fn server(&self) -> Pair {
        self.issue(
            &["localhost", "127.0.0.1"],
            None,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate carrying the URI SAN `uri`.
    pub fn client(&self, uri: &str) -> Pair {
        self.issue(&[], Some(uri), rcgen::ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A certificate for the DNS names or IP addresses `names` and the URI SAN `uri`, for `usage`.
    pub fn issue(
        &self,
        names: &[&str],
        uri: Option<&str>,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> Pair {
        let mut params = for_names(names);
        if let Some(uri) = uri {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(uri).expect("uri"),
            ));
        }
        params.extended_key_usages = vec![usage];
        self.sign(params)
    }

    /// A client certificate carrying exactly the SANs `sans` (of any type).
    pub fn client_with(&self, sans: Vec<rcgen::SanType>) -> Pair {
        let mut params = for_names(&[]);
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    /// A certificate of `params` with a new key, signed by this CA.
    fn sign(&self, params: rcgen::CertificateParams) -> Pair {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("cert");
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Certificate parameters for the DNS names or IP addresses `names`.
fn for_names(names: &[&str]) -> rcgen::CertificateParams {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    rcgen::CertificateParams::new(names).expect("params")
}

/// A new private CA, a server certificate it signed (for `localhost` and `127.0.0.1`) and a
/// client certificate it signed, as PEM files in a temporary directory that lives as long as
/// this value.
pub struct CertFiles {
    pub dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
}

impl CertFiles {
    pub fn new() -> CertFiles {
        let ca = Ca::new("slidegate test CA");
        let mut server = for_names(&["localhost", "127.0.0.1"]);
        server
            .distinguished_name
            .push(rcgen::DnType::CommonName, "localhost");
        // Client auth too: cluster nodes present this certificate to each other on the bus.
        server.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server = ca.sign(server);
        let mut client = for_names(&[]);
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "slidegate");
        client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client = ca.sign(client);

        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, pem: &str| {
            let file = dir.path().join(name);
            std::fs::write(&file, pem).unwrap_or_else(|e| panic!("write {name}: {e}"));
            file
        };
        CertFiles {
            ca_file: write("ca.pem", &ca.pem),
            cert_file: write("server.pem", &server.cert),
            key_file: write("server.key", &server.key),
            client_cert_file: write("client.pem", &client.cert),
            client_key_file: write("client.key", &client.key),
            dir,
        }
    }

    /// redis-server flags serving this certificate (clients need not present one unless later
    /// flags say `--tls-auth-clients yes`).
    pub fn server_args(&self) -> Vec<String> {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        vec![
            "--tls-cert-file".into(),
            path(&self.cert_file),
            "--tls-key-file".into(),
            path(&self.key_file),
            "--tls-ca-cert-file".into(),
            path(&self.ca_file),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}
