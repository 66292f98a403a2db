//! The Kubernetes manifests (`deploy/kubernetes/`): built with `kubectl kustomize` (offline),
//! validated against the Kubernetes schemas with `kubernetes-validate` (PyPI, offline), and
//! checked against what the binary serves: the Deployment's container arguments and environment
//! start the real binary with the ConfigMap's rules, its probes and the Prometheus annotations
//! answer on the ports they name, the container ports are the binary's defaults, and the rules
//! give a 429 as docs/kubernetes.md's walkthrough says.
//!
//! The Istio example (`examples/istio/`) is built and validated the same way; its EnvoyFilters'
//! patches are put into an Envoy bootstrap that `envoy --mode validate` must accept, and they must
//! point at the Service's gRPC port, with the domain and descriptor keys of the example's rules.
//!
//! `kubernetes-validate` is looked for in `SLIDEGATE_KUBERNETES_VALIDATE`, then `.venv/bin`
//! (where `scripts/test` installs it), then on PATH.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{
    KillOnDrop, envoy_program, free_port, http_get, require_program, slidegate_command, wait_until,
};
use serde_yaml::Value;

const BASE: &str = "deploy/kubernetes/base";
const REDIS_OVERLAY: &str = "deploy/kubernetes/overlays/redis";
const OPERATOR_OVERLAY: &str = "deploy/kubernetes/overlays/prometheus-operator";
const ISTIO: &str = "examples/istio";

fn kubernetes_validate() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SLIDEGATE_KUBERNETES_VALIDATE") {
        return require_program(&PathBuf::from(path).to_string_lossy());
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubernetes-validate");
    if venv.exists() {
        return Some(venv);
    }
    require_program("kubernetes-validate")
}

/// `kubectl kustomize DIR`, which must succeed.
fn kustomize(kubectl: &Path, dir: &str) -> String {
    let output = Command::new(kubectl)
        .arg("kustomize")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
        .output()
        .expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 manifests")
}

/// `kubernetes-validate --strict` (unknown fields are errors) on the built manifests.
fn validate(validator: &Path, dir: &str, manifests: &str) {
    let mut child = Command::new(validator)
        .args(["--strict", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubernetes-validate");
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, manifests.as_bytes()).expect("write manifests");
    drop(stdin);
    let output = child.wait_with_output().expect("kubernetes-validate");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{dir}:\n{report}");
    // Istio's and the Prometheus Operator's kinds have no schema there (a warning); every
    // Kubernetes kind must pass.
    let kubernetes = documents(manifests)
        .iter()
        .filter(|d| {
            !d["apiVersion"]
                .as_str()
                .is_some_and(|v| v.contains("istio.io") || v.contains("monitoring.coreos.com"))
        })
        .count();
    let passed = report.matches("passed for resource").count();
    assert_eq!(passed, kubernetes, "{dir}:\n{report}");
}

/// The Prometheus Operator overlay: the base, a PodMonitor on the operator port, and a
/// PrometheusRule whose groups are exactly those of deploy/prometheus/slidegate-alerts.yml.
#[test]
fn the_prometheus_operator_overlay_scrapes_the_operator_port_and_ships_the_alerts() {
    let Some(kubectl) = require_program("kubectl") else {
        return;
    };
    let Some(validator) = kubernetes_validate() else {
        return;
    };
    let built = kustomize(&kubectl, OPERATOR_OVERLAY);
    validate(&validator, OPERATOR_OVERLAY, &built);
    let built = documents(&built);
    let monitor = &find(&built, "PodMonitor", "slidegate")["spec"];
    assert_eq!(
        monitor["podMetricsEndpoints"][0]["port"].as_str(),
        Some("admin")
    );
    let labels = &find(&built, "Deployment", "slidegate")["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&monitor["selector"]["matchLabels"], labels);
    let rules: Value = serde_yaml::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/slidegate-alerts.yml"),
        )
        .expect("alert rules"),
    )
    .expect("YAML");
    assert_eq!(
        find(&built, "PrometheusRule", "slidegate")["spec"]["groups"],
        rules["groups"],
        "the PrometheusRule differs from deploy/prometheus/slidegate-alerts.yml"
    );
}

fn documents(manifests: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(manifests)
        .map(|document| serde::Deserialize::deserialize(document).expect("YAML document"))
        .collect()
}

