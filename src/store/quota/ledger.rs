//! The quota arithmetic of RLQS, without a network: how one bucket's limits (N per window W) are
//! shared among the Envoys that report it, as token buckets whose parameters alone hold them.
//!
//! **What an assignment can admit.** Envoy's token bucket holds at most `max_tokens` (b) and
//! refills continuously at r = `tokens_per_fill` / `fill_interval` (whole seconds); it starts
//! full, an identical assignment keeps it and a changed one replaces it, full again. So while one
//! assignment lasts it admits at most b + r·W in any window of length W; a grant's *weight* for a
//! limit is that bound, b + ⌊r·W⌋. Envoy holds one token bucket per bucket at a time, so a window
//! that sees several assignments of one holder (one bucket of one Envoy: its replacements) sees at
//! most all their bursts and the fastest of their refills over W, Σ b + max ⌊r·W⌋, and one that
//! sees several holders at most the sum of theirs.
//!
//! **The ledger.** Each bucket keeps its grants that are live or ended less than W ago. A grant is
//! made (or renewed for another TTL) only when what all of them admit together, its own included,
//! is at most N for every limit (a renewal fails it only after a reload lowered a limit; it is
//! then replaced by what there is room for). Any window of length W sees only grants whose lives
//! come within W of the last one made before the window ended, and that one was checked against
//! all of them (a holder's count only grows with grants added): all Envoys together admit at most
//! N in any window W, whatever they report. The bound never depends on reported usage; only the
//! split does.
//!
//! **The split.** With k Envoys reporting a bucket, N / (k + 1) is held back, so that an Envoy
//! that joins gets a share at once from what is not assigned, and the rest, the pool P, is split
//! by demand: each Envoy's share is P / 2k (its floor) plus half of P in proportion to its demand
//! (the requests it reported, allowed and denied, per second, in its last report). Equal demands,
//! or none reported, give each P / k = N / (k + 1); one busy Envoy of two gets half of N, the quiet
//! one a sixth.
//!
//! A grant clearly larger than today's share (by an eighth) is replaced by what the ledger has room
//! for beside it, or by `DENY_ALL` without room; the larger one still counts until its own end,
//! since a share cannot be taken back sooner (there is no acknowledgement). A grant clearly smaller
//! than the share grows toward it, as far as the room beside everything (its own old grant
//! included: beside it a new one adds its burst and only the refill faster than the old one's)
//! and beside what the shrinking ones are to add (their new bursts, mostly), when that is clearly
//! more. So a share moves from a quiet Envoy to a busy one in part at once, at the busy one's next
//! report (within 5 s), and in full once the quiet one's larger grant stops counting: its next
//! report (within 5 s), then its TTL and the delivery margin (18 s), then one window, then the
//! busy one's next report: within about 28 s + W. An Envoy that leaves (no report for a
//! TTL) stops sharing then, and its grants stop counting a window after their end: its share is
//! back within about 23 s + W. Where room is tight, Envoys grow one after the other, each once the
//! grant the one before it replaced stops counting (up to 23 s + W more each). A grant over its
//! share that finds room for less than half the share is renewed for up to a TTL rather than cut
//! (the room often frees by then), then cut to the room or denied. The eighth keeps
//! shares from moving on noise: each move refills the
//! Envoy's bucket, and its burst counts twice for a while. A grant is renewed
//! unchanged (Envoy keeps its tokens) only while Envoy surely still holds it; a later one starts
//! full, and is a new grant. A quarter of a weight (at least one token) is burst, the rest is
//! rate: a client can send a quarter of its share at once, and its share over any window.
//!
//! Time is a [`Duration`] since an epoch the caller picks, so tests drive it by hand.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

/// How long an assignment lasts: longer than Envoy's report interval (5 s) with room for one
/// missed report (a renewal needs a report within a TTL less [`MARGIN`]); a share moves to
/// another Envoy no faster than this.
pub const TTL: Duration = Duration::from_secs(15);

