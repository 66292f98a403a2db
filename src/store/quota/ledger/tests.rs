//! The ledger's unit and property tests: shares, their moves with demand, the holder bound, and
//! (by proptest) that all grants together never admit more than a limit in any window. Apart
//! from `ledger.rs` so that the arithmetic stays readable and under the size limit.

use super::*;
use proptest::prelude::*;

const S: Duration = Duration::from_secs(1);

/// One limit: `n` per `window`.
fn per_window(n: u64, window: Duration) -> [Quota; 1] {
    [Quota { n, window }]
}

/// The exact bound of the grants together, as Envoy would enforce them: the most all of them
/// can admit in any window of length `window`. Each grant admits at most b + r·t over the
/// time t Envoy uses it within the window, and Envoy uses one of a holder's grants at a time:
/// within a window a holder's grants overlapping it each give their burst, and their refills
/// share the window's length at most, the fastest first, each for no longer than its life
/// overlaps the window. Times here are whole seconds, so the most is reached at a window
/// start where a slope changes or the refills' time runs out: a whole second, or a fraction
/// with as many parts as the grants that enter or leave together; starts are tried every
/// twelfth of a second, which finds it for up to four such grants of one holder.
fn most_admitted(grants: &[Grant], window: Duration) -> u64 {
    let w = window.as_secs_f64();
    let from = grants
        .iter()
        .map(|g| g.start.as_secs_f64())
        .fold(f64::MAX, f64::min)
        - w;
    let to = grants
        .iter()
        .map(|g| g.end.as_secs_f64())
        .fold(0.0, f64::max);
    let mut holders: Vec<u64> = grants.iter().map(|g| g.holder).collect();
    holders.sort_unstable();
    holders.dedup();
    let rate =
        |g: &Grant| f64::from(g.bucket.tokens_per_fill) / f64::from(g.bucket.fill_interval_secs);
    let mut most = 0;
    let steps = ((to - from.floor()) * 12.0).ceil() as u64;
    for step in 0..=steps {
        let a = from.floor() + step as f64 / 12.0;
        let mut sum = 0;
        for holder in &holders {
            // (rate, time in the window) of each of the holder's grants the window meets.
            let mut met: Vec<(f64, f64)> = Vec::new();
            for g in grants.iter().filter(|g| g.holder == *holder) {
                let (s, e) = (g.start.as_secs_f64(), g.end.as_secs_f64());
                let overlap = e.min(a + w) - s.max(a);
                if overlap >= 0.0 {
                    sum += u64::from(g.bucket.max_tokens);
                    met.push((rate(g), overlap));
                }
            }
            met.sort_by(|x, y| y.0.total_cmp(&x.0));
            let (mut left, mut refill) = (w, 0.0);
            for (r, t) in met {
                let used = t.min(left);
                refill += r * used;
                left -= used;
            }
            sum += (refill + 1e-9).floor() as u64;
        }
        most = most.max(sum);
    }
    most
}

#[test]
fn a_share_is_a_quarter_burst_and_the_rest_over_the_window() {
    let bucket = TokenBucket::for_share(100, Duration::from_secs(10)).expect("bucket");
    assert_eq!(
        bucket,
        TokenBucket {
            max_tokens: 25,
            tokens_per_fill: 75,
            fill_interval_secs: 10
        }
    );
    assert_eq!(bucket.weight(Duration::from_secs(10)), 100, "exact");
    // A window of no whole seconds: its whole seconds above, the refill scaled down.
    let odd = TokenBucket::for_share(100, Duration::from_millis(2500)).expect("bucket");
    assert_eq!((odd.tokens_per_fill, odd.fill_interval_secs), (90, 3));
    assert_eq!(odd.weight(Duration::from_millis(2500)), 100);
    let slow = TokenBucket::for_share(10, Duration::from_secs(60)).expect("bucket");
    assert_eq!(slow.max_tokens, 3);
    assert!(slow.weight(Duration::from_secs(60)) <= 10, "{slow:?}");
    let one = TokenBucket::for_share(1, Duration::from_secs(60)).expect("bucket");
    assert!(one.weight(Duration::from_secs(60)) <= 1, "{one:?}");
    assert_eq!(TokenBucket::for_share(0, Duration::from_secs(1)), None);
}