fn find<'a>(documents: &'a [Value], kind: &str, name: &str) -> &'a Value {
    documents
        .iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .map(|seq| {
            seq.iter()
                .map(|v| v.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The default address of a `serve` flag, from `--help` (`[default: 0.0.0.0:8080]`).
fn default_port(flag: &str) -> u16 {
    let output = slidegate_command()
        .args(["serve", "--help"])
        .output()
        .expect("slidegate --help");
    let help = String::from_utf8_lossy(&output.stdout);
    let after = help.split(flag).nth(1).expect("flag in --help");
    let default = after
        .split("[default: ")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("a default");
    default.rsplit(':').next().unwrap().parse().expect("a port")
}

#[test]
fn manifests_build_validate_and_match_what_the_binary_serves() {
    let Some(kubectl) = require_program("kubectl") else {
        return;
    };
    let Some(validator) = kubernetes_validate() else {
        return;
    };
    let base = kustomize(&kubectl, BASE);
    let overlay = kustomize(&kubectl, REDIS_OVERLAY);
    validate(&validator, BASE, &base);
    validate(&validator, REDIS_OVERLAY, &overlay);

    let base = documents(&base);
    let deployment = find(&base, "Deployment", "slidegate");
    assert_eq!(deployment["spec"]["replicas"].as_u64(), Some(2));
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    let container = &pod["spec"]["containers"][0];

    // The image is pinned to this release, never `latest`.
    assert_eq!(
        container["image"].as_str(),
        Some(concat!("slidegate:", env!("CARGO_PKG_VERSION"))),
    );
    // Non-root, read-only root file system, nothing to escalate to.
    assert_eq!(
        pod["spec"]["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true)
    );
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));

    // The container ports are the binary's defaults (the arguments set no address).
    let port_of = |name: &str| -> u16 {
        container["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("no container port {name}"))
    };
    assert_eq!(port_of("http"), default_port("--http-addr"));
    assert_eq!(port_of("grpc"), default_port("--grpc-addr"));
    // The operator listener's address comes from the container's environment (its default
    // binds only the loopback interface, which Prometheus and the kubelet cannot reach).
    let admin_addr = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|v| v["name"].as_str() == Some("SLIDEGATE_ADMIN_ADDR"))
        .and_then(|v| v["value"].as_str())
        .expect("SLIDEGATE_ADMIN_ADDR in the container's environment");
    assert_eq!(
        admin_addr,
        format!("0.0.0.0:{}", port_of("admin")),
        "the operator listener on the pod's address, at the container port `admin`"
    );

    // Services reach the named ports; the PDB and the Services select the pods.
    for service in ["slidegate", "slidegate-headless"] {
        let spec = &find(&base, "Service", service)["spec"];
        for port in spec["ports"].as_sequence().expect("service ports") {
            let target = port["targetPort"].as_str().expect("a named target port");
            port_of(target);
            if target == "grpc" {
                assert_eq!(port["appProtocol"].as_str(), Some("grpc"), "{service}");
            }
        }
        assert_eq!(&spec["selector"], labels, "{service}");
    }
    assert_eq!(
        spec_selector(find(&base, "PodDisruptionBudget", "slidegate")),
        labels
    );
    // Scaled on CPU, and reachable only where it should be: the data ports from anywhere, the
    // operator listener from Prometheus's namespace.
    let hpa = &find(&base, "HorizontalPodAutoscaler", "slidegate")["spec"];
    assert_eq!(hpa["scaleTargetRef"]["name"].as_str(), Some("slidegate"));
    assert!(hpa["minReplicas"].as_u64() >= Some(2));
    let policy = &find(&base, "NetworkPolicy", "slidegate")["spec"];
    assert_eq!(&policy["podSelector"]["matchLabels"], labels);
    let admitted: Vec<(String, bool)> = policy["ingress"]
        .as_sequence()
        .expect("ingress rules")
        .iter()
        .flat_map(|rule| {
            let from_anywhere = rule["from"][0]["namespaceSelector"]
                .as_mapping()
                .is_some_and(|m| m.is_empty());
            rule["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .map(move |p| (p["port"].as_str().unwrap_or("").to_owned(), from_anywhere))
        })
        .collect();
    for (port, anywhere) in [("http", true), ("grpc", true), ("admin", false)] {
        port_of(port);
        assert!(
            admitted.contains(&(port.to_owned(), anywhere)),
            "{port}: {admitted:?}"
        );
    }
    assert_eq!(spec_selector(deployment), labels);

    // The overlay's Redis: a password from its Secret, a memory ceiling below its limit with
    // noeviction (slidegate's `oom`, not an OOM kill or evicted counters), a PDB.
    let overlay = documents(&overlay);
    let redis = &find(&overlay, "Deployment", "redis")["spec"]["template"]["spec"]["containers"][0];
    let command = strings(&redis["args"]).join(" ");
    for part in [
        "--requirepass",
        "--maxmemory 768mb",
        "--maxmemory-policy noeviction",
    ] {
        assert!(command.contains(part), "{part} is not in {command}");
    }
    assert_eq!(
        redis["resources"]["limits"]["memory"].as_str(),
        Some("1Gi"),
        "maxmemory must stay below the limit"
    );
    find(&overlay, "Secret", "redis-auth");
    find(&overlay, "PodDisruptionBudget", "redis");
    // The overlay's variables are flags of the binary.
    let overlay_env = &find(&overlay, "Deployment", "slidegate")["spec"]["template"]["spec"]["containers"]
        [0]["env"];
    let help = String::from_utf8_lossy(
        &slidegate_command()
            .args(["serve", "--help"])
            .output()
            .expect("--help")
            .stdout,
    )
    .into_owned();
    for variable in overlay_env.as_sequence().expect("env") {
        let name = variable["name"].as_str().expect("name");
        // `[env: NAME=value]`, or `[env: NAME]` for a flag whose value may be a secret.
        assert!(
            help.contains(&format!("[env: {name}=")) || help.contains(&format!("[env: {name}]")),
            "{name} is no flag's variable"
        );
    }

    // Run the container's command: the ConfigMap's files where it is mounted, the container's
    // environment, and test ports instead of 8080/8081.
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = find(&base, "ConfigMap", "slidegate-rules");
    let mount = container["volumeMounts"][0]["mountPath"]
        .as_str()
        .expect("mount");
    let mounted = dir.path().join("rules");
    std::fs::create_dir(&mounted).expect("rules dir");
    for (file, text) in rules["data"].as_mapping().expect("data") {
        let file = file.as_str().expect("file name");
        std::fs::write(mounted.join(file), text.as_str().expect("text")).expect("write");
    }
    let args: Vec<String> = strings(&container["args"])
        .into_iter()
        .map(|arg| arg.replace(mount, &mounted.to_string_lossy()))
        .collect();
    let (http, grpc, admin) = (free_port(), free_port(), free_port());
    let mut command = slidegate_command();
    command
        .args(&args)
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for variable in container["env"].as_sequence().expect("env") {
        let name = variable["name"].as_str().expect("name");
        command.env(name, variable["value"].as_str().expect("value"));
    }
    let _server = KillOnDrop(command.spawn().expect("spawn slidegate"));
    let mapped = |name: &str| match name {
        "http" => http,
        "grpc" => grpc,
        "admin" => admin,
        other => panic!("probe on unknown port {other}"),
    };
    let up = wait_until(Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", grpc)).is_ok() && http_get(http, "/").0 != 0
    });
    assert!(
        up,
        "slidegate did not start with the container's arguments {args:?}"
    );

    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &container[probe]["httpGet"];
        let path = get["path"].as_str().expect("probe path");
        let port = mapped(get["port"].as_str().expect("named probe port"));
        let (status, body) = http_get(port, path);
        assert_eq!(status, 200, "{probe} {path}: {body}");
    }
    let annotations = &pod["metadata"]["annotations"];
    let scrape_port: u16 = annotations["prometheus.io/port"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .expect("prometheus.io/port");
    assert_eq!(scrape_port, port_of("admin"));
    let path = annotations["prometheus.io/path"].as_str().expect("path");
    let (status, metrics) = http_get(admin, path);
    assert_eq!(status, 200);
    assert!(metrics.contains("slidegate_"), "{metrics}");

    // docs/kubernetes.md's walkthrough: two calls for one user and path pass, the third gets a 429.
    let statuses: Vec<u16> = (0..3)
        .map(|_| check(http, "user_id=alice,path=/x"))
        .collect();
    assert_eq!(statuses, vec![200, 200, 429]);
}

fn spec_selector(resource: &Value) -> &Value {
    &resource["spec"]["selector"]["matchLabels"]
}

/// `GET /check` in the domain `edge` with one descriptor: the status.
fn check(port: u16, descriptor: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        stream,
        "GET /check HTTP/1.1\r\nHost: 127.0.0.1\r\nx-ratelimit-domain: edge\r\n\
         x-ratelimit-descriptor: {descriptor}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or(0)
}

/// The `value` of the patch applied to `applies_to` in one of the EnvoyFilters.
fn patch<'a>(documents: &'a [Value], applies_to: &str) -> &'a Value {
    documents
        .iter()
        .filter(|d| d["kind"].as_str() == Some("EnvoyFilter"))
        .flat_map(|d| {
            d["spec"]["configPatches"]
                .as_sequence()
                .into_iter()
                .flatten()
        })
        .find(|p| p["applyTo"].as_str() == Some(applies_to))
        .map(|p| &p["patch"]["value"])
        .unwrap_or_else(|| panic!("no EnvoyFilter patch for {applies_to}"))
}

