//! Abusive requests to the real binary: thousands of descriptors, huge values, deep entries,
//! empty keys, bad percent-encoding, oversized gRPC messages and HTTP bodies, huge `hits_addend`.

use std::time::{Duration, Instant};

use crate::support::{
    RedisServer, Slidegate, call, descriptor, grpc_frame, http_status, raw_should_rate_limit,
    wait_until,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use prost::Message as _;

use super::{Rules, entry, request, runner};

/// gRPC abuse: thousands of descriptors, thousands of entries, megabyte values and domains, empty
/// keys, a message over tonic's 4 MiB decoding limit, huge `hits_addend` on a limit the client
/// chooses. What only a proxy's configuration decides is refused with INVALID_ARGUMENT (or, for
/// the oversized message, OUT_OF_RANGE); what a client can choose (a megabyte value, huge hits) is
/// decided. Each in well under a second; slidegate's memory stays bounded; it keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_grpc_requests_are_refused_quickly() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let mut client = server.client().await;
    call(&mut client, request(vec![descriptor(&[("plain", "warm")])])).await;
    let rss_before = server.rss_kib();

    let huge = "v".repeat(1 << 20);
    let many_descriptors: Vec<RateLimitDescriptor> = (0..20_000)
        .map(|i| descriptor(&[("plain", &i.to_string())]))
        .collect();
    let many_entries = RateLimitDescriptor {
        entries: (0..50_000).map(|i| entry("k", &i.to_string())).collect(),
        ..RateLimitDescriptor::default()
    };
    let over_4mib = RateLimitDescriptor {
        entries: vec![entry("plain", &"x".repeat(5 << 20))],
        ..RateLimitDescriptor::default()
    };
    // The client picks the limit (Envoy's RateLimitOverride) and the hits: a sliding log stores
    // every hit, so this would be 2^32 hits recorded by one request.
    let hits_bomb = |i: usize| RateLimitDescriptor {
        entries: vec![entry("anything", &format!("bomb{i}"))],
        limit: Some(RateLimitOverride {
            requests_per_unit: u32::MAX,
            unit: 6, // YEAR
        }),
        hits_addend: Some(UInt64Value {
            value: u64::from(u32::MAX),
        }),
        ..RateLimitDescriptor::default()
    };
    let mut big_request_hits = request(vec![descriptor(&[("big", "x")])]);
    big_request_hits.hits_addend = u32::MAX;
    let cases: Vec<(&str, RateLimitRequest, tonic::Code, &str)> = vec![
        (
            "20 000 descriptors",
            request(many_descriptors),
            tonic::Code::InvalidArgument,
            "too many descriptors",
        ),
        (
            "50 000 entries",
            request(vec![many_entries]),
            tonic::Code::InvalidArgument,
            "too many entries",
        ),
        (
            "a 1 MiB key",
            request(vec![descriptor(&[(&huge, "v")])]),
            tonic::Code::InvalidArgument,
            "key is 1048576 bytes",
        ),
        (
            "a 1 MiB domain",
            RateLimitRequest {
                domain: huge.clone(),
                ..request(vec![descriptor(&[("plain", "v")])])
            },
            tonic::Code::InvalidArgument,
            "domain is 1048576 bytes",
        ),
        (
            "an empty key",
            request(vec![descriptor(&[("plain", "v"), ("", "v")])]),
            tonic::Code::InvalidArgument,
            "key must not be empty",
        ),
        (
            "a 5 MiB message",
            request(vec![over_4mib]),
            tonic::Code::OutOfRange,
            "message length too large",
        ),
    ];
    for (what, req, code, message) in cases {
        let started = Instant::now();
        let result = client.should_rate_limit(req).await;
        let elapsed = started.elapsed();
        match result {
            Err(status) => {
                assert_eq!(status.code(), code, "{what}: {status:?}");
                assert!(
                    status.message().contains(message),
                    "{what}: {:?} lacks {message:?}",
                    status.message()
                );
            }
            Ok(r) => panic!("{what}: accepted: {:?}", r.into_inner().overall_code()),
        }
        assert!(elapsed < Duration::from_secs(1), "{what} took {elapsed:?}");
        eprintln!("{what}: refused in {elapsed:?}");
    }
    // What a client can choose (values, hits) is decided, never refused: a refusal would let
    // the request through uncounted behind Envoy. A long value is counted under its digest;
    // hits over --max-hits on an exact log are a deny that records nothing. Client-chosen limits
    // of 2^32 - 1 per year are kept as buckets (the automatic choice), where any number of hits
    // is one count: 2^32 - 1 hits on 64 of them fit.
    let decided: Vec<(&str, RateLimitRequest, Code)> = vec![
        (
            "a 1 MiB value",
            request(vec![descriptor(&[("plain", &huge)])]),
            Code::Ok,
        ),
        (
            "2^32 hits on 64 client-chosen limits",
            request((0..64).map(hits_bomb).collect()),
            Code::Ok,
        ),
        (
            "2^32 request hits on a configured limit of 10^9",
            big_request_hits,
            Code::OverLimit,
        ),
    ];
    for (what, req, code) in decided {
        let started = Instant::now();
        let r = call(&mut client, req).await;
        let elapsed = started.elapsed();
        assert_eq!(r.overall_code(), code, "{what}");
        assert!(elapsed < Duration::from_secs(1), "{what} took {elapsed:?}");
        eprintln!("{what}: decided in {elapsed:?}");
    }
    // 20 KiB of metadata, over the 16 KiB of headers HTTP/2 allows here: that call is refused
    // (431, stream refused) and the connection goes on serving.
    let mut oversized = tonic::Request::new(request(vec![descriptor(&[("plain", "v")])]));
    let padding = "p".repeat(20 << 10).parse().expect("ASCII metadata");
    oversized.metadata_mut().insert("x-padding", padding);
    let started = Instant::now();
    let refused = client.should_rate_limit(oversized).await;
    assert!(refused.is_err(), "20 KiB of headers accepted");
    assert!(started.elapsed() < Duration::from_secs(1));

    // Bodies no gRPC library would send, written by hand: a clear status each, never a hang.
    let valid = request(vec![descriptor(&[("plain", "raw")])]).encode_to_vec();
    let mut two = grpc_frame(&valid);
    two.extend_from_slice(&grpc_frame(&valid));
    let mut compressed = grpc_frame(&valid);
    compressed[0] = 1;
    let mut truncated = grpc_frame(&valid);
    truncated.pop();
    let raw_cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("no message", Vec::new(), "3", "no message"),
        ("half a prefix", vec![0, 0], "3", "no message"),
        ("a truncated message", truncated, "3", "ends inside"),
        ("two messages", two, "3", "one message"),
        (
            "bytes that are not protobuf",
            grpc_frame(&[0xff; 16]),
            "3",
            "cannot decode",
        ),
        (
            "a message flagged compressed",
            compressed,
            "13",
            "compressed",
        ),
    ];
    for (what, body, status, message) in raw_cases {
        let started = Instant::now();
        let answer = raw_should_rate_limit(server.grpc_port, &[], body).await;
        assert_eq!(answer.status.as_deref(), Some(status), "{what}: {answer:?}");
        let text = answer.message.unwrap_or_default();
        assert!(text.contains(message), "{what}: {text:?} lacks {message:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "{what}");
    }
    let rss_after = server.rss_kib();
    eprintln!("RSS {rss_before} KiB before, {rss_after} KiB after");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "after")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

