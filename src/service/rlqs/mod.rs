//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`,
//! `StreamRateLimitQuotas`): each Envoy's `rate_limit_quota` filter reports its usage per bucket
//! on one long-lived stream and enforces locally the token bucket this service assigns, so no
//! request waits for a call.
//!
//! **Rules.** The stream's `domain` is a rule-file domain and a bucket id's entries are a
//! descriptor's entries. A bucket id is a map without order; it finds its rule in the one order of
//! its entries that reaches a limit ([`DomainRules::bucket_order`]); when several orders do, the
//! first in key order is taken, logged once and counted in
//! `slidegate_rlqs_ambiguous_buckets_total`. A bucket that reaches no limit, a shadow rule and an
//! `unlimited` rule are assigned `ALLOW_ALL`. Every limit of the rule is held at once.
//!
//! **Assignments** come from the store's quota ledgers ([`crate::store::quota`]), which state and
//! keep the bound: all Envoys of this slidegate together admit at most each limit in any window.
//! The ledgers live in this process: with several replicas each holds the bound for the Envoys
//! connected to it.
//!
//! **Serving.** The stream goes through tonic's routes beside health and reflection (the gRPC
//! port's fast path serves only `ShouldRateLimit`), on the same listener with the same TLS. A
//! stream with a call in flight keeps its connection out of the idle timeout; the connection's
//! maximum age ends it (Envoy reopens on its next report); on shutdown the drain answers it
//! `UNAVAILABLE`. A bucket that reports no request for [`ABANDON_AFTER`] is abandoned.
//!
//! **Bounds.** A report is at most [`MAX_REPORT_BYTES`]. One peer (an IP address, or a process
//! over a Unix socket) holds at most [`MAX_STREAMS_PER_PEER`] streams (another is refused
//! `RESOURCE_EXHAUSTED`); a stream holds at most [`MAX_BUCKETS_PER_STREAM`] buckets; the process
//! keeps at most [`MAX_BUCKETS`] ledgers, of which one peer makes at most
//! [`MAX_BUCKETS_PER_PEER`], so one client cannot fill them for the others (a new bucket over
//! either is denied until idle ledgers are dropped). A bucket id over the request limits that
//! Envoy's configuration decides (entries, key lengths) is not assigned (Envoy keeps its
//! `no_assignment_behavior`); a value, which a client decides, is assigned whatever its length.
//! A bucket id with a value that is not UTF-8 is read but not answered: Envoy could not read an
//! answer naming it ([`wire`]). Each refusal is counted.

mod explain;
mod wire;

pub use explain::BucketExplained;
pub use wire::QuotaServer;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket as ProtoTokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use futures::Stream;
use parking_lot::Mutex;
use prometheus::{Histogram, IntCounter, IntGauge};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use wire::{WireBucketAction as BucketAction, WireReports, WireResponse, WireUsage};

use super::PeerKey;
use crate::config::BucketOrder;
use crate::limiter::{RateLimiter, entry_text};
use crate::metrics::Metrics;
use crate::store::quota::{
    Assignment, Full, LedgerKey, Quota, QuotaLedgers, TTL, Usage, ledger_key,
};

/// The largest report message read.
pub const MAX_REPORT_BYTES: usize = 1 << 20;

/// The most buckets one stream (one Envoy) has assigned.
pub const MAX_BUCKETS_PER_STREAM: usize = 4096;

/// The most buckets with a ledger in the process; a new bucket over it is denied (a bucket a
/// client shapes must not skip its limit) until idle ones are dropped.
pub const MAX_BUCKETS: usize = 100_000;

/// The most ledgers one peer's buckets make (a ledger outlives its buckets by a window): room for
/// a few streams' worth, and a sixth of [`MAX_BUCKETS`], so filling them takes seven peers.
pub const MAX_BUCKETS_PER_PEER: usize = 4 * MAX_BUCKETS_PER_STREAM;

/// The most streams open from one peer. An Envoy opens one per `rate_limit_quota` filter
/// configuration (and RLQS server), however many workers it runs.
pub const MAX_STREAMS_PER_PEER: usize = 64;