/// One Envoy gets half (one share held back); a second gets a third at once; the first's
/// half shrinks to a third at once too: beside its half, which counts until it ends, the
/// third adds only its burst (Envoy uses one of them at a time, so the two refills never
/// add up). Both keep a third, renewed unchanged, and the bound holds throughout.
#[test]
fn envoys_that_join_get_a_share_at_once_and_larger_shares_shrink() {
    let quotas = per_window(120, 10 * S);
    let mut ledger = Ledger::default();
    let Assignment::Bucket(first) =
        ledger.assign(1, Duration::ZERO, Usage::default(), &quotas, false)
    else {
        panic!("the first Envoy gets a bucket");
    };
    assert_eq!(first.weight(10 * S), 60, "{first:?}");
    assert_eq!(
        ledger.assign(1, 5 * S, Usage::default(), &quotas, false),
        Assignment::Bucket(first)
    );
    let Assignment::Bucket(second) = ledger.assign(2, 6 * S, Usage::default(), &quotas, false)
    else {
        panic!("a second Envoy gets a bucket at once");
    };
    assert_eq!(second.weight(10 * S), 40, "{second:?}");
    let Assignment::Bucket(shrunk) = ledger.assign(1, 10 * S, Usage::default(), &quotas, false)
    else {
        panic!("the first Envoy's share shrinks");
    };
    assert_eq!(shrunk.weight(10 * S), 40, "{shrunk:?}");
    assert!(most_admitted(ledger.grants(), 10 * S) <= 120);
    // Reported again before Envoy's TTL runs out: renewed unchanged.
    assert_eq!(
        ledger.assign(1, 12 * S, Usage::default(), &quotas, false),
        Assignment::Bucket(shrunk)
    );
    let mut now = 10 * S;
    let mut last = (Assignment::DenyAll, Assignment::DenyAll);
    while now < 120 * S {
        now += 5 * S;
        last = (
            ledger.assign(1, now, Usage::default(), &quotas, false),
            ledger.assign(2, now, Usage::default(), &quotas, false),
        );
    }
    let (Assignment::Bucket(a), Assignment::Bucket(b)) = last else {
        panic!("both hold a bucket in the end: {last:?}");
    };
    assert_eq!(a, b, "equal shares in the end");
    assert_eq!(a, shrunk, "{a:?}");
    assert!(most_admitted(ledger.grants(), 10 * S) <= 120);
}

/// A bucket that differs from the holder's last one only in its fill interval's seconds is
/// never sent as it is: some Envoy versions would keep the old one.
#[test]
fn a_bucket_envoy_could_take_for_the_last_one_is_told_apart() {
    let mut ledger = Ledger::default();
    let bucket = |max_tokens, tokens_per_fill, fill_interval_secs| TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval_secs,
    };
    ledger.grant(1, bucket(3, 2, 10), Duration::ZERO);
    assert_eq!(
        ledger.grant(1, bucket(3, 2, 11), 5 * S),
        Assignment::Bucket(bucket(2, 2, 11))
    );
    ledger.grant(3, bucket(1, 2, 10), Duration::ZERO);
    assert_eq!(
        ledger.grant(3, bucket(1, 2, 11), 5 * S),
        Assignment::Bucket(bucket(1, 1, 11))
    );
    ledger.grant(4, bucket(1, 1, 10), Duration::ZERO);
    assert_eq!(
        ledger.grant(4, bucket(1, 1, 11), 5 * S),
        Assignment::DenyAll
    );
    // Another holder's, or one that ended: no confusion.
    assert_eq!(
        ledger.grant(5, bucket(1, 1, 11), 5 * S),
        Assignment::Bucket(bucket(1, 1, 11))
    );
    assert_eq!(
        ledger.grant(4, bucket(1, 1, 11), 60 * S),
        Assignment::Bucket(bucket(1, 1, 11))
    );
}

