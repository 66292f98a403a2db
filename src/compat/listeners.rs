//! The listeners: `HOST`/`PORT`, `GRPC_*` (the connection age included), `DEBUG_*`.

use std::net::ToSocketAddrs;

use crate::server::socket::Address;
use crate::server::tls::Listener;

use super::value::Value;
use super::{CompatError, Env, Translation, invalid, set, unsupported};

/// A listener's host and port variables, the setting they make, the pair's name and its default
/// port.
type Listen = (
    &'static str,
    &'static str,
    fn(Address) -> Value,
    &'static str,
    u16,
);

/// `HOST`/`PORT` → `--http-addr`, `GRPC_HOST`/`GRPC_PORT` → `--grpc-addr`, `DEBUG_HOST`/`DEBUG_PORT`
/// → `--admin-addr`.
pub(super) fn listeners<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let listeners: [Listen; 3] = [
        ("HOST", "PORT", Value::HttpAddr, "HOST/PORT", 8080),
        (
            "GRPC_HOST",
            "GRPC_PORT",
            Value::GrpcAddr,
            "GRPC_HOST/GRPC_PORT",
            8081,
        ),
        // Its debug port serves /rlconfig (and stats): slidegate's operator listener.
        (
            "DEBUG_HOST",
            "DEBUG_PORT",
            Value::AdminAddr,
            "DEBUG_HOST/DEBUG_PORT",
            6070,
        ),
    ];
    for (host_var, port_var, value, from, default_port) in listeners {
        let host = env.take(host_var);
        let port = env.port(port_var)?;
        if host.is_none() && port.is_none() {
            continue;
        }
        let host = host.unwrap_or_else(|| "0.0.0.0".to_owned());
        let port = port.unwrap_or(default_port);
        // A name (`localhost`) is resolved once, as Go's net.Listen would.
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| invalid(host_var, &host, "expected an IP address or host name"))?;
        set(out, value(Address::Tcp(addr)), from);
    }
    grpc_tls(env, out)?;
    for (name, value) in [
        (
            "GRPC_MAX_CONNECTION_AGE",
            Value::GrpcMaxConnectionAge as fn(_) -> _,
        ),
        (
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            Value::GrpcMaxConnectionAgeGrace,
        ),
    ] {
        if let Some(age) = env.take(name) {
            let age = humantime::parse_duration(&age)
                .map_err(|_| invalid(name, &age, "expected a duration such as 30m"))?;
            set(out, value(age), name);
        }
    }
    Ok(())
}

/// `GRPC_SERVER_USE_TLS=true` → TLS on the gRPC listener only (the HTTP port keeps serving its
/// probes in plaintext, as envoyproxy/ratelimit's does), from `GRPC_SERVER_TLS_CERT`/`_KEY`; with
/// `GRPC_CLIENT_TLS_CACERT`, mutual TLS, held to `GRPC_CLIENT_TLS_SAN` when set.
fn grpc_tls<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    if env.flag("GRPC_SERVER_USE_TLS")? != Some(true) {
        return Ok(());
    }
    let needed = "needed with GRPC_SERVER_USE_TLS=true";
    let cert = env
        .take("GRPC_SERVER_TLS_CERT")
        .ok_or_else(|| unsupported("GRPC_SERVER_TLS_CERT", needed))?;
    let key = env
        .take("GRPC_SERVER_TLS_KEY")
        .ok_or_else(|| unsupported("GRPC_SERVER_TLS_KEY", needed))?;
    set(out, Value::TlsCertFile(cert.into()), "GRPC_SERVER_TLS_CERT");
    set(out, Value::TlsKeyFile(key.into()), "GRPC_SERVER_TLS_KEY");
    let grpc = vec![Listener::Grpc];
    set(out, Value::TlsListeners(grpc), "GRPC_SERVER_USE_TLS");
    if let Some(ca) = env.take("GRPC_CLIENT_TLS_CACERT") {
        set(
            out,
            Value::TlsClientCaFile(ca.into()),
            "GRPC_CLIENT_TLS_CACERT",
        );
        if let Some(san) = env.take("GRPC_CLIENT_TLS_SAN") {
            let sans = san.split(',').map(String::from).collect();
            set(out, Value::TlsClientSan(sans), "GRPC_CLIENT_TLS_SAN");
        }
    }
    Ok(())
}
