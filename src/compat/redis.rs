//! The store: `REDIS_*` and `CACHE_KEY_PREFIX`.

use super::value::Value;
use super::{Caveat, CompatError, Env, Translation, invalid, set, unsupported};

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
        let insecure = skip_hostname_verification(env, out)?;
        sentinel_settings(env, &url, tls, auth.as_deref(), insecure, out)?;
    } else {
        let insecure = skip_hostname_verification(env, out)?;
        let nodes = url
            .split(',')
            .map(|node| {
                Node::parse(node.trim()).map(|node| node.url(tls, auth.as_deref(), insecure))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if cluster {
            if nodes.iter().any(|node| node.1) {
                return Err(invalid(
                    "REDIS_URL",
                    &url,
                    "a Redis Cluster has only database 0",
                ));
            }
            let nodes = nodes.into_iter().map(|node| node.0).collect();
            set(out, Value::RedisCluster(nodes), "REDIS_URL");
        } else if let [(node, _)] = nodes.as_slice() {
            set(out, Value::RedisUrl(node.clone()), "REDIS_URL");
        } else {
            return Err(invalid(
                "REDIS_URL",
                &url,
                "expected one host:port or redis:// URL (several are for REDIS_TYPE=cluster)",
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
    insecure: bool,
    out: &mut Translation,
) -> Result<(), CompatError> {
    let fragment = if tls && insecure { "#insecure" } else { "" };
    let mut parts = url.split(',').map(str::trim);
    let master = parts.next().unwrap_or_default();
    let sentinels = parts
        .map(|node| {
            host_port(node).map(|node| match tls {
                true => format!("rediss://{node}{fragment}"),
                false => node.to_owned(),
            })
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
        let url = format!("{scheme}://{userinfo}primary{fragment}");
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

/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true`: the store's URLs get `#insecure`, with a
/// warning, because redis-rs then checks neither the name nor the chain (envoyproxy/ratelimit
/// still checks the chain against its CAs): a server that can be impersonated is trusted.
fn skip_hostname_verification<F: Fn(&str) -> Option<String>>(
    env: &Env<F>,
    out: &mut Translation,
) -> Result<bool, CompatError> {
    let skip = env.flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? == Some(true);
    if skip {
        out.warnings.push(Caveat {
            variable: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            cost: "the Redis server's certificate is not verified at all (neither its name nor \
                  its chain): anyone on the path can pose as the server",
        });
    }
    Ok(skip)
}

/// One entry of `REDIS_URL` in any form envoyproxy/ratelimit's client (radix) dials: `host:port`,
/// or `redis://[user[:password]@]host:port[/db][?db=N&username=U&password=P]`; and
/// `rediss://...`, which slidegate reads as TLS (`REDIS_TLS=true` does the same for either).
struct Node<'a> {
    tls: bool,
    /// `user:password@` or `:password@`, percent-encoded.
    userinfo: Option<String>,
    host_port: &'a str,
    db: Option<u32>,
}

impl<'a> Node<'a> {
    fn parse(raw: &'a str) -> Result<Node<'a>, CompatError> {
        let bad = |expected| invalid("REDIS_URL", raw, expected);
        let lower = raw.get(..9).unwrap_or_default().to_ascii_lowercase();
        let (tls, rest) = if lower.starts_with("redis://") {
            (false, &raw[8..])
        } else if lower.starts_with("rediss://") {
            (true, &raw[9..])
        } else {
            return Ok(Node {
                tls: false,
                userinfo: None,
                host_port: host_port(raw)?,
                db: None,
            });
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (rest, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (user_password, host) = match rest.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, rest),
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let (mut user, mut password) = match user_password {
            Some(info) => match info.split_once(':') {
                Some((user, password)) => (decode(user), decode(password)),
                None => (decode(info), String::new()),
            },
            None => (String::new(), String::new()),
        };
        let mut db = (!path.is_empty()).then(|| path.to_owned());
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "db" if db.is_none() => db = Some(decode(value)),
                "username" if user.is_empty() => user = decode(value),
                "password" if password.is_empty() => password = decode(value),
                "db" | "username" | "password" => {}
                _ => return Err(bad("expected only db, username and password in the query")),
            }
        }
        let db = db
            .map(|db| {
                db.parse::<u32>()
                    .map_err(|_| bad("expected a database number after '/'"))
            })
            .transpose()?;
        let userinfo = match (user.is_empty(), password.is_empty()) {
            (true, true) => None,
            (_, true) => Some(format!("{}@", encode(&user))),
            _ => Some(format!("{}:{}@", encode(&user), encode(&password))),
        };
        Ok(Node {
            tls,
            userinfo,
            host_port: host_port(host)
                .map_err(|_| bad("expected redis://[user:password@]host:port[/db]"))?,
            db,
        })
    }

    /// The URL `--redis-url` and `--redis-cluster` take, and whether it names a database other
    /// than 0. The URL's own credentials win over `REDIS_AUTH`, as radix reads them.
    fn url(&self, tls: bool, auth: Option<&str>, insecure: bool) -> (String, bool) {
        let tls = tls || self.tls;
        let scheme = if tls { "rediss" } else { "redis" };
        let userinfo = match &self.userinfo {
            Some(userinfo) => userinfo.clone(),
            None => auth.map(userinfo).unwrap_or_default(),
        };
        let db = self.db.map(|db| format!("/{db}")).unwrap_or_default();
        let fragment = if tls && insecure { "#insecure" } else { "" };
        let url = format!("{scheme}://{userinfo}{}{db}{fragment}", self.host_port);
        (url, self.db.is_some_and(|db| db != 0))
    }
}

fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

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
