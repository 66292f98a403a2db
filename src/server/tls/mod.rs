//! TLS and mutual TLS on the listeners, under the limits every connection gets.
//!
//! A worker takes an admitted TCP connection, runs the TLS handshake within the handshake
//! timeout ([`Tls::accept`]), and hands the decrypted [`Stream`] to the gRPC or HTTP server,
//! which read it through the control-frame meter as they read a plaintext one: the meter sees
//! HTTP/2 frames, never TLS records. A client refused during the handshake (no certificate, one
//! from an unknown CA, a SAN not on the allow-list, not TLS at all, too slow) gets a TLS alert or
//! a closed connection, never a rate-limit answer; it is counted in
//! `slidegate_tls_handshake_failures_total` by reason and logged (aggregated, see
//! [`super::throttle`]).
//!
//! The material (certificate, key, client CAs) is read from files and replaced while serving
//! ([`rotate`]): each handshake takes the configuration live at that moment, and established
//! connections keep the session they negotiated, unless a client CA was taken out of the bundle:
//! it must stop admitting the clients it signed, so every connection verified under the previous
//! CAs closes as at a shutdown (GOAWAY, or `connection: close` after its request; what is still
//! open after the drain timeout, long-lived streams included, is cut), and its client verifies
//! again under the new ones when it reconnects ([`Revoked`]). A CA added leaves them open.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::CertificateError;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

pub mod material;
pub mod rotate;
pub mod san;

use super::socket::{Io, Peer};
use crate::server::metrics::ServerMetrics;
use crate::throttle::Throttle;
pub use material::{Material, TlsError, TlsFiles};

/// Which listener a connection came to: whether it is TLS, its ALPN protocols and the metrics'
/// `listener` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Listener {
    Grpc,
    Http,
    /// The operator listener (`/metrics`, `/rlconfig`): TLS only when named, since Prometheus
    /// needs its own TLS settings to scrape it.
    Admin,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Grpc => "grpc",
            Listener::Http => "http",
            Listener::Admin => "admin",
        }
    }
}

/// The live TLS material of both listeners; replaced by [`rotate`].
#[derive(Debug)]
pub struct Tls {
    live: ArcSwap<Material>,
    /// The listeners that serve TLS; the others stay plaintext.
    listeners: Vec<Listener>,
    metrics: Arc<ServerMetrics>,
    /// Counts the client CAs' removals: a mutual-TLS connection closes at the first after its
    /// handshake.
    trust: watch::Sender<u64>,
}

impl Tls {
    /// Loads the material from `files`; an error names the file that is wrong.
    pub fn load(files: &TlsFiles, metrics: Arc<ServerMetrics>) -> Result<Arc<Tls>, TlsError> {
        let material = material::build(files, &material::read(files)?)?;
        metrics.set_tls_expiry(material.expires);
        Ok(Arc::new(Tls {
            live: ArcSwap::from_pointee(material),
            listeners: files.listeners.clone(),
            metrics,
            trust: watch::Sender::new(0),
        }))
    }

    /// New connections from now on get `material`; when it lacks a client CA of the previous
    /// one, the connections verified under the previous ones are asked to close.
    fn replace(&self, material: Material) {
        self.metrics.set_tls_expiry(material.expires);
        let trust_changed = match (&self.live.load().trusted, &material.trusted) {
            (Some(old), Some(new)) => old.iter().any(|ca| new.binary_search(ca).is_err()),
            (old, new) => old.is_some() != new.is_some(),
        };
        self.live.store(Arc::new(material));
        if trust_changed {
            self.trust.send_modify(|changes| *changes += 1);
            tracing::info!(
                "a client CA was taken out: connections verified under the previous ones are \
                 asked to close, and their clients verify again"
            );
        }
    }

    /// Runs the TLS handshake on `io` within `timeout`; `None` (counted and logged) when the
    /// client is refused or does not finish in time.
    pub async fn accept(
        &self,
        io: Io,
        peer: Peer,
        listener: Listener,
        timeout: Duration,
    ) -> Option<(Stream, Revoked)> {
        // Before the configuration is taken: a change during the handshake counts.
        let trust = self.trust.subscribe();
        let (config, mutual) = {
            let live = self.live.load();
            let config = match listener {
                Listener::Grpc => Arc::clone(&live.grpc),
                // HTTP/1.1 and h2, as the data listener.
                Listener::Http | Listener::Admin => Arc::clone(&live.http),
            };
            // Without client CAs (no `--tls-client-ca-file`) there are none to take out.
            (config, live.trusted.is_some())
        };
        let handshake = TlsAcceptor::from(config).accept(io);
        let failure = match tokio::time::timeout(timeout, handshake).await {
            Ok(Ok(stream)) => {
                return Some((
                    Stream::Tls(Box::new(stream)),
                    Revoked(mutual.then_some(trust)),
                ));
            }
            Ok(Err(error)) => Failure::from_io(&error),
            Err(_) => Failure {
                reason: "handshake_timeout",
                detail: format!("no TLS handshake within {timeout:?}"),
            },
        };
        self.metrics
            .tls_handshake_failure(listener.as_str(), failure.reason);
        // A connection closed before it sent anything is what TCP health probes do: counted,
        // but not logged, so that probes do not hide the refusals in the aggregated warning.
        if failure.reason == "aborted" {
            tracing::debug!(listener = listener.as_str(), %peer, error = %failure.detail, "TLS handshake aborted");
            return None;
        }
        static REFUSED: Throttle = Throttle::new();
        if let Some(left_out) = REFUSED.admit() {
            tracing::warn!(
                listener = listener.as_str(),
                %peer,
                reason = failure.reason,
                error = %failure.detail,
                refused_before = left_out,
                "TLS handshake failed; connection closed"
            );
        }
        None
    }
}