/// Request bodies of arbitrary bytes, written by hand over HTTP/2 (random bytes, a valid 5-byte
/// prefix on random bytes, prefixes that lie about the length or the compression): every one
/// gets a gRPC status from the set a bad request may get, within a second, and the server keeps
/// answering.
#[test]
fn grpc_bodies_of_arbitrary_bytes_get_a_status() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..600),
        proptest::collection::vec(any::<u8>(), 0..600).prop_map(|m| grpc_frame(&m)),
        (
            any::<u8>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(flag, length, rest)| {
                let mut body = vec![flag % 3];
                body.extend_from_slice(&length.to_be_bytes());
                body.extend_from_slice(&rest);
                body
            }),
    ];
    runner()
        .run(&body, |body| {
            let started = Instant::now();
            let call = raw_should_rate_limit(server.grpc_port, &[], body);
            let answer = runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(2), call).await })
                .map_err(|_| TestCaseError::fail("no answer within 2 s"))?;
            // OK (bytes that happen to decode as a request), INVALID_ARGUMENT, OUT_OF_RANGE,
            // INTERNAL (the compressed flag without grpc-encoding).
            let status = answer.status.as_deref().unwrap_or("none");
            prop_assert!(["0", "3", "11", "13"].contains(&status), "{answer:?}");
            prop_assert!(started.elapsed() < Duration::from_secs(1));
            Ok(())
        })
        .expect("every body gets a status");
    let mut client = runtime.block_on(server.client());
    let r = runtime.block_on(call(
        &mut client,
        request(vec![descriptor(&[("plain", "v")])]),
    ));
    assert_eq!(r.overall_code(), Code::Ok);
}

