//! slidegate as a drop-in for envoyproxy/ratelimit: the binary, started as `/bin/ratelimit` would
//! be in Istio's sample (`samples/ratelimit/rate-limit-service.yaml`), with exactly that
//! environment and nothing else, its rules in a directory shaped like a mounted ConfigMap and
//! updated the way kubelet updates one; and the errors that stop a start with a malformed value.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{
    KillOnDrop, RedisServer, call, descriptor, free_port, http_get, request, wait_until,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// The ConfigMap of Istio's sample (its comment), with a `metadata` key as envoyproxy/ratelimit
/// accepts it.
pub(super) const ISTIO_RULES: &str = r#"
domain: echo-ratelimit
descriptors:
  - key: PATH
    value: "/"
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      team: { name: echo }
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#;

/// The rules after the ConfigMap update: one more path.
const UPDATED_RULES: &str = r#"
domain: echo-ratelimit
descriptors:
  - key: PATH
    value: "/"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    value: "/reloaded"
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
"#;

/// A volume as kubelet mounts a ConfigMap: `config.yaml -> ..data/config.yaml`,
/// `..data -> ..<timestamp>`, the files in the timestamped directory.
pub(super) struct ConfigMapVolume {
    dir: PathBuf,
    version: u32,
}

impl ConfigMapVolume {
    pub(super) fn create(dir: PathBuf, rules: &str) -> ConfigMapVolume {
        std::fs::create_dir_all(&dir).expect("volume dir");
        let mut volume = ConfigMapVolume { dir, version: 0 };
        volume.update(rules);
        std::os::unix::fs::symlink("..data/config.yaml", volume.dir.join("config.yaml"))
            .expect("file symlink");
        volume
    }

    /// kubelet's atomic update: a new timestamped directory, a `..data_tmp` link to it renamed
    /// over `..data`, the old directory removed.
    fn update(&mut self, rules: &str) {
        self.version += 1;
        let old = self.timestamped(self.version - 1);
        let new = self.timestamped(self.version);
        std::fs::create_dir(self.dir.join(&new)).expect("timestamped dir");
        std::fs::write(self.dir.join(&new).join("config.yaml"), rules).expect("write rules");
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("rename over ..data");
        if self.version > 1 {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove old version");
        }
    }

    fn timestamped(&self, version: u32) -> String {
        format!("..2026_12_01_06_00_0{version}.{}", 1000 + version)
    }
}

/// `slidegate` under the name `ratelimit` (as the image's `/bin/ratelimit`), with no arguments
/// and an environment of exactly `env`.
pub(super) fn ratelimit(dir: &Path, env: &[(&str, String)]) -> Command {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let link = bin.join("ratelimit");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_slidegate"), &link).expect("symlink");
    }
    let mut command = Command::new(link);
    command
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

/// Istio's sample environment, with the test's Redis and rule directory. `PORT`, `GRPC_PORT` and
/// `DEBUG_PORT` are added (free ports instead of 8080/8081/6070, which other tests or programs
/// may hold).
fn istio_env(redis: &str, root: &Path, ports: [u16; 3]) -> Vec<(&'static str, String)> {
    let [http, grpc, debug] = ports;
    vec![
        ("LOG_LEVEL", "debug".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", redis.into()),
        ("USE_STATSD", "false".into()),
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("HOST", "::".into()),
        ("GRPC_HOST", "::".into()),
        ("PORT", http.to_string()),
        ("GRPC_PORT", grpc.to_string()),
        ("DEBUG_PORT", debug.to_string()),
    ]
}

/// A started server: the process, its log, its ports.
pub(super) struct Started {
    process: KillOnDrop,
    log: PathBuf,
    grpc: u16,
}

impl Started {
    pub(super) fn start(mut command: Command, log: PathBuf, http: u16, grpc: u16) -> Started {
        let file = std::fs::File::create(&log).expect("log");
        let process = KillOnDrop(command.stderr(file).spawn().expect("spawn"));
        let mut started = Started { process, log, grpc };
        let up = wait_until(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", grpc)).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
        });
        if !up {
            let exit = started.process.0.try_wait().ok().flatten();
            panic!("did not start (exit {exit:?}):\n{}", started.log());
        }
        started
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The lines of the compatibility warning.
    fn warnings(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|line| line.contains("not honoured"))
            .map(String::from)
            .collect()
    }

    pub(super) async fn decide(&self, path: &str) -> Code {
        self.answer(path).await.overall_code()
    }

    async fn answer(&self, path: &str) -> RateLimitResponse {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", self.grpc))
                .expect("uri")
                .connect()
                .await
                .expect("connect");
        let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
        call(
            &mut client,
            request("echo-ratelimit", vec![descriptor(&[("PATH", path)])]),
        )
        .await
    }
}

