//! envoyproxy/ratelimit's environment, read once at start and mapped onto slidegate's settings.
//!
//! A deployment of envoyproxy/ratelimit (Istio's sample, most Helm charts) configures it with
//! environment variables: `REDIS_URL=redis:6379`, `RUNTIME_ROOT=/data`, `USE_STATSD=false`, ...
//! Switching should mean changing the image and nothing else, so [`translate`] reads those
//! variables and says which of slidegate's settings they stand for. The caller (`main.rs`)
//! applies a setting only where the command line and the `SLIDEGATE_*` variables left it at its
//! default: slidegate's own settings always win.
//!
//! The layer is off unless the environment looks like envoyproxy/ratelimit's: at least one of its
//! variables other than the generic `HOST`, `PORT`, `LOG_LEVEL` and `LOG_FORMAT` is set (a shell
//! or platform may export those for other reasons).
//!
//! Every variable is either honoured (mapped, or not needed because slidegate already behaves
//! that way), or named in [`Translation::unhonoured`] for one startup warning, or, where slidegate
//! cannot serve as configured (quota mode, a gRPC TLS or Unix-socket listener, xDS,
//! memcached), a [`CompatError`] that stops the start. So is a malformed value: a start with a
//! setting silently dropped would look healthy and behave differently.
//!
//! No other module knows these variables' names.

use std::net::ToSocketAddrs;
use std::path::PathBuf;

/// The settings envoyproxy/ratelimit's environment stands for, and what it asks that slidegate
/// does not do.
#[derive(Debug, Default)]
pub struct Translation {
    /// Settings to apply where slidegate's own are unset.
    pub settings: Vec<Setting>,
    /// Variables set but not honoured, each with the reason; empty when all were honoured.
    pub unhonoured: Vec<Unhonoured>,
}

/// One of slidegate's settings, from one or more of envoyproxy/ratelimit's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The setting's identifier: the `serve` flag's name with `_` for `-` (`redis_url`).
    pub id: &'static str,
    /// The value as the flag takes it.
    pub value: String,
    /// The variables it came from, for the log (values can hold secrets: `REDIS_AUTH`).
    pub from: &'static str,
}

impl Setting {
    /// `--flag=value`, to append to the command line.
    pub fn arg(&self) -> String {
        format!("--{}={}", self.id.replace('_', "-"), self.value)
    }
}

/// A variable that is set but not honoured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhonoured {
    pub variable: &'static str,
    pub why: &'static str,
}

/// Every setting identifier [`translate`] can produce (`main.rs` checks they exist).
pub const SETTING_IDS: &[&str] = &[
    "config",
    "http_addr",
    "grpc_addr",
    "redis_url",
    "redis_cluster",
    "redis_sentinel",
    "redis_sentinel_master",
    "redis_sentinel_password",
    "redis_tls_ca_file",
    "redis_tls_cert_file",
    "redis_tls_key_file",
    "redis_timeout",
    "redis_prefix",
    "log_level",
    "log_format",
    "shadow_mode",
    "response_headers",
    "admin_addr",
    "xds_server",
    "xds_node_id",
    "xds_node_metadata",
    "xds_connect_retry_interval",
    "xds_tls_ca_file",
    "xds_tls_cert_file",
    "xds_tls_key_file",
    "xds_tls_server_name",
    "force_start_without_initial_config",
    "otlp_endpoint",
    "otlp_protocol",
    "otlp_service_name",
    "otlp_service_namespace",
    "otlp_service_instance_id",
    "trace_sampling_ratio",
];

/// A value slidegate cannot start with, naming the variable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{variable}: {problem}")]
pub struct CompatError {
    pub variable: &'static str,
    pub problem: String,
}

/// Reads envoyproxy/ratelimit's variables through `env` (a lookup by name; `std::env::var` in the
/// binary). `None` when none of its distinctive variables is set.
pub fn translate(env: impl Fn(&str) -> Option<String>) -> Result<Option<Translation>, CompatError> {
    let env = Env::new(env);
    if !KNOWN
        .iter()
        .any(|name| !GENERIC.contains(name) && env.get(name).is_some())
    {
        return Ok(None);
    }
    let mut out = Translation::default();
    refuse_what_cannot_be_served(&env)?;
    if !xds(&env, &mut out)? {
        rules(&env, &mut out)?;
    }
    listeners(&env, &mut out)?;
    redis(&env, &mut out)?;
    logging(&env, &mut out)?;
    behaviour(&env, &mut out)?;
    observability(&env, &mut out)?;
    for name in KNOWN {
        if env.get(name).is_some() && !env.was_read(name) {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why: "slidegate has no such setting",
            });
        }
    }
    Ok(Some(out))
}