#[test]
fn istio_example_builds_and_envoy_accepts_its_filters() {
    let Some(kubectl) = require_program("kubectl") else {
        return;
    };
    let Some(validator) = kubernetes_validate() else {
        return;
    };
    let Some(envoy) = envoy_program() else {
        return;
    };
    let built = kustomize(&kubectl, ISTIO);
    validate(&validator, ISTIO, &built);
    let documents = documents(&built);

    // The rules: the ConfigMap holds the example's file, which slidegate accepts.
    let rules_file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(ISTIO)
        .join("rules");
    let check = slidegate_command()
        .arg("check-config")
        .arg(&rules_file)
        .output()
        .expect("check-config");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let config_map = find(&documents, "ConfigMap", "slidegate-rules");
    let data = config_map["data"].as_mapping().expect("data");
    assert_eq!(data.len(), 1, "only the example's rules: {data:?}");
    let text = std::fs::read_to_string(rules_file.join("ingress.yaml")).expect("rules");
    assert_eq!(
        data.values().next().and_then(Value::as_str),
        Some(text.as_str())
    );
    let rules: Value = serde_yaml::from_str(&text).expect("rules YAML");

    // The filter points at the Service's gRPC port, in the rules' domain.
    let filter = patch(&documents, "HTTP_FILTER");
    let config = &filter["typed_config"];
    assert_eq!(config["domain"], rules["domain"]);
    let service = find(&documents, "Service", "slidegate");
    let grpc_port = service["spec"]["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["targetPort"].as_str() == Some("grpc"))
        .and_then(|p| p["port"].as_u64())
        .expect("gRPC port");
    let cluster = config["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .expect("cluster_name");
    assert_eq!(
        cluster,
        format!("outbound|{grpc_port}||slidegate.default.svc.cluster.local")
    );

    // The actions send descriptor keys the rules know.
    let rate_limits = &patch(&documents, "VIRTUAL_HOST")["rate_limits"];
    let rule_keys: Vec<&str> = rules["descriptors"]
        .as_sequence()
        .expect("descriptors")
        .iter()
        .filter_map(|d| d["key"].as_str())
        .collect();
    for action in rate_limits[0]["actions"].as_sequence().expect("actions") {
        let key = action["request_headers"]["descriptor_key"]
            .as_str()
            .expect("descriptor_key");
        assert!(rule_keys.contains(&key), "{key} not in {rule_keys:?}");
    }

    // Envoy accepts both patches, as the gateway would hold them: the filter before the router,
    // the actions on a virtual host, the cluster Istio generates (HTTP/2, as for appProtocol grpc).
    let bootstrap = serde_json::json!({
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "gateway",
                        "route_config": {"virtual_hosts": [{
                            "name": "*:80",
                            "domains": ["*"],
                            "rate_limits": to_json(rate_limits),
                            "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]
                        }]},
                        "http_filters": [
                            to_json(filter),
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
                        ]
                    }
                }]}]
            }],
            "clusters": [{
                "name": cluster,
                "type": "STRICT_DNS",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}
                    }
                },
                "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [{
                    "endpoint": {"address": {"socket_address": {
                        "address": "slidegate.default.svc.cluster.local", "port_value": grpc_port}}}
                }]}]}
            }]
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("gateway.json");
    std::fs::write(&file, bootstrap.to_string()).expect("write bootstrap");
    let output = Command::new(envoy)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&file)
        .output()
        .expect("run envoy");
    assert!(
        output.status.success(),
        "envoy --mode validate: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn to_json(value: &Value) -> serde_json::Value {
    serde_json::to_value(value).expect("YAML as JSON")
}
