//! Where the rules come from: `CONFIG_TYPE`, `CONFIG_GRPC_XDS_*`, `RUNTIME_*`; and the modes
//! slidegate refuses to start with.

use std::path::PathBuf;

use crate::config::source::xds::parse_metadata_pair;

use super::value::Value;
use super::{CompatError, Env, Translation, Unhonoured, invalid, set, unsupported};

/// Builds a setting from a file variable's value.
type FileValue = fn(String) -> Value;

/// Settings that would leave its peers unable to talk to slidegate, or deciding differently.
pub(super) fn refuse_what_cannot_be_served<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
) -> Result<(), CompatError> {
    if let Some(kind) = env.take("CONFIG_TYPE")
        && !kind.eq_ignore_ascii_case("FILE")
        && !kind.eq_ignore_ascii_case("GRPC_XDS_SOTW")
    {
        return Err(unsupported(
            "CONFIG_TYPE",
            "slidegate reads rules from files (FILE) or from a control plane (GRPC_XDS_SOTW)",
        ));
    }
    if let Some(kind) = env.take("BACKEND_TYPE")
        && !kind.eq_ignore_ascii_case("redis")
    {
        return Err(unsupported(
            "BACKEND_TYPE",
            "slidegate stores counters in Redis or in memory; memcached is not supported",
        ));
    }
    if env.take("GRPC_UDS").is_some() {
        return Err(unsupported(
            "GRPC_UDS",
            "slidegate serves gRPC over TCP only (GRPC_HOST/GRPC_PORT)",
        ));
    }
    Ok(())
}

/// `CONFIG_TYPE=GRPC_XDS_SOTW` and its `CONFIG_GRPC_XDS_*` variables → `--xds-server` and the
/// other `--xds-*` settings. Returns whether rules come from xDS: the rule directory variables
/// then say nothing (Envoy Gateway sets them all the same), since a `--config` beside
/// `--xds-server` is a contradiction.
pub(super) fn xds<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<bool, CompatError> {
    let from_xds = env
        .get("CONFIG_TYPE")
        .is_some_and(|kind| kind.eq_ignore_ascii_case("GRPC_XDS_SOTW"));
    if !from_xds {
        return Ok(false);
    }
    let tls = env.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS")? == Some(true);
    // envoyproxy/ratelimit's default address; its address has no scheme.
    let server = env
        .take("CONFIG_GRPC_XDS_SERVER_URL")
        .unwrap_or_else(|| "localhost:18000".to_owned());
    let server = match (server.contains("://"), tls) {
        (false, true) => format!("https://{server}"),
        (false, false) => format!("http://{server}"),
        (true, _) => server,
    };
    set(out, Value::XdsServer(server), "CONFIG_GRPC_XDS_SERVER_URL");
    if let Some(id) = env.take("CONFIG_GRPC_XDS_NODE_ID") {
        set(out, Value::XdsNodeId(id), "CONFIG_GRPC_XDS_NODE_ID");
    }
    let variable = "CONFIG_GRPC_XDS_NODE_METADATA";
    if let Some(metadata) = env.take(variable) {
        let pairs = (metadata.split(','))
            .map(|pair| {
                parse_metadata_pair(pair).map_err(|problem| CompatError { variable, problem })
            })
            .collect::<Result<_, _>>()?;
        set(out, Value::XdsNodeMetadata(pairs), variable);
    }
    let variable = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL";
    if let Some(interval) = env.take(variable) {
        let interval = humantime::parse_duration(&interval)
            .map_err(|_| invalid(variable, &interval, "expected a duration such as 3s"))?;
        set(out, Value::XdsConnectRetryInterval(interval), variable);
    }
    let files: [(&str, FileValue); 4] = [
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", |v| {
            Value::XdsTlsCaFile(v.into())
        }),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", |v| {
            Value::XdsTlsCertFile(v.into())
        }),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", |v| {
            Value::XdsTlsKeyFile(v.into())
        }),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Value::XdsTlsServerName),
    ];
    for (variable, value) in files {
        match env.take(variable) {
            // slidegate's TLS settings turn TLS on; envoyproxy/ratelimit reads them only with TLS.
            Some(text) if tls => set(out, value(text), variable),
            Some(_) => out.unhonoured.push(Unhonoured {
                variable,
                why: "read only with CONFIG_GRPC_XDS_SERVER_USE_TLS=true",
            }),
            None => {}
        }
    }
    if let Some(force) = env.flag("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
        set(
            out,
            Value::ForceStartWithoutInitialConfig(force),
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
        );
    }
    // Read, as envoyproxy/ratelimit reads them, and unused: xDS brings the rules.
    for variable in [
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_APPDIRECTORY",
    ] {
        env.take(variable);
    }
    env.flag("RUNTIME_WATCH_ROOT")?;
    env.flag("RUNTIME_IGNOREDOTFILES")?;
    Ok(true)
}

/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY` → `--config`.
pub(super) fn files<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let root = env.take("RUNTIME_ROOT");
    let sub = env.take("RUNTIME_SUBDIRECTORY");
    let app = env.take("RUNTIME_APPDIRECTORY");
    if root.is_some() || sub.is_some() || app.is_some() {
        // envoyproxy/ratelimit's defaults; empty parts are skipped, as Go's filepath.Join does.
        let mut path = PathBuf::from(root.as_deref().unwrap_or("/srv/runtime_data/current"));
        for part in [
            sub.as_deref().unwrap_or(""),
            app.as_deref().unwrap_or("config"),
        ] {
            let part = part.trim_start_matches('/');
            if !part.is_empty() {
                path.push(part);
            }
        }
        set(
            out,
            Value::Config(path),
            "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
        );
    }
    // Either way slidegate watches the rule directory itself, which also sees a kubelet swap of
    // a ConfigMap's `..data` link.
    env.flag("RUNTIME_WATCH_ROOT")?;
    env.expect_flag(
        "RUNTIME_IGNOREDOTFILES",
        true,
        "slidegate always skips dotfiles in the rule directory",
        out,
    )?;
    Ok(())
}
