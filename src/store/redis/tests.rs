use super::batch::batches;
use super::cross_slot::group_by_slot;
use super::*;
use crate::store::Precision;

#[test]
fn windows_of_one_descriptor_share_a_slot() {
    let a = CounterKey::new("api", [("user", "alice")], Duration::from_secs(1));
    let b = CounterKey::new("api", [("user", "alice")], Duration::from_secs(60));
    let c = CounterKey::new("api", [("user", "bob")], Duration::from_secs(1));
    let keys: Vec<String> = [a, b, c]
        .iter()
        .map(|k| format!("{DEFAULT_PREFIX}{}", k.as_str()))
        .collect();
    let groups: Vec<Vec<usize>> = group_by_slot(&keys).into_iter().map(|(_, g)| g).collect();
    assert_eq!(groups, vec![vec![0, 1], vec![2]]);
}

#[test]
fn batches_hold_one_slot_and_at_most_max_batch_in_queue_order() {
    let queued = |slot: Option<u16>, id: String| Queued {
        id,
        provisional: false,
        slot: slot.and_then(Slot::new),
        counters: Vec::new(),
        deadline: Instant::now(),
        answer: oneshot::channel().0,
    };
    let ids = |batches: Vec<Vec<Queued>>| -> Vec<Vec<String>> {
        batches
            .into_iter()
            .map(|b| b.into_iter().map(|q| q.id).collect())
            .collect()
    };
    let standalone = (0..20).map(|i| queued(None, i.to_string())).collect();
    let batched = ids(batches(standalone, DEFAULT_MAX_CALL_HITS));
    assert_eq!(batched.iter().map(Vec::len).collect::<Vec<_>>(), [16, 4]);
    assert_eq!(
        (batched[0][0].as_str(), batched[1][3].as_str()),
        ("0", "19")
    );
    let cluster = [(7, "a"), (9, "b"), (7, "c"), (9, "d"), (3, "e")]
        .into_iter()
        .map(|(slot, id)| queued(Some(slot), id.to_string()))
        .collect();
    assert_eq!(
        ids(batches(cluster, DEFAULT_MAX_CALL_HITS)),
        [vec!["a", "c"], vec!["b", "d"], vec!["e"]]
    );
    let one_slot = (0..33).map(|i| queued(Some(5), i.to_string())).collect();
    let sizes: Vec<usize> = batches(one_slot, DEFAULT_MAX_CALL_HITS)
        .iter()
        .map(Vec::len)
        .collect();
    assert_eq!(sizes, [16, 16, 1]);
}

#[test]
fn batches_add_up_to_at_most_max_call_hits() {
    let counted = |slot: Option<u16>, hits: u64, precision: Precision| Queued {
        id: hits.to_string(),
        provisional: false,
        slot: slot.and_then(Slot::new),
        counters: vec![Counter {
            key: CounterKey::new("d", [("k", "v")], Duration::from_secs(1)),
            limit: u64::MAX,
            window: Duration::from_secs(1),
            hits,
            shadow: false,
            precision,
            kind: crate::store::HitKind::Admitted,
        }],
        deadline: Instant::now(),
        answer: oneshot::channel().0,
    };
    let queued = |slot: Option<u16>, hits: u64| counted(slot, hits, Precision::Exact);
    for slot in [None, Some(5)] {
        // 4096 hits per call: 3000 + 1000 + 0 (counts 1) fill one, 4000 starts the next,
        // and a request over the bound goes alone.
        let queue = [3000, 1000, 0, 4000, 96, 5000, 1]
            .map(|hits| queued(slot, hits))
            .into_iter()
            .collect();
        let sizes: Vec<usize> = batches(queue, DEFAULT_MAX_CALL_HITS)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, [3, 2, 1, 1], "slot {slot:?}");
        // A bucket counter costs 1 whatever its hits (one field): 4096 of them fill a call
        // only by their number, so these three share one.
        let width = Precision::Buckets(Duration::from_millis(100));
        let queue = [4000, 1_000_000, 4096]
            .map(|hits| counted(slot, hits, width))
            .into_iter()
            .collect();
        assert_eq!(
            batches(queue, DEFAULT_MAX_CALL_HITS).len(),
            1,
            "slot {slot:?}"
        );
    }
}

#[tokio::test]
async fn bad_options_are_errors_without_secrets() {
    let opts = RedisOptions {
        prefix: "a{b".into(),
        ..RedisOptions::default()
    };
    let err = RedisStore::connect(&opts).await.unwrap_err();
    assert!(err.to_string().contains("prefix"), "{err}");

    let opts = RedisOptions {
        url: "redis://user:hunter2@[bad".into(),
        ..RedisOptions::default()
    };
    let err = RedisStore::connect(&opts).await.unwrap_err().to_string();
    assert!(!err.contains("hunter2") && err.contains("***"), "{err}");

    let opts = RedisOptions {
        url: "rediss://user:hunter2@localhost:1".into(),
        tls_ca_file: Some("/nonexistent/ca.pem".into()),
        ..RedisOptions::default()
    };
    let err = RedisStore::connect(&opts).await.unwrap_err().to_string();
    assert!(err.contains("CA file") && !err.contains("hunter2"), "{err}");
    assert!(!format!("{opts:?}").contains("hunter2"));
}

#[tokio::test]
async fn unreachable_redis_fails_fast_with_a_connection_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let opts = RedisOptions {
        url: format!("redis://:hunter2@127.0.0.1:{port}"),
        timeout: Duration::from_millis(300),
        ..RedisOptions::default()
    };
    let store = RedisStore::connect(&opts).await.expect("lazy connect");
    let counter = Counter {
        key: CounterKey::new("d", [], Duration::from_secs(1)),
        limit: 1,
        window: Duration::from_secs(1),
        hits: 1,
        shadow: false,
        precision: Precision::Exact,
        kind: crate::store::HitKind::Admitted,
    };
    let started = Instant::now();
    let err = store.decide(&[counter]).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(err.is_unreachable(), "{err:?}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(!format!("{store:?}").contains("hunter2"));
}