/// Istio's sample, switched to slidegate by changing the image only: the rules are found under
/// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config`, enforced with the counters in Redis, reloaded when
/// the ConfigMap changes, and nothing in that environment is left unhonoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_sample_environment_serves_reloads_and_enforces_with_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("data");
    let mut volume = ConfigMapVolume::create(root.join("ratelimit/config"), ISTIO_RULES);
    let (http, grpc, debug) = (free_port(), free_port(), free_port());
    let env = istio_env(
        &format!("127.0.0.1:{}", redis.port),
        &root,
        [http, grpc, debug],
    );
    let server = Started::start(
        ratelimit(dir.path(), &env),
        dir.path().join("log"),
        http,
        grpc,
    );

    // Served: the rules from the mounted ConfigMap, on the debug port.
    let (status, rules) = http_get(debug, "/rlconfig");
    assert_eq!(status, 200, "{rules}");
    assert!(rules.contains("echo-ratelimit"), "{rules}");
    let (status, _) = http_get(http, "/healthcheck");
    assert_eq!(status, 200);

    // Enforced, with the counters in Redis: 1 per minute on `/`.
    assert_eq!(server.decide("/").await, Code::Ok);
    assert_eq!(server.decide("/").await, Code::OverLimit);
    // envoyproxy/ratelimit's default: no RateLimit-* headers without
    // LIMIT_RESPONSE_HEADERS_ENABLED.
    let other = server.answer("/other").await;
    assert_eq!(other.overall_code(), Code::Ok);
    assert_eq!(other.response_headers_to_add, vec![]);
    // Counter keys hold the descriptor's `{...}` (beside them the node's clock).
    let keys = redis.cli(&["--scan", "--pattern", "*{*"]);
    assert!(
        !keys.trim().is_empty(),
        "no counters in Redis:\n{}",
        server.log()
    );

    // Reloaded: kubelet swaps `..data`; the new path's limit (2 per minute) applies.
    volume.update(UPDATED_RULES);
    let reloaded = wait_until(Duration::from_secs(20), || {
        http_get(debug, "/rlconfig").1.contains("/reloaded")
    });
    assert!(
        reloaded,
        "no reload after the ..data swap:\n{}",
        server.log()
    );
    assert_eq!(server.decide("/reloaded").await, Code::Ok);
    assert_eq!(server.decide("/reloaded").await, Code::Ok);
    assert_eq!(server.decide("/reloaded").await, Code::OverLimit);
    // The count on `/` survived the reload.
    assert_eq!(server.decide("/").await, Code::OverLimit);

    assert_eq!(server.warnings(), Vec::<String>::new(), "{}", server.log());
}

/// Variables slidegate does not honour are named in one warning; a flag on the command line and
/// a `SLIDEGATE_*` variable beat envoyproxy/ratelimit's variable for the same setting.
#[test]
fn unhonoured_variables_are_named_in_one_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("data");
    ConfigMapVolume::create(root.join("ratelimit/config"), ISTIO_RULES);
    let (http, grpc) = (free_port(), free_port());
    let mut env = istio_env(
        "unused:6379",
        &root,
        [free_port(), free_port(), free_port()],
    );
    env.retain(|(k, _)| !k.starts_with("REDIS_"));
    env.extend([
        ("SLIDEGATE_HTTP_ADDR", format!("127.0.0.1:{http}")),
        ("LIMIT_RESET_HEADER", "X-Reset".to_string()),
        // Read only with USE_PROMETHEUS=true.
        ("PROMETHEUS_PATH", "/stats".to_string()),
        ("NEAR_LIMIT_RATIO", "0.9".to_string()),
        ("USE_STATSD", "false".to_string()),
    ]);
    let mut command = ratelimit(dir.path(), &env);
    command.args(["serve", "--grpc-addr", &format!("127.0.0.1:{grpc}")]);
    let server = Started::start(command, dir.path().join("log"), http, grpc);
    let warnings = server.warnings();
    assert_eq!(warnings.len(), 1, "{}", server.log());
    for variable in ["LIMIT_RESET_HEADER", "PROMETHEUS_PATH", "NEAR_LIMIT_RATIO"] {
        assert!(
            warnings[0].contains(variable),
            "{variable}: {}",
            warnings[0]
        );
    }
    assert!(!warnings[0].contains("USE_STATSD"), "{}", warnings[0]);
}

