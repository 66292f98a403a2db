//! The three listeners (gRPC, HTTP, operators) and the TLS they serve.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;

use super::Given;
use crate::server::Listeners;
use crate::server::socket::{Address, parse_mode};
use crate::server::tls::{Listener, TlsFiles};

/// A listener that cannot be bound, named by what it serves.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {serves} on {address}")]
pub struct BindError {
    serves: &'static str,
    address: Address,
    source: std::io::Error,
}

#[derive(clap::Args, Debug, Clone)]
pub struct ListenSettings {
    /// Address of the gRPC server (RateLimitService, the Rate Limit Quota Service, health,
    /// reflection): HOST:PORT, or
    /// unix:/path for a Unix domain socket (Envoy's `pipe` address).
    #[arg(long, env = "SLIDEGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub grpc_addr: Address,
    /// Address of the HTTP server (/json, /check, /healthcheck): HOST:PORT, or unix:/path for a
    /// Unix domain socket (nginx's `server unix:/path;`).
    #[arg(long, env = "SLIDEGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: Address,
    /// Address of the operator listener (plaintext unless --tls-listeners names `admin`):
    /// /metrics, /rlconfig, /healthcheck, POST /explain, GET /limited, DELETE /counters,
    /// /status.json and the operator page (GET /). The data ports never serve the rules or the metrics,
    /// and the default binds only the loopback interface; give Prometheus a reachable address
    /// (e.g. 0.0.0.0:6070 in a pod) where it scrapes. HOST:PORT or unix:/path.
    #[arg(long, env = "SLIDEGATE_ADMIN_ADDR", default_value = "127.0.0.1:6070")]
    pub admin_addr: Address,
    /// Leave descriptor values out of what the operator listener answers (POST /explain,
    /// GET /limited and DELETE /counters show each value as `(hidden)` and no counter keys, which
    /// carry them; the decision log names a rule named by values, `detailed_metric` or
    /// `value_to_metric`, by its path and /status.json counts its decisions under `(hidden)`;
    /// /metrics keeps such names): for operators whose descriptor values are personal data (user
    /// ids, addresses).
    #[arg(long, env = "SLIDEGATE_OPERATOR_HIDE_VALUES", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub operator_hide_values: bool,
    /// File holding the operator token: the operator listener's endpoints that change state
    /// (DELETE /counters) then require `Authorization: Bearer <token>`; without it they answer
    /// 403. Surrounding whitespace is ignored; the file is read again at each use, so replacing
    /// it rotates the token without a restart.
    #[arg(long, env = "SLIDEGATE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Permissions of the Unix socket files (octal, e.g. 0660: the owner and its group may
    /// connect); without it the umask decides. A socket file left by a crashed run is replaced,
    /// anything else at the path is refused; the file is removed on shutdown.
    #[arg(long, env = "SLIDEGATE_UNIX_SOCKET_MODE", value_parser = parse_mode)]
    pub unix_socket_mode: Option<u32>,
    /// PEM certificate chain (leaf first): both listeners serve TLS only (gRPC with ALPN h2,
    /// HTTP with h2 and http/1.1). Replaced without a restart when the file changes.
    #[arg(long, env = "SLIDEGATE_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "SLIDEGATE_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM bundle of CAs for client certificates: mutual TLS, every client must present a
    /// certificate signed by one of them (refused with a TLS alert otherwise).
    #[arg(long, env = "SLIDEGATE_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,
    /// Comma-separated URIs (SPIFFE IDs; scheme:…), IP addresses and DNS names: with
    /// --tls-client-ca-file, a client certificate must carry one of them, each matched against
    /// SANs of its own type only (a URI exactly, an IP as an address, a DNS name without regard
    /// to case, a certificate's *.wildcard standing for one label); refused with a TLS alert
    /// otherwise.
    #[arg(long, env = "SLIDEGATE_TLS_CLIENT_SAN", value_delimiter = ',')]
    pub tls_client_san: Vec<String>,
    /// Comma-separated listeners that serve TLS with --tls-cert-file (and mutual TLS with
    /// --tls-client-ca-file): `grpc`, `http`, `admin` (the operator listener; Prometheus then
    /// scrapes with `scheme: https`). The others stay plaintext (say, HTTP for a kubelet's
    /// /healthcheck probe).
    #[arg(
        long,
        env = "SLIDEGATE_TLS_LISTENERS",
        value_enum,
        value_delimiter = ',',
        default_value = "grpc,http"
    )]
    pub tls_listeners: Vec<Listener>,
}

impl ListenSettings {
    /// The TLS flags each need another: checked once envoyproxy/ratelimit's environment has
    /// been applied, so that its `GRPC_SERVER_TLS_*` files satisfy a flag given on the command
    /// line (`--tls-listeners` with the environment's certificate). `given` says which settings
    /// the user gave: `--tls-listeners` has a default, which needs nothing.
    pub fn check(&self, given: &Given) -> Result<(), clap::Error> {
        let needs = [
            (
                self.tls_cert_file.is_some(),
                self.tls_key_file.is_some(),
                "--tls-key-file <TLS_KEY_FILE>",
            ),
            (
                self.tls_key_file.is_some(),
                self.tls_cert_file.is_some(),
                "--tls-cert-file <TLS_CERT_FILE>",
            ),
            (
                self.tls_client_ca_file.is_some(),
                self.tls_cert_file.is_some(),
                "--tls-cert-file <TLS_CERT_FILE>",
            ),
            (
                !self.tls_client_san.is_empty(),
                self.tls_client_ca_file.is_some(),
                "--tls-client-ca-file <TLS_CLIENT_CA_FILE>",
            ),
            (
                given.contains("tls_listeners"),
                self.tls_cert_file.is_some(),
                "--tls-cert-file <TLS_CERT_FILE>",
            ),
        ];
        match needs.iter().find(|(set, needed, _)| *set && !*needed) {
            None => Ok(()),
            Some((_, _, missing)) => Err(clap::Error::raw(
                clap::error::ErrorKind::MissingRequiredArgument,
                format!("the following required arguments were not provided:\n  {missing}\n"),
            )),
        }
    }

    /// The TLS files when --tls-cert-file is given (clap makes --tls-key-file come with it).
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            listeners: self.tls_listeners.clone(),
            cert: self.tls_cert_file.clone()?,
            key: self.tls_key_file.clone()?,
            client_ca: self.tls_client_ca_file.clone(),
            client_sans: self.tls_client_san.clone(),
        })
    }

    /// Binds the three listeners, Unix sockets with --unix-socket-mode.
    pub async fn bind(&self) -> Result<Listeners, BindError> {
        let bind = async |serves, address: &Address| {
            address
                .bind(self.unix_socket_mode)
                .await
                .map_err(|source| BindError {
                    serves,
                    address: address.clone(),
                    source,
                })
        };
        Ok(Listeners {
            grpc: bind("gRPC", &self.grpc_addr).await?,
            http: bind("HTTP", &self.http_addr).await?,
            admin: bind("operators", &self.admin_addr).await?,
        })
    }
}