/// Added to a grant's end for the time the answer takes to reach Envoy, whose TTL starts when it
/// reads the answer: a report's answers are sent together, after every bucket of it.
const DELIVERY: Duration = Duration::from_secs(3);

/// The most Envoys' buckets (holders) one ledger shares among: a `share_threshold` wildcard maps
/// many bucket ids to one counter, and each assignment reads the whole ledger. A new one over it
/// is denied until some leave.
pub const MAX_HOLDERS: usize = 1024;

/// A grant is renewed (Envoy keeps its tokens) only while Envoy surely still holds it: sent less
/// than a TTL minus this ago. Later, Envoy may have let it expire, and what it gets next starts
/// full: a new grant, checked against the room.
const MARGIN: Duration = Duration::from_secs(1);

/// One limit of a bucket's rule: `n` per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub n: u64,
    pub window: Duration,
}

/// Whether `a` is more than `b` by more than an eighth of `b` (and at least one): a share moves
/// only then.
fn clearly_over(a: u64, b: u64) -> bool {
    a > b.saturating_add((b / 8).max(1))
}

/// Envoy's token bucket parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    /// Whole seconds, at least 1 (Envoy reads no fraction).
    pub fill_interval_secs: u32,
}

impl TokenBucket {
    /// The most it admits in a window of length `window` while it lasts: b + ⌊r·W⌋.
    pub fn weight(&self, window: Duration) -> u64 {
        let refill = u128::from(self.tokens_per_fill) * window.as_millis()
            / (u128::from(self.fill_interval_secs.max(1)) * 1000);
        u64::from(self.max_tokens).saturating_add(u64::try_from(refill).unwrap_or(u64::MAX))
    }

    /// The bucket for a share of `share` per `window`: a quarter burst (at least 1), the rest
    /// refilled over the window, rounded down. The refill is the rest per the window's whole
    /// seconds (Envoy refills continuously, at `tokens_per_fill` per `fill_interval`), so a whole
    /// window's share is exact: a share per second would round away up to a token a second.
    /// `None` for a share of 0.
    pub fn for_share(share: u64, window: Duration) -> Option<TokenBucket> {
        if share == 0 {
            return None;
        }
        let clamp = |n: u128| u32::try_from(n).unwrap_or(u32::MAX);
        let burst = share.div_ceil(4).max(1);
        let rest = u128::from(share - burst);
        let window_ms = window.as_millis().max(1);
        // Whole seconds, at least the window: the rest scaled to them, rounded down, is never
        // faster than the rest per window, and at least the rest (so at least 1).
        let fill_secs = window_ms.div_ceil(1000).max(1);
        let (tokens_per_fill, fill_interval_secs) = if rest > 0 {
            (clamp(rest * fill_secs * 1000 / window_ms), clamp(fill_secs))
        } else {
            // No rest: a refill slower than the window (at most one token per window).
            (1, clamp(fill_secs + 1))
        };
        let bucket = TokenBucket {
            max_tokens: clamp(u128::from(burst)),
            tokens_per_fill,
            fill_interval_secs,
        };
        // Without rest the refill may add a token per window: the burst gives it back.
        if bucket.weight(window) > share {
            return (burst > 1).then(|| TokenBucket {
                max_tokens: clamp(u128::from(burst - 1)),
                ..bucket
            });
        }
        Some(bucket)
    }

    /// A bucket admitting no more than every one of `buckets` in any window: the smallest burst
    /// and the slowest refill.
    fn tightest(buckets: &[TokenBucket]) -> Option<TokenBucket> {
        let max_tokens = buckets.iter().map(|b| b.max_tokens).min()?;
        let slowest = buckets.iter().min_by(|a, b| {
            // a.t / a.f < b.t / b.f  ⇔  a.t · b.f < b.t · a.f
            (u64::from(a.tokens_per_fill) * u64::from(b.fill_interval_secs))
                .cmp(&(u64::from(b.tokens_per_fill) * u64::from(a.fill_interval_secs)))
        })?;
        Some(TokenBucket {
            max_tokens,
            ..*slowest
        })
    }
}