/// The most distinct key sets whose ambiguous order is logged (then only counted).
const MAX_LOGGED_AMBIGUITIES: usize = 64;

/// The service; see the module docs.
#[derive(Clone)]
pub struct QuotaService {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for QuotaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaService").finish_non_exhaustive()
    }
}

struct Shared {
    limiter: Arc<RateLimiter>,
    ledgers: QuotaLedgers<Option<PeerKey>>,
    /// Open streams by peer (no peer: served without the gRPC port, in one count).
    streams: Mutex<HashMap<Option<PeerKey>, usize>>,
    epoch: Instant,
    /// The number of the next bucket that appears on a stream: its holder in the ledgers.
    next_holder: AtomicU64,
    /// Whether the per-replica bound was said (once, at the first stream on a shared store).
    said_per_replica: AtomicBool,
    logged: Mutex<HashSet<Vec<String>>>,
    metrics: QuotaMetrics,
}

struct QuotaMetrics {
    streams: IntGauge,
    streams_refused: IntCounter,
    token_bucket: IntCounter,
    allow_all: IntCounter,
    deny_all: IntCounter,
    abandon: IntCounter,
    too_many: IntCounter,
    too_many_from_peer: IntCounter,
    too_large: IntCounter,
    not_utf8: IntCounter,
    too_complex: IntCounter,
    ambiguous: IntCounter,
    assigned: Histogram,
    share: Histogram,
}

impl QuotaMetrics {
    fn new(metrics: &Metrics) -> QuotaMetrics {
        // Constant definitions: registering them can only fail on a programming error.
        let assignments = metrics
            .counter_vec(
                "slidegate_rlqs_assignments_total",
                "RLQS bucket answers by action: token_bucket, allow_all, deny_all (no room in the \
                 ledger yet), abandon (idle for a minute).",
                &["action"],
            )
            .expect("metric definitions are valid");
        let refused = metrics
            .counter_vec(
                "slidegate_rlqs_buckets_refused_total",
                "RLQS buckets not assigned (or denied), by reason: too_many (per stream or in \
                 all), too_many_from_peer (the ledgers one peer may make), too_large (a bucket id \
                 over the request limits), not_utf8 (a value Envoy could not read back in an \
                 answer), too_complex (its order search ran out: denied).",
                &["reason"],
            )
            .expect("metric definitions are valid");
        QuotaMetrics {
            streams: metrics
                .gauge(
                    "slidegate_rlqs_streams",
                    "Open RLQS streams (StreamRateLimitQuotas).",
                )
                .expect("metric definitions are valid"),
            streams_refused: metrics
                .counter(
                    "slidegate_rlqs_streams_refused_total",
                    "RLQS streams refused RESOURCE_EXHAUSTED: their peer held the most streams \
                     one peer may open.",
                )
                .expect("metric definitions are valid"),
            token_bucket: assignments.with_label_values(&["token_bucket"]),
            allow_all: assignments.with_label_values(&["allow_all"]),
            deny_all: assignments.with_label_values(&["deny_all"]),
            abandon: assignments.with_label_values(&["abandon"]),
            too_many: refused.with_label_values(&["too_many"]),
            too_many_from_peer: refused.with_label_values(&["too_many_from_peer"]),
            too_large: refused.with_label_values(&["too_large"]),
            not_utf8: refused.with_label_values(&["not_utf8"]),
            too_complex: refused.with_label_values(&["too_complex"]),
            assigned: metrics
                .ratio(
                    "slidegate_rlqs_bucket_assigned_ratio",
                    "At each RLQS token-bucket answer, how much of its bucket's limit the Envoys \
                     hold together (the current grants' weights over N; the bound keeps what \
                     still counts at most 1).",
                )
                .expect("metric definitions are valid"),
            share: metrics
                .ratio(
                    "slidegate_rlqs_share_ratio",
                    "At each RLQS token-bucket answer, the Envoy's share of its bucket's limit \
                     (the spread of shares: by demand, from a floor to most of the limit).",
                )
                .expect("metric definitions are valid"),
            ambiguous: metrics
                .counter(
                    "slidegate_rlqs_ambiguous_buckets_total",
                    "RLQS bucket ids whose entries reach a limit in more than one order (the \
                     first in key order is taken).",
                )
                .expect("metric definitions are valid"),
        }
    }
}