/// The lookup, remembering which variables a mapping read (the rest are unhonoured).
struct Env<F> {
    lookup: F,
    read: std::cell::RefCell<Vec<&'static str>>,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    fn new(lookup: F) -> Self {
        Env {
            lookup,
            read: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// The value, `None` when unset or empty (envoyproxy/ratelimit's defaults then apply).
    fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|value| !value.is_empty())
    }

    /// [`Env::get`], marking the variable as honoured.
    fn take(&self, name: &'static str) -> Option<String> {
        self.read.borrow_mut().push(name);
        self.get(name)
    }

    fn was_read(&self, name: &str) -> bool {
        self.read.borrow().contains(&name)
    }

    /// A boolean as Go's `strconv.ParseBool` reads it (`1`, `t`, `true`, `TRUE`, `0`, `f`, ...).
    fn flag(&self, name: &'static str) -> Result<Option<bool>, CompatError> {
        let Some(value) = self.take(name) else {
            return Ok(None);
        };
        match value.as_str() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(Some(true)),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(Some(false)),
            _ => Err(invalid(name, &value, "expected true or false")),
        }
    }

    fn port(&self, name: &'static str) -> Result<Option<u16>, CompatError> {
        self.take(name)
            .map(|value| {
                value
                    .parse::<u16>()
                    .map_err(|_| invalid(name, &value, "expected a port number (0-65535)"))
            })
            .transpose()
    }

    /// Honoured as long as it is unset or `expected`; otherwise named with `why`.
    fn expect_flag(
        &self,
        name: &'static str,
        expected: bool,
        why: &'static str,
        out: &mut Translation,
    ) -> Result<(), CompatError> {
        if self.flag(name)?.is_some_and(|value| value != expected) {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why,
            });
        }
        Ok(())
    }

    /// Named with `why` when set at all.
    fn unhonoured_if_set(&self, name: &'static str, why: &'static str, out: &mut Translation) {
        if self.take(name).is_some() {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why,
            });
        }
    }
}

fn invalid(variable: &'static str, value: &str, expected: &str) -> CompatError {
    CompatError {
        variable,
        problem: format!("{expected}, got {value:?}"),
    }
}

fn unsupported(variable: &'static str, problem: &str) -> CompatError {
    CompatError {
        variable,
        problem: problem.to_owned(),
    }
}

fn set(out: &mut Translation, id: &'static str, value: impl Into<String>, from: &'static str) {
    out.settings.push(Setting {
        id,
        value: value.into(),
        from,
    });
}

/// Settings that would leave its peers unable to talk to slidegate, or deciding differently.
fn refuse_what_cannot_be_served<F: Fn(&str) -> Option<String>>(
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
    if env.flag("QUOTA_MODE")? == Some(true) {
        return Err(unsupported(
            "QUOTA_MODE",
            "quota mode is not supported by slidegate (a limit here always denies when over)",
        ));
    }
    Ok(())
}

