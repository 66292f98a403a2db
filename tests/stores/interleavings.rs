//! Property: whatever the interleaving of requests, reloads (another limit, the exact log or
//! buckets of another width on the same counter), requests that name the counter a second time
//! with another limit and precision (a limit override), huge charges and clock steps back, the
//! memory store never admits more than the limits in force allow in any window, counted in true
//! time against an exact model of what it admitted, and admits nothing for a window after a charge
//! larger than any limit (its whole debt, up to 2^64 - 1 hits, never wraps). The clock steps only
//! back: a step forward frees hits early by the step, as documented (docs/rules.md, "Exact or
//! bounded").

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use slidegate::store::{Counter, CounterKey, HitKind, ManualClock, MemoryStore, Precision};

/// The window, in microseconds.
const W: u64 = 1_000_000;

#[derive(Clone, Debug)]
enum Step {
    /// True time (and the clock) moves on by this many microseconds; then a request of `hits`,
    /// naming the counter a second time with this limit and precision if `twice`.
    Request {
        after: u64,
        hits: u64,
        twice: Option<(u64, Precision)>,
    },
    /// True time moves on; then a charge of this many hits (more than any limit).
    Charge { after: u64, hits: u64 },
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
        8 => (0..W / 4, 0..4u64, prop::option::weighted(0.3, (1..10u64, precision())))
            .prop_map(|(after, hits, twice)| Step::Request { after, hits, twice }),
        1 => (0..W / 4, prop_oneof![Just(1000), Just(1 << 50), Just(u64::MAX - 9), Just(u64::MAX)])
            .prop_map(|(after, hits)| Step::Charge { after, hits }),
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
        // Nothing is admitted before this true time: the last huge charge's window.
        let mut debt_until = 0u64;
        let counter = |limit: u64, precision: Precision, hits: u64, kind: HitKind| Counter {
            key: CounterKey::new("interleavings", [("k", "v")], Duration::from_micros(W)),
            kind,
            limit,
            window: Duration::from_micros(W),
            hits,
            shadow: false,
            precision,
        };
        for step in steps {
            match step {
                Step::Reload { limit: l, precision: p } => (limit, precision) = (l, p),
                Step::ClockBack { by } => offset += by,
                Step::Charge { after, hits } => {
                    now += after;
                    clock.set(origin + Duration::from_micros(now.saturating_sub(offset)));
                    let d = store.decide_now(&[counter(limit, precision, hits, HitKind::Charged)]);
                    prop_assert!(!d.allowed, "a charge of {hits} fits a limit of {limit}");
                    debt_until = now + W;
                }
                Step::Request { after, hits, twice } => {
                    now += after;
                    // The clock never goes before the store's creation.
                    let shown = now.saturating_sub(offset);
                    clock.set(origin + Duration::from_micros(shown));
                    let mut counters = vec![counter(limit, precision, hits, HitKind::Admitted)];
                    if let Some((l, p)) = twice {
                        counters.push(counter(l, p, hits, HitKind::Admitted));
                    }
                    let d = store.decide_now(&counters);
                    if d.allowed && hits > 0 {
                        prop_assert!(now >= debt_until, "admitted at {now} under a debt until {debt_until}");
                        let held: u64 = admitted
                            .iter()
                            .filter(|&&(t, _)| t + W > now)
                            .map(|&(_, h)| h)
                            .sum();
                        // Each naming of the counter records its hits, and admits them only where
                        // they fit with those of the namings before it.
                        for (i, c) in counters.iter().enumerate() {
                            let with = held + (i as u64 + 1) * hits;
                            prop_assert!(
                                with <= c.limit,
                                "{with} admitted in the window ending at {now} under a limit of {}",
                                c.limit
                            );
                        }
                        admitted.push((now, hits * counters.len() as u64));
                    }
                }
            }
        }
    }
}
