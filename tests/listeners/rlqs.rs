//! The Rate Limit Quota Service through the binary, with tonic's client as two Envoys would use
//! it: a bucket that reaches a rule gets a token bucket whose parameters hold the limit for every
//! Envoy together, a second Envoy gets its share at once, a bucket without a rule gets
//! `ALLOW_ALL`, a bucket id over the request limits gets nothing, and the metrics say so.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;

use crate::support::{Slidegate, metric_value};

pub(crate) const RULES: &str = "domain: rlqs
descriptors:
  - key: user
    rate_limit: { unit: second, unit_multiplier: 10, requests_per_unit: 120 }
  - key: plan
    value: free
    descriptors:
      - key: path
        rate_limit: { unit: second, requests_per_unit: 30 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
";

pub(crate) fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// An Envoy's stream: reports go in, answers come out.
pub(crate) struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
}

impl Envoy {
    async fn connect(server: &Slidegate) -> Envoy {
        Envoy::open(server.channel().await)
            .await
            .expect("StreamRateLimitQuotas")
    }

    /// A stream on `channel`, or the status it was refused with.
    pub(crate) async fn open(channel: tonic::transport::Channel) -> Result<Envoy, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (reports, outbound) = mpsc::channel(4);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(outbound);
        let answers = client
            .stream_rate_limit_quotas(outbound)
            .await?
            .into_inner();
        Ok(Envoy { reports, answers })
    }

    /// Reports one request allowed in each of `buckets`; the answer's action for each bucket
    /// answered.
    pub(crate) async fn report(&mut self, buckets: &[BucketId]) -> Vec<(BucketId, Action)> {
        let report = RateLimitQuotaUsageReports {
            domain: "rlqs".to_owned(),
            bucket_quota_usages: buckets
                .iter()
                .map(|id| BucketQuotaUsage {
                    bucket_id: Some(id.clone()),
                    time_elapsed: None,
                    num_requests_allowed: 1,
                    num_requests_denied: 0,
                })
                .collect(),
        };
        self.reports.send(report).await.expect("send a report");
        let answer = tokio::time::timeout(Duration::from_secs(5), self.answers.message())
            .await
            .expect("an answer within 5 s")
            .expect("no stream error")
            .expect("the stream stays open");
        answer
            .bucket_action
            .into_iter()
            .map(|a| {
                (
                    a.bucket_id.expect("the bucket id echoed"),
                    a.bucket_action.expect("an action"),
                )
            })
            .collect()
    }
}

/// The strategy of an assignment: (max_tokens, tokens_per_fill, fill_interval seconds) of a
/// token bucket, or the blanket rule.
pub(crate) fn strategy(action: &Action) -> Result<(u32, u32, i64), BlanketRule> {
    let Action::QuotaAssignmentAction(assignment) = action else {
        panic!("an assignment, not {action:?}");
    };
    let ttl = assignment.assignment_time_to_live.expect("a TTL");
    assert!(
        ttl.seconds >= 6,
        "a TTL longer than Envoy's report interval: {ttl:?}"
    );
    match assignment
        .rate_limit_strategy
        .and_then(|s| s.strategy)
        .expect("a strategy")
    {
        Strategy::TokenBucket(bucket) => {
            let fill = bucket.fill_interval.expect("a fill interval");
            assert!(
                fill.seconds >= 1 && fill.nanos == 0,
                "whole seconds: {fill:?}"
            );
            let per_fill = bucket.tokens_per_fill.expect("tokens per fill").value;
            Ok((bucket.max_tokens, per_fill, fill.seconds))
        }
        Strategy::BlanketRule(rule) => Err(BlanketRule::try_from(rule).expect("a blanket rule")),
        other => panic!("unexpected strategy {other:?}"),
    }
}

