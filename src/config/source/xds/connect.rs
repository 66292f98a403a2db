//! The connection to the control plane: its address, TLS, and the node slidegate says it is.
//!
//! Everything here is checked once, at start, so that a wrong URL or an unreadable certificate
//! stops slidegate with a clear error instead of turning into endless reconnects.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::{XdsError, XdsOptions};

/// How long to wait for a TCP (and TLS) connection to the control plane.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 pings on the stream: a control plane that vanished without closing the connection (a
/// node gone, a dropped NAT entry) is noticed within interval + timeout, and slidegate reconnects.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The endpoint for `options.server`: `host:port` (plain, or TLS when a `--xds-tls-*` option is
/// given, as envoyproxy/ratelimit's address has no scheme), `http://host:port` or
/// `https://host:port`.
pub(super) fn endpoint(options: &XdsOptions) -> Result<Endpoint, XdsError> {
    let tls = &options.tls;
    let tls_asked = tls.ca_file.is_some()
        || tls.cert_file.is_some()
        || tls.key_file.is_some()
        || tls.server_name.is_some();
    let server = options.server.trim();
    let uri = match server.split_once("://") {
        None if tls_asked => format!("https://{server}"),
        None => format!("http://{server}"),
        Some(("http", _)) if tls_asked => {
            return Err(XdsError::Server(format!(
                "{server}: an `http://` control plane cannot use the --xds-tls-* options; \
                 write `https://` or leave out the scheme"
            )));
        }
        Some(("http" | "https", _)) => server.to_owned(),
        Some((scheme, _)) => {
            return Err(XdsError::Server(format!(
                "{server}: unsupported scheme `{scheme}` (use `host:port`, `http://` or `https://`)"
            )));
        }
    };
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| XdsError::Server(format!("{server}: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .user_agent(concat!("slidegate/", env!("CARGO_PKG_VERSION")))
        .map_err(|e| XdsError::Server(format!("{server}: {e}")))?;
    if uri.starts_with("https://") {
        endpoint = endpoint
            .tls_config(tls_config(options)?)
            .map_err(|e| XdsError::Tls(format!("{server}: {e}")))?;
    }
    Ok(endpoint)
}

fn tls_config(options: &XdsOptions) -> Result<ClientTlsConfig, XdsError> {
    let tls = &options.tls;
    let mut config = ClientTlsConfig::new();
    config = match &tls.ca_file {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca)?)),
        None => config.with_native_roots(),
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(XdsError::Tls(
                "--xds-tls-cert-file and --xds-tls-key-file go together (a client certificate \
                 needs its key)"
                    .to_owned(),
            ));
        }
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

fn read(path: &Path) -> Result<Vec<u8>, XdsError> {
    std::fs::read(path).map_err(|e| XdsError::Tls(format!("cannot read {}: {e}", path.display())))
}

/// The node sent with the first request of every stream. A control plane picks the resources for
/// a client by its node id (Envoy Gateway serves its rules to `envoy-ratelimit`).
pub(super) fn node(options: &XdsOptions) -> Node {
    let fields: HashMap<String, Value> = options
        .node_metadata
        .iter()
        .map(|(key, value)| {
            let value = Value {
                kind: Some(Kind::StringValue(value.clone())),
            };
            (key.clone(), value)
        })
        .collect();
    Node {
        id: options.node_id.clone(),
        metadata: (!fields.is_empty()).then_some(Struct { fields }),
        user_agent_name: "slidegate".to_owned(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_owned(),
        )),
        ..Node::default()
    }
}

/// Parses one `key=value` pair of `--xds-node-metadata`.
pub fn parse_metadata_pair(pair: &str) -> Result<(String, String), String> {
    match pair.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(format!("`{pair}` is not `key=value`")),
    }
}

/// TLS settings for the connection to the control plane.
#[derive(Clone, Debug, Default)]
pub struct XdsTls {
    /// CA certificates (PEM) to verify the control plane with; the system roots without it.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM), for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key_file: Option<PathBuf>,
    /// The name to verify in the control plane's certificate, if not the host of the URL.
    pub server_name: Option<String>,
}