/// What one holder's counting grants admit together in any window W. Envoy holds one token
/// bucket per bucket at a time, each replacing the one before (full again), so in a window the
/// bursts of all of them add up but their refills take turns: at most Σ b + the fastest ⌊r·W⌋,
/// less than the sum of their weights once a grant has been replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counted {
    bursts: u64,
    fastest: u64,
}

impl Counted {
    fn add(&mut self, bucket: &TokenBucket, window: Duration) {
        *self = self.with(bucket, window);
    }

    fn with(self, bucket: &TokenBucket, window: Duration) -> Counted {
        let burst = u64::from(bucket.max_tokens);
        Counted {
            bursts: self.bursts.saturating_add(burst),
            fastest: self.fastest.max(bucket.weight(window) - burst),
        }
    }

    fn total(&self) -> u64 {
        self.bursts.saturating_add(self.fastest)
    }

    /// What granting `bucket` to this holder adds to the ledger's count.
    fn cost(&self, bucket: &TokenBucket, window: Duration) -> u64 {
        self.with(bucket, window)
            .total()
            .saturating_sub(self.total())
    }
}

/// Whether an Envoy that holds `held` may take `sent` for it (see [`Ledger::grant`]): fill
/// intervals are whole seconds here, so their nanoseconds always agree.
fn envoy_may_confuse(held: &TokenBucket, sent: &TokenBucket) -> bool {
    held.max_tokens == sent.max_tokens && held.tokens_per_fill == sent.tokens_per_fill
}

/// What all holders' counting grants admit together in a window (see [`Counted`]).
fn counted(tally: &HashMap<u64, Counted>) -> u64 {
    tally.values().map(Counted::total).sum()
}

/// The largest share up to `share` that `holder` can be granted of `quota` beside every grant
/// that counts and `aside`: the ledger's count with it stays within the limit.
fn fitting_share(
    holder: u64,
    quota: &Quota,
    tally: &HashMap<u64, Counted>,
    share: u64,
    aside: u64,
) -> u64 {
    let own = tally.get(&holder).copied().unwrap_or_default();
    let free = (quota.n.saturating_sub(counted(tally))).saturating_sub(aside);
    let fits = |s: u64| {
        TokenBucket::for_share(s, quota.window).is_none_or(|b| own.cost(&b, quota.window) <= free)
    };
    // What a share adds grows with it: the largest that fits, by halves.
    let (mut lo, mut hi) = (0, share);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The bucket of a share for every limit, each no more than `holder` has room for beside
/// `set_aside` (per limit).
fn bucket_within_room(
    holder: u64,
    quotas: &[Quota],
    tallies: &[HashMap<u64, Counted>],
    share: &impl Fn(&Quota) -> u64,
    set_aside: &[u64],
) -> Option<TokenBucket> {
    let mut buckets = Vec::with_capacity(quotas.len());
    for ((quota, tally), aside) in quotas.iter().zip(tallies).zip(set_aside) {
        let fitting = fitting_share(holder, quota, tally, share(quota), *aside);
        buckets.push(TokenBucket::for_share(fitting, quota.window)?);
    }
    TokenBucket::tightest(&buckets)
}

/// What a bucket gets now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// This token bucket, for [`TTL`] (the same as before when it is renewed).
    Bucket(TokenBucket),
    /// No room in the ledger yet: deny until the next report finds some.
    DenyAll,
}

/// One grant: who holds it, what it is, and when it began and ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The ledger's count of grants when this one was made.
    pub id: u64,
    pub holder: u64,
    pub bucket: TokenBucket,
    pub start: Duration,
    /// When it was last sent (made or renewed): Envoy holds it until a TTL after that, at least.
    pub sent: Duration,
    /// Until when it counts as admitting: a TTL after it was last sent, and the time the answer
    /// takes. A replaced grant keeps its end (Envoy may not have read the replacement).
    pub end: Duration,
    /// Whether it is the holder's latest assignment, not replaced.
    pub current: bool,
    /// Since when it has been over its holder's share while it could not be cut (see
    /// [`Ledger::assign`]).
    pub over_since: Option<Duration>,
}