/// What a bucket id reaches in the rules ([`Shared::reach`]).
enum Reach {
    /// `ALLOW_ALL`.
    Free(Free),
    /// Its search for a rule ran out: `DENY_ALL`.
    TooComplex,
    /// A rule (its name or path) with limits: shared through the ledger of its counter.
    Limited {
        rule: String,
        quotas: Vec<Quota>,
        key: LedgerKey,
    },
}

/// Why a bucket id is assigned `ALLOW_ALL`.
enum Free {
    NoRule,
    /// An `unlimited` rule (or one without limits), by name.
    Unlimited(String),
    /// A shadow rule, by name.
    Shadow(String),
}

/// What one bucket of a report gets.
enum Answer {
    Assign(Assignment),
    AllowAll,
    /// Idle for [`ABANDON_AFTER`]: Envoy forgets the bucket and stops reporting it.
    Abandon,
}

/// How long a bucket reports no request before it is abandoned. Envoy reports every bucket it
/// has every 5 s, idle ones as 0 allowed and 0 denied, until the server abandons them: an idle
/// bucket would otherwise keep its place in the stream and its share of the limit. A request
/// after that makes a new bucket, assigned one round trip later.
pub const ABANDON_AFTER: Duration = Duration::from_secs(60);

/// One stream's buckets: the digest of each bucket id, when it last reported a request, and its
/// holder in the ledgers. Each bucket of each stream holds its own grant (Envoy enforces each
/// bucket apart, even when several bucket ids share a counter through a `share_threshold`
/// wildcard); a bucket abandoned and made again is another holder. The ledgers' bound rests on
/// this: one holder is one token bucket in one Envoy, which uses one assignment at a time (so
/// its replaced grants' refills never add up; see `store::quota::ledger`).
#[derive(Debug, Default)]
struct StreamBuckets {
    active_at: HashMap<LedgerKey, (Duration, u64)>,
    /// The ledger whose token bucket each bucket was last answered with (none: `ALLOW_ALL` or
    /// `DENY_ALL` outside a ledger, or not answered yet): Envoy holds a grant of that ledger only.
    answered_from: HashMap<LedgerKey, LedgerKey>,
}

/// What [`StreamBuckets::seen`] says of a bucket in a report.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// A bucket to answer: its holder.
    Live(u64),
    /// A new bucket over [`MAX_BUCKETS_PER_STREAM`].
    TooMany,
    /// Idle for [`ABANDON_AFTER`]: forgotten here, to be abandoned.
    Idle,
}

impl StreamBuckets {
    /// Records a report of bucket `id` at `now`, with requests in it or not; a new bucket's
    /// holder is the next of `holders`.
    fn seen(&mut self, id: LedgerKey, requests: bool, now: Duration, holders: &AtomicU64) -> Seen {
        let known = self.active_at.len();
        match self.active_at.get_mut(&id) {
            Some((at, holder)) if requests => {
                *at = now;
                Seen::Live(*holder)
            }
            Some((at, _)) if now.saturating_sub(*at) >= ABANDON_AFTER => {
                self.active_at.remove(&id);
                self.answered_from.remove(&id);
                Seen::Idle
            }
            Some((_, holder)) => Seen::Live(*holder),
            None if known >= MAX_BUCKETS_PER_STREAM => Seen::TooMany,
            None => {
                let holder = holders.fetch_add(1, Ordering::Relaxed);
                self.active_at.insert(id, (now, holder));
                Seen::Live(holder)
            }
        }
    }
}

impl QuotaService {
    pub fn new(limiter: Arc<RateLimiter>, metrics: &Metrics) -> QuotaService {
        QuotaService {
            shared: Arc::new(Shared {
                limiter,
                ledgers: QuotaLedgers::new(MAX_BUCKETS, MAX_BUCKETS_PER_PEER),
                streams: Mutex::new(HashMap::new()),
                epoch: Instant::now(),
                next_holder: AtomicU64::new(0),
                said_per_replica: AtomicBool::new(false),
                logged: Mutex::new(HashSet::new()),
                metrics: QuotaMetrics::new(metrics),
            }),
        }
    }

