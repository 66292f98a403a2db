//! TLS material from PEM files: the server's certificate chain and key, and for mutual TLS the
//! client CA bundle and the allow-list of client SANs, built into one rustls configuration per
//! listener.
//!
//! Why everything is checked here, before anything is swapped in: a rotation that writes a
//! truncated file, a key of another certificate or an expired certificate must leave the
//! listeners serving the previous material (see [`super::rotate`]), so a load either yields
//! configurations that will work or an error saying which file is wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore};
use rustls::{SignatureScheme, SupportedProtocolVersion};

use super::san::{self, AllowedSan, BadSan};

/// Where the material comes from, as the flags name it, and which listeners serve it.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The listeners that serve TLS (the others stay plaintext).
    pub listeners: Vec<super::Listener>,
    /// The server's certificate chain (leaf first), PEM.
    pub cert: PathBuf,
    /// The server's private key (PKCS#8, PKCS#1 or SEC1), PEM.
    pub key: PathBuf,
    /// CAs that sign client certificates, PEM. Set: every client must present a certificate
    /// that chains to one of them.
    pub client_ca: Option<PathBuf>,
    /// Subject alternative names (URIs, DNS names, IP addresses; see [`super::san`]) a verified
    /// client must carry one of; empty: any verified client.
    pub client_sans: Vec<String>,
}

impl TlsFiles {
    /// The files the material is read from, to watch.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }
}

/// Why material cannot be used. None of these carries key bytes.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid PEM: {source}")]
    Pem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} holds no PEM private key")]
    NoKey { path: PathBuf },
    #[error("{path}: the certificate is not valid now (expired, or not yet valid)")]
    NotValidNow { path: PathBuf },
    #[error("{path}: the certificate cannot be parsed")]
    Unparseable { path: PathBuf },
    #[error("{path}: {source}")]
    ClientCa {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("{cert} and {key} do not make a usable pair: {source}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error(transparent)]
    ClientSan(#[from] BadSan),
}

/// The rustls configurations the listeners accept connections with.
#[derive(Debug)]
pub struct Material {
    /// When the served certificate expires, Unix time: what an alert watches.
    pub expires: i64,
    /// ALPN `h2` only: gRPC is HTTP/2.
    pub grpc: Arc<ServerConfig>,
    /// ALPN `h2` and `http/1.1`.
    pub http: Arc<ServerConfig>,
    /// The client CAs (DER, sorted; none without mutual TLS): when a rotation takes one out, the
    /// connections verified under the previous ones are closed ([`super::Tls`]).
    pub trusted: Option<Vec<Vec<u8>>>,
}

/// The PEM bytes of every file, as read together: material is rebuilt only when they change.
pub type Contents = Vec<Vec<u8>>;

/// Reads the files' bytes (in [`TlsFiles::paths`] order).
pub fn read(files: &TlsFiles) -> Result<Contents, TlsError> {
    files
        .paths()
        .map(|path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        })
        .collect()
}

/// Builds the listeners' configurations from `contents` (read from `files` by [`read`]).
pub fn build(files: &TlsFiles, contents: &Contents) -> Result<Material, TlsError> {
    let (cert_pem, key_pem) = (&contents[0], &contents[1]);
    let chain = certificates(&files.cert, cert_pem)?;
    let expires = valid_now(&files.cert, &chain[0])?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| match error {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            path: files.key.clone(),
        },
        source => TlsError::Pem {
            path: files.key.clone(),
            source,
        },
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match (&files.client_ca, contents.get(2)) {
        (Some(path), Some(pem)) => Some(client_verifier(
            path,
            pem,
            &files.client_sans,
            Arc::clone(&provider),
        )?),
        _ => None,
    };
    let config = |alpn: &[&[u8]]| {
        let pair = |source| TlsError::Pair {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        };
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(PROTOCOLS)
            .map_err(pair)?;
        let builder = match &verifier {
            Some(verifier) => builder.with_client_cert_verifier(Arc::clone(verifier)),
            None => builder.with_no_client_auth(),
        };
        // `with_single_cert` refuses a key that does not belong to the leaf certificate.
        let mut config = builder
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(pair)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok::<_, TlsError>(Arc::new(config))
    };
    Ok(Material {
        expires,
        grpc: config(&[b"h2"])?,
        http: config(&[b"h2", b"http/1.1"])?,
        trusted: match (&files.client_ca, contents.get(2)) {
            (Some(path), Some(pem)) => {
                let mut cas: Vec<Vec<u8>> = (certificates(path, pem)?.iter())
                    .map(|ca| ca.to_vec())
                    .collect();
                cas.sort();
                Some(cas)
            }
            _ => None,
        },
    })
}

/// TLS 1.3 and 1.2: what Envoy and nginx speak by default.
const PROTOCOLS: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];

