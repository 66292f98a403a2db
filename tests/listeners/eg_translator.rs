//! What Envoy Gateway's translator generates, served over xDS to the real binary: every shape of
//! `RateLimitConfig` that `internal/xds/translator/ratelimit.go` builds (per-route and shared
//! domains, header/method/path/query matches, `distinct` values, `masked_remote_address` with
//! exact, distinct and `invert:` CIDRs, month and year units, shadow rules, request costs), each
//! acknowledged and enforced as Envoy's descriptors for it ask. The fixtures are written here in
//! the translator's shape: a route node (`key` = `value` = the route), then one node per match of a
//! rule, the limit on the last; a shadow rule sets `shadow_mode` on every node of its chain.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as Sent;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use slidegate::config::source::xds::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

use super::xds::{ControlPlane, slidegate, wait_ready};
use crate::support::{Slidegate, call, descriptor, metric_value, request};

use Code::{Ok as OK, OverLimit as OVER};

/// A limit as the translator writes one: `requests` per `unit`, nothing else set.
fn policy(unit: RateLimitUnit, requests: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit.into(),
        requests_per_unit: requests,
        ..RateLimitPolicy::default()
    })
}

/// One rule as the translator sees it: its matches as (key, value) nodes, its limit, whether it is a
/// shadow rule.
type RuleShape<'a> = (Vec<(&'a str, &'a str)>, Option<RateLimitPolicy>, bool);

/// One rule's chain under its route node: a node per (key, value) match (an empty value is a
/// `distinct` match), the limit on the last, `shadow_mode` on every node of the chain when
/// `shadow` (the route node is not the rule's: it never has it).
fn route(name: &str, rules: Vec<RuleShape<'_>>) -> RateLimitDescriptor {
    let chains = rules
        .into_iter()
        .map(|(matches, limit, shadow)| {
            let mut node: Option<RateLimitDescriptor> = None;
            for (i, (key, value)) in matches.iter().enumerate().rev() {
                let last = i == matches.len() - 1;
                node = Some(RateLimitDescriptor {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                    rate_limit: if last { limit.clone() } else { None },
                    shadow_mode: shadow,
                    descriptors: node.into_iter().collect(),
                    ..RateLimitDescriptor::default()
                });
            }
            node.expect("a rule has at least one match")
        })
        .collect();
    RateLimitDescriptor {
        key: name.to_owned(),
        value: name.to_owned(),
        descriptors: chains,
        ..RateLimitDescriptor::default()
    }
}

/// A resource as the translator names it: `name` = `domain`.
fn config(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.to_owned(),
        domain: domain.to_owned(),
        descriptors,
    }
}

/// slidegate with `configs` as the control plane's first response, which it must acknowledge.
async fn serve(configs: &[RateLimitConfig]) -> (ControlPlane, Slidegate) {
    let mut control_plane = ControlPlane::start().await;
    let server = slidegate(&control_plane, &[]);
    control_plane.next_request().await;
    control_plane.push("1", "n1", configs);
    let ack = control_plane.next_request().await;
    assert_eq!(
        ack.version_info,
        "1",
        "acknowledged; log:\n{}",
        server.log()
    );
    assert!(
        ack.error_detail.is_none(),
        "NACK: {:?}",
        ack.error_detail.map(|d| d.message)
    );
    wait_ready(&server);
    (control_plane, server)
}

/// The route entry and then `entries`, as Envoy sends a rule's descriptor.
fn sent(route: &str, entries: &[(&str, &str)]) -> Sent {
    let mut all = vec![(route, route)];
    all.extend_from_slice(entries);
    descriptor(&all)
}

async fn ask(server: &Slidegate, domain: &str, descriptors: Vec<Sent>) -> RateLimitResponse {
    let mut client = server.client().await;
    call(&mut client, request(domain, descriptors)).await
}

/// The overall codes of `times` identical requests.
async fn codes(server: &Slidegate, domain: &str, one: &Sent, times: usize) -> Vec<Code> {
    let mut codes = Vec::new();
    for _ in 0..times {
        codes.push(ask(server, domain, vec![one.clone()]).await.overall_code());
    }
    codes
}