/// `CONFIG_TYPE=GRPC_XDS_SOTW` and its `CONFIG_GRPC_XDS_*` variables → `--xds-server` and the
/// other `--xds-*` settings. Returns whether rules come from xDS: the rule directory variables
/// then say nothing (Envoy Gateway sets them all the same), since a `--config` beside
/// `--xds-server` is a contradiction.
fn xds<F: Fn(&str) -> Option<String>>(
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
    set(out, "xds_server", server, "CONFIG_GRPC_XDS_SERVER_URL");
    let plain = [
        ("CONFIG_GRPC_XDS_NODE_ID", "xds_node_id"),
        ("CONFIG_GRPC_XDS_NODE_METADATA", "xds_node_metadata"),
        (
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "xds_connect_retry_interval",
        ),
    ];
    for (variable, id) in plain {
        if let Some(value) = env.take(variable) {
            set(out, id, value, variable);
        }
    }
    let files = [
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds_tls_ca_file"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds_tls_cert_file"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds_tls_key_file"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds_tls_server_name"),
    ];
    for (variable, id) in files {
        match env.take(variable) {
            // slidegate's TLS settings turn TLS on; envoyproxy/ratelimit reads them only with TLS.
            Some(value) if tls => set(out, id, value, variable),
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
            "force_start_without_initial_config",
            force.to_string(),
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
fn rules<F: Fn(&str) -> Option<String>>(
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
            "config",
            path.to_string_lossy(),
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

/// `HOST`/`PORT` → `--http-addr`, `GRPC_HOST`/`GRPC_PORT` → `--grpc-addr`, `DEBUG_HOST`/`DEBUG_PORT`
/// → `--admin-addr`.
fn listeners<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    for (host_var, port_var, id, from, default_port) in [
        ("HOST", "PORT", "http_addr", "HOST/PORT", 8080),
        (
            "GRPC_HOST",
            "GRPC_PORT",
            "grpc_addr",
            "GRPC_HOST/GRPC_PORT",
            8081,
        ),
        // Its debug port serves /rlconfig (and stats): slidegate's operator listener.
        (
            "DEBUG_HOST",
            "DEBUG_PORT",
            "admin_addr",
            "DEBUG_HOST/DEBUG_PORT",
            6070,
        ),
    ] {
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
        set(out, id, addr.to_string(), from);
    }
    grpc_tls(env, out)?;
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
    set(out, "tls_cert_file", cert, "GRPC_SERVER_TLS_CERT");
    set(out, "tls_key_file", key, "GRPC_SERVER_TLS_KEY");
    set(out, "tls_listeners", "grpc", "GRPC_SERVER_USE_TLS");
    if let Some(ca) = env.take("GRPC_CLIENT_TLS_CACERT") {
        set(out, "tls_client_ca_file", ca, "GRPC_CLIENT_TLS_CACERT");
        if let Some(san) = env.take("GRPC_CLIENT_TLS_SAN") {
            set(out, "tls_client_san", san, "GRPC_CLIENT_TLS_SAN");
        }
    }
    Ok(())
}

/// `REDIS_*` and `CACHE_KEY_PREFIX` → `--redis-url`, `--redis-cluster` or `--redis-sentinel`,
/// and the rest of the store's settings. Without `REDIS_URL` the counters stay in memory.
fn redis<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let Some(url) = env.take("REDIS_URL") else {
        for name in REDIS_SETTINGS {
            env.unhonoured_if_set(
                name,
                "REDIS_URL is not set: the counters live in this process's memory",
                out,
            );
        }
        return Ok(());
    };
    let kind = env
        .take("REDIS_TYPE")
        .unwrap_or_else(|| "single".to_owned());
    let (cluster, sentinel) = match kind.to_ascii_lowercase().as_str() {
        "single" => (false, false),
        "cluster" => (true, false),
        "sentinel" => (false, true),
        _ => {
            return Err(invalid(
                "REDIS_TYPE",
                &kind,
                "expected single, cluster or sentinel",
            ));
        }
    };
    if !sentinel {
        env.unhonoured_if_set(
            "REDIS_SENTINEL_AUTH",
            "only used with REDIS_TYPE=sentinel",
            out,
        );
    }
    let unix = match env.take("REDIS_SOCKET_TYPE") {
        Some(kind) if kind.eq_ignore_ascii_case("tcp") => false,
        Some(kind) if kind.eq_ignore_ascii_case("unix") => true,
        Some(kind) => return Err(invalid("REDIS_SOCKET_TYPE", &kind, "expected tcp or unix")),
        // envoyproxy/ratelimit defaults to unix; a host:port URL says what is meant.
        None => url.starts_with('/'),
    };
    let tls = env.flag("REDIS_TLS")?.unwrap_or(false);
    let auth = env.take("REDIS_AUTH");
    if unix {
        if cluster || sentinel || tls {
            return Err(unsupported(
                "REDIS_SOCKET_TYPE",
                "a Unix socket works with REDIS_TYPE=single and without REDIS_TLS",
            ));
        }
        set(
            out,
            "redis_url",
            unix_url(&url, auth.as_deref())?,
            "REDIS_URL",
        );
    } else if sentinel {
        sentinel_settings(env, &url, tls, auth.as_deref(), out)?;
    } else {
        let scheme = if tls { "rediss" } else { "redis" };
        let userinfo = auth.as_deref().map(userinfo).unwrap_or_default();
        let nodes = url
            .split(',')
            .map(|node| host_port(node.trim()).map(|node| format!("{scheme}://{userinfo}{node}")))
            .collect::<Result<Vec<_>, _>>()?;
        if cluster {
            set(out, "redis_cluster", nodes.join(","), "REDIS_URL");
        } else if let [node] = nodes.as_slice() {
            set(out, "redis_url", node.clone(), "REDIS_URL");
        } else {
            return Err(invalid(
                "REDIS_URL",
                &url,
                "expected one host:port (several are for REDIS_TYPE=cluster)",
            ));
        }
    }
    if let Some(ca) = env.take("REDIS_TLS_CACERT") {
        set(out, "redis_tls_ca_file", ca, "REDIS_TLS_CACERT");
    }
    if let Some(timeout) = env.take("REDIS_TIMEOUT") {
        humantime::parse_duration(&timeout).map_err(|_| {
            invalid(
                "REDIS_TIMEOUT",
                &timeout,
                "expected a duration such as 50ms",
            )
        })?;
        set(out, "redis_timeout", timeout, "REDIS_TIMEOUT");
    }
    if let Some(prefix) = env.take("CACHE_KEY_PREFIX") {
        if prefix.contains(['{', '}']) {
            return Err(invalid(
                "CACHE_KEY_PREFIX",
                &prefix,
                "must not contain '{' or '}' (they decide the cluster hash slot)",
            ));
        }
        set(out, "redis_prefix", prefix, "CACHE_KEY_PREFIX");
    }
    // Not needed: each worker thread multiplexes its calls on one connection.
    if let Some(size) = env.take("REDIS_POOL_SIZE") {
        size.parse::<u32>()
            .map_err(|_| invalid("REDIS_POOL_SIZE", &size, "expected a whole number"))?;
    }
    match (
        env.take("REDIS_TLS_CLIENT_CERT"),
        env.take("REDIS_TLS_CLIENT_KEY"),
    ) {
        (Some(cert), Some(key)) => {
            set(out, "redis_tls_cert_file", cert, "REDIS_TLS_CLIENT_CERT");
            set(out, "redis_tls_key_file", key, "REDIS_TLS_CLIENT_KEY");
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err(unsupported(
                "REDIS_TLS_CLIENT_KEY",
                "needed with REDIS_TLS_CLIENT_CERT",
            ));
        }
        (None, Some(_)) => {
            return Err(unsupported(
                "REDIS_TLS_CLIENT_CERT",
                "needed with REDIS_TLS_CLIENT_KEY",
            ));
        }
    }
    env.expect_flag(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        false,
        "slidegate always verifies the Redis server's name",
        out,
    )?;
    env.expect_flag(
        "REDIS_PERSECOND",
        false,
        "slidegate keeps all counters in one store",
        out,
    )?;
    Ok(())
}

/// `REDIS_TYPE=sentinel`: `REDIS_URL=MASTER,HOST:PORT,...` names the master and its sentinels
/// (`--redis-sentinel-master`, `--redis-sentinel`); `REDIS_SENTINEL_AUTH` is the sentinels'
/// password. `REDIS_AUTH` and `REDIS_TLS` are the primary's, as `--redis-url` gives them with
/// Sentinel (its host is not used); `REDIS_TLS` also makes the sentinel connections TLS, as
/// envoyproxy/ratelimit dials both with the same TLS settings.
fn sentinel_settings<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    url: &str,
    tls: bool,
    auth: Option<&str>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let mut parts = url.split(',').map(str::trim);
    let master = parts.next().unwrap_or_default();
    let sentinels = parts
        .map(|node| {
            host_port(node).map(|node| format!("{}{node}", if tls { "rediss://" } else { "" }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if master.is_empty() || master.contains(':') || sentinels.is_empty() {
        return Err(invalid(
            "REDIS_URL",
            url,
            "expected MASTER_NAME,HOST:PORT[,HOST:PORT...] with REDIS_TYPE=sentinel",
        ));
    }
    set(out, "redis_sentinel", sentinels.join(","), "REDIS_URL");
    set(out, "redis_sentinel_master", master, "REDIS_URL");
    if tls || auth.is_some() {
        let scheme = if tls { "rediss" } else { "redis" };
        let userinfo = auth.map(userinfo).unwrap_or_default();
        set(
            out,
            "redis_url",
            format!("{scheme}://{userinfo}primary"),
            "REDIS_AUTH",
        );
    }
    if let Some(password) = env.take("REDIS_SENTINEL_AUTH") {
        set(
            out,
            "redis_sentinel_password",
            password,
            "REDIS_SENTINEL_AUTH",
        );
    }
    Ok(())
}

/// What only matters with `REDIS_URL`.
const REDIS_SETTINGS: &[&str] = &[
    "REDIS_TYPE",
    "REDIS_SENTINEL_AUTH",
    "REDIS_SOCKET_TYPE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TIMEOUT",
    "REDIS_POOL_SIZE",
    "CACHE_KEY_PREFIX",
];

/// `host:port`, with a port that is a number; `[::1]:6379` for IPv6.
fn host_port(node: &str) -> Result<&str, CompatError> {
    let valid = node
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if valid && !node.contains(['/', '@', ' ']) {
        Ok(node)
    } else {
        Err(invalid("REDIS_URL", node, "expected host:port"))
    }
}

/// `REDIS_AUTH` as a URL's user information: `password` or `user:password`, as
/// envoyproxy/ratelimit splits it.
fn userinfo(auth: &str) -> String {
    let encode = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    match auth.split_once(':') {
        Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
        None => format!(":{}@", encode(auth)),
    }
}

/// `redis+unix:///path[?user=..&pass=..]`.
fn unix_url(path: &str, auth: Option<&str>) -> Result<String, CompatError> {
    if !path.starts_with('/') {
        return Err(invalid(
            "REDIS_URL",
            path,
            "expected the absolute path of a Unix socket (REDIS_SOCKET_TYPE=unix)",
        ));
    }
    let encode = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    Ok(
        match auth.map(|auth| auth.split_once(':').unwrap_or(("", auth))) {
            None => format!("redis+unix://{path}"),
            Some(("", password)) => format!("redis+unix://{path}?pass={}", encode(password)),
            Some((user, password)) => format!(
                "redis+unix://{path}?user={}&pass={}",
                encode(user),
                encode(password)
            ),
        },
    )
}

/// `LOG_LEVEL` (logrus levels) → `--log-level`, `LOG_FORMAT` → `--log-format`.
fn logging<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    if let Some(level) = env.take("LOG_LEVEL") {
        // envoyproxy/ratelimit's levels apply to its own messages: other crates stay at warn.
        let filter = match level.to_ascii_lowercase().as_str() {
            "trace" => "warn,slidegate=trace",
            "debug" => "warn,slidegate=debug",
            "info" => "warn,slidegate=info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => {
                return Err(invalid(
                    "LOG_LEVEL",
                    &level,
                    "expected trace, debug, info, warn, error, fatal or panic",
                ));
            }
        };
        set(out, "log_level", filter, "LOG_LEVEL");
    }
    if let Some(format) = env.take("LOG_FORMAT") {
        let format = format.to_ascii_lowercase();
        if format != "text" && format != "json" {
            return Err(invalid("LOG_FORMAT", &format, "expected text or json"));
        }
        set(out, "log_format", format, "LOG_FORMAT");
    }
    Ok(())
}

/// What a decision does: shadow mode, response headers, the handling of denied hits and split
/// domains.
fn behaviour<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    if let Some(shadow) = env.flag("SHADOW_MODE")? {
        set(out, "shadow_mode", shadow.to_string(), "SHADOW_MODE");
    }
    // envoyproxy/ratelimit sends no headers unless asked; slidegate's default is to send them.
    let headers = env.flag("LIMIT_RESPONSE_HEADERS_ENABLED")?.unwrap_or(false);
    set(
        out,
        "response_headers",
        headers.to_string(),
        "LIMIT_RESPONSE_HEADERS_ENABLED",
    );
    for (name, default) in [
        ("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
        ("LIMIT_RESET_HEADER", "RateLimit-Reset"),
    ] {
        if env
            .take(name)
            .is_some_and(|header| !header.eq_ignore_ascii_case(default))
        {
            out.unhonoured.push(Unhonoured {
                variable: name,
                why: "slidegate's header names are fixed (RateLimit-Limit, -Remaining, -Reset)",
            });
        }
    }
    env.expect_flag(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        true,
        "slidegate never counts a denied request",
        out,
    )?;
    env.expect_flag(
        "MERGE_DOMAIN_CONFIG",
        false,
        "each domain must be in one rule file; a domain split over files is refused at load",
        out,
    )?;
    // Not needed: slidegate's exact cache of denied counters is on by default (--redis-deny-cache).
    env.take("LOCAL_CACHE_SIZE_IN_BYTES");
    Ok(())
}

/// Metrics and traces: slidegate has Prometheus metrics at `/metrics` on the operator listener
/// (`DEBUG_HOST`/`DEBUG_PORT`), and traces as envoyproxy/ratelimit's `TRACING_*` variables
/// configure them.
fn observability<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    tracing(env, out)?;
    env.expect_flag(
        "USE_STATSD",
        false,
        "no StatsD: Prometheus metrics are served at /metrics on the debug port (DEBUG_PORT)",
        out,
    )?;
    env.expect_flag(
        "USE_PROMETHEUS",
        false,
        "metrics are served at /metrics on the debug port (DEBUG_PORT), not on PROMETHEUS_ADDR",
        out,
    )?;
    for name in ["PROMETHEUS_ADDR", "PROMETHEUS_PATH"] {
        env.unhonoured_if_set(
            name,
            "metrics are served at /metrics on the debug port (DEBUG_PORT)",
            out,
        );
    }
    Ok(())
}

/// `TRACING_ENABLED=true` → `--otlp-endpoint` from the OpenTelemetry variables that
/// envoyproxy/ratelimit's exporter reads (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT`, else a collector on localhost), and the other `TRACING_*`
/// variables → the other `--otlp-*` flags and `--trace-sampling-ratio`, with
/// envoyproxy/ratelimit's defaults: HTTP, service name `RateLimit`, every request sampled.
/// Without `TRACING_ENABLED=true` they are read and unused, as there.
fn tracing<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let enabled = env.flag("TRACING_ENABLED")? == Some(true);
    let protocol = env
        .take("TRACING_EXPORTER_PROTOCOL")
        .unwrap_or_else(|| "http".to_owned());
    let protocol = match protocol.as_str() {
        "http" | "grpc" => protocol,
        _ => {
            return Err(invalid(
                "TRACING_EXPORTER_PROTOCOL",
                &protocol,
                "expected http or grpc",
            ));
        }
    };
    let ratio = match env.take("TRACING_SAMPLING_RATE") {
        Some(value) => match value.parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => ratio.to_string(),
            _ => {
                return Err(invalid(
                    "TRACING_SAMPLING_RATE",
                    &value,
                    "expected 0.0 to 1.0",
                ));
            }
        },
        None => "1".to_owned(),
    };
    let name = env
        .take("TRACING_SERVICE_NAME")
        .unwrap_or_else(|| "RateLimit".to_owned());
    let namespace = env.take("TRACING_SERVICE_NAMESPACE");
    let instance = env.take("TRACING_SERVICE_INSTANCE_ID");
    if !enabled {
        return Ok(());
    }
    let (endpoint, from) = match (
        env.take("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        env.take("OTEL_EXPORTER_OTLP_ENDPOINT"),
    ) {
        (Some(url), _) => (url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        (None, Some(url)) => (url, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (None, None) if protocol == "grpc" => ("localhost:4317".to_owned(), "TRACING_ENABLED"),
        (None, None) => ("localhost:4318".to_owned(), "TRACING_ENABLED"),
    };
    // Go's exporters take `host:port` too; slidegate's flag takes a URL.
    let endpoint = match endpoint.contains("://") {
        true => endpoint,
        false => format!("http://{endpoint}"),
    };
    set(out, "otlp_endpoint", endpoint, from);
    set(out, "otlp_protocol", protocol, "TRACING_EXPORTER_PROTOCOL");
    set(out, "trace_sampling_ratio", ratio, "TRACING_SAMPLING_RATE");
    set(out, "otlp_service_name", name, "TRACING_SERVICE_NAME");
    if let Some(namespace) = namespace {
        set(
            out,
            "otlp_service_namespace",
            namespace,
            "TRACING_SERVICE_NAMESPACE",
        );
    }
    if let Some(instance) = instance {
        set(
            out,
            "otlp_service_instance_id",
            instance,
            "TRACING_SERVICE_INSTANCE_ID",
        );
    }
    Ok(())
}

/// Variables that other software sets too: alone, they do not turn the layer on.
const GENERIC: &[&str] = &["HOST", "PORT", "LOG_LEVEL", "LOG_FORMAT"];

/// Every variable envoyproxy/ratelimit reads (its `src/settings/settings.go`).
const KNOWN: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn run(vars: &[(&str, &str)]) -> Result<Option<Translation>, CompatError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        translate(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    fn value(translation: &Translation, id: &str) -> Option<String> {
        translation
            .settings
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.value.clone())
    }

    fn error_variable(vars: &[(&str, &str)]) -> &'static str {
        run(vars).expect_err("should be refused").variable
    }

    #[test]
    fn off_without_a_distinctive_variable() {
        assert!(run(&[]).unwrap().is_none());
        assert!(
            run(&[("HOST", "myhost"), ("PORT", "80")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn istio_sample() {
        let t = run(&[
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("USE_STATSD", "false"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("HOST", "::"),
            ("GRPC_HOST", "::"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "config").as_deref(),
            Some("/data/ratelimit/config")
        );
        assert_eq!(
            value(&t, "redis_url").as_deref(),
            Some("redis://redis:6379")
        );
        assert_eq!(value(&t, "http_addr").as_deref(), Some("[::]:8080"));
        assert_eq!(value(&t, "grpc_addr").as_deref(), Some("[::]:8081"));
        assert_eq!(value(&t, "response_headers").as_deref(), Some("false"));
        assert_eq!(
            value(&t, "log_level").as_deref(),
            Some("warn,slidegate=debug")
        );
        assert_eq!(t.unhonoured, vec![]);
    }

    /// Envoy Gateway's rate-limit Deployment: rules over xDS with mutual TLS; its runtime
    /// directory variables are read and unused, as there.
    #[test]
    fn envoy_gateway_xds() {
        let t = run(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "xds_server").as_deref(),
            Some("https://envoy-gateway:18001")
        );
        assert_eq!(value(&t, "xds_node_id").as_deref(), Some("envoy-ratelimit"));
        assert_eq!(
            value(&t, "xds_tls_ca_file").as_deref(),
            Some("/certs/ca.crt")
        );
        assert_eq!(
            value(&t, "xds_tls_cert_file").as_deref(),
            Some("/certs/tls.crt")
        );
        assert_eq!(
            value(&t, "xds_tls_key_file").as_deref(),
            Some("/certs/tls.key")
        );
        assert_eq!(
            value(&t, "force_start_without_initial_config").as_deref(),
            Some("true")
        );
        assert_eq!(
            value(&t, "config"),
            None,
            "--config beside --xds-server is refused"
        );
        assert_eq!(t.unhonoured, vec![]);

        let plain = run(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap().unwrap();
        assert_eq!(
            value(&plain, "xds_server").as_deref(),
            Some("http://localhost:18000")
        );
        let no_tls = run(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(value(&no_tls, "xds_tls_ca_file"), None);
        assert_eq!(
            no_tls.unhonoured.first().map(|u| u.variable),
            Some("CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
        );
        assert_eq!(
            error_variable(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")]),
            "CONFIG_TYPE"
        );
    }

    #[test]
    fn redis_variants() {
        let t = run(&[
            ("REDIS_URL", "a:1, b:2"),
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "user:p@ss"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "redis_cluster").as_deref(),
            Some("rediss://user:p%40ss@a:1,rediss://user:p%40ss@b:2")
        );
        let t = run(&[("REDIS_URL", "/run/redis.sock"), ("REDIS_AUTH", "secret")])
            .unwrap()
            .unwrap();
        assert_eq!(
            value(&t, "redis_url").as_deref(),
            Some("redis+unix:///run/redis.sock?pass=secret")
        );
    }

    #[test]
    fn redis_sentinel_maps_master_sentinels_and_both_passwords() {
        let t = run(&[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster, s1:26379,s2:26379"),
            ("REDIS_AUTH", "p@ss"),
            ("REDIS_SENTINEL_AUTH", "sentinel-secret"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "redis_sentinel_master").as_deref(),
            Some("mymaster")
        );
        assert_eq!(
            value(&t, "redis_sentinel").as_deref(),
            Some("s1:26379,s2:26379")
        );
        assert_eq!(
            value(&t, "redis_url").as_deref(),
            Some("redis://:p%40ss@primary")
        );
        assert_eq!(
            value(&t, "redis_sentinel_password").as_deref(),
            Some("sentinel-secret")
        );
        assert_eq!(value(&t, "redis_cluster"), None);
        assert!(t.unhonoured.is_empty(), "{:?}", t.unhonoured);

        // TLS: to the sentinels and to the primary; no password, no URL needed without TLS.
        let t = run(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "m,s1:1"),
            ("REDIS_TLS", "true"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "redis_sentinel").as_deref(),
            Some("rediss://s1:1")
        );
        assert_eq!(value(&t, "redis_url").as_deref(), Some("rediss://primary"));
        let t = run(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m,s1:1")])
            .unwrap()
            .unwrap();
        assert_eq!(value(&t, "redis_url"), None);

        // A master name and at least one sentinel, each host:port.
        for url in ["mymaster", "s1:26379,s2:26379", "m,s1", ",s1:1"] {
            assert_eq!(
                error_variable(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", url)]),
                "REDIS_URL",
                "{url}"
            );
        }
        // The sentinels' password means nothing without Sentinel: named in the warning.
        let t = run(&[("REDIS_URL", "a:1"), ("REDIS_SENTINEL_AUTH", "x")])
            .unwrap()
            .unwrap();
        assert_eq!(
            t.unhonoured.first().map(|u| u.variable),
            Some("REDIS_SENTINEL_AUTH")
        );
    }

    #[test]
    fn redis_client_certificate_maps_onto_its_flags() {
        let t = run(&[
            ("REDIS_URL", "a:1"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/tls/ca.pem"),
            ("REDIS_TLS_CLIENT_CERT", "/tls/client.pem"),
            ("REDIS_TLS_CLIENT_KEY", "/tls/client.key"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "redis_tls_ca_file").as_deref(),
            Some("/tls/ca.pem")
        );
        assert_eq!(
            value(&t, "redis_tls_cert_file").as_deref(),
            Some("/tls/client.pem")
        );
        assert_eq!(
            value(&t, "redis_tls_key_file").as_deref(),
            Some("/tls/client.key")
        );
        assert!(t.unhonoured.iter().all(|u| !u.variable.contains("CLIENT")));
        // A certificate without its key cannot be presented: refuse to start, naming the missing one.
        assert_eq!(
            error_variable(&[("REDIS_URL", "a:1"), ("REDIS_TLS_CLIENT_CERT", "/c.pem")]),
            "REDIS_TLS_CLIENT_KEY"
        );
    }

    #[test]
    fn malformed_values_name_their_variable() {
        assert_eq!(error_variable(&[("REDIS_URL", "redis")]), "REDIS_URL");
        assert_eq!(error_variable(&[("REDIS_URL", "redis:x")]), "REDIS_URL");
        assert_eq!(error_variable(&[("REDIS_URL", "redis://a:1")]), "REDIS_URL");
        assert_eq!(
            error_variable(&[("REDIS_URL", "a:1"), ("PORT", "80a")]),
            "PORT"
        );
        assert_eq!(error_variable(&[("GRPC_PORT", "70000")]), "GRPC_PORT");
        assert_eq!(error_variable(&[("USE_STATSD", "nope")]), "USE_STATSD");
        assert_eq!(
            error_variable(&[("REDIS_URL", "a:1"), ("REDIS_TIMEOUT", "soon")]),
            "REDIS_TIMEOUT"
        );
        assert_eq!(
            error_variable(&[("LOG_LEVEL", "loud"), ("USE_STATSD", "false")]),
            "LOG_LEVEL"
        );
        assert_eq!(
            error_variable(&[("REDIS_URL", "a:1"), ("REDIS_TYPE", "replicated")]),
            "REDIS_TYPE"
        );
        assert_eq!(error_variable(&[("QUOTA_MODE", "true")]), "QUOTA_MODE");
    }

    #[test]
    fn tracing_variables_map_onto_the_trace_flags() {
        let t = run(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SAMPLING_RATE", "0.25"),
            ("TRACING_SERVICE_NAMESPACE", "edge"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(t.unhonoured, vec![]);
        assert_eq!(
            value(&t, "otlp_endpoint").as_deref(),
            Some("http://otel:4317")
        );
        assert_eq!(value(&t, "otlp_protocol").as_deref(), Some("grpc"));
        assert_eq!(value(&t, "trace_sampling_ratio").as_deref(), Some("0.25"));
        assert_eq!(value(&t, "otlp_service_name").as_deref(), Some("RateLimit"));
        assert_eq!(value(&t, "otlp_service_namespace").as_deref(), Some("edge"));
        assert_eq!(
            value(&t, "otlp_service_instance_id").as_deref(),
            Some("pod-1")
        );

        // envoyproxy/ratelimit's defaults: HTTP to a local collector, every request sampled.
        let t = run(&[("TRACING_ENABLED", "true")]).unwrap().unwrap();
        assert_eq!(
            value(&t, "otlp_endpoint").as_deref(),
            Some("http://localhost:4318")
        );
        assert_eq!(value(&t, "otlp_protocol").as_deref(), Some("http"));
        assert_eq!(value(&t, "trace_sampling_ratio").as_deref(), Some("1"));
        let t = run(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "collector:4318/v1/traces",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            value(&t, "otlp_endpoint").as_deref(),
            Some("http://collector:4318/v1/traces")
        );

        // Off: read, honoured (as there, they do nothing), no trace flag set.
        let t = run(&[
            ("TRACING_ENABLED", "false"),
            ("TRACING_SAMPLING_RATE", "0.5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(t.unhonoured, vec![]);
        assert_eq!(value(&t, "otlp_endpoint"), None);

        for (variable, value) in [
            ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
            ("TRACING_SAMPLING_RATE", "2"),
            ("TRACING_SAMPLING_RATE", "often"),
        ] {
            assert_eq!(
                error_variable(&[("TRACING_ENABLED", "true"), (variable, value)]),
                variable
            );
        }
        assert_eq!(
            error_variable(&[("TRACING_ENABLED", "yes please")]),
            "TRACING_ENABLED"
        );
    }

    #[test]
    fn unhonoured_variables_are_named() {
        let t = run(&[
            ("USE_STATSD", "true"),
            ("DEBUG_PORT", "6070"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("LIMIT_LIMIT_HEADER", "ratelimit-limit"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("REDIS_TYPE", "cluster"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(value(&t, "admin_addr").as_deref(), Some("0.0.0.0:6070"));
        let names: Vec<&str> = t.unhonoured.iter().map(|u| u.variable).collect();
        assert_eq!(
            names,
            vec![
                "REDIS_TYPE",
                "LIMIT_RESET_HEADER",
                "USE_STATSD",
                "NEAR_LIMIT_RATIO"
            ]
        );
        assert!(t.unhonoured[0].why.contains("REDIS_URL is not set"));
    }
}
