//! The e2e tests' fixtures: slidegate, Envoy and nginx as processes on free ports (Envoy and
//! nginx with the files in `examples/`, rewritten textually by [`rewrite`]), the demo upstream,
//! HTTP/1.1 by hand, and the small helpers for files and directories.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Ca, KillOnDrop, free_port, wait_until};

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// A running slidegate on free ports.
pub struct Slidegate {
    pub http_port: u16,
    pub grpc_port: u16,
    /// The operator listener: `/metrics`, `/rlconfig`.
    pub admin_port: u16,
    process: Option<KillOnDrop>,
    /// How it was started, for [`Slidegate::restart`].
    config: PathBuf,
    redis_url: Option<String>,
    flags: Vec<String>,
    ready: fn(u16, u16) -> bool,
}

/// slidegate answers /healthcheck and accepts gRPC connections.
fn slidegate_healthy(http_port: u16, grpc_port: u16) -> bool {
    try_http(http_port, "GET", "/healthcheck", &[], "").is_ok_and(|r| r.status == 200)
        && TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
}

/// Both of slidegate's ports accept connections.
fn slidegate_listening(http_port: u16, grpc_port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", http_port)).is_ok()
        && TcpStream::connect(("127.0.0.1", grpc_port)).is_ok()
}

impl Slidegate {
    /// Starts `slidegate serve` with the given rules and store; waits for /healthcheck.
    pub fn start(dir: &Path, config: &Path, redis_url: Option<&str>, name: &str) -> Slidegate {
        Slidegate::launch(dir, config, redis_url, name, &[], slidegate_healthy, None)
    }

    /// Like [`Slidegate::start`] on the memory store, with more `flags` (e.g.
    /// `--response-metadata`).
    pub fn start_with_flags(dir: &Path, config: &Path, name: &str, flags: &[&str]) -> Slidegate {
        Slidegate::launch(dir, config, None, name, flags, slidegate_healthy, None)
    }

    /// Starts `slidegate serve` on the memory store with TLS `flags`; waits until both ports
    /// accept connections (a plaintext /healthcheck cannot tell more).
    pub fn start_tls(dir: &Path, config: &Path, name: &str, flags: &[&str]) -> Slidegate {
        Slidegate::launch(dir, config, None, name, flags, slidegate_listening, None)
    }

    /// Kills it (unless [`Slidegate::stop`] did already) and starts it again as it was started,
    /// on the same three ports; its log goes to `<name>.log`.
    pub fn restart(&mut self, dir: &Path, name: &str) {
        self.stop();
        let flags: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        let ports = (self.http_port, self.grpc_port, self.admin_port);
        let config = self.config.clone();
        let redis_url = self.redis_url.clone();
        *self = Slidegate::launch(
            dir,
            &config,
            redis_url.as_deref(),
            name,
            &flags,
            self.ready,
            Some(ports),
        );
    }

    /// Starts slidegate on `ports` (HTTP, gRPC, admin), else on free ports.
    fn launch(
        dir: &Path,
        config: &Path,
        redis_url: Option<&str>,
        name: &str,
        flags: &[&str],
        ready: fn(u16, u16) -> bool,
        ports: Option<(u16, u16, u16)>,
    ) -> Slidegate {
        let (http_port, grpc_port, admin_port) =
            ports.unwrap_or_else(|| (free_port(), free_port(), free_port()));
        let mut command = Command::new(env!("CARGO_BIN_EXE_slidegate"));
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc_port}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")]);
        if let Some(url) = redis_url {
            command.args(["--redis-url", url]);
        }
        command.args(flags);
        // Only the flags above: no SLIDEGATE_* from the environment running the tests.
        for (key, _) in std::env::vars() {
            if key.starts_with("SLIDEGATE_") {
                command.env_remove(key);
            }
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(log_file(dir, name))
            .spawn()
            .expect("spawn slidegate");
        let mut process = KillOnDrop(child);
        let up = wait_until(Duration::from_secs(30), || ready(http_port, grpc_port));
        if !up {
            let exited = process.0.try_wait().ok().flatten();
            panic!(
                "slidegate did not become healthy (exit: {exited:?}); log:\n{}",
                std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
            );
        }
        Slidegate {
            http_port,
            grpc_port,
            admin_port,
            process: Some(process),
            config: config.to_path_buf(),
            redis_url: redis_url.map(str::to_string),
            flags: flags.iter().map(|f| f.to_string()).collect(),
            ready,
        }
    }

    /// Kills it (the ports then refuse connections).
    pub fn stop(&mut self) {
        self.process = None;
    }
}

