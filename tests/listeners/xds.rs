//! Rules from a control plane over xDS: a test control plane (tonic, Envoy's discovery protos)
//! serves `RateLimitConfig` resources over ADS to the real slidegate binary, and checks both sides
//! of the protocol: what slidegate enforces, and what it answers (ACK, NACK, reconnects).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::protobuf::value::Kind;
use futures::Stream;
use prost::Message as _;
use slidegate::config::source::xds::RESOURCE_TYPE;
use slidegate::config::source::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::{Slidegate, call, descriptor, metric_value, request, wait_until};

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

/// Where the test pushes what one stream sends.
type StreamSender = UnboundedSender<Result<DiscoveryResponse, Status>>;

/// The server side of ADS, driven by the test: what each stream sends is pushed by the test, what
/// slidegate sends is handed to the test in order.
#[derive(Clone)]
struct Ads {
    requests: UnboundedSender<DiscoveryRequest>,
    /// The sender of the newest stream's responses.
    current: Arc<Mutex<Option<StreamSender>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let mut incoming = request.into_inner();
        let (responses, outgoing) = unbounded_channel();
        *self.current.lock().expect("lock") = Some(responses);
        let requests = self.requests.clone();
        tokio::spawn(async move {
            while let Ok(Some(request)) = incoming.message().await {
                let _ = requests.send(request);
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            outgoing,
        ))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// A control plane on a free port; stops with the test's runtime.
pub(super) struct ControlPlane {
    port: u16,
    ads: Ads,
    requests: UnboundedReceiver<DiscoveryRequest>,
}

impl ControlPlane {
    pub(super) async fn start() -> ControlPlane {
        ControlPlane::start_with(tonic::transport::Server::builder()).await
    }

    /// A control plane that requires TLS with a client certificate signed by `ca`'s CA, as Envoy
    /// Gateway's does.
    async fn start_mtls(ca: &crate::support::CertFiles) -> ControlPlane {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let read = |path: &std::path::Path| std::fs::read(path).expect("read test certificate");
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(read(&ca.cert_file), read(&ca.key_file)))
            .client_ca_root(Certificate::from_pem(read(&ca.ca_file)));
        let builder = tonic::transport::Server::builder()
            .tls_config(tls)
            .expect("server TLS");
        ControlPlane::start_with(builder).await
    }

    async fn start_with(builder: tonic::transport::Server) -> ControlPlane {
        ControlPlane::start_on(builder, 0).await
    }

    /// A plain control plane on `port` (0: any free port).
    async fn start_on(mut builder: tonic::transport::Server, port: u16) -> ControlPlane {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (requests_tx, requests) = unbounded_channel();
        let ads = Ads {
            requests: requests_tx,
            current: Arc::default(),
        };
        let service = AggregatedDiscoveryServiceServer::new(ads.clone());
        tokio::spawn(
            builder
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        ControlPlane {
            port,
            ads,
            requests,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The next request slidegate sent.
    pub(super) async fn next_request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(Duration::from_secs(20), self.requests.recv())
            .await
            .expect("a request from slidegate within 20 s")
            .expect("control plane running")
    }

    /// Sends the state of the world on the newest stream.
    pub(super) fn push(&self, version: &str, nonce: &str, configs: &[RateLimitConfig]) {
        let response = DiscoveryResponse {
            version_info: version.to_owned(),
            resources: configs.iter().map(resource).collect(),
            type_url: RESOURCE_TYPE.to_owned(),
            nonce: nonce.to_owned(),
            ..DiscoveryResponse::default()
        };
        self.send(Ok(response));
    }

    /// Ends the newest stream with an error, as a control plane going away does.
    fn drop_stream(&self) {
        self.send(Err(Status::unavailable("control plane restarting")));
        self.ads.current.lock().expect("lock").take();
    }

    fn send(&self, item: Result<DiscoveryResponse, Status>) {
        let current = self.ads.current.lock().expect("lock");
        let stream = current.as_ref().expect("slidegate has a stream open");
        stream.send(item).expect("stream open");
    }
}

fn resource(config: &RateLimitConfig) -> Any {
    Any {
        type_url: RESOURCE_TYPE.to_owned(),
        value: config.encode_to_vec(),
    }
}

/// A domain with one rule: `key` at `requests` per minute (0 denies every request).
fn domain(name: &str, key: &str, requests: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_owned(),
        domain: name.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            key: key.to_owned(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute.into(),
                requests_per_unit: requests,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

/// slidegate with rules from `control_plane`, reconnecting quickly.
pub(super) fn slidegate(control_plane: &ControlPlane, extra: &[&str]) -> Slidegate {
    let url = control_plane.url();
    let mut args = vec![
        "--xds-server",
        &url,
        "--xds-node-id",
        "test-node",
        "--xds-node-metadata",
        "cluster=edge,zone=a",
        "--xds-connect-retry-interval",
        "100ms",
    ];
    args.extend_from_slice(extra);
    Slidegate::start_without_config(&args)
}

/// The CA, client certificate and key files of `ca`, as arguments.
fn tls_files(ca: &crate::support::CertFiles) -> [String; 3] {
    [&ca.ca_file, &ca.cert_file, &ca.key_file].map(|p| p.to_string_lossy().into_owned())
}

/// The decision for one request `{key: "x"}` in `domain`.
async fn decide(server: &Slidegate, domain: &str, key: &str) -> Code {
    let mut client = server.client().await;
    call(
        &mut client,
        request(domain, vec![descriptor(&[(key, "x")])]),
    )
    .await
    .overall_code()
}

/// The gRPC health status envoyproxy/ratelimit's clients ask for (service `ratelimit`).
async fn grpc_health(server: &Slidegate) -> ServingStatus {
    let request = HealthCheckRequest {
        service: "ratelimit".into(),
    };
    let response = HealthClient::new(server.channel().await)
        .check(request)
        .await
        .expect("gRPC health answers");
    response.into_inner().status()
}

fn ready(server: &Slidegate) -> bool {
    server.get("/healthcheck").0 == 200
}

pub(super) fn wait_ready(server: &Slidegate) {
    let ok = wait_until(Duration::from_secs(10), || ready(server));
    assert!(ok, "not ready; log:\n{}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_the_control_plane_are_enforced_and_acknowledged() {
    let mut control_plane = ControlPlane::start().await;
    let server = slidegate(&control_plane, &[]);

    let subscribe = control_plane.next_request().await;
    assert_eq!(subscribe.type_url, RESOURCE_TYPE);
    assert_eq!(subscribe.version_info, "", "nothing accepted yet");
    assert_eq!(subscribe.response_nonce, "");
    assert!(subscribe.resource_names.is_empty(), "wildcard subscription");
    let node = subscribe.node.expect("node on the first request");
    assert_eq!(node.id, "test-node");
    let metadata = node.metadata.expect("node metadata");
    let zone = metadata.fields.get("zone").and_then(|v| v.kind.clone());
    assert_eq!(zone, Some(Kind::StringValue("a".into())));

    // Serving, but not ready: no rules yet (two health ticks to be sure it stays so).
    std::thread::sleep(Duration::from_millis(2200));
    assert_eq!(
        server.get("/healthcheck").0,
        503,
        "ready before the first rules"
    );
    assert_eq!(grpc_health(&server).await, ServingStatus::NotServing);

    control_plane.push("1", "nonce-1", &[domain("edge", "user", 2)]);
    let ack = control_plane.next_request().await;
    assert_eq!(ack.version_info, "1");
    assert_eq!(ack.response_nonce, "nonce-1");
    assert_eq!(ack.type_url, RESOURCE_TYPE);
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);

    wait_ready(&server);
    assert_eq!(grpc_health(&server).await, ServingStatus::Serving);
    assert_eq!(decide(&server, "edge", "user").await, Code::Ok);
    assert_eq!(decide(&server, "edge", "user").await, Code::Ok);
    assert_eq!(decide(&server, "edge", "user").await, Code::OverLimit);
    let metrics = server.get("/metrics").1;
    let successes = r#"slidegate_config_reloads_total{result="success"}"#;
    assert_eq!(metric_value(&metrics, successes), 1.0, "{metrics}");
    let (_, rlconfig) = server.get("/rlconfig");
    assert!(rlconfig.contains("edge user: 2 per MINUTE"), "{rlconfig}");
    assert!(rlconfig.contains("source=xds:edge"), "{rlconfig}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_applies_and_a_removed_resource_drops_its_domain() {
    let mut control_plane = ControlPlane::start().await;
    let server = slidegate(&control_plane, &[]);
    control_plane.next_request().await;

    // Two domains in one response, both denying everything.
    let both = [domain("alpha", "k", 0), domain("beta", "k", 0)];
    control_plane.push("1", "n1", &both);
    assert_eq!(control_plane.next_request().await.version_info, "1");
    wait_ready(&server);
    assert_eq!(decide(&server, "alpha", "k").await, Code::OverLimit);
    assert_eq!(decide(&server, "beta", "k").await, Code::OverLimit);

    // alpha's limit raised, beta gone.
    control_plane.push("2", "n2", &[domain("alpha", "k", 100)]);
    let ack = control_plane.next_request().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("2", "n2")
    );
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    assert_eq!(
        decide(&server, "alpha", "k").await,
        Code::Ok,
        "update applied"
    );
    assert_eq!(
        decide(&server, "beta", "k").await,
        Code::Ok,
        "domain removed"
    );
    let (_, rlconfig) = server.get("/rlconfig");
    assert!(!rlconfig.contains("beta"), "{rlconfig}");
    assert!(rlconfig.contains("alpha k: 100 per MINUTE"), "{rlconfig}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_resource_is_refused_whole_with_the_reason() {
    let mut control_plane = ControlPlane::start().await;
    let server = slidegate(&control_plane, &[]);
    control_plane.next_request().await;
    control_plane.push("1", "n1", &[domain("alpha", "k", 0)]);
    control_plane.next_request().await;
    wait_ready(&server);

    // A good change to alpha next to a resource slidegate cannot honour (a unit number the proto
    // does not define, which envoyproxy/ratelimit refuses too).
    let mut bad = domain("gamma", "k", 5);
    if let Some(policy) = bad.descriptors[0].rate_limit.as_mut() {
        policy.unit = 42;
    }
    control_plane.push("2", "n2", &[domain("alpha", "k", 100), bad]);
    let nack = control_plane.next_request().await;
    assert_eq!(
        nack.version_info, "1",
        "a NACK names the version still in force"
    );
    assert_eq!(nack.response_nonce, "n2");
    let detail = nack.error_detail.expect("error_detail on a NACK");
    assert_eq!(detail.code, tonic::Code::InvalidArgument as i32);
    assert!(
        detail
            .message
            .contains("xds:gamma: descriptors[0].rate_limit.unit: unknown unit number 42"),
        "{}",
        detail.message
    );
    assert_eq!(
        decide(&server, "alpha", "k").await,
        Code::OverLimit,
        "all or nothing: alpha's change is refused with gamma"
    );
    assert_eq!(decide(&server, "gamma", "k").await, Code::Ok, "kept out");
    assert!(
        ready(&server),
        "a refused response does not take the rules away"
    );
    let metrics = server.get("/metrics").1;
    let failures = r#"slidegate_config_reloads_total{result="failure"}"#;
    assert_eq!(metric_value(&metrics, failures), 1.0, "{metrics}");
    assert_eq!(metric_value(&metrics, "slidegate_config_stale"), 1.0);
    assert!(
        server.log().contains("xDS response refused"),
        "{}",
        server.log()
    );

    // The control plane fixes it: accepted, and no longer stale.
    control_plane.push("3", "n3", &[domain("alpha", "k", 100)]);
    let ack = control_plane.next_request().await;
    assert_eq!(ack.version_info, "3");
    assert!(ack.error_detail.is_none());
    assert_eq!(decide(&server, "alpha", "k").await, Code::Ok);
    let metrics = server.get("/metrics").1;
    assert_eq!(metric_value(&metrics, "slidegate_config_stale"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_keeps_the_rules_and_reconnects() {
    let mut control_plane = ControlPlane::start().await;
    let server = slidegate(&control_plane, &[]);
    control_plane.next_request().await;
    control_plane.push("7", "n1", &[domain("alpha", "k", 0)]);
    control_plane.next_request().await;
    wait_ready(&server);

    control_plane.drop_stream();
    let again = control_plane.next_request().await;
    assert_eq!(again.response_nonce, "", "a new stream");
    assert_eq!(
        again.version_info, "7",
        "resubscribes with the version in force"
    );
    assert_eq!(again.node.map(|n| n.id).as_deref(), Some("test-node"));
    // Nothing sent on the new stream yet: the last good rules are in force, and still ready.
    assert_eq!(decide(&server, "alpha", "k").await, Code::OverLimit);
    assert!(ready(&server));
    assert!(
        server
            .log()
            .contains("xDS stream to the control plane ended")
    );

    control_plane.push("8", "n2", &[domain("alpha", "k", 100)]);
    assert_eq!(control_plane.next_request().await.version_info, "8");
    assert_eq!(decide(&server, "alpha", "k").await, Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_that_comes_up_later_is_reached() {
    // slidegate first, as when its pod starts before Envoy Gateway's: nothing listens yet.
    let port = crate::support::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let server = Slidegate::start_without_config(&[
        "--xds-server",
        &url,
        "--xds-connect-retry-interval",
        "100ms",
    ]);
    let refused = wait_until(Duration::from_secs(10), || {
        server.log().contains("cannot connect")
    });
    assert!(refused, "{}", server.log());
    assert!(!ready(&server));

    let mut control_plane = ControlPlane::start_on(tonic::transport::Server::builder(), port).await;
    assert_eq!(control_plane.next_request().await.version_info, "");
    control_plane.push("1", "n1", &[domain("alpha", "k", 0)]);
    assert_eq!(control_plane.next_request().await.version_info, "1");
    wait_ready(&server);
    assert_eq!(decide(&server, "alpha", "k").await, Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_start_is_ready_without_rules_and_allows() {
    let mut control_plane = ControlPlane::start().await;
    let server = slidegate(&control_plane, &["--force-start-without-initial-config"]);
    control_plane.next_request().await;
    wait_ready(&server);
    assert_eq!(decide(&server, "alpha", "k").await, Code::Ok);
    // An empty state of the world is the control plane's answer, not a failure.
    control_plane.push("1", "n1", &[]);
    let ack = control_plane.next_request().await;
    assert_eq!(ack.version_info, "1");
    assert!(ack.error_detail.is_none());
    assert!(ready(&server));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_arrive_over_mutual_tls() {
    let ca = crate::support::CertFiles::new();
    let mut control_plane = ControlPlane::start_mtls(&ca).await;
    // As Envoy Gateway configures it: `host:port`, TLS because TLS files are given.
    let address = format!("127.0.0.1:{}", control_plane.port);
    let [ca_file, cert_file, key_file] = tls_files(&ca);
    let server = Slidegate::start_without_config(&[
        "--xds-server",
        &address,
        "--xds-node-id",
        "envoy-ratelimit",
        "--xds-tls-ca-file",
        &ca_file,
        "--xds-tls-cert-file",
        &cert_file,
        "--xds-tls-key-file",
        &key_file,
    ]);
    let subscribe = control_plane.next_request().await;
    assert_eq!(
        subscribe.node.map(|n| n.id).as_deref(),
        Some("envoy-ratelimit")
    );
    control_plane.push("1", "n1", &[domain("alpha", "k", 0)]);
    assert_eq!(control_plane.next_request().await.version_info, "1");
    wait_ready(&server);
    assert_eq!(decide(&server, "alpha", "k").await, Code::OverLimit);
}

/// Proves: envoyproxy/ratelimit's environment as Envoy Gateway sets it (xDS over mutual TLS, node
/// id `envoy-ratelimit`, runtime directory variables that do not exist) brings the rules from the
/// control plane, with no flag of slidegate's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_environment_brings_rules_over_xds() {
    let ca = crate::support::CertFiles::new();
    let mut control_plane = ControlPlane::start_mtls(&ca).await;
    let address = format!("127.0.0.1:{}", control_plane.port);
    let [ca_file, cert_file, key_file] = tls_files(&ca);
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("CONFIG_GRPC_XDS_SERVER_URL", address.as_str()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca_file.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert_file.as_str()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key_file.as_str()),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("USE_STATSD", "false"),
    ];
    let server = Slidegate::launch(None, crate::support::free_port(), &[], &env);
    let subscribe = control_plane.next_request().await;
    assert_eq!(
        subscribe.node.map(|n| n.id).as_deref(),
        Some("envoy-ratelimit")
    );
    control_plane.push("1", "n1", &[domain("alpha", "k", 0)]);
    assert_eq!(control_plane.next_request().await.version_info, "1");
    wait_ready(&server);
    assert_eq!(decide(&server, "alpha", "k").await, Code::OverLimit);
    assert!(
        !server.log().contains("not honoured"),
        "every variable honoured: {}",
        server.log()
    );
}

#[test]
fn rule_files_and_a_control_plane_together_are_refused() {
    let output = crate::support::slidegate_command()
        .args(["serve", "--config", "config", "--xds-server", "127.0.0.1:1"])
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .output()
        .expect("run slidegate");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("both given"), "{stderr}");
}

#[test]
fn a_control_plane_overrides_slidegate_config_from_the_environment() {
    // slidegate's image sets SLIDEGATE_CONFIG; a deployment adding SLIDEGATE_XDS_SERVER must start.
    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("slidegate.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let (grpc, http) = (crate::support::free_port(), crate::support::free_port());
    let child = crate::support::slidegate_command()
        .args(["serve", "--xds-server", "127.0.0.1:1"])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args([
            "--admin-addr",
            &format!("127.0.0.1:{}", crate::support::free_port()),
        ])
        .env("SLIDEGATE_CONFIG", "config")
        .stderr(log)
        .spawn()
        .expect("spawn slidegate");
    let _process = crate::support::KillOnDrop(child);
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let listening = wait_until(Duration::from_secs(20), || read_log().contains("listening"));
    let log = read_log();
    assert!(listening, "{log}");
    assert!(log.contains("SLIDEGATE_CONFIG is ignored"), "{log}");
}

/// A response over the bounds on what one response may hold (descriptors, bytes) is refused with
/// a NACK naming the bound, before it is converted (RSS stays flat), and the rules in force keep
/// serving; a response just under the bound is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_bounds_is_refused_and_the_rules_kept() {
    use slidegate::config::source::xds::bound::MAX_DESCRIPTORS;
    let mut control_plane = ControlPlane::start().await;
    let server = slidegate(&control_plane, &[]);
    control_plane.next_request().await;
    control_plane.push("1", "n1", &[domain("alpha", "k", 0)]);
    control_plane.next_request().await;
    wait_ready(&server);

    // Many tiny descriptors: the shape that once took 190 times its size while converted.
    let tiny = |n: usize| RateLimitConfig {
        name: "flood".into(),
        domain: "flood".into(),
        descriptors: (0..n)
            .map(|i| RateLimitDescriptor {
                key: "k".into(),
                value: i.to_string(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
    };
    let rss_before = server.rss_kib();
    control_plane.push(
        "2",
        "n2",
        &[domain("alpha", "k", 100), tiny(MAX_DESCRIPTORS + 1)],
    );
    let nack = control_plane.next_request().await;
    let detail = nack.error_detail.expect("a NACK");
    assert!(
        detail.message.contains("more than 50000 descriptors"),
        "{}",
        detail.message
    );
    assert_eq!(nack.version_info, "1");
    assert_eq!(
        decide(&server, "alpha", "k").await,
        Code::OverLimit,
        "the old rules"
    );
    let refused_growth = server.rss_kib().saturating_sub(rss_before) / 1024;

    control_plane.push(
        "3",
        "n3",
        &[domain("alpha", "k", 100), tiny(MAX_DESCRIPTORS - 1)],
    );
    let ack = control_plane.next_request().await;
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    let accepted_growth = server.rss_kib().saturating_sub(rss_before) / 1024;
    eprintln!(
        "RSS +{refused_growth} MiB after the refused response, +{accepted_growth} MiB after the accepted one"
    );
    assert!(
        refused_growth < 32,
        "RSS +{refused_growth} MiB for a refused response"
    );
    assert_eq!(
        decide(&server, "alpha", "k").await,
        Code::Ok,
        "the new rules"
    );
}