/// Runs `ratelimit` with `env` (plus a rule directory) and expects it to refuse to start: exit
/// status 2 and an error naming `variable`.
fn refused(env: &[(&str, &str)], variable: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("data");
    ConfigMapVolume::create(root.join("ratelimit/config"), ISTIO_RULES);
    let mut all: Vec<(&str, String)> = vec![
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("PORT", free_port().to_string()),
        ("GRPC_PORT", free_port().to_string()),
        ("DEBUG_PORT", free_port().to_string()),
    ];
    all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    let log = dir.path().join("stderr");
    let file = std::fs::File::create(&log).expect("log");
    let mut process = KillOnDrop(
        ratelimit(dir.path(), &all)
            .stderr(file)
            .spawn()
            .expect("spawn"),
    );
    let mut status = None;
    wait_until(Duration::from_secs(20), || {
        status = process.0.try_wait().ok().flatten();
        status.is_some()
    });
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{env:?}: {stderr}");
    assert!(
        stderr.starts_with(&format!("slidegate: {variable}:")),
        "{env:?}: {stderr}"
    );
}

#[test]
fn malformed_values_stop_the_start_naming_the_variable() {
    refused(&[("REDIS_URL", "redis")], "REDIS_URL");
    refused(&[("REDIS_URL", "redis:six")], "REDIS_URL");
    refused(&[("PORT", "eighty")], "PORT");
    refused(&[("GRPC_PORT", "65536")], "GRPC_PORT");
    refused(&[("USE_STATSD", "no")], "USE_STATSD");
    refused(
        &[("REDIS_URL", "redis:6379"), ("REDIS_TIMEOUT", "1x")],
        "REDIS_TIMEOUT",
    );
    refused(&[("LOG_LEVEL", "verbose")], "LOG_LEVEL");
}

#[test]
fn unsupported_modes_stop_the_start_with_a_clear_error() {
    refused(&[("GRPC_SERVER_USE_TLS", "true")], "GRPC_SERVER_TLS_CERT");
}

/// `REDIS_SOCKET_TYPE=unix` with a socket path in `REDIS_URL` (envoyproxy/ratelimit's default
/// form, used with a local proxy such as nutcracker): the counters go to that Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_a_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("redis.sock");
    let socket_arg = socket.display().to_string();
    let Some(redis) = RedisServer::start_with(&["--unixsocket", &socket_arg]) else {
        return;
    };
    let root = dir.path().join("data");
    ConfigMapVolume::create(root.join("ratelimit/config"), ISTIO_RULES);
    let (http, grpc) = (free_port(), free_port());
    let env = vec![
        ("REDIS_SOCKET_TYPE", "unix".to_string()),
        ("REDIS_URL", socket_arg.clone()),
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("PORT", http.to_string()),
        ("GRPC_PORT", grpc.to_string()),
        ("DEBUG_PORT", free_port().to_string()),
    ];
    let server = Started::start(
        ratelimit(dir.path(), &env),
        dir.path().join("log"),
        http,
        grpc,
    );
    assert_eq!(server.decide("/").await, Code::Ok);
    assert_eq!(server.decide("/").await, Code::OverLimit);
    let counters = redis.cli(&["--scan", "--pattern", "*{*"]);
    assert!(!counters.trim().is_empty(), "{}", server.log());
}