/// A running Envoy with a file from examples/ (envoy.yaml unless started with
/// [`Envoy::launch`]), its ports rewritten.
pub struct Envoy {
    pub port: u16,
    pub admin_port: u16,
    /// Envoy's stdout, where the example's access log goes: `<name>.access.log`.
    access_log: PathBuf,
    _process: KillOnDrop,
}

impl Envoy {
    /// Starts Envoy in front of `upstream` with one `ratelimit` endpoint per gRPC port;
    /// waits until its admin /ready says LIVE.
    pub fn start(program: &Path, dir: &Path, grpc_ports: &[u16], upstream: u16) -> Envoy {
        let endpoints = tcp_endpoints(grpc_ports);
        Envoy::start_with(program, dir, &endpoints, upstream, "envoy", None)
    }

    /// [`Envoy::start`] with the `ratelimit` endpoints' `addresses` (Envoy's YAML: a
    /// `socket_address` or a `pipe`), named `name` (its config and log files), with
    /// `transport_socket` (YAML at the cluster's indentation) added to the `ratelimit` cluster.
    pub fn start_with(
        program: &Path,
        dir: &Path,
        addresses: &[String],
        upstream: u16,
        name: &str,
        transport_socket: Option<&str>,
    ) -> Envoy {
        let port = free_port();
        let admin_port = free_port();
        let example = read_example("envoy.yaml");
        // The ratelimit endpoint line, once per replica.
        let endpoint_line = example
            .lines()
            .find(|l| l.contains("- endpoint:") && l.contains("port_value: 8081"))
            .expect("examples/envoy.yaml: no ratelimit endpoint on port 8081");
        let endpoints = addresses
            .iter()
            .map(|a| endpoint_line.replace(EXAMPLE_RATELIMIT_ADDRESS, a))
            .collect::<Vec<_>>()
            .join("\n");
        let config = rewrite(
            &example,
            &[
                (endpoint_line, endpoints),
                ("port_value: 10000", format!("port_value: {port}")),
                ("port_value: 9901", format!("port_value: {admin_port}")),
                ("port_value: 8000", format!("port_value: {upstream}")),
                ("timeout: 0.1s", "timeout: 2s".to_string()),
            ],
        );
        let config = match transport_socket {
            Some(socket) => rewrite(
                &config,
                &[(RATELIMIT_CLUSTER, format!("{RATELIMIT_CLUSTER}{socket}"))],
            ),
            None => config,
        };
        Envoy::launch(program, dir, name, &config, port, admin_port)
    }

    /// Starts Envoy with `config` (an example file after [`rewrite`], listening on `port` with
    /// its admin on `admin_port`), named `name` (its config and log files); waits until its
    /// admin /ready says LIVE.
    pub fn launch(
        program: &Path,
        dir: &Path,
        name: &str,
        config: &str,
        port: u16,
        admin_port: u16,
    ) -> Envoy {
        let config_path = dir.join(format!("{name}.yaml"));
        std::fs::write(&config_path, config).expect("write envoy config");
        let access_log = dir.join(format!("{name}.access.log"));
        let child = Command::new(program)
            .arg("-c")
            .arg(&config_path)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "--log-level",
                "info",
                // The access log reaches the file within 0.1 s instead of Envoy's 10 s.
                "--file-flush-interval-msec",
                "100",
            ])
            .stdout(std::fs::File::create(&access_log).expect("create access log"))
            .stderr(log_file(dir, name))
            .spawn()
            .expect("spawn envoy");
        let mut process = KillOnDrop(child);
        let ready = wait_until(Duration::from_secs(60), || {
            try_http(admin_port, "GET", "/ready", &[], "").is_ok_and(|r| r.status == 200)
        });
        if !ready {
            let exited = process.0.try_wait().ok().flatten();
            panic!(
                "envoy did not become ready (exit: {exited:?}); log:\n{}",
                std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
            );
        }
        Envoy {
            port,
            admin_port,
            access_log,
            _process: process,
        }
    }

    /// The access-log line (examples/envoy.yaml's format) of the one request for `path` (with
    /// its query string): waits up to 30 s for Envoy to write it, panics with the log without it.
    pub fn access_log_line(&self, method: &str, path: &str) -> String {
        let request = format!("\"{method} {path} HTTP/1.1\"");
        let mut log = String::new();
        let mut lines = Vec::new();
        wait_until(Duration::from_secs(30), || {
            log = std::fs::read_to_string(&self.access_log).unwrap_or_default();
            lines = log
                .lines()
                .filter(|l| l.contains(&request))
                .map(str::to_string)
                .collect();
            !lines.is_empty()
        });
        match lines.as_slice() {
            [line] => line.clone(),
            [] => panic!(
                "no access-log line for {request} in {}:\n{log}",
                self.access_log.display()
            ),
            _ => panic!("several access-log lines for {request}:\n{log}"),
        }
    }

    /// A page of the admin interface.
    pub fn admin(&self, path: &str) -> String {
        http_get(self.admin_port, path, &[]).body
    }
}

