//! gRPC `ShouldRateLimit` end to end, with the memory store (Envoy's RateLimitService v3 client
//! from envoy-types): statuses and RateLimit headers as Envoy reads them, several limits, hits,
//! shadow mode, overrides and `replaces`, invalid arguments, an unknown method, and server
//! reflection.

use crate::service_fixture::{Server, headers, limit, reset_secs};
use crate::support::{call, descriptor, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_statuses_follow_envoy_semantics() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request(
        "test",
        vec![
            descriptor(&[("nothing", "x")]),
            descriptor(&[("free", "x")]),
            descriptor(&[("user", "alice")]),
            descriptor(&[("window", "w")]),
        ],
    );
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses.len(), 4);
    // No rule: OK, no limit, nothing remaining, no reset.
    let none = &r.statuses[0];
    assert_eq!(none.code(), Code::Ok);
    assert_eq!(none.current_limit, None);
    assert_eq!(none.limit_remaining, 0);
    assert_eq!(none.duration_until_reset, None);
    // Unlimited: OK, remaining u32::MAX.
    let free = &r.statuses[1];
    assert_eq!(free.code(), Code::Ok);
    assert_eq!(free.current_limit, None);
    assert_eq!(free.limit_remaining, u32::MAX);
    // Limited: the configured limit with its name, hits left, time until the hit leaves.
    let user = &r.statuses[2];
    assert_eq!(user.code(), Code::Ok);
    assert_eq!(limit(user), Some(("per_user".into(), 3, Unit::Minute)));
    assert_eq!(user.limit_remaining, 2);
    assert!((59.0..=60.0).contains(&reset_secs(user)), "{user:?}");
    // A window of 30 seconds: reported as configured (10 per SECOND), the reset shows the window.
    let window = &r.statuses[3];
    assert_eq!(limit(window), Some((String::new(), 10, Unit::Second)));
    assert_eq!(window.limit_remaining, 9);
    assert!((29.0..=30.0).contains(&reset_secs(window)), "{window:?}");
    // Headers from the most restrictive descriptor (2 left of 3), with the true window.
    let h = headers(&r);
    assert_eq!(h.get("ratelimit-limit").map(String::as_str), Some("3"));
    assert_eq!(h.get("ratelimit-remaining").map(String::as_str), Some("2"));
    assert_eq!(
        h.get("ratelimit-policy").map(String::as_str),
        Some("3;w=60")
    );
    assert_eq!(h.get("ratelimit-reset").map(String::as_str), Some("60"));
    assert!(!h.contains_key("retry-after"));

    call(&mut client, req.clone()).await;
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[2].limit_remaining, 0);

    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(r.statuses[2].code(), Code::OverLimit);
    assert_eq!(r.statuses[2].limit_remaining, 0);
    assert!(reset_secs(&r.statuses[2]) > 55.0);
    for i in [0, 1, 3] {
        assert_eq!(r.statuses[i].code(), Code::Ok, "descriptor {i}");
    }
    // The denied request recorded nothing: 3 hits on the window counter, not 4.
    assert_eq!(r.statuses[3].limit_remaining, 7);
    let h = headers(&r);
    assert_eq!(h.get("ratelimit-remaining").map(String::as_str), Some("0"));
    let retry: u64 = h
        .get("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!((56..=60).contains(&retry), "{retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_most_restrictive_of_several_limits() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("two", "t")])]);
    let r = call(&mut client, req.clone()).await;
    // 2 per second leaves 1, 5 per minute leaves 4.
    assert_eq!(
        limit(&r.statuses[0]),
        Some((String::new(), 2, Unit::Second))
    );
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(
        headers(&r).get("ratelimit-policy").map(String::as_str),
        Some("2;w=1, 5;w=60")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_hits_addend_variants() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    // Request-level hits.
    let mut req = request("test", vec![descriptor(&[("user", "h1")])]);
    req.hits_addend = 2;
    assert_eq!(
        call(&mut client, req.clone()).await.statuses[0].limit_remaining,
        1
    );
    // Per-descriptor 0: check only, nothing counted (twice).
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..2 {
        let r = call(&mut client, req.clone()).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 1);
    }
    // Per-descriptor hits win over the request's (5 would not fit).
    req.hits_addend = 5;
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // Request-level 0 means 1.
    let fresh = request("test", vec![descriptor(&[("user", "h2")])]);
    assert_eq!(
        call(&mut client, fresh).await.statuses[0].limit_remaining,
        2
    );
    // Mixed: one descriptor inherits 2, the other counts its own 3 (over its limit of 3? no: fits).
    let mut mixed = request(
        "test",
        vec![
            descriptor(&[("user", "h3")]),
            descriptor(&[("window", "h3")]),
        ],
    );
    mixed.hits_addend = 2;
    mixed.descriptors[1].hits_addend = Some(UInt64Value { value: 3 });
    let r = call(&mut client, mixed).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 7);
    // More hits than the limit never fit.
    let mut big = request("test", vec![descriptor(&[("user", "h4")])]);
    big.hits_addend = 4;
    assert_eq!(call(&mut client, big).await.overall_code(), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_shadow_mode_per_rule_and_global() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let req = request("test", vec![descriptor(&[("shadow", "s")])]);
    for _ in 0..3 {
        let r = call(&mut client, req.clone()).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(r.statuses[0].code(), Code::Ok);
    }
    let m = server.metrics().await;
    let series = |d: &str| {
        format!(r#"slidegate_decisions_total{{decision="{d}",domain="test",rule="shadow"}}"#)
    };
    assert_eq!(m.get(&series("allowed")), 1.0);
    assert_eq!(m.get(&series("shadow_denied")), 2.0);
    assert_eq!(m.get(&series("denied")), 0.0);

    let global = Server::start(&["--shadow-mode"]);
    let mut client = global.client().await;
    let req = request("test", vec![descriptor(&[("user", "g")])]);
    for _ in 0..3 {
        assert_eq!(
            call(&mut client, req.clone()).await.overall_code(),
            Code::Ok
        );
    }
    let r = call(&mut client, req.clone()).await;
    assert_eq!(
        r.overall_code(),
        Code::Ok,
        "global shadow mode never denies"
    );
    assert_eq!(
        r.statuses[0].code(),
        Code::OverLimit,
        "but reports the truth"
    );
    assert!(
        !headers(&r).contains_key("ratelimit-remaining"),
        "nothing is enforced, so no RateLimit headers: {:?}",
        headers(&r)
    );
    let m = global.metrics().await;
    assert_eq!(
        m.get(
            r#"slidegate_decisions_total{decision="shadow_denied",domain="test",rule="per_user"}"#
        ),
        1.0
    );
}

/// A shadow rule changes nothing a client sees: the RateLimit headers come from enforced limits
/// only, even when a shadow limit is the most restrictive of the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_headers_come_from_enforced_limits_only() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let shadow_only = request("test", vec![descriptor(&[("shadow", "q")])]);
    let r = call(&mut client, shadow_only.clone()).await;
    assert!(
        !headers(&r).contains_key("ratelimit-limit"),
        "{:?}",
        headers(&r)
    );
    let both = request(
        "test",
        vec![descriptor(&[("shadow", "q")]), descriptor(&[("user", "z")])],
    );
    let r = call(&mut client, both).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0, "the shadow rule is full");
    let h = headers(&r);
    assert_eq!(
        h.get("ratelimit-limit").map(String::as_str),
        Some("3"),
        "{h:?}"
    );
    assert_eq!(h.get("ratelimit-remaining").map(String::as_str), Some("2"));
    assert_eq!(
        h.get("ratelimit-policy").map(String::as_str),
        Some("3;w=60")
    );
    let r = call(&mut client, shadow_only).await;
    assert!(
        !headers(&r).contains_key("ratelimit-limit"),
        "{:?}",
        headers(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_override_and_replaces() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    // The override (1 per HOUR) replaces the configured 3 per minute.
    let mut d = descriptor(&[("user", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, // HOUR in envoy.type.v3.RateLimitUnit
    });
    let req = request("test", vec![d.clone()]);
    let r = call(&mut client, req.clone()).await;
    assert_eq!(limit(&r.statuses[0]), Some((String::new(), 1, Unit::Hour)));
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(reset_secs(&r.statuses[0]) > 3590.0);
    assert_eq!(call(&mut client, req).await.overall_code(), Code::OverLimit);
    // It applies to a descriptor without a rule too, when the domain exists...
    let mut none = descriptor(&[("nothing", "o")]);
    none.limit = d.limit;
    let r = call(&mut client, request("test", vec![none.clone()])).await;
    assert_eq!(limit(&r.statuses[0]), Some((String::new(), 1, Unit::Hour)));
    // ...but not in an unknown domain.
    let r = call(&mut client, request("elsewhere", vec![none])).await;
    assert_eq!(r.statuses[0].current_limit, None);

    // `specific` replaces `general` when both match: general (1 per minute) is not applied.
    let both = request(
        "test",
        vec![
            descriptor(&[("general", "r")]),
            descriptor(&[("specific", "r")]),
        ],
    );
    for remaining in [4, 3, 2] {
        let r = call(&mut client, both.clone()).await;
        assert_eq!(r.overall_code(), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        assert_eq!(
            limit(&r.statuses[1]),
            Some(("specific".into(), 5, Unit::Minute))
        );
        assert_eq!(r.statuses[1].limit_remaining, remaining);
    }
    // Alone, general applies, and its counter was untouched.
    let alone = request("test", vec![descriptor(&[("general", "r")])]);
    assert_eq!(
        call(&mut client, alone.clone()).await.statuses[0].limit_remaining,
        0
    );
    assert_eq!(
        call(&mut client, alone).await.overall_code(),
        Code::OverLimit
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_invalid_arguments() {
    let server = Server::start(&[
        "--max-descriptors",
        "3",
        "--max-entries",
        "2",
        "--max-value-bytes",
        "16",
    ]);
    let mut client = server.client().await;
    let ok = || descriptor(&[("user", "v")]);
    let long = "x".repeat(17);
    let mut bad_unit = ok();
    bad_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let cases = vec![
        (request("", vec![ok()]), "domain must not be empty"),
        (request("test", vec![]), "descriptor list must not be empty"),
        (
            request("test", vec![ok(), ok(), ok(), ok()]),
            "too many descriptors: 4",
        ),
        (
            request("test", vec![ok(), descriptor(&[])]),
            "descriptors[1] has no entries",
        ),
        (
            request(
                "test",
                vec![descriptor(&[("a", "1"), ("b", "2"), ("c", "3")])],
            ),
            "too many entries: 3",
        ),
        (
            request("test", vec![descriptor(&[("", "v")])]),
            "entries[0].key must not be empty",
        ),
        (
            request("test", vec![descriptor(&[(&long, "v")])]),
            "entries[0].key is 17 bytes",
        ),
        (request(&long, vec![ok()]), "domain is 17 bytes"),
    ];
    for (req, expected) in cases {
        match client.should_rate_limit(req.clone()).await {
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{req:?}");
                assert!(
                    status.message().contains(expected),
                    "{:?} lacks {expected:?}",
                    status.message()
                );
            }
            Ok(r) => panic!("accepted {req:?}: {r:?}"),
        }
    }
    // The server is still fine.
    let r = call(&mut client, request("test", vec![ok()])).await;
    assert_eq!(r.overall_code(), Code::Ok);
    // An override's unit can come from metadata a client shaped: decided (a limit of 0), never
    // refused, since Envoy passes a refused request uncounted.
    let r = call(&mut client, request("test", vec![bad_unit])).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    // A value over --max-value-bytes, which a client can choose, is decided (counted under its
    // digest), not refused.
    let r = call(
        &mut client,
        request("test", vec![descriptor(&[("user", &long)])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_and_describes_the_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1alpha;

    let server = Server::start(&[]);
    let channel = server.channel().await;
    let mut client = ServerReflectionClient::new(channel.clone());
    let ask = |message: MessageRequest| {
        tokio_stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(message),
        }])
    };
    let mut stream = client
        .server_reflection_info(ask(MessageRequest::ListServices(String::new())))
        .await
        .expect("reflection")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("a message");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reply {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }

    // The file defining the service, with what it imports, so a client can encode requests.
    let mut stream = client
        .server_reflection_info(ask(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".into(),
        )))
        .await
        .expect("reflection")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("a message");
    let Some(MessageResponse::FileDescriptorResponse(files)) = reply.message_response else {
        panic!("unexpected reply {reply:?}");
    };
    let all: Vec<u8> = files.file_descriptor_proto.concat();
    let text = String::from_utf8_lossy(&all);
    for expected in [
        "ShouldRateLimit",
        "RateLimitRequest",
        "hits_addend",
        "envoy/service/ratelimit/v3/rls.proto",
    ] {
        assert!(
            text.contains(expected),
            "{expected} missing from the descriptors"
        );
    }

    // The v1alpha service (older grpcurl versions) lists the same.
    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = alpha
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("v1alpha reflection")
        .into_inner();
    let reply = stream.message().await.expect("reply").expect("a message");
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("unexpected reply {reply:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "envoy.service.ratelimit.v3.RateLimitService")
    );
}

/// A method the RateLimitService does not have is UNIMPLEMENTED, as gRPC servers answer; a
/// request larger than the codec's initial buffer is decoded all the same.
#[tokio::test]
async fn unknown_method_is_unimplemented_and_large_requests_decode() {
    let server = Server::start(&[]);
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod",
    );
    let status = grpc
        .unary::<RateLimitRequest, RateLimitResponse, _>(
            tonic::Request::new(RateLimitRequest::default()),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");

    let value = "v".repeat(2000);
    let descriptors = (0..8).map(|_| descriptor(&[("nothing", &value)])).collect();
    let response = call(&mut server.client().await, request("test", descriptors)).await;
    assert_eq!(response.statuses.len(), 8);
}
