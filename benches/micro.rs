//! Criterion micro-benchmarks of the hot path, without any network: descriptor matching, counter
//! key encoding, the memory store's decision, the deny cache, and one whole limiter call.
//!
//! `cargo bench --bench micro` (or `bench/scripts/bench --only micro`); results and their reading are in
//! docs/benchmarks.md. Groups:
//!
//! - `matching`: one descriptor against 10 and 10 000 rules. The tree is a map per level, so the
//!   two must cost the same.
//! - `key`: encoding a counter identity, plain and with escaping: from scratch (`CounterKey::new`,
//!   the path of limit overrides) and from a rule's precomputed `TagTemplate` (the hot path, which
//!   escapes only the values). `*_2_windows`: the two counters of a rule with two windows.
//! - `memory_store`: one decision on a fresh or busy counter, and on logs of 10..100 000 hits
//!   (decisions per second per core = 1 / time per decision); `hour_*_descriptors`: buckets against
//!   the exact log for 1 and 4 counters of an hour window.
//! - `deny_cache`: the Redis store's local check, a miss (the common case) and a hit.
//! - `limiter`: a whole `should_rate_limit` with the memory store (1 and 4 descriptors), and the
//!   gRPC message conversions around it.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use prost::Message;
use slidegate::config::{RuleSet, load_sources};
use slidegate::limiter::DecisionMetrics;
use slidegate::limiter::{Options, RateLimiter};
use slidegate::service::answer::Answer;
use slidegate::service::wire::WireRequest;
use slidegate::store::key::TagTemplate;
use slidegate::store::redis::DenyCache;
use slidegate::store::{Counter, CounterKey, ManualClock, MemoryStore, Precision};

const START: Duration = Duration::from_secs(1_700_000_000);

/// A domain with `n` exact-value rules under `route`, a key-only `client` rule, and a two-level
/// `user`/`path` rule.
fn rules(n: usize) -> RuleSet {
    let mut yaml = String::from(
        "domain: bench\ndescriptors:\n  - key: client\n    rate_limit: { unit: second, requests_per_unit: 100 }\n  - key: user\n    descriptors:\n      - key: path\n        rate_limit: { unit: minute, requests_per_unit: 60 }\n",
    );
    for i in 0..n {
        yaml.push_str(&format!(
            "  - key: route\n    value: /r{i}\n    rate_limit: {{ unit: second, requests_per_unit: 100 }}\n"
        ));
    }
    load_sources(&[("bench.yaml".to_string(), yaml)])
        .unwrap_or_else(|e| panic!("bench rules do not load: {e}"))
}

fn matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("matching");
    for n in [10usize, 10_000] {
        let set = rules(n);
        let domain = set.domain("bench").expect("domain bench");
        let route = format!("/r{}", n / 2);
        let cases: [(&str, Vec<(&str, &str)>); 4] = [
            ("exact", vec![("route", route.as_str())]),
            ("key_only", vec![("client", "10.1.2.3")]),
            ("two_levels", vec![("user", "alice"), ("path", "/login")]),
            ("no_match", vec![("route", "/nowhere")]),
        ];
        for (name, entries) in &cases {
            group.bench_with_input(
                BenchmarkId::new(*name, format!("{n}_rules")),
                entries,
                |b, entries| b.iter(|| black_box(domain.match_entries(black_box(entries)))),
            );
        }
    }
    group.finish();
}