/// What an Envoy reported of a bucket in one report: the requests it allowed and denied since its
/// previous report, `elapsed` ago. Kept beside the grants for shares that follow demand; the
/// bound never depends on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub allowed: u64,
    pub denied: u64,
    pub elapsed: Duration,
}

impl Usage {
    /// The requests per second it reports, if it reports a second or more: Envoy's first
    /// report of a new bucket comes at once, with the request that made it, and says nothing of
    /// a rate yet.
    fn rate(&self) -> Option<f64> {
        let requests = self.allowed.saturating_add(self.denied) as f64;
        let secs = self.elapsed.as_secs_f64();
        (secs >= 1.0).then(|| requests / secs)
    }
}

/// One Envoy's (stream's) last report of a bucket: when, what it said, and its demand so far.
#[derive(Clone, Copy, Debug)]
struct Reporter {
    at: Duration,
    usage: Usage,
    /// Requests per second, as its last report said; `None` before a report says.
    demand: Option<f64>,
}

/// What a ledger shows ([`Ledger::view`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LedgerView {
    /// Each current grant: its holder, its bucket, and how long until it ends.
    pub grants: Vec<(u64, TokenBucket, Duration)>,
    /// Each reporter and its demand (requests per second; `None` before a report says).
    pub demands: Vec<(u64, Option<f64>)>,
}

/// The grants and reporters of one bucket (see the module docs).
#[derive(Debug, Default)]
pub struct Ledger {
    grants: Vec<Grant>,
    /// Each Envoy (stream) that reported the bucket, and its last report.
    reporters: HashMap<u64, Reporter>,
    /// The longest window of the bucket's limits: how long an ended grant still counts.
    longest: Duration,
    /// Grants made so far.
    made: u64,
}