    /// The gRPC route, with its message bound.
    pub fn server(self) -> QuotaServer {
        QuotaServer::new(self, MAX_REPORT_BYTES)
    }

    /// `StreamRateLimitQuotas`: answers each report of the stream as it comes.
    fn stream(
        &self,
        request: Request<Streaming<WireReports>>,
    ) -> Result<Response<Answers>, Status> {
        let peer = request.extensions().get::<PeerKey>().copied();
        let open = StreamTicket::take(&self.shared, peer)?;
        let mut reports = request.into_inner();
        let (answers, outbound) = mpsc::channel(4);
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            let _open = open;
            let store = shared.limiter.store().kind();
            if store != "memory" && !shared.said_per_replica.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    store,
                    "RLQS quotas are held by each replica for the Envoys connected to it: with \
                     several replicas, their Envoys together can admit a limit once per replica"
                );
            }
            let mut buckets = StreamBuckets::default();
            while let Ok(Some(report)) = reports.message().await {
                let answer = shared.answer(&report, peer, &mut buckets);
                if !answer.bucket_action.is_empty() && answers.send(Ok(answer)).await.is_err() {
                    break;
                }
            }
        });
        let outbound = futures::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|answer| (answer, outbound))
        });
        Ok(Response::new(Box::pin(outbound)))
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<WireResponse, Status>> + Send>>;

/// One open stream of a peer: counted while it lives, in the gauge and against its peer's cap.
struct StreamTicket {
    shared: Arc<Shared>,
    peer: Option<PeerKey>,
}

impl StreamTicket {
    fn take(shared: &Arc<Shared>, peer: Option<PeerKey>) -> Result<StreamTicket, Status> {
        let mut streams = shared.streams.lock();
        let open = streams.entry(peer).or_default();
        if *open >= MAX_STREAMS_PER_PEER {
            shared.metrics.streams_refused.inc();
            return Err(Status::resource_exhausted(format!(
                "this peer holds {MAX_STREAMS_PER_PEER} RLQS streams, the most one peer may open"
            )));
        }
        *open += 1;
        shared.metrics.streams.inc();
        Ok(StreamTicket {
            shared: Arc::clone(shared),
            peer,
        })
    }
}

impl Drop for StreamTicket {
    fn drop(&mut self) {
        self.shared.metrics.streams.dec();
        let mut streams = self.shared.streams.lock();
        if let Some(open) = streams.get_mut(&self.peer) {
            *open -= 1;
            if *open == 0 {
                streams.remove(&self.peer);
            }
        }
    }
}

