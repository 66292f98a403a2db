//! What one client may hold of the Rate Limit Quota Service through the binary: a peer opens a
//! bounded number of streams, and its buckets make a bounded number of ledgers, so that another
//! peer's Envoys still get their quota while it is at its bounds.

use std::net::IpAddr;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::BlanketRule;

use crate::rlqs::{Envoy, RULES, bucket, strategy};
use crate::support::{Slidegate, metric_value, wait_until};

/// `slidegate::service::rlqs`'s bounds, as its docs state them.
const MAX_STREAMS_PER_PEER: usize = 64;
const MAX_BUCKETS_PER_STREAM: usize = 4096;
const MAX_BUCKETS_PER_PEER: usize = 16_384;

fn metric(server: &Slidegate, name: &str) -> f64 {
    metric_value(&server.get("/metrics").1, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_bounded_streams_and_ledgers_and_another_is_still_served() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &[]);
    let local: IpAddr = [127, 0, 0, 1].into();
    let other: IpAddr = [127, 0, 0, 2].into();

    // Streams: 64 from one peer (over one connection, as h2 allows 100), the 65th refused.
    let channel = server.channel_from(local).await;
    let mut streams = Vec::new();
    for _ in 0..MAX_STREAMS_PER_PEER {
        streams.push(Envoy::open(channel.clone()).await.expect("a stream"));
    }
    let refused = Envoy::open(server.channel_from(local).await).await;
    let Err(status) = refused else {
        panic!("a stream over the peer's bound was opened")
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(metric(&server, "slidegate_rlqs_streams_refused_total"), 1.0);
    assert_eq!(
        metric(&server, "slidegate_rlqs_streams"),
        MAX_STREAMS_PER_PEER as f64
    );
    // Another peer is not held back by this one's streams.
    let mut neighbour = Envoy::open(server.channel_from(other).await)
        .await
        .expect("another peer's stream");

    // Ledgers: five streams of 4,096 distinct users each make 20,480 buckets; the first 16,384
    // get a token bucket, the rest are denied, counted as the peer's.
    let (mut assigned, mut denied) = (0, 0);
    for (s, stream) in streams.iter_mut().take(5).enumerate() {
        let ids: Vec<_> = (0..MAX_BUCKETS_PER_STREAM)
            .map(|i| bucket(&[("user", &format!("u{s}-{i}"))]))
            .collect();
        let answers = stream.report(&ids).await;
        assert_eq!(answers.len(), MAX_BUCKETS_PER_STREAM);
        for (_, action) in &answers {
            match strategy(action) {
                Ok(_) => assigned += 1,
                Err(BlanketRule::DenyAll) => denied += 1,
                Err(other) => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(assigned, MAX_BUCKETS_PER_PEER);
    assert_eq!(denied, 5 * MAX_BUCKETS_PER_STREAM - MAX_BUCKETS_PER_PEER);
    assert_eq!(
        metric(
            &server,
            "slidegate_rlqs_buckets_refused_total{reason=\"too_many_from_peer\"}"
        ),
        denied as f64
    );
    // The other peer's new bucket still gets its quota.
    let answer = neighbour
        .report(&[bucket(&[("user", "bob")])])
        .await
        .pop()
        .expect("an answer for bob");
    assert!(strategy(&answer.1).is_ok(), "{answer:?}");

    // Closed streams give their place back.
    drop(streams);
    assert!(
        wait_until(Duration::from_secs(5), || {
            metric(&server, "slidegate_rlqs_streams") == 1.0
        }),
        "closed streams are no longer counted"
    );
    Envoy::open(server.channel_from(local).await)
        .await
        .expect("a stream once the peer is under its bound");
}

/// `POST /explain` with a bucket id: the rule it reaches, and each Envoy's share from the ledger,
/// assigning nothing (a bucket no Envoy reported has no shares); values hidden when told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_a_bucket_ids_rule_and_each_envoys_share() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &[]);
    let explain = |bucket: &str| format!(r#"{{"domain":"rlqs","bucketId":{bucket}}}"#);

    let (status, fresh) = server.explain(&explain(r#"{"user":"alice"}"#)).await;
    assert_eq!(status, 200, "{fresh}");
    assert_eq!(fresh["outcome"], "limited", "{fresh}");
    assert_eq!(fresh["limits"][0]["limit"], 120, "{fresh}");
    assert_eq!(fresh["envoys"].as_array().map(Vec::len), Some(0), "{fresh}");

    let alice = bucket(&[("user", "alice")]);
    let mut first = Envoy::open(server.channel().await).await.expect("a stream");
    let mut second = Envoy::open(server.channel().await).await.expect("a stream");
    first.report(std::slice::from_ref(&alice)).await;
    second.report(std::slice::from_ref(&alice)).await;
    let (_, shared) = server.explain(&explain(r#"{"user":"alice"}"#)).await;
    let envoys = shared["envoys"].as_array().cloned().unwrap_or_default();
    assert_eq!(envoys.len(), 2, "{shared}");
    let assigned = shared["assigned"][0].as_u64().expect("assigned");
    assert!(
        assigned > 0 && assigned <= 120,
        "what both admit per window: {shared}"
    );
    assert!(
        envoys.iter().all(|e| e["admits"][0].as_u64() > Some(0)),
        "{shared}"
    );
    // Explaining assigned nothing: the ledger holds the same after it.
    let (_, again) = server.explain(&explain(r#"{"user":"alice"}"#)).await;
    assert_eq!(again["assigned"], shared["assigned"]);
    assert_eq!(again["envoys"].as_array().map(Vec::len), Some(2));

    for (bucket, outcome) in [
        (r#"{"team":"blue"}"#, "no_rule"),
        (r#"{"shadow":"s"}"#, "shadow"),
        (r#"{"plan":"free","path":"/x"}"#, "limited"),
    ] {
        let (_, answer) = server.explain(&explain(bucket)).await;
        assert_eq!(answer["outcome"], outcome, "{bucket}: {answer}");
    }
    assert_eq!(
        metric(
            &server,
            "slidegate_rlqs_assignments_total{action=\"token_bucket\"}"
        ),
        2.0,
        "explaining assigns nothing"
    );

    let hidden = Slidegate::start(rules.path(), &["--operator-hide-values"]);
    let (_, answer) = hidden.explain(&explain(r#"{"user":"alice"}"#)).await;
    assert_eq!(answer["outcome"], "limited", "{answer}");
    assert!(!answer.to_string().contains("alice"), "{answer}");
}