/// Every certificate in `pem`; an error when there is none.
fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

/// An expired certificate would make every handshake fail: refuse it as a replacement. When a
/// valid one expires, Unix time.
fn valid_now(path: &Path, leaf: &CertificateDer<'_>) -> Result<i64, TlsError> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf).map_err(|_| TlsError::Unparseable {
            path: path.to_owned(),
        })?;
    if parsed.validity().is_valid() {
        Ok(parsed.validity().not_after.timestamp())
    } else {
        Err(TlsError::NotValidNow {
            path: path.to_owned(),
        })
    }
}

/// Client certificates required and verified against the CAs in `pem`, then held to `sans`.
fn client_verifier(
    path: &Path,
    pem: &[u8],
    sans: &[String],
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in certificates(path, pem)? {
        roots.add(ca).map_err(|_| TlsError::Unparseable {
            path: path.to_owned(),
        })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|source| TlsError::ClientCa {
            path: path.to_owned(),
            source,
        })?;
    if sans.is_empty() {
        return Ok(verifier);
    }
    let allowed = (sans.iter())
        .map(|san| san.parse::<AllowedSan>())
        .collect::<Result<_, _>>()?;
    Ok(Arc::new(AllowedSans {
        verified: verifier,
        allowed,
    }))
}

/// A client verifier that, after the chain is verified, also requires one of the client
/// certificate's SANs to be on the allow-list, by type (see [`super::san`]).
#[derive(Debug)]
struct AllowedSans {
    verified: Arc<dyn ClientCertVerifier>,
    allowed: Vec<AllowedSan>,
}

impl ClientCertVerifier for AllowedSans {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.verified.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .verified
            .verify_client_cert(end_entity, intermediates, now)?;
        if san::allows(&self.allowed, end_entity) {
            Ok(verified)
        } else {
            // Sent as an `access_denied` alert; counted as `san_not_allowed`.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verified.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verified.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.verified.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `localhost` valid from the start of year `from` to the
    /// start of year `until`, and its key.
    fn certificate(from: i32, until: i32) -> (String, String) {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(until, 1, 1);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        (cert.pem(), key.serialize_pem())
    }

    fn files() -> TlsFiles {
        TlsFiles {
            listeners: vec![super::super::Listener::Grpc],
            cert: PathBuf::from("tls.crt"),
            key: PathBuf::from("tls.key"),
            client_ca: None,
            client_sans: Vec::new(),
        }
    }

    fn built(cert: &str, key: &str) -> Result<Material, TlsError> {
        build(
            &files(),
            &vec![cert.as_bytes().to_vec(), key.as_bytes().to_vec()],
        )
    }

    #[test]
    fn a_usable_pair_builds_and_broken_ones_say_why() {
        let (cert, key) = certificate(2000, 2100);
        let material = built(&cert, &key).expect("a good pair");
        assert_eq!(material.expires, 4_102_444_800, "2100-01-01T00:00:00Z");
        assert_eq!(material.grpc.alpn_protocols, vec![b"h2".to_vec()]);

        let (_, other_key) = certificate(2000, 2100);
        assert!(matches!(
            built(&cert, &other_key),
            Err(TlsError::Pair { .. })
        ));
        assert!(matches!(
            built("junk\n", &key),
            Err(TlsError::NoCertificate { .. })
        ));
        assert!(matches!(
            built(&cert, "junk\n"),
            Err(TlsError::NoKey { .. })
        ));
        let (expired, expired_key) = certificate(2000, 2001);
        assert!(matches!(
            built(&expired, &expired_key),
            Err(TlsError::NotValidNow { .. })
        ));
    }
}
