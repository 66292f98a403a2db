//! Property: whatever the interleaving of requests, reloads (another limit, the exact log or
//! buckets of another width on the same counter) and clock steps back, the memory store never
//! admits more than the limit in force allows in any window, counted in true time against an exact
//! model of what it admitted. The clock steps only back: a step forward frees hits early by the
//! step, as documented (docs/rules.md, "Exact or bounded").

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use slidegate::store::{Counter, CounterKey, ManualClock, MemoryStore, Precision};

/// The window, in microseconds.
const W: u64 = 1_000_000;

#[derive(Clone, Debug)]
enum Step {
    /// True time (and the clock) moves on by this many microseconds; then a request of `hits`.
    Request { after: u64, hits: u64 },
    /// The rules change: the counter's limit and precision from now on.
    Reload { limit: u64, precision: Precision },
    /// The clock steps back by this many microseconds (true time does not).
    ClockBack { by: u64 },
}

fn precision() -> impl Strategy<Value = Precision> {
    prop_oneof![
        Just(Precision::Exact),
        Just(Precision::Buckets(Duration::from_micros(W / 10))),
        Just(Precision::Buckets(Duration::from_micros(W / 4))),
        Just(Precision::Buckets(Duration::from_micros(W / 2))),
        Just(Precision::Buckets(Duration::from_micros(W / 50))),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..W / 4, 0..4u64).prop_map(|(after, hits)| Step::Request { after, hits }),
        2 => (1..10u64, precision()).prop_map(|(limit, precision)| Step::Reload { limit, precision }),
        1 => (1..W).prop_map(|by| Step::ClockBack { by }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn at_most_the_limit_in_force_in_any_window(
        start in (5u64..9, precision()),
        steps in prop::collection::vec(step(), 1..120),
    ) {
        let origin = Duration::from_secs(1_800_000_000);
        let clock = Arc::new(ManualClock::new(origin));
        let store = MemoryStore::new(clock.clone());
        let (mut limit, mut precision) = start;
        // True time and the clock's offset from it (only ever falling), in microseconds.
        let (mut now, mut offset) = (0u64, 0u64);
        // What the store admitted: (true time, hits).
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for step in steps {
            match step {
                Step::Reload { limit: l, precision: p } => (limit, precision) = (l, p),
                Step::ClockBack { by } => offset += by,
                Step::Request { after, hits } => {
                    now += after;
                    // The clock never goes before the store's creation.
                    let shown = now.saturating_sub(offset);
                    clock.set(origin + Duration::from_micros(shown));
                    let c = Counter {
                        key: CounterKey::new("interleavings", [("k", "v")], Duration::from_micros(W)),
                        kind: slidegate::store::HitKind::Admitted,
                        limit,
                        window: Duration::from_micros(W),
                        hits,
                        shadow: false,
                        precision,
                    };
                    let d = store.decide_now(&[c]);
                    if d.allowed && hits > 0 {
                        admitted.push((now, hits));
                        let held: u64 = admitted
                            .iter()
                            .filter(|&&(t, _)| t + W > now)
                            .map(|&(_, h)| h)
                            .sum();
                        prop_assert!(
                            held <= limit,
                            "{held} admitted in the window ending at {now} under a limit of {limit}"
                        );
                    }
                }
            }
        }
    }
}