fn key(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let window = Duration::from_secs(1);
    group.bench_function("plain_1_entry", |b| {
        b.iter(|| {
            CounterKey::new(
                black_box("bench"),
                [("client", black_box("0-4711"))],
                window,
            )
        })
    });
    group.bench_function("plain_2_entries", |b| {
        b.iter(|| {
            CounterKey::new(
                black_box("edge"),
                [
                    ("user_id", black_box("alice")),
                    ("path", black_box("/api/v1/orders")),
                ],
                window,
            )
        })
    });
    group.bench_function("escaped", |b| {
        b.iter(|| {
            CounterKey::new(
                black_box("edge"),
                [("remote_address", black_box("2001:db8::1 {x}"))],
                window,
            )
        })
    });

    // The same identities from templates, as the limiter builds them for a matched rule.
    let client = TagTemplate::new("bench").with_key("client");
    group.bench_function("template_plain_1_entry", |b| {
        b.iter(|| {
            client
                .tag([black_box("0-4711")].into_iter())
                .counter_key(window)
        })
    });
    let user_path = TagTemplate::new("edge")
        .with_key("user_id")
        .with_key("path");
    group.bench_function("template_plain_2_entries", |b| {
        b.iter(|| {
            user_path
                .tag([black_box("alice"), black_box("/api/v1/orders")].into_iter())
                .counter_key(window)
        })
    });
    let remote_address = TagTemplate::new("edge").with_key("remote_address");
    group.bench_function("template_escaped", |b| {
        b.iter(|| {
            remote_address
                .tag([black_box("2001:db8::1 {x}")].into_iter())
                .counter_key(window)
        })
    });

    // A rule with two windows: before, each counter escaped everything again.
    let minute = Duration::from_secs(60);
    group.bench_function("new_2_windows", |b| {
        b.iter(|| {
            let entries = [
                ("user_id", black_box("alice")),
                ("path", black_box("/login")),
            ];
            [
                CounterKey::new(black_box("edge"), entries, window),
                CounterKey::new(black_box("edge"), entries, minute),
            ]
        })
    });
    group.bench_function("template_2_windows", |b| {
        b.iter(|| {
            let mut tag = user_path.tag([black_box("alice"), black_box("/login")].into_iter());
            [tag.counter_key(window), tag.counter_key(minute)]
        })
    });
    group.finish();
}

fn counter(key: CounterKey, limit: u64, window: Duration) -> Counter {
    Counter {
        key,
        limit,
        window,
        hits: 1,
        shadow: false,
        precision: Precision::Exact,
        kind: slidegate::store::HitKind::Admitted,
    }
}

fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_store");
    group.throughput(Throughput::Elements(1));
    let second = Duration::from_secs(1);

    // 10 000 counters, drawn in turn, each a few hits deep, always allowed: the steady state of
    // the end-to-end benchmark.
    {
        let clock = Arc::new(ManualClock::new(START));
        let store = MemoryStore::new(clock.clone());
        let counters: Vec<Counter> = (0..10_000)
            .map(|i| {
                let key = CounterKey::new("bench", [("client", format!("0-{i}").as_str())], second);
                counter(key, 1_000, second)
            })
            .collect();
        let mut i = 0;
        group.bench_function("decide_10k_counters", |b| {
            b.iter(|| {
                clock.advance(Duration::from_micros(1));
                i = (i + 7919) % counters.len();
                black_box(store.decide_now(std::slice::from_ref(&counters[i])))
            })
        });
    }

    // Four counters of one request (four descriptors), across shards.
    {
        let clock = Arc::new(ManualClock::new(START));
        let store = MemoryStore::new(clock.clone());
        let requests: Vec<Vec<Counter>> = (0..10_000)
            .map(|i| {
                (0..4)
                    .map(|p| {
                        let value = format!("{p}-{i}");
                        let key = CounterKey::new("bench", [("client", value.as_str())], second);
                        counter(key, 1_000, second)
                    })
                    .collect()
            })
            .collect();
        let mut i = 0;
        group.bench_function("decide_4_counters", |b| {
            b.iter(|| {
                clock.advance(Duration::from_micros(1));
                i = (i + 7919) % requests.len();
                black_box(store.decide_now(&requests[i]))
            })
        });
    }

    // Buckets against the exact log: 10 000 clients of 10 000 per hour, 1 or 4 descriptors per
    // request, a millisecond between requests, so each counter takes a hit every 10 s (360 in its
    // window, always allowed) and its buckets (a minute wide, the automatic choice) roll.
    let hour = Duration::from_secs(3_600);
    let minute = Duration::from_secs(60);
    for descriptors in [1usize, 4] {
        for (name, precision) in [
            ("exact", Precision::Exact),
            ("buckets", Precision::Buckets(minute)),
        ] {
            let clock = Arc::new(ManualClock::new(START));
            let store = MemoryStore::new(clock.clone());
            let requests: Vec<Vec<Counter>> = (0..10_000)
                .map(|i| {
                    (0..descriptors)
                        .map(|p| {
                            let value = format!("{p}-{i}");
                            let key = CounterKey::new("bench", [("client", value.as_str())], hour);
                            Counter {
                                precision,
                                ..counter(key, 10_000, hour)
                            }
                        })
                        .collect()
                })
                .collect();
            let mut i = 0;
            let mut next = || {
                clock.advance(Duration::from_millis(1));
                i = (i + 7919) % requests.len();
                store.decide_now(&requests[i])
            };
            // An hour of traffic first, so every window is as full as it stays.
            for _ in 0..3_600_000 {
                next();
            }
            let id = BenchmarkId::new(format!("hour_{descriptors}_descriptors"), name);
            group.bench_function(id, |b| b.iter(|| black_box(next())));
        }
    }

    // One counter whose log holds `limit` hits (a full sliding window, one hit expiring and one
    // admitted per decision): cost against the log length.
    for limit in [10u64, 1_000, 100_000] {
        let clock = Arc::new(ManualClock::new(START));
        let store = MemoryStore::new(clock.clone());
        let window = Duration::from_secs(10);
        let c = counter(
            CounterKey::new("bench", [("client", "hot")], window),
            limit,
            window,
        );
        let step = window / u32::try_from(limit).expect("small limit");
        for _ in 0..limit {
            store.decide_now(std::slice::from_ref(&c));
            clock.advance(step);
        }
        group.bench_with_input(BenchmarkId::new("full_log", limit), &c, |b, c| {
            b.iter(|| {
                clock.advance(step);
                black_box(store.decide_now(std::slice::from_ref(c)))
            })
        });
        // Denied on a full log (no time passes): the answer needs when the oldest hit leaves.
        group.bench_with_input(BenchmarkId::new("full_log_denied", limit), &c, |b, c| {
            b.iter(|| black_box(store.decide_now(std::slice::from_ref(c))))
        });
    }
    group.finish();
}