/// A ledger shares among at most [`MAX_HOLDERS`] Envoys' buckets: one more is denied and not
/// counted as a sharer (the others' shares stay), and a known one is still answered.
#[test]
fn a_ledger_shares_among_a_bounded_number_of_holders() {
    let quotas = per_window(1_000_000, 10 * S);
    let mut ledger = Ledger::default();
    for holder in 0..MAX_HOLDERS as u64 {
        ledger.assign(holder, S, Usage::default(), &quotas, false);
    }
    assert!(ledger.usage(MAX_HOLDERS as u64 - 1).is_some());
    let over = ledger.assign(MAX_HOLDERS as u64, S, Usage::default(), &quotas, false);
    assert_eq!(over, Assignment::DenyAll);
    assert_eq!(ledger.usage(MAX_HOLDERS as u64), None, "not a sharer");
    let known = ledger.assign(0, 2 * S, Usage::default(), &quotas, false);
    assert!(matches!(known, Assignment::Bucket(_)), "{known:?}");
}

/// Every 5 s, as Envoy reports, holder 1 and 2 report `demand` requests each; the weights of
/// their current grants after `rounds` reports (over a window of 10 s).
fn run(
    ledger: &mut Ledger,
    now: &mut Duration,
    rounds: u32,
    demand: (u64, u64),
    quotas: &[Quota],
) -> (u64, u64) {
    let report = |n| Usage {
        allowed: n / 2,
        denied: n - n / 2,
        elapsed: 5 * S,
    };
    let mut last = (Assignment::DenyAll, Assignment::DenyAll);
    for _ in 0..rounds {
        *now += 5 * S;
        last = (
            ledger.assign(1, *now, report(demand.0), quotas, false),
            ledger.assign(2, *now, report(demand.1), quotas, false),
        );
    }
    let weight = |a: Assignment| match a {
        Assignment::Bucket(b) => b.weight(10 * S),
        Assignment::DenyAll => 0,
    };
    (weight(last.0), weight(last.1))
}

/// A steady demand converges to its share: of N = 120 per 10 s and two Envoys, 40 is held
/// back and the pool of 80 is split a quarter each plus half by demand, so the busy one gets
/// 60, the quiet one 20. Demand moving to the other moves the share at the next report, and
/// the bound holds throughout.
#[test]
fn shares_follow_demand_and_move_with_it() {
    let quotas = per_window(120, 10 * S);
    let mut ledger = Ledger::default();
    let mut now = Duration::ZERO;
    let (busy, quiet) = run(&mut ledger, &mut now, 24, (500, 0), &quotas);
    assert!((55..=60).contains(&busy), "{busy}");
    assert!((15..=20).contains(&quiet), "{quiet}");
    let reported = Usage {
        allowed: 250,
        denied: 250,
        elapsed: 5 * S,
    };
    assert_eq!(ledger.usage(1), Some(reported), "what it reported is kept");
    assert!(ledger.assigned_ratio(&quotas[0]) <= 80.0 / 120.0);
    // Equal demands: equal shares.
    let (a, b) = run(&mut ledger, &mut now, 24, (300, 300), &quotas);
    assert!(a.abs_diff(b) <= 5 && a >= 35, "{a} {b}");
    // The demand moves to the other: so does the share, at the next report (beside the
    // one shrinking, the new grant adds what it refills faster and its burst).
    let (was_busy, now_busy) = run(&mut ledger, &mut now, 1, (0, 500), &quotas);
    assert!(now_busy >= 55 && was_busy <= 20, "{was_busy} {now_busy}");
    assert!(most_admitted(ledger.grants(), 10 * S) <= 120);
    let (was_busy, now_busy) = run(&mut ledger, &mut now, 8, (0, 500), &quotas);
    assert!(now_busy >= 55 && was_busy <= 20, "{was_busy} {now_busy}");
    assert!(most_admitted(ledger.grants(), 10 * S) <= 120);
}