impl Shared {
    /// The answer to one report of a stream of `peer` whose buckets are `buckets`.
    fn answer(
        &self,
        report: &WireReports,
        peer: Option<PeerKey>,
        buckets: &mut StreamBuckets,
    ) -> WireResponse {
        let mut actions = Vec::new();
        let mut answered = HashSet::new();
        for usage in &report.bucket_quota_usages {
            let Some(id) = &usage.bucket_id else { continue };
            // One answer per bucket id, and no more than a stream's buckets in one report.
            if answered.len() >= MAX_BUCKETS_PER_STREAM {
                self.metrics.too_many.inc();
                break;
            }
            // An answer names its bucket by the id as reported, and Envoy's gRPC client refuses
            // a message holding a string that is not UTF-8 and closes the stream: such a bucket
            // cannot be answered without breaking every other bucket's answers.
            if (id.bucket.values()).any(|v| std::str::from_utf8(v).is_err()) {
                self.metrics.not_utf8.inc();
                continue;
            }
            let texts = as_read(id.bucket.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
            let entries = sorted(&texts);
            if self.too_large(&report.domain, &entries) {
                self.metrics.too_large.inc();
                continue;
            }
            let id_digest = ledger_key(entries.iter().flat_map(|(k, v)| [*k, *v]));
            if !answered.insert(id_digest) {
                continue;
            }
            let requests = usage.num_requests_allowed > 0 || usage.num_requests_denied > 0;
            let answer =
                match buckets.seen(id_digest, requests, self.epoch.elapsed(), &self.next_holder) {
                    Seen::Live(holder) => {
                        let last = buckets.answered_from.get(&id_digest).copied();
                        let asked = (reported(usage), last);
                        let (answer, from) =
                            self.bucket((holder, peer), asked, &report.domain, &entries);
                        match from {
                            Some(key) => buckets.answered_from.insert(id_digest, key),
                            None => buckets.answered_from.remove(&id_digest),
                        };
                        answer
                    }
                    Seen::TooMany => {
                        self.metrics.too_many.inc();
                        continue;
                    }
                    Seen::Idle => Answer::Abandon,
                };
            let action = match answer {
                Answer::Abandon => {
                    self.metrics.abandon.inc();
                    actions.push(BucketAction {
                        bucket_id: Some(id.clone()),
                        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                    });
                    continue;
                }
                Answer::AllowAll => {
                    self.metrics.allow_all.inc();
                    blanket(BlanketRule::AllowAll)
                }
                Answer::Assign(Assignment::DenyAll) => {
                    self.metrics.deny_all.inc();
                    blanket(BlanketRule::DenyAll)
                }
                Answer::Assign(Assignment::Bucket(bucket)) => {
                    self.metrics.token_bucket.inc();
                    Strategy::TokenBucket(ProtoTokenBucket {
                        max_tokens: bucket.max_tokens,
                        tokens_per_fill: Some(UInt32Value {
                            value: bucket.tokens_per_fill,
                        }),
                        fill_interval: Some(seconds(u64::from(bucket.fill_interval_secs))),
                    })
                }
            };
            actions.push(BucketAction {
                bucket_id: Some(id.clone()),
                bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                    assignment_time_to_live: Some(seconds(TTL.as_secs())),
                    rate_limit_strategy: Some(RateLimitStrategy {
                        strategy: Some(action),
                    }),
                })),
            });
        }
        WireResponse {
            bucket_action: actions,
        }
    }

    /// Whether a bucket id (or the domain) is over the request limits that Envoy's configuration
    /// decides: its number of entries, and the length of the domain and of each key. A value's
    /// length is not among them: values come from clients (a header), and a bucket left
    /// unassigned keeps Envoy's `no_assignment_behavior`, which may let it through. A long value
    /// costs nothing kept: its ledger is known by a digest ([`ledger_key`]).
    fn too_large(&self, domain: &str, entries: &[(&str, &str)]) -> bool {
        let limits = &self.limiter.options().limits;
        entries.len() > limits.max_entries
            || domain.len() > limits.max_value_bytes
            || (entries.iter()).any(|(k, _)| k.len() > limits.max_value_bytes)
    }

    /// What the bucket of `holder` (a bucket of `peer`), with these (sorted) entries, this usage
    /// reported and its last token bucket from the ledger `last`, gets now; and the ledger of
    /// the token bucket it gets, if it gets one.
    fn bucket(
        &self,
        holder: (u64, Option<PeerKey>),
        (usage, last): (Usage, Option<LedgerKey>),
        domain: &str,
        entries: &[(&str, &str)],
    ) -> (Answer, Option<LedgerKey>) {
        let (quotas, key) = match self.reach(domain, entries, true) {
            Reach::Free(_) => return (Answer::AllowAll, None),
            // A bucket id shaped to outlast the search is denied, never let through.
            Reach::TooComplex => {
                self.metrics.too_complex.inc();
                return (Answer::Assign(Assignment::DenyAll), None);
            }
            Reach::Limited { quotas, key, .. } => (quotas, key),
        };
        let now = || self.epoch.elapsed();
        let fresh = last != Some(key);
        let answer = match self.ledgers.assign(key, holder, now, usage, &quotas, fresh) {
            Ok((assignment, assigned)) => {
                if let Assignment::Bucket(bucket) = assignment {
                    self.metrics.assigned.observe(assigned);
                    let share = (quotas.iter())
                        .map(|q| bucket.weight(q.window) as f64 / q.n.max(1) as f64)
                        .fold(0.0, f64::max);
                    self.metrics.share.observe(share);
                }
                Answer::Assign(assignment)
            }
            // A bucket a client shapes must not skip its limit: denied until there is room.
            Err(full) => {
                match full {
                    Full::All => self.metrics.too_many.inc(),
                    Full::Peer => self.metrics.too_many_from_peer.inc(),
                }
                Answer::Assign(Assignment::DenyAll)
            }
        };
        let from = matches!(answer, Answer::Assign(Assignment::Bucket(_))).then_some(key);
        (answer, from)
    }

    /// What a bucket id (its sorted entries) reaches in the rules: a rule that assigns
    /// `ALLOW_ALL`, a search that ran out, or a rule's limits and the ledger of its counter.
    /// `counted`: an ambiguous order is counted and logged (for an assignment, not an explain).
    fn reach(&self, domain: &str, entries: &[(&str, &str)], counted: bool) -> Reach {
        let rules = self.limiter.rules().load();
        let Some(domain_rules) = rules.domain(domain) else {
            return Reach::Free(Free::NoRule);
        };
        let order = match domain_rules.bucket_order(entries) {
            BucketOrder::None => return Reach::Free(Free::NoRule),
            BucketOrder::Unsettled => return Reach::TooComplex,
            BucketOrder::One(order) => order,
            BucketOrder::Several(order) => {
                if counted {
                    self.ambiguous(domain, &order);
                }
                order
            }
        };
        let Some(matched) = domain_rules.match_entries(&order) else {
            return Reach::Free(Free::NoRule);
        };
        let rule = matched.rule;
        let label = rule.name.clone().unwrap_or_else(|| rule.path.clone());
        if rule.unlimited || rule.limits.is_empty() {
            return Reach::Free(Free::Unlimited(label));
        }
        if rule.shadow_mode {
            return Reach::Free(Free::Shadow(label));
        }
        let quotas: Vec<Quota> = (rule.limits.iter())
            .map(|limit| Quota {
                n: limit.requests_per_unit,
                window: limit.window(),
            })
            .collect();
        let counter = std::iter::once(domain)
            .chain((matched.counter_entries.iter()).flat_map(|(k, v)| [*k, *v]));
        Reach::Limited {
            rule: label,
            quotas,
            key: ledger_key(counter),
        }
    }

    /// Logs the first time a set of keys reaches a limit in several orders.
    fn ambiguous(&self, domain: &str, order: &[(&str, &str)]) {
        self.metrics.ambiguous.inc();
        let mut keys: Vec<String> = std::iter::once(domain.to_owned())
            .chain(order.iter().map(|(k, _)| (*k).to_owned()))
            .collect();
        keys[1..].sort_unstable();
        let mut logged = self.logged.lock();
        if logged.len() < MAX_LOGGED_AMBIGUITIES && logged.insert(keys) {
            let order: Vec<&str> = order.iter().map(|(k, _)| *k).collect();
            tracing::warn!(
                domain,
                order = %order.join(", "),
                "an RLQS bucket id reaches a limit in more than one order of its keys; the first \
                 in key order is used"
            );
        }
    }
}