/// The most a token bucket admits in a window of `window_secs`: its burst and its refill.
fn weight((max_tokens, per_fill, fill_secs): (u32, u32, i64), window_secs: i64) -> i64 {
    i64::from(max_tokens) + i64::from(per_fill) * window_secs / fill_secs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_share_a_bucket_within_its_limit_and_other_buckets_are_answered() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &[]);

    let alice = bucket(&[("user", "alice")]);
    let free_path = bucket(&[("path", "/x"), ("plan", "free")]);
    let team = bucket(&[("team", "blue")]);
    let shadow = bucket(&[("shadow", "s")]);
    let too_large = bucket(
        &(0..40)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect::<Vec<_>>()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
    );

    let mut first = Envoy::connect(&server).await;
    let answered = first
        .report(&[
            alice.clone(),
            free_path.clone(),
            team.clone(),
            shadow.clone(),
            too_large.clone(),
        ])
        .await;
    let action = |id: &BucketId| {
        answered
            .iter()
            .find(|(answered, _)| answered == id)
            .map(|(_, action)| action)
    };
    assert!(
        action(&too_large).is_none(),
        "a bucket id over the request limits is not assigned"
    );
    assert_eq!(answered.len(), 4, "{answered:?}");
    // One Envoy: half of 120 per 10 s (one share is held back for the next Envoy).
    let first_alice =
        strategy(action(&alice).expect("answered")).expect("a token bucket for alice");
    let w = weight(first_alice, 10);
    assert!(
        (30..=60).contains(&w),
        "{first_alice:?} admits {w} per 10 s"
    );
    // The entries of a map find their rule in the tree's order (plan, then path).
    let free = strategy(action(&free_path).expect("answered"))
        .expect("a token bucket for plan=free, path");
    assert!(weight(free, 1) <= 15, "{free:?}");
    assert_eq!(
        strategy(action(&team).expect("answered")),
        Err(BlanketRule::AllowAll)
    );
    assert_eq!(
        strategy(action(&shadow).expect("answered")),
        Err(BlanketRule::AllowAll)
    );

    // A second Envoy gets a third at once; the first, at its next report, a third too: its
    // larger bucket still counts for a window, but Envoy uses one of them at a time, so beside
    // it the smaller adds only its burst. Together never over 120 per 10 s.
    let mut second = Envoy::connect(&server).await;
    let answered = second.report(std::slice::from_ref(&alice)).await;
    let second_alice = strategy(&answered[0].1).expect("a token bucket for the second Envoy");
    assert_eq!(weight(second_alice, 10), 40, "{second_alice:?}");
    let answered = first.report(std::slice::from_ref(&alice)).await;
    let shrunk = strategy(&answered[0].1).expect("a smaller bucket for the first Envoy");
    assert_eq!(weight(shrunk, 10), 40, "{shrunk:?}");
    let refill = |bucket| weight(bucket, 10) - i64::from(bucket.0);
    let first_holds = i64::from(first_alice.0 + shrunk.0) + refill(first_alice).max(refill(shrunk));
    assert!(
        first_holds + weight(second_alice, 10) <= 120,
        "{first_alice:?} {second_alice:?} {shrunk:?}"
    );

    // The same bucket again, at once: renewed unchanged (Envoy keeps its tokens).
    let again = second.report(std::slice::from_ref(&alice)).await;
    assert_eq!(strategy(&again[0].1), Ok(second_alice));

    let (_, metrics) = server.get("/metrics");
    assert_eq!(metric_value(&metrics, "slidegate_rlqs_streams"), 2.0);
    assert_eq!(
        metric_value(
            &metrics,
            "slidegate_rlqs_buckets_refused_total{reason=\"too_large\"}"
        ),
        1.0
    );
    assert!(
        metric_value(
            &metrics,
            "slidegate_rlqs_assignments_total{action=\"token_bucket\"}"
        ) >= 5.0,
        "{metrics}"
    );
    drop(first);
    drop(second);
    assert!(
        crate::support::wait_until(Duration::from_secs(5), || {
            metric_value(&server.get("/metrics").1, "slidegate_rlqs_streams") == 0.0
        }),
        "closed streams are no longer counted"
    );
}

/// A bucket id's value comes from a client (a header), so its length must not keep the bucket
/// from its limit: a value over `--max-value-bytes` is assigned a token bucket like any other,
/// under a ledger of its own (a second such value, differing only in its last byte, gets a first
/// Envoy's share too, not a second Envoy's third of the same ledger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_value_is_assigned_its_own_token_bucket() {
    let rules = tempfile::tempdir().expect("tempdir");
    std::fs::write(rules.path().join("rules.yaml"), RULES).expect("write rules");
    let server = Slidegate::start(rules.path(), &[]);
    let long = "a".repeat(5000);
    let neighbour = format!("{}b", &long[1..]);
    let (long, neighbour) = (
        bucket(&[("user", long.as_str())]),
        bucket(&[("user", neighbour.as_str())]),
    );
    let alice = bucket(&[("user", "alice")]);

    let mut envoy = Envoy::connect(&server).await;
    let answered = envoy
        .report(&[alice.clone(), long.clone(), neighbour.clone()])
        .await;
    assert_eq!(answered.len(), 3, "{answered:?}");
    let share = |id: &BucketId| {
        let (_, action) = (answered.iter())
            .find(|(answered, _)| answered == id)
            .expect("answered");
        strategy(action).expect("a token bucket")
    };
    let first = share(&alice);
    assert_eq!(share(&long), first, "a long value, a first Envoy's share");
    assert_eq!(
        share(&neighbour),
        first,
        "its neighbour, a ledger of its own"
    );
    let metrics = server.get("/metrics").1;
    assert_eq!(
        metric_value(
            &metrics,
            "slidegate_rlqs_buckets_refused_total{reason=\"too_large\"}"
        ),
        0.0
    );
}
