//! The store: `REDIS_*` and `CACHE_KEY_PREFIX`.

use super::value::Value;
use super::{CompatError, Env, Translation, invalid, set, unsupported};

/// `REDIS_*` and `CACHE_KEY_PREFIX` → `--redis-url`, `--redis-cluster` or `--redis-sentinel`,
/// and the rest of the store's settings. Without `REDIS_URL` the counters stay in memory.
pub(super) fn redis<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<(), CompatError> {
    // envoyproxy/ratelimit's /healthcheck follows the Redis connection only when asked to.
    let active = env.flag("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")?;
    set(
        out,
        Value::HealthIgnoresStoreOutage(!active.unwrap_or(false)),
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    );
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
        let url = unix_url(&url, auth.as_deref())?;
        set(out, Value::RedisUrl(url), "REDIS_URL");
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
            set(out, Value::RedisCluster(nodes), "REDIS_URL");
        } else if let [node] = nodes.as_slice() {
            set(out, Value::RedisUrl(node.clone()), "REDIS_URL");
        } else {
            return Err(invalid(
                "REDIS_URL",
                &url,
                "expected one host:port (several are for REDIS_TYPE=cluster)",
            ));
        }
    }
    if let Some(ca) = env.take("REDIS_TLS_CACERT") {
        set(out, Value::RedisTlsCaFile(ca.into()), "REDIS_TLS_CACERT");
    }
    if let Some(timeout) = env.take("REDIS_TIMEOUT") {
        let timeout = humantime::parse_duration(&timeout).map_err(|_| {
            invalid(
                "REDIS_TIMEOUT",
                &timeout,
                "expected a duration such as 50ms",
            )
        })?;
        set(out, Value::RedisTimeout(timeout), "REDIS_TIMEOUT");
    }
    if let Some(prefix) = env.take("CACHE_KEY_PREFIX") {
        if prefix.contains(['{', '}']) {
            return Err(invalid(
                "CACHE_KEY_PREFIX",
                &prefix,
                "must not contain '{' or '}' (they decide the cluster hash slot)",
            ));
        }
        set(out, Value::RedisPrefix(prefix), "CACHE_KEY_PREFIX");
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
            set(
                out,
                Value::RedisTlsCertFile(cert.into()),
                "REDIS_TLS_CLIENT_CERT",
            );
            set(
                out,
                Value::RedisTlsKeyFile(key.into()),
                "REDIS_TLS_CLIENT_KEY",
            );
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
    set(out, Value::RedisSentinel(sentinels), "REDIS_URL");
    set(
        out,
        Value::RedisSentinelMaster(master.to_owned()),
        "REDIS_URL",
    );
    if tls || auth.is_some() {
        let scheme = if tls { "rediss" } else { "redis" };
        let userinfo = auth.map(userinfo).unwrap_or_default();
        let url = format!("{scheme}://{userinfo}primary");
        set(out, Value::RedisUrl(url), "REDIS_AUTH");
    }
    if let Some(password) = env.take("REDIS_SENTINEL_AUTH") {
        set(
            out,
            Value::RedisSentinelPassword(password),
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