const LISTENER: &str = "default/eg/http";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_method_path_and_query_matches_on_a_per_route_domain() {
    let r = "httproute/default/backend/rule/0";
    let rules = vec![
        // Rule 0: a header value, the method, the path and a query value (query matches continue
        // the header matches' numbering).
        (
            vec![
                ("rule-0-match-0", "rule-0-match-0"),
                ("rule-0-method", "rule-0-method"),
                ("rule-0-path", "rule-0-path"),
                ("rule-0-match-1", "rule-0-match-1"),
            ],
            policy(RateLimitUnit::Minute, 2),
            false,
        ),
        // Rule 1: no match, all traffic of the route.
        (
            vec![("rule-1-match--1", "rule-1-match--1")],
            policy(RateLimitUnit::Minute, 3),
            false,
        ),
    ];
    let (_cp, server) = serve(&[config(LISTENER, vec![route(r, rules)])]).await;
    let matched = sent(
        r,
        &[
            ("rule-0-match-0", "rule-0-match-0"),
            ("rule-0-method", "rule-0-method"),
            ("rule-0-path", "rule-0-path"),
            ("rule-0-match-1", "rule-0-match-1"),
        ],
    );
    assert_eq!(codes(&server, LISTENER, &matched, 3).await, [OK, OK, OVER]);
    let all = sent(r, &[("rule-1-match--1", "rule-1-match--1")]);
    assert_eq!(codes(&server, LISTENER, &all, 4).await, [OK, OK, OK, OVER]);
    // A descriptor that stops short of the limit's node (Envoy sends the matches it has) has no
    // limit.
    let partial = sent(r, &[("rule-0-match-0", "rule-0-match-0")]);
    assert_eq!(codes(&server, LISTENER, &partial, 3).await, [OK, OK, OK]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_header_and_query_values_count_apart() {
    let r = "httproute/default/per-user/rule/0";
    let rules = vec![(
        vec![("rule-0-match-0", ""), ("rule-0-match-1", "")],
        policy(RateLimitUnit::Hour, 1),
        false,
    )];
    let (_cp, server) = serve(&[config(LISTENER, vec![route(r, rules)])]).await;
    let alice = sent(r, &[("rule-0-match-0", "alice"), ("rule-0-match-1", "eu")]);
    let alice_us = sent(r, &[("rule-0-match-0", "alice"), ("rule-0-match-1", "us")]);
    let bob = sent(r, &[("rule-0-match-0", "bob"), ("rule-0-match-1", "eu")]);
    assert_eq!(codes(&server, LISTENER, &alice, 2).await, [OK, OVER]);
    assert_eq!(codes(&server, LISTENER, &alice_us, 2).await, [OK, OVER]);
    assert_eq!(codes(&server, LISTENER, &bob, 2).await, [OK, OVER]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_remote_address_exact_distinct_and_inverted() {
    let exact = "httproute/default/cidr-exact/rule/0";
    let distinct = "httproute/default/cidr-distinct/rule/0";
    let invert = "httproute/default/cidr-invert/rule/0";
    let one = |matches| vec![(matches, policy(RateLimitUnit::Minute, 1), false)];
    let routes = vec![
        route(
            exact,
            one(vec![("masked_remote_address", "192.168.0.0/16")]),
        ),
        route(
            distinct,
            one(vec![
                ("masked_remote_address", "10.0.0.0/8"),
                ("remote_address", ""),
            ]),
        ),
        route(
            invert,
            one(vec![("masked_remote_address", "invert:192.168.0.0/24")]),
        ),
    ];
    let (_cp, server) = serve(&[config(LISTENER, routes)]).await;
    // Exact: every address of the CIDR shares one counter (Envoy sends the CIDR, not the address).
    let masked = sent(exact, &[("masked_remote_address", "192.168.0.0/16")]);
    assert_eq!(codes(&server, LISTENER, &masked, 2).await, [OK, OVER]);
    // Distinct: one counter per address inside the CIDR.
    let from = |ip| {
        sent(
            distinct,
            &[
                ("masked_remote_address", "10.0.0.0/8"),
                ("remote_address", ip),
            ],
        )
    };
    assert_eq!(
        codes(&server, LISTENER, &from("10.0.0.1"), 2).await,
        [OK, OVER]
    );
    assert_eq!(
        codes(&server, LISTENER, &from("10.0.0.2"), 2).await,
        [OK, OVER]
    );
    // Inverted: the value carries the `invert:` prefix as Envoy sends it.
    let outside = sent(
        invert,
        &[("masked_remote_address", "invert:192.168.0.0/24")],
    );
    assert_eq!(codes(&server, LISTENER, &outside, 2).await, [OK, OVER]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn month_and_year_units() {
    let monthly = "httproute/default/monthly/rule/0";
    let yearly = "httproute/default/yearly/rule/0";
    let rule = |unit, n| {
        vec![(
            vec![("rule-0-match-0", "rule-0-match-0")],
            policy(unit, n),
            false,
        )]
    };
    let routes = vec![
        route(monthly, rule(RateLimitUnit::Month, 2)),
        route(yearly, rule(RateLimitUnit::Year, 1)),
    ];
    let (_cp, server) = serve(&[config(LISTENER, routes)]).await;
    let m = sent(monthly, &[("rule-0-match-0", "rule-0-match-0")]);
    assert_eq!(codes(&server, LISTENER, &m, 3).await, [OK, OK, OVER]);
    let y = sent(yearly, &[("rule-0-match-0", "rule-0-match-0")]);
    let response = ask(&server, LISTENER, vec![y.clone()]).await;
    let limit = response.statuses[0].current_limit.clone().expect("a limit");
    assert_eq!(limit.unit, RateLimitUnit::Year as i32, "{limit:?}");
    assert_eq!(codes(&server, LISTENER, &y, 1).await, [OVER]);
    let (_, rlconfig) = server.get("/rlconfig");
    assert!(
        rlconfig.contains("2 per MONTH (window 30days"),
        "{rlconfig}"
    );
    assert!(
        rlconfig.contains("1 per YEAR (window 11months 30days 3h"),
        "{rlconfig}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_domain_counts_across_routes_next_to_per_route_domains() {
    // A shared rule: its own domain (the policy, `/rule/N` stripped), its node keyed by the
    // rule's name; every route the policy targets sends the same descriptor.
    let shared_domain = "default/shared-policy";
    let shared_key = "default/shared-policy/rule/0";
    let shared = route(
        shared_key,
        vec![(
            vec![("rule-0-match-0", "rule-0-match-0")],
            policy(RateLimitUnit::Minute, 2),
            false,
        )],
    );
    let r = "httproute/default/own/rule/0";
    let own = route(
        r,
        vec![(
            vec![("rule-0-match--1", "rule-0-match--1")],
            policy(RateLimitUnit::Minute, 1),
            false,
        )],
    );
    let configs = [
        config(shared_domain, vec![shared]),
        config(LISTENER, vec![own]),
        config("default/eg/https", Vec::new()),
    ];
    let (_cp, server) = serve(&configs).await;
    let from_any_route = sent(shared_key, &[("rule-0-match-0", "rule-0-match-0")]);
    assert_eq!(
        codes(&server, shared_domain, &from_any_route, 3).await,
        [OK, OK, OVER]
    );
    let own = sent(r, &[("rule-0-match--1", "rule-0-match--1")]);
    assert_eq!(codes(&server, LISTENER, &own, 2).await, [OK, OVER]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_answers_ok_but_counts() {
    let r = "httproute/default/shadow/rule/0";
    let chain = vec![
        ("rule-0-match-0", "rule-0-match-0"),
        ("rule-0-match-1", "rule-0-match-1"),
        ("masked_remote_address", "0.0.0.0/0"),
    ];
    let rules = vec![
        (chain.clone(), policy(RateLimitUnit::Minute, 1), true),
        (
            vec![("rule-1-match--1", "rule-1-match--1")],
            policy(RateLimitUnit::Minute, 1),
            false,
        ),
    ];
    let (_cp, server) = serve(&[config(LISTENER, vec![route(r, rules)])]).await;
    let shadowed = sent(r, &chain);
    assert_eq!(codes(&server, LISTENER, &shadowed, 3).await, [OK, OK, OK]);
    let response = ask(&server, LISTENER, vec![shadowed]).await;
    assert_eq!(response.statuses[0].code(), OK, "the descriptor too");
    // The rule next to it is enforced.
    let enforced = sent(r, &[("rule-1-match--1", "rule-1-match--1")]);
    assert_eq!(codes(&server, LISTENER, &enforced, 2).await, [OK, OVER]);
    // Counted: the first was within the limit, the three after it over.
    let metrics = server.get("/metrics").1;
    // The rule label is the matched chain, cut to the label bound (a cut plus a digest).
    let rule = format!(
        "{r}_{r}.rule-0-match-0_rule-0-match-0.rule-0-match-1_rule-0-match-1.\
         masked_remote_address_0.0.0.0/0"
    );
    let rule = slidegate::metrics::bounded_label(&rule);
    let series = format!(
        "slidegate_decisions_total{{decision=\"shadow_denied\",domain=\"{LISTENER}\",rule=\"{rule}\"}}"
    );
    assert_eq!(
        metric_value(&metrics, &series),
        3.0,
        "{series} in\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cost_is_the_descriptors_hits() {
    let r = "httproute/default/cost/rule/0";
    let rules = vec![(
        vec![("rule-0-match--1", "rule-0-match--1")],
        policy(RateLimitUnit::Minute, 5),
        false,
    )];
    let (_cp, server) = serve(&[config(LISTENER, vec![route(r, rules)])]).await;
    let costing = |hits| {
        let mut one = sent(r, &[("rule-0-match--1", "rule-0-match--1")]);
        one.hits_addend = Some(UInt64Value { value: hits });
        one
    };
    // `cost.request.number: 3`: 3 of 5, then 3 more do not fit. A descriptor's own cost is a
    // charge (docs/envoy.md, costs charged after the response): denied, and recorded all the same.
    assert_eq!(codes(&server, LISTENER, &costing(3), 2).await, [OK, OVER]);
    // A check with cost 0 (the request phase of a response cost) takes nothing and sees the debt.
    let response = ask(&server, LISTENER, vec![costing(0)]).await;
    assert_eq!(response.statuses[0].code(), OVER, "{response:?}");
    assert_eq!(response.statuses[0].limit_remaining, 0, "{response:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_descriptors_deny_only_when_every_one_is_over() {
    let quota = |key: &str, requests| RateLimitDescriptor {
        key: key.to_owned(),
        rate_limit: policy(RateLimitUnit::Hour, requests),
        quota_mode: true,
        ..RateLimitDescriptor::default()
    };
    let ordinary = RateLimitDescriptor {
        key: "ordinary".into(),
        rate_limit: policy(RateLimitUnit::Hour, 1),
        ..RateLimitDescriptor::default()
    };
    let descriptors = vec![quota("team", 1), quota("org", 2), ordinary];
    let (_cp, server) = serve(&[config("quota", descriptors)]).await;
    let both = || vec![descriptor(&[("team", "a")]), descriptor(&[("org", "a")])];
    let first = ask(&server, "quota", both()).await;
    assert_eq!(first.overall_code(), OK);
    // `team` is over, `org` is not: the quota descriptor reports it, the request passes.
    let second = ask(&server, "quota", both()).await;
    assert_eq!(second.overall_code(), OK, "{second:?}");
    assert_eq!(second.statuses[0].code(), OVER, "{second:?}");
    assert_eq!(second.statuses[1].code(), OK, "{second:?}");
    // Both over: denied.
    let third = ask(&server, "quota", both()).await;
    assert_eq!(third.overall_code(), OVER, "{third:?}");
    // An ordinary descriptor over its limit denies whatever the quota descriptors say.
    let mixed = |team| {
        vec![
            descriptor(&[("team", team)]),
            descriptor(&[("ordinary", "b")]),
        ]
    };
    assert_eq!(ask(&server, "quota", mixed("b")).await.overall_code(), OK);
    let denied = ask(&server, "quota", mixed("c")).await;
    assert_eq!(denied.statuses[0].code(), OK, "{denied:?}");
    assert_eq!(denied.overall_code(), OVER, "{denied:?}");
    let (_, rlconfig) = server.get("/rlconfig");
    assert!(
        rlconfig
            .contains("quota team: 1 per HOUR (window 1h, exact); quota_mode; source=xds:quota"),
        "{rlconfig}"
    );
}