/// The `ratelimit` endpoint's address in examples/envoy.yaml.
const EXAMPLE_RATELIMIT_ADDRESS: &str =
    "{ socket_address: { address: 127.0.0.1, port_value: 8081 } }";

/// Envoy addresses for slidegate's gRPC `ports` on 127.0.0.1.
pub fn tcp_endpoints(ports: &[u16]) -> Vec<String> {
    ports
        .iter()
        .map(|p| format!("{{ socket_address: {{ address: 127.0.0.1, port_value: {p} }} }}"))
        .collect()
}

/// The start of the `ratelimit` cluster in examples/envoy.yaml, where a transport socket goes.
const RATELIMIT_CLUSTER: &str = "  - name: ratelimit\n    type: STATIC\n";

/// The `ratelimit` cluster's transport socket for mutual TLS: Envoy presents `cert`/`key`,
/// trusts `ca` for slidegate's certificate and checks that it is for `localhost`.
pub fn upstream_tls(cert: &Path, key: &Path, ca: &Path) -> String {
    format!(
        "    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: [h2]
          tls_certificates:
          - certificate_chain: {{ filename: {} }}
            private_key: {{ filename: {} }}
          validation_context:
            trusted_ca: {{ filename: {} }}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{ exact: localhost }}
",
        cert.display(),
        key.display(),
        ca.display()
    )
}

/// Writes `pem` as `name` in `dir`.
pub fn write_pem(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("write PEM");
    path
}

/// slidegate's flags for mutual TLS: a `localhost` certificate from `ca`, clients required to
/// present a certificate from `ca` for `client_san`.
pub fn mutual_tls_flags(dir: &Path, ca: &Ca, client_san: &str) -> Vec<String> {
    let server = ca.server();
    let path = |name: &str, pem: &str| write_pem(dir, name, pem).display().to_string();
    vec![
        "--tls-cert-file".to_string(),
        path("sg.crt", &server.cert),
        "--tls-key-file".to_string(),
        path("sg.key", &server.key),
        "--tls-client-ca-file".to_string(),
        path("ca.crt", &ca.pem),
        "--tls-client-san".to_string(),
        client_san.to_string(),
    ]
}

/// A running nginx with examples/nginx.conf, its ports rewritten.
pub struct Nginx {
    pub port: u16,
    _process: KillOnDrop,
}

impl Nginx {
    /// Starts nginx in front of `upstream`, checking with slidegate on `check_port`; waits until
    /// it accepts connections.
    pub fn start(program: &Path, dir: &Path, check_port: u16, upstream: u16) -> Nginx {
        Nginx::start_with(program, dir, check_port, upstream, &[])
    }

    /// Like `start`, with `extra` textual rewrites of the example (e.g. the check over TLS).
    pub fn start_with(
        program: &Path,
        dir: &Path,
        check_port: u16,
        upstream: u16,
        extra: &[(&str, String)],
    ) -> Nginx {
        let port = free_port();
        let mut pairs = vec![
            (
                "listen 127.0.0.1:8888;",
                format!("listen 127.0.0.1:{port};"),
            ),
            (
                "server 127.0.0.1:8080;",
                format!("server 127.0.0.1:{check_port};"),
            ),
            (
                "server 127.0.0.1:8000;",
                format!("server 127.0.0.1:{upstream};"),
            ),
            (
                "proxy_read_timeout    100ms;",
                "proxy_read_timeout    2s;".to_string(),
            ),
        ];
        pairs.extend(extra.iter().cloned());
        let conf = rewrite(&read_example("nginx.conf"), &pairs);
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let prefix = dir.join("nginx");
        std::fs::create_dir_all(&prefix).expect("nginx prefix");
        let log = log_file(dir, "nginx");
        let child = Command::new(program)
            .arg("-p")
            .arg(&prefix)
            .args(["-e", "stderr", "-c"])
            .arg(&conf_path)
            .args(["-g", "daemon off; master_process off;"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nginx");
        let process = KillOnDrop(child);
        assert!(
            wait_until(Duration::from_secs(10), || TcpStream::connect((
                "127.0.0.1",
                port
            ))
            .is_ok()),
            "nginx did not start; see {}",
            dir.join("nginx.log").display()
        );
        Nginx {
            port,
            _process: process,
        }
    }
}

/// The demo upstream: answers every request with 200 "hello from the upstream\n" (keep-alive).
/// Its thread ends with the test process.
pub struct Upstream {
    pub port: u16,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let port = listener.local_addr().expect("upstream addr").port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || serve_hello(stream));
            }
        });
        Upstream { port }
    }
}