/// Why a handshake failed: the metric's `reason` label and the log's detail.
struct Failure {
    reason: &'static str,
    detail: String,
}

impl Failure {
    /// From the error tokio-rustls returns: a rustls error inside when TLS failed, else an I/O
    /// error (the client closed or reset the connection mid-handshake).
    fn from_io(error: &io::Error) -> Failure {
        let tls = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let reason = match tls {
            None => "aborted",
            Some(error) => reason(error),
        };
        Failure {
            reason,
            detail: error.to_string(),
        }
    }
}

/// The `reason` label of a rustls handshake error.
fn reason(error: &rustls::Error) -> &'static str {
    use rustls::Error;
    match error {
        Error::NoCertificatesPresented => "no_client_certificate",
        Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure) => {
            "san_not_allowed"
        }
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => "unknown_issuer",
        Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "client_certificate_not_valid_now",
        Error::InvalidCertificate(_) => "bad_client_certificate",
        Error::NoApplicationProtocol => "no_application_protocol",
        Error::AlertReceived(_) => "alert_received",
        Error::InvalidMessage(_)
        | Error::InappropriateMessage { .. }
        | Error::InappropriateHandshakeMessage { .. } => "not_tls",
        Error::PeerIncompatible(_) => "incompatible",
        _ => "other",
    }
}

/// An accepted connection, plaintext or TLS, as the gRPC and HTTP servers read it.
///
/// An enum rather than a boxed trait object: a plaintext connection pays one branch per read
/// and write, and vectored writes (one `writev` for a round of answers) pass through.
pub enum Stream {
    Plain(Io),
    Tls(Box<TlsStream<Io>>),
}

super::socket::delegate_io!(Stream { Plain, Tls });

/// A connection as the servers get it: through TLS when `tls` covers `listener`, else as it
/// came; with when it is to close for a change of the client CAs.
pub async fn secure(
    tls: Option<&Tls>,
    io: Io,
    peer: Peer,
    listener: Listener,
    timeout: Duration,
) -> Option<(Stream, Revoked)> {
    match tls {
        Some(tls) if tls.listeners.contains(&listener) => {
            tls.accept(io, peer, listener, timeout).await
        }
        _ => Some((Stream::Plain(io), Revoked(None))),
    }
}

/// When a client CA a mutual-TLS connection may have been verified under is taken out; never
/// for another connection.
#[derive(Debug)]
pub struct Revoked(Option<watch::Receiver<u64>>);

impl Revoked {
    async fn wait(self) {
        if let Some(mut trust) = self.0
            && trust.changed().await.is_ok()
        {
            return;
        }
        std::future::pending().await
    }

    /// A connection's `stop` and `drain_over`: the server's, and for a mutual-TLS connection
    /// also true once a client CA is taken out (`stop` at once, `drain_over` after `grace`):
    /// the connection then closes as at a shutdown, GOAWAY and its calls answered, and what is
    /// still open at `drain_over` (a long-lived stream) is cut.
    pub fn or_stop(
        self,
        stop: watch::Receiver<bool>,
        drain_over: watch::Receiver<bool>,
        grace: Duration,
    ) -> (watch::Receiver<bool>, watch::Receiver<bool>) {
        if self.0.is_none() {
            return (stop, drain_over);
        }
        let (stop_tx, stop_rx) = watch::channel(*stop.borrow());
        let (drain_tx, drain_rx) = watch::channel(*drain_over.borrow());
        tokio::spawn(async move {
            // The connection ended: nobody is listening any more.
            let gone = async {
                stop_tx.closed().await;
                drain_tx.closed().await;
            };
            let mut gone = std::pin::pin!(gone);
            let server_drain = super::stopped(drain_over);
            tokio::select! {
                () = &mut gone => return,
                () = super::stopped(stop) => {
                    let _ = stop_tx.send(true);
                    tokio::select! {
                        () = &mut gone => return,
                        () = server_drain => {}
                    }
                }
                () = self.wait() => {
                    tracing::debug!("a client CA was taken out; the connection verified under the previous ones is closing");
                    let _ = stop_tx.send(true);
                    tokio::select! {
                        () = &mut gone => return,
                        () = tokio::time::sleep(grace) => {}
                        () = server_drain => {}
                    }
                }
            }
            let _ = drain_tx.send(true);
        });
        (stop_rx, drain_rx)
    }
}

#[cfg(test)]
mod tests {
    use rustls::{AlertDescription, CertificateError, Error, PeerIncompatible};

    use super::reason;
    use crate::server::metrics::HANDSHAKE_FAILURES;

    #[test]
    fn every_reason_has_a_series_from_start() {
        let errors = [
            Error::NoCertificatesPresented,
            Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure),
            Error::InvalidCertificate(CertificateError::UnknownIssuer),
            Error::InvalidCertificate(CertificateError::Expired),
            Error::InvalidCertificate(CertificateError::BadEncoding),
            Error::NoApplicationProtocol,
            Error::AlertReceived(AlertDescription::HandshakeFailure),
            Error::PeerIncompatible(PeerIncompatible::Tls12NotOffered),
            Error::General("x".into()),
        ];
        for error in errors {
            let reason = reason(&error);
            assert!(HANDSHAKE_FAILURES.contains(&reason), "{reason}");
        }
        for fixed in ["handshake_timeout", "aborted", "not_tls"] {
            assert!(HANDSHAKE_FAILURES.contains(&fixed), "{fixed}");
        }
    }
}