fn deny_cache(c: &mut Criterion) {
    let mut group = c.benchmark_group("deny_cache");
    let cache = DenyCache::new(100_000);
    let now = Instant::now();
    let keys: Vec<CounterKey> = (0..10_000)
        .map(|i| {
            CounterKey::new(
                "bench",
                [("client", format!("0-{i}").as_str())],
                Duration::from_secs(1),
            )
        })
        .collect();
    for k in keys.iter().step_by(2) {
        cache.insert(k, 100, now + Duration::from_secs(3600), now);
    }
    group.bench_function("miss", |b| {
        b.iter(|| black_box(cache.denied_for(&keys[1], 100, now)))
    });
    group.bench_function("hit", |b| {
        b.iter(|| black_box(cache.denied_for(&keys[0], 100, now)))
    });
    group.finish();
}

fn proto_request(descriptors: usize, i: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".to_string(),
        descriptors: (0..descriptors)
            .map(|p| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".to_string(),
                    value: format!("{p}-{i}"),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 1,
    }
}

fn limiter(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter");
    group.throughput(Throughput::Elements(1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for descriptors in [1usize, 4] {
        let clock = Arc::new(ManualClock::new(START));
        let store = Arc::new(MemoryStore::new(clock.clone()));
        let limiter = RateLimiter::new(
            Arc::new(ArcSwap::from_pointee(rules(10))),
            store,
            Options {
                response_headers: true,
                ..Options::default()
            },
            Arc::new(DecisionMetrics::default()),
        );
        // As the gRPC port receives them: encoded, decoded by the service's own wire decoder.
        let requests: Vec<Vec<u8>> = (0..10_000)
            .map(|i| proto_request(descriptors, i).encode_to_vec())
            .collect();
        let mut i = 0;
        // Bytes in, bytes out: what one gRPC call costs above the transport.
        group.bench_function(BenchmarkId::new("grpc_call", descriptors), |b| {
            b.iter(|| {
                clock.advance(Duration::from_micros(1));
                i = (i + 7919) % requests.len();
                let wire = WireRequest::decode(requests[i].as_slice()).expect("decodes");
                let domain = wire.domain();
                let response = runtime.block_on(limiter.should_rate_limit(&wire.request(&domain)));
                let answer = response.map(|response| Answer {
                    response,
                    dynamic_metadata: Vec::new(),
                });
                black_box(answer.map(|answer| answer.encode_to_vec()).ok())
            })
        });
        group.bench_function(BenchmarkId::new("decode", descriptors), |b| {
            b.iter(|| black_box(WireRequest::decode(black_box(requests[1].as_slice()))))
        });
    }
    group.finish();
}

criterion_group!(benches, matching, key, memory_store, deny_cache, limiter);
criterion_main!(benches);