impl Ledger {
    /// What `holder`, reporting `usage`, gets for the bucket at `now`, under `quotas` (the rule's
    /// limits). `fresh`: the holder's last answer was not from this ledger (another rule's, or
    /// none), so Envoy holds none of its grants here any more.
    pub fn assign(
        &mut self,
        holder: u64,
        now: Duration,
        usage: Usage,
        quotas: &[Quota],
        fresh: bool,
    ) -> Assignment {
        // A reload may lengthen a window: an ended grant counts for the longest ever seen.
        let longest = quotas.iter().map(|q| q.window).max().unwrap_or_default();
        self.longest = self.longest.max(longest);
        self.forget(now);
        if !self.reporters.contains_key(&holder) && self.reporters.len() >= MAX_HOLDERS {
            return Assignment::DenyAll;
        }
        if fresh {
            for grant in self.grants.iter_mut().filter(|g| g.holder == holder) {
                grant.current = false;
            }
        }
        let demand = usage.rate();
        self.reporters.insert(
            holder,
            Reporter {
                at: now,
                usage,
                demand,
            },
        );
        let sharers = self.reporters.len() as u64;
        // A demand not known yet counts as the mean of those known.
        let known: Vec<f64> = self.reporters.values().filter_map(|r| r.demand).collect();
        let mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
        let total = mean * sharers as f64;
        // A reporter's part of the pool: a floor of 1/2k and half in proportion to its demand;
        // at least one token while the limit has one, even when that leaves nothing in reserve.
        let share_at = |q: &Quota, demand: Option<f64>| {
            let demand = demand.unwrap_or(mean);
            let part = if total > 0.0 {
                1.0 / (2 * sharers) as f64 + demand / (2.0 * total)
            } else {
                1.0 / sharers as f64
            };
            let pool = q.n - q.n / (sharers + 1);
            ((pool as f64 * part) as u64).min(pool).max(q.n.min(1))
        };
        let share = |q: &Quota| share_at(q, demand);
        // What each holder's counting grants admit together, per limit: read once, since what
        // follows changes no grant's count until the new one is made.
        let tallies: Vec<HashMap<u64, Counted>> =
            quotas.iter().map(|q| self.tally(now, q)).collect();
        // What the other Envoys whose grants are clearly over their shares are to add when they
        // get them: a grant grows only beside it, so that a share moving from one Envoy to
        // another does not leave the first with less than its new share while both grants count.
        let pending = |(q, tally): (&Quota, &HashMap<u64, Counted>)| -> u64 {
            (self.grants.iter())
                .filter(|g| g.current && g.holder != holder)
                .filter_map(|g| {
                    let share = share_at(q, self.reporters.get(&g.holder)?.demand);
                    let cost = TokenBucket::for_share(share, q.window).map_or(0, |b| {
                        tally
                            .get(&g.holder)
                            .copied()
                            .unwrap_or_default()
                            .cost(&b, q.window)
                    });
                    clearly_over(g.bucket.weight(q.window), share).then_some(cost)
                })
                .sum()
        };
        let pending: Vec<u64> = quotas.iter().zip(&tallies).map(pending).collect();
        // The holder's assignment that Envoy surely still holds (its TTL runs from when Envoy
        // read it, after it was sent); any older one Envoy has dropped or replaced.
        let mut held = None;
        for (i, grant) in self.grants.iter_mut().enumerate() {
            if grant.holder == holder && grant.current {
                if now + MARGIN < grant.sent + TTL {
                    held = Some(i);
                } else {
                    grant.current = false;
                }
            }
        }
        if let Some(i) = held {
            let grant = self.grants[i];
            let within =
                (quotas.iter()).all(|q| !clearly_over(grant.bucket.weight(q.window), share(q)));
            // Everything counted, this grant included, is within every limit: true since it was
            // made, unless a reload lowered a limit.
            let fits = (quotas.iter().zip(&tallies)).all(|(q, tally)| counted(tally) <= q.n);
            if within && fits {
                // Grow toward the share, as far as there is room beside everything else and what
                // the shrinking ones are to get, when that is clearly more.
                let bigger = bucket_within_room(holder, quotas, &tallies, &share, &pending);
                let current = |q: &Quota| grant.bucket.weight(q.window);
                let grows = bigger.is_some_and(|b| {
                    (quotas.iter()).all(|q| b.weight(q.window) >= current(q))
                        && (quotas.iter()).any(|q| clearly_over(b.weight(q.window), current(q)))
                });
                match bigger {
                    Some(bigger) if grows => {
                        self.grants[i].current = false;
                        return self.grant(holder, bigger, now);
                    }
                    _ => {
                        self.grants[i].over_since = None;
                        self.grants[i].sent = now;
                        self.grants[i].end = now + TTL + DELIVERY;
                        return Assignment::Bucket(grant.bucket);
                    }
                }
            }
            // Over the share (an Envoy joined, or its demand fell) or the limit (a reload):
            // replaced by what there is room for beside it. The old grant keeps counting until
            // its own end: with no acknowledgement, Envoy may not have read the replacement.
            // With room for less than half the share, a grant that still fits is renewed for up
            // to a TTL instead (room often frees by then): each replacement counts twice for a
            // while, and a cut one would soon grow again. After that it is cut to the room, or
            // denied without any, so that no grant keeps more than its share for long.
            let cramped = (quotas.iter().zip(&tallies)).any(|(q, tally)| {
                fitting_share(holder, q, tally, share(q), 0) < share(q).div_ceil(2)
            });
            let over_since = *self.grants[i].over_since.get_or_insert(now);
            if cramped && fits && now < over_since + TTL {
                self.grants[i].sent = now;
                self.grants[i].end = now + TTL + DELIVERY;
                return Assignment::Bucket(grant.bucket);
            }
            self.grants[i].current = false;
        }
        let nothing = vec![0; quotas.len()];
        match bucket_within_room(holder, quotas, &tallies, &share, &nothing) {
            Some(bucket) => self.grant(holder, bucket, now),
            None => Assignment::DenyAll,
        }
    }