fn serve_hello(stream: TcpStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut content_length = 0usize;
        let mut first = true;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" || line == "\n" {
                if first {
                    continue;
                }
                break;
            }
            first = false;
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let reply = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 24\r\n\r\n\
                     hello from the upstream\n";
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 by hand (one connection per request), and small helpers
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> Response {
    try_http(port, "GET", path, headers, "")
        .unwrap_or_else(|e| panic!("GET 127.0.0.1:{port}{path}: {e}"))
}

pub fn try_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\
         content-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw).ok_or_else(|| {
        std::io::Error::other(format!("bad response: {:?}", String::from_utf8_lossy(&raw)))
    })
}

/// A GET of `path` with `headers` written as they are (each line ending in CRLF): headers whose
/// bytes are not UTF-8 (obs-text), which a client may send. Its status, 0 when the exchange failed.
pub fn get_with_raw_headers(port: u16, path: &str, headers: &[u8]) -> u16 {
    let mut request =
        format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n").into_bytes();
    request.extend_from_slice(headers);
    request.extend_from_slice(b"\r\n");
    let exchange = || -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.write_all(&request)?;
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        Ok(raw)
    };
    exchange()
        .ok()
        .and_then(|raw| parse_response(&raw))
        .map_or(0, |r| r.status)
}

pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Some(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size =
            usize::from_str_radix(size.split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
        if size == 0 || after.len() < size {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    body
}

/// `count` GETs from `threads` threads; the statuses (0 for a failed connection).
pub fn parallel_gets(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    count: usize,
    threads: usize,
) -> Vec<u16> {
    let next = Arc::new(AtomicUsize::new(0));
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let next = next.clone();
            let headers = headers.clone();
            let path = path.to_string();
            std::thread::spawn(move || {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                let mut statuses = Vec::new();
                while next.fetch_add(1, Ordering::SeqCst) < count {
                    let status = try_http(port, "GET", &path, &headers, "").map_or(0, |r| r.status);
                    statuses.push(status);
                }
                statuses
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("request thread"))
        .collect()
}

/// A host's counter from Envoy's admin `/clusters` (`cluster::ip:port::stat::value`).
pub fn cluster_stat(clusters: &str, cluster: &str, port: u16, stat: &str) -> Option<u64> {
    let prefix = format!("{cluster}::127.0.0.1:{port}::{stat}::");
    clusters
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

/// The single value of a PromQL instant-vector answer.
pub fn promql_scalar(body: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let result = v["data"]["result"].as_array()?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

pub fn url_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Replaces each `from` (which must occur) by its `to`, all at once: a new port number can never
/// be rewritten again by a later pair.
pub fn rewrite(text: &str, pairs: &[(&str, String)]) -> String {
    let mut out = text.to_string();
    for (i, (from, _)) in pairs.iter().enumerate() {
        assert!(out.contains(from), "example no longer contains {from:?}");
        out = out.replace(from, &format!("\u{0}{i}\u{0}"));
    }
    for (i, (_, to)) in pairs.iter().enumerate() {
        out = out.replace(&format!("\u{0}{i}\u{0}"), to);
    }
    out
}

pub fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

pub fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

pub fn example(name: &str) -> PathBuf {
    repo_file("examples").join(name)
}

pub fn read_example(name: &str) -> String {
    std::fs::read_to_string(example(name)).unwrap_or_else(|e| panic!("read examples/{name}: {e}"))
}

/// The shipped rules.
pub fn default_config() -> PathBuf {
    repo_file("config")
}

/// A fresh directory for one test's configs and logs: target/tmp/e2e/<name>.
pub fn test_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("e2e")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

/// Writes a rule directory with one file; returns the directory.
pub fn write_config(dir: &Path, yaml: &str) -> PathBuf {
    let config = dir.join("config");
    std::fs::create_dir_all(&config).expect("config dir");
    std::fs::write(config.join("rules.yaml"), yaml).expect("write rules");
    config
}

pub fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(format!("{name}.log"))).expect("create log file")
}