/// What one step of a run does: an Envoy (of four) reports the bucket after some seconds,
/// with some requests allowed and denied.
fn steps() -> impl Strategy<Value = Vec<(u64, u64, u64, u64, bool)>> {
    let step = (
        0..4u64,
        0..8u64,
        0..1000u64,
        0..1000u64,
        prop::bool::weighted(0.1),
    );
    prop::collection::vec(step, 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// For any sequence of reports (Envoys joining, reporting, going silent, in any order and
    /// at any pace), all the grants together never admit more than each limit in any window.
    #[test]
    fn grants_never_admit_more_than_the_limit_in_any_window(
        steps in steps(),
        n in 1..500u64,
        window_secs in 1..120u64,
        second in prop::option::of((1..100u64, 1..30u64)),
    ) {
        let mut quotas = vec![Quota { n, window: Duration::from_secs(window_secs) }];
        if let Some((n, secs)) = second {
            quotas.push(Quota { n, window: Duration::from_secs(secs) });
        }
        let mut ledger = Ledger::default();
        let mut all: Vec<Grant> = Vec::new();
        let mut now = Duration::ZERO;
        for (holder, pause, allowed, denied, fresh) in steps {
            now += Duration::from_secs(pause);
            let usage = Usage { allowed, denied, elapsed: Duration::from_secs(pause) };
            ledger.assign(holder, now, usage, &quotas, fresh);
            // Every grant ever made, with its latest end (renewals and replacements).
            for grant in ledger.grants() {
                match all.iter_mut().find(|g| g.id == grant.id) {
                    Some(known) => known.end = grant.end,
                    None => all.push(*grant),
                }
            }
        }
        for quota in &quotas {
            let most = most_admitted(&all, quota.window);
            prop_assert!(most <= quota.n, "{most} > {} per {:?}: {all:?}", quota.n, quota.window);
        }
    }

    /// After any sequence of reports, Envoys that then report a steady demand settle at
    /// their shares of it (P/2k plus half of P by demand): none off its share by more than
    /// the eighth a share moves by (and a token of rounding).
    #[test]
    fn a_steady_demand_converges_to_its_share(
        steps in steps(),
        n in 16..500u64,
        window_secs in 1..30u64,
        demands in prop::collection::vec(0..1000u64, 1..4),
    ) {
        let quotas = per_window(n, Duration::from_secs(window_secs));
        let mut ledger = Ledger::default();
        let mut now = Duration::ZERO;
        for (holder, pause, allowed, denied, fresh) in steps {
            now += Duration::from_secs(pause);
            let usage = Usage { allowed, denied, elapsed: Duration::from_secs(pause) };
            ledger.assign(holder, now, usage, &quotas, fresh);
        }
        let k = demands.len() as u64;
        let mut last = vec![Assignment::DenyAll; demands.len()];
        for _ in 0..40 {
            now += 5 * S;
            for (holder, demand) in demands.iter().enumerate() {
                let usage = Usage { allowed: *demand, denied: 0, elapsed: 5 * S };
                last[holder] = ledger.assign(holder as u64, now, usage, &quotas, false);
            }
        }
        let pool = n - n / (k + 1);
        let total: u64 = demands.iter().sum();
        for (holder, demand) in demands.iter().enumerate() {
            let part = if total > 0 {
                1.0 / (2 * k) as f64 + *demand as f64 / (2.0 * total as f64)
            } else {
                1.0 / k as f64
            };
            let share = ((pool as f64 * part) as u64).max(1);
            let Assignment::Bucket(bucket) = last[holder] else {
                return Err(TestCaseError::fail(format!("holder {holder} denied: {last:?}")));
            };
            let weight = bucket.weight(quotas[0].window);
            let slack = (share / 8).max(1) + 1;
            prop_assert!(
                weight <= share + slack && weight + slack >= share,
                "holder {holder}: admits {weight}, its share is {share} (n {n}, {demands:?})"
            );
        }
    }
}