/// A client that opens calls and never finishes their bodies can hold at most 100 of them on one
/// connection: the server says so in its HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`, which clients
/// must honour (h2 refuses streams beyond it). With 99 such calls held open, the connection's
/// last call and other connections are still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_calls_are_bounded_per_connection() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let io = tokio::net::TcpStream::connect(("127.0.0.1", server.grpc_port))
        .await
        .expect("connect");
    let (sender, connection) = h2::client::handshake(io).await.expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let mut sender = sender.ready().await.expect("ready");
    // Let the server's SETTINGS arrive before counting streams.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sender.current_max_send_streams(), 100);
    let uri = format!(
        "http://127.0.0.1:{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.grpc_port
    );
    let mut half_sent = Vec::new();
    for _ in 0..100 {
        let call = http::Request::post(uri.as_str())
            .header("content-type", "application/grpc")
            .body(())
            .expect("request");
        sender = sender.ready().await.expect("ready");
        half_sent.push(sender.send_request(call, false).expect("open a call"));
    }
    // All 100 are open on the server (none refused): one of them still gets its answer.
    let (response, mut body) = half_sent.pop().expect("a call");
    let frame = grpc_frame(&request(vec![descriptor(&[("plain", "last")])]).encode_to_vec());
    body.send_data(bytes::Bytes::from(frame), true)
        .expect("send the body");
    let answer = tokio::time::timeout(Duration::from_secs(2), response)
        .await
        .expect("answered in time")
        .expect("answered");
    assert_eq!(answer.status(), 200);

    let mut client = server.client().await;
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "other")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
    drop(half_sent);
}

/// 4 MiB of empty descriptors (`12 00`, two bytes each) would take hundreds of MiB decoded in
/// full: descriptors are counted on the wire instead, and the message is refused at the 65th
/// (`--max-descriptors`) before anything is built. Four such calls at once leave the server's
/// memory within 64 MiB of where it was, and it keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_empty_descriptors_is_refused_before_it_is_built() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &[]);
    let mut client = server.client().await;
    call(&mut client, request(vec![descriptor(&[("plain", "warm")])])).await;
    let rss_before = server.rss_kib();
    let mut message = request(vec![]).encode_to_vec();
    message.extend([0x12, 0x00].repeat(((4 << 20) - 64) / 2));
    let calls = (0..4).map(|_| raw_should_rate_limit(server.grpc_port, &[], grpc_frame(&message)));
    for answer in futures::future::join_all(calls).await {
        assert_eq!(answer.status.as_deref(), Some("3"), "{answer:?}");
        let text = answer.message.unwrap_or_default();
        assert!(text.contains("too many descriptors"), "{text}");
    }
    let grown = server.rss_kib().saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
    let r = call(
        &mut client,
        request(vec![descriptor(&[("plain", "after")])]),
    )
    .await;
    assert_eq!(r.overall_code(), Code::Ok);
}