    /// The weights for `quota` of the grants Envoys hold now (current ones), against its limit:
    /// how much of the limit is handed out.
    pub fn assigned_ratio(&self, quota: &Quota) -> f64 {
        let assigned: u64 = (self.grants.iter())
            .filter(|g| g.current)
            .map(|g| g.bucket.weight(quota.window))
            .sum();
        assigned as f64 / quota.n.max(1) as f64
    }

    /// What each holder's grants that still count at `now` admit together in a window of
    /// `quota` (see [`Counted`]).
    fn tally(&self, now: Duration, quota: &Quota) -> HashMap<u64, Counted> {
        let mut tally: HashMap<u64, Counted> = HashMap::new();
        for grant in (self.grants.iter()).filter(|g| g.end + quota.window >= now) {
            tally
                .entry(grant.holder)
                .or_default()
                .add(&grant.bucket, quota.window);
        }
        tally
    }

    /// Records a new grant of `bucket` to `holder` from `now`, for a TTL.
    ///
    /// Some Envoy versions take an assignment for the one they hold when its burst, its tokens
    /// per fill and the nanoseconds of its fill interval are the same, whatever the seconds: they
    /// would keep the old bucket and its rate. So a bucket that differs from the holder's last
    /// one (which Envoy may still hold) only in its whole seconds is made a token smaller in its
    /// burst, or else in its refill, to be told apart; one of a token each is not sent
    /// (`DENY_ALL` until the next report, which finds no bucket to confuse it with).
    fn grant(&mut self, holder: u64, bucket: TokenBucket, now: Duration) -> Assignment {
        let last = (self.grants.iter())
            .filter(|g| g.holder == holder && g.end > now)
            .max_by_key(|g| g.id);
        let bucket = match last {
            Some(last) if last.bucket != bucket && envoy_may_confuse(&last.bucket, &bucket) => {
                if bucket.max_tokens > 1 {
                    TokenBucket {
                        max_tokens: bucket.max_tokens - 1,
                        ..bucket
                    }
                } else if bucket.tokens_per_fill > 1 {
                    TokenBucket {
                        tokens_per_fill: bucket.tokens_per_fill - 1,
                        ..bucket
                    }
                } else {
                    return Assignment::DenyAll;
                }
            }
            _ => bucket,
        };
        self.made += 1;
        self.grants.push(Grant {
            id: self.made,
            holder,
            bucket,
            start: now,
            sent: now,
            end: now + TTL + DELIVERY,
            current: true,
            over_since: None,
        });
        Assignment::Bucket(bucket)
    }

    /// Drops grants that ended more than the longest window ago and reporters silent for a TTL.
    fn forget(&mut self, now: Duration) {
        let longest = self.longest;
        self.grants.retain(|g| g.end + longest >= now);
        self.reporters.retain(|_, r| r.at + TTL > now);
    }

    /// Whether nothing is held or reported any more (the bucket can be dropped).
    pub fn is_idle(&mut self, now: Duration) -> bool {
        self.forget(now);
        self.grants.is_empty() && self.reporters.is_empty()
    }

    /// What each Envoy holds and reported now, for `POST /explain`: per current grant, its
    /// holder, bucket, and the seconds until it ends; per reporter, its demand.
    pub fn view(&self, now: Duration) -> LedgerView {
        LedgerView {
            grants: (self.grants.iter())
                .filter(|g| g.current)
                .map(|g| (g.holder, g.bucket, g.end.saturating_sub(now)))
                .collect(),
            demands: (self.reporters.iter())
                .map(|(holder, r)| (*holder, r.demand))
                .collect(),
        }
    }

    /// What `holder` last reported of the bucket, while it is a reporter.
    pub fn usage(&self, holder: u64) -> Option<Usage> {
        self.reporters.get(&holder).map(|r| r.usage)
    }

    /// The grants kept now, for tests.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }
}