/// What a report says of one bucket, as the ledger keeps it.
fn reported(usage: &WireUsage) -> Usage {
    let elapsed = usage.time_elapsed.map(|d| {
        let secs = u64::try_from(d.seconds).unwrap_or(0);
        Duration::new(secs, u32::try_from(d.nanos).unwrap_or(0).min(999_999_999))
    });
    Usage {
        allowed: usage.num_requests_allowed,
        denied: usage.num_requests_denied,
        elapsed: elapsed.unwrap_or_default(),
    }
}

/// A bucket id's entries (a reported one, or one asked about), sorted by key.
fn sorted<'a>(entries: &'a [(&'a str, Cow<'a, str>)]) -> Vec<(&'a str, &'a str)> {
    let mut sorted: Vec<(&str, &str)> = (entries.iter()).map(|(k, v)| (*k, v.as_ref())).collect();
    sorted.sort_unstable();
    sorted
}

/// A bucket id's entries with their values as the rules read them ([`entry_text`], as the
/// request path reads a descriptor's): most stand for themselves, and nothing is copied.
fn as_read<'a>(entries: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<(&'a str, Cow<'a, str>)> {
    entries.map(|(k, v)| (k, entry_text(v))).collect()
}

fn blanket(rule: BlanketRule) -> Strategy {
    Strategy::BlanketRule(rule as i32)
}