/// A sliding log stores every hit (one sorted-set member each in Redis), so `hits_addend` is the
/// one request field that multiplies work. Against a real Redis: 4097 hits on an exact log, or
/// two descriptors of 2049 hits each, are denied before Redis sees them (the budget is the
/// request's); the largest allowed (`--max-hits`, 4096 by default) is decided in one call and
/// records exactly that many members. Charges (a descriptor's own cost) land whatever the budget:
/// past it, in buckets. A client-chosen limit of 2^32 - 1 per year is kept as buckets: 10^7 hits
/// on it are one count in one hash field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_are_bounded_before_they_reach_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let rules = Rules::new();
    // A generous store timeout: 4096 members in one script call take milliseconds, more on a
    // loaded machine, and this test is about the bound, not the latency.
    let server = Slidegate::start(
        rules.path(),
        &["--redis-url", &redis.url(), "--redis-timeout", "5s"],
    );
    assert!(wait_until(Duration::from_secs(10), || server
        .get("/healthcheck")
        .0
        == 200));
    let mut client = server.client().await;
    let with_hits = |hits: u64, limit: Option<RateLimitOverride>| {
        let mut d = descriptor(&[("big", "h")]);
        d.hits_addend = Some(UInt64Value { value: hits });
        d.limit = limit;
        request(vec![d])
    };
    let forever = RateLimitOverride {
        requests_per_unit: u32::MAX,
        unit: 6, // YEAR
    };
    let mut admitted = request(vec![descriptor(&[("big", "h")])]);
    admitted.hits_addend = 4097;
    let r = call(&mut client, admitted).await;
    assert_eq!(r.overall_code(), Code::OverLimit, "4097 hits");
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
    // As a charge, 4097 on an exact log lands in buckets (one minute each for the hour).
    let r = call(&mut client, with_hits(4097, None)).await;
    assert_eq!(r.overall_code(), Code::Ok, "a charge of 4097");
    let hour = "slidegate:{hostile:big=h}3600000";
    assert_eq!(redis.cli(&["HGET", hour, "t"]), "4097");
    assert_eq!(redis.cli(&["HGET", hour, "w"]), "60000000");
    // The charge also moved the node's clock: gone with it, nothing is left.
    redis.cli(&["DEL", hour, "slidegate:clock"]);
    // The budget is the request's, not each descriptor's: two descriptors of 2049 hits on exact
    // logs are denied as a whole and record nothing.
    let pair: Vec<RateLimitDescriptor> = (0..2)
        .map(|i| descriptor(&[("big", &format!("pair{i}"))]))
        .collect();
    let mut both = request(pair.clone());
    both.hits_addend = 2049;
    let r = call(&mut client, both).await;
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(redis.cli(&["DBSIZE"]), "0");
    // As descriptor costs they are charges: the first fits the budget on its log, the second is
    // over what is left and lands in buckets.
    let charges = pair
        .into_iter()
        .map(|mut d| {
            d.hits_addend = Some(UInt64Value { value: 2049 });
            d
        })
        .collect();
    let r = call(&mut client, request(charges)).await;
    assert_eq!(r.overall_code(), Code::Ok);
    let pair_key = |i: u32| format!("slidegate:{{hostile:big=pair{i}}}3600000");
    assert_eq!(redis.cli(&["ZCARD", &pair_key(0)]), "2049");
    assert_eq!(redis.cli(&["HGET", &pair_key(1), "t"]), "2049");
    redis.cli(&["DEL", &pair_key(0), &pair_key(1)]);
    let r = call(&mut client, with_hits(10_000_000, Some(forever))).await;
    assert_eq!(r.overall_code(), Code::Ok);
    let buckets = "slidegate:{hostile:big=h}31536000000";
    assert_eq!(redis.cli(&["HGET", buckets, "t"]), "10000000");
    assert_eq!(
        redis.cli(&["HLEN", buckets]),
        "5",
        "one bucket, its total, its oldest and newest index and its width"
    );
    redis.cli(&["DEL", buckets]);
    let started = Instant::now();
    let r = call(&mut client, with_hits(4096, None)).await;
    assert_eq!(r.overall_code(), Code::Ok);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        redis.cli(&["ZCARD", "slidegate:{hostile:big=h}3600000"]),
        "4096"
    );
}

/// Sends raw bytes as one HTTP/1.1 request and returns the status (0: connection closed without
/// an answer) and the time it took.
fn raw_http(port: u16, request: &[u8]) -> (u16, Duration) {
    use std::io::{Read, Write};
    let started = Instant::now();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // The server may answer (and close) before reading everything.
    let _ = stream.write_all(request);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    (
        http_status(&String::from_utf8_lossy(&raw)),
        started.elapsed(),
    )
}

/// HTTP abuse on `/json` and `/check`: oversized bodies (with and without a Content-Length),
/// thousands of descriptors, 100 000 nested brackets, invalid UTF-8, bad percent-encoding,
/// thousands of descriptor headers and a 1 MiB header. Each gets 400, 413 or 431 quickly (what a
/// client may choose, bytes that are not UTF-8 and hits, is decided instead);
/// memory stays bounded; the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_http_requests_are_refused_quickly() {
    let rules = Rules::new();
    let server = Slidegate::start(rules.path(), &["--max-body-bytes", "65536"]);
    let port = server.http_port;
    let rss_before = server.rss_kib();

    let json_post = |body: &[u8], chunked: bool| -> Vec<u8> {
        let mut out = Vec::new();
        if chunked {
            out.extend_from_slice(
                b"POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            for chunk in body.chunks(8192) {
                out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                out.extend_from_slice(chunk);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
        } else {
            out.extend_from_slice(
                format!(
                    "POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(body);
        }
        out
    };
    let check = |headers: &str| -> Vec<u8> {
        format!(
            "GET /check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-ratelimit-domain: hostile\r\n{headers}\r\n"
        )
        .into_bytes()
    };
    let descriptors = (0..1000)
        .map(|i| format!(r#"{{"entries":[{{"key":"plain","value":"{i}"}}]}}"#))
        .collect::<Vec<_>>()
        .join(",");
    let many = format!(r#"{{"domain":"hostile","descriptors":[{descriptors}]}}"#);
    let big_body = vec![b' '; 4 << 20];
    let deep = "[".repeat(60_000);
    let many_headers: String = (0..5000)
        .map(|i| format!("x-ratelimit-descriptor: plain={i}\r\n"))
        .collect();
    let many_entries = format!(
        "x-ratelimit-descriptor: {}\r\n",
        (0..5000)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let huge_header = format!("x-ratelimit-descriptor: plain={}\r\n", "v".repeat(1 << 20));

    let cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        ("/json 4 MiB body", json_post(&big_body, false), &[413]),
        ("/json 4 MiB chunked body", json_post(&big_body, true), &[413]),
        ("/json 1000 descriptors", json_post(many.as_bytes(), false), &[400]),
        ("/json 60 000 nested brackets", json_post(deep.as_bytes(), false), &[400]),
        ("/json invalid UTF-8", json_post(b"{\"domain\":\"\xff\xfe\"}", false), &[400]),
        ("/json empty key", json_post(br#"{"domain":"hostile","descriptors":[{"entries":[{"key":"","value":"v"}]}]}"#, false), &[400]),
        ("/check invalid percent-encoding", check("x-ratelimit-descriptor: plain=%zz\r\n"), &[400]),
        // Not UTF-8: counted under an escape of the bytes (decided, not refused).
        ("/check percent-encoded invalid UTF-8", check("x-ratelimit-descriptor: plain=%ff%fe\r\n"), &[200]),
        ("/check raw non-ASCII", b"GET /check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nx-ratelimit-domain: hostile\r\nx-ratelimit-descriptor: plain=\xff\r\n\r\n".to_vec(), &[200]),
        ("/check empty key", check("x-ratelimit-descriptor: =v\r\n"), &[400]),
        ("/check 5000 entries", check(&many_entries), &[400, 431]),
        ("/check 5000 descriptor headers", check(&many_headers), &[400, 431]),
        ("/check a 1 MiB header", check(&huge_header), &[400, 431]),
        ("/check hits 2^64", check("x-ratelimit-descriptor: plain=v\r\nx-ratelimit-hits: 18446744073709551616\r\n"), &[400]),
        // Over --max-hits: a deny, never a refusal a proxy would pass.
        ("/check hits 2^32 on a limit of 10^9", check("x-ratelimit-descriptor: big=v\r\nx-ratelimit-hits: 4294967295\r\n"), &[429]),
    ];
    for (what, bytes, expected) in cases {
        let (status, elapsed) = raw_http(port, &bytes);
        eprintln!("{what}: {status} in {elapsed:?}");
        assert!(
            expected.contains(&status),
            "{what}: got {status}, expected {expected:?}"
        );
        assert!(elapsed < Duration::from_secs(1), "{what} took {elapsed:?}");
    }
    let rss_after = server.rss_kib();
    eprintln!("RSS {rss_before} KiB before, {rss_after} KiB after");
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS {rss_before} -> {rss_after} KiB"
    );
    assert_eq!(server.get("/healthcheck").0, 200);
    let (status, _) = raw_http(port, &check("x-ratelimit-descriptor: plain=ok\r\n"));
    assert_eq!(status, 200);
}