fn seconds(secs: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[cfg(test)]
mod tests {
    use arc_swap::ArcSwap;

    use super::wire::WireBucketId;
    use super::*;
    use crate::config::load_sources;
    use crate::limiter::{DecisionMetrics, Options};
    use crate::store::{ManualClock, MemoryStore};

    /// A report whose one bucket id holds a value that is not UTF-8: the other buckets are
    /// answered, that one is not (an answer naming it would make Envoy close the stream), and
    /// the refusal is counted.
    #[test]
    fn a_bucket_that_is_not_utf8_is_left_out_and_the_others_answered() {
        let rules = "domain: rlqs\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n";
        let rules = load_sources(&[("rules.yaml".to_string(), rules.to_string())])
            .unwrap_or_else(|e| panic!("{e}"));
        let metrics = Metrics::new();
        let limiter = RateLimiter::new(
            Arc::new(ArcSwap::from_pointee(rules)),
            Arc::new(MemoryStore::new(Arc::new(ManualClock::new(
                Duration::from_secs(1),
            )))),
            Options::default(),
            Arc::new(DecisionMetrics::new(&metrics)),
        );
        let service = QuotaService::new(Arc::new(limiter), &metrics);
        let id = |value: &[u8]| WireBucketId {
            bucket: HashMap::from([("user".to_owned(), value.to_vec())]),
        };
        let usage = |value: &[u8]| WireUsage {
            bucket_id: Some(id(value)),
            time_elapsed: None,
            num_requests_allowed: 1,
            num_requests_denied: 0,
        };
        let report = WireReports {
            domain: "rlqs".to_owned(),
            bucket_quota_usages: vec![usage(b"b\xf6b"), usage(b"alice"), usage(b"bob")],
        };
        let answer = service
            .shared
            .answer(&report, None, &mut StreamBuckets::default());
        let answered: Vec<_> = (answer.bucket_action.iter())
            .map(|a| a.bucket_id.clone())
            .collect();
        assert_eq!(answered, [Some(id(b"alice")), Some(id(b"bob"))]);
        assert_eq!(service.shared.metrics.not_utf8.get(), 1);
    }

    /// A bucket that reports no request for [`ABANDON_AFTER`] is abandoned (and forgotten: its
    /// next report is a new bucket); one with requests stays; a stream holds at most
    /// [`MAX_BUCKETS_PER_STREAM`] at once.
    #[test]
    fn idle_buckets_are_abandoned_and_a_stream_holds_a_bounded_number() {
        let mut buckets = StreamBuckets::default();
        let holders = AtomicU64::new(1);
        let (idle, busy) = (ledger_key(["idle"]), ledger_key(["busy"]));
        let at = Duration::from_secs;
        assert_eq!(buckets.seen(idle, true, at(0), &holders), Seen::Live(1));
        assert_eq!(buckets.seen(busy, true, at(0), &holders), Seen::Live(2));
        assert_eq!(buckets.seen(idle, false, at(30), &holders), Seen::Live(1));
        assert_eq!(buckets.seen(busy, true, at(55), &holders), Seen::Live(2));
        assert_eq!(buckets.seen(idle, false, at(60), &holders), Seen::Idle);
        assert_eq!(buckets.seen(busy, false, at(100), &holders), Seen::Live(2));
        assert_eq!(buckets.seen(busy, false, at(115), &holders), Seen::Idle);
        assert_eq!(
            buckets.seen(idle, false, at(120), &holders),
            Seen::Live(3),
            "a new bucket, another holder"
        );
        for i in 1..MAX_BUCKETS_PER_STREAM {
            let new = buckets.seen(
                ledger_key([i.to_string().as_str()]),
                true,
                at(121),
                &holders,
            );
            assert!(matches!(new, Seen::Live(_)), "{new:?}");
        }
        assert_eq!(
            buckets.seen(ledger_key(["one more"]), true, at(121), &holders),
            Seen::TooMany
        );
        assert_eq!(
            buckets.seen(idle, true, at(121), &holders),
            Seen::Live(3),
            "a known one"
        );
    }
}
