//! From `RateLimitConfig` resources to a rule set.
//!
//! A resource is one rule file in protobuf form: the same fields under the same names. So each is
//! written out as the YAML file it stands for and loaded by the code that loads rule files
//! ([`load_sources`]): one validation, the same error messages with the same field paths
//! (`descriptors[0].rate_limit.unit`), and a checksum of the text for `/rlconfig` and the metrics.
//! What envoyproxy/ratelimit accepts from a control plane is accepted here too, since one refused
//! resource NACKs the whole response (every domain keeps its old rules). So the conversion leaves
//! out what acts on nothing: the flags of a node without a `rate_limit` (Envoy Gateway sets
//! `shadow_mode` on every node of a shadow rule's chain, and its `metadata`) and the count of an
//! unlimited rule. A limited node's `metadata` (a protobuf `Struct`) becomes the YAML map it
//! stands for, returned in answers' dynamic metadata as the rule files' is.
//! Unit numbers the proto does not define are refused here, naming the field, as envoyproxy/
//! ratelimit refuses them; everything else is the rule files' own validation.

use std::collections::HashMap;

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, Struct as ProtoStruct, Value as ProtoValue};
use prost::Message as _;
use serde_json::{Map, Value, json};

use crate::config::validate::metadata_bounds;
use crate::config::{Checksum, ConfigError, ConfigErrors, RuleSet, load_sources};

/// The generated types of `proto/ratelimit/config/ratelimit/v3/rls_conf.proto`.
pub mod proto {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(
        env!("OUT_DIR"),
        "/ratelimit.config.ratelimit.v3.rs"
    ));
}

use proto::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

/// The type URL of the resources slidegate asks for and accepts.
pub const RESOURCE_TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The rule set a response's resources describe, all or nothing. No resources at all is a valid
/// state of the world (a control plane with no rate-limit policies): an empty rule set.
pub fn rules_from(resources: &[Any]) -> Result<RuleSet, ConfigErrors> {
    let mut sources = Vec::with_capacity(resources.len());
    let mut errors = Vec::new();
    for (i, resource) in resources.iter().enumerate() {
        match to_source(i, resource) {
            Ok(source) => sources.push(source),
            Err(mut resource_errors) => errors.append(&mut resource_errors),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    if sources.is_empty() {
        return Ok(RuleSet::new(HashMap::new(), Vec::new(), Checksum::of(&[])));
    }
    // The order of resources in a response means nothing; the checksum should not depend on it.
    sources.sort();
    load_sources(&sources)
}

/// One resource as (source name, YAML text). The source name (`xds:NAME`) is what errors,
/// `/rlconfig` and the metrics show for its rules.
fn to_source(index: usize, resource: &Any) -> Result<(String, String), Vec<ConfigError>> {
    let unnamed = format!("xds:resources[{index}]");
    let error = |file: &str, message: String| {
        vec![ConfigError {
            file: file.to_owned(),
            message,
        }]
    };
    if resource.type_url != RESOURCE_TYPE {
        return Err(error(
            &unnamed,
            format!(
                "type_url: `{}` is not a rule resource (expected `{RESOURCE_TYPE}`)",
                resource.type_url
            ),
        ));
    }
    let config = RateLimitConfig::decode(resource.value.as_slice())
        .map_err(|e| error(&unnamed, format!("cannot decode RateLimitConfig: {e}")))?;
    let name = if config.name.is_empty() {
        unnamed
    } else {
        format!("xds:{}", config.name)
    };
    let mut errors = Vec::new();
    let descriptors = descriptors(&config.descriptors, "", &name, &mut errors);
    if !errors.is_empty() {
        return Err(errors);
    }
    let file = json!({ "domain": config.domain, "descriptors": descriptors });
    let text = serde_yaml::to_string(&file)
        .map_err(|e| error(&name, format!("cannot write as YAML: {e}")))?;
    Ok((name, text))
}

/// The descriptors of one level as YAML values; `at` is the parent's field path.
fn descriptors(
    list: &[RateLimitDescriptor],
    at: &str,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Vec<Value> {
    list.iter()
        .enumerate()
        .map(|(i, descriptor)| {
            let loc = if at.is_empty() {
                format!("descriptors[{i}]")
            } else {
                format!("{at}.descriptors[{i}]")
            };
            self::descriptor(descriptor, &loc, file, errors)
        })
        .collect()
}

fn descriptor(
    descriptor: &RateLimitDescriptor,
    loc: &str,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Value {
    let mut node = Map::new();
    node.insert("key".into(), descriptor.key.clone().into());
    if !descriptor.value.is_empty() {
        node.insert("value".into(), descriptor.value.clone().into());
    }
    if let Some(policy) = &descriptor.rate_limit {
        let at = format!("{loc}.rate_limit");
        node.insert("rate_limit".into(), rate_limit(policy, &at, file, errors));
    }
    let flags = [
        ("shadow_mode", descriptor.shadow_mode),
        ("quota_mode", descriptor.quota_mode),
        ("detailed_metric", descriptor.detailed_metric),
    ];
    if descriptor.rate_limit.is_some() {
        for (field, _) in flags.into_iter().filter(|(_, on)| *on) {
            node.insert(field.into(), true.into());
        }
        if let Some(metadata) = &descriptor.metadata {
            // Over the rule files' bounds it is left out, not refused: one refused resource
            // would refuse the whole response, and envoyproxy/ratelimit takes any size.
            let map = struct_map(metadata);
            match metadata_bounds(&map) {
                Ok(()) => {
                    node.insert("metadata".into(), Value::Object(map));
                }
                Err(problem) => tracing::warn!(
                    resource = file,
                    at = %format!("{loc}.metadata"),
                    problem,
                    "rule metadata left out of dynamic metadata"
                ),
            }
        }
    }
    if !descriptor.descriptors.is_empty() {
        let children = descriptors(&descriptor.descriptors, loc, file, errors);
        node.insert("descriptors".into(), children.into());
    }
    Value::Object(node)
}

/// A protobuf `Struct` as the JSON map it stands for. A number JSON cannot hold (NaN, an
/// infinity) becomes null.
fn struct_map(fields: &ProtoStruct) -> Map<String, Value> {
    fields
        .fields
        .iter()
        .map(|(name, value)| (name.clone(), proto_value(value)))
        .collect()
}

fn proto_value(value: &ProtoValue) -> Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => Value::Object(struct_map(s)),
        Some(Kind::ListValue(list)) => Value::Array(list.values.iter().map(proto_value).collect()),
    }
}

/// A policy as a YAML `rate_limit`. Proto3 cannot tell an unset field from its zero value, so
/// zeros are left out where the YAML would reject them (the unit of an unlimited rule) and written
/// where they mean something (a limit of 0 requests denies everything). An unlimited rule's count
/// is left out whatever it is: envoyproxy/ratelimit ignores it.
fn rate_limit(
    policy: &RateLimitPolicy,
    at: &str,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Value {
    let mut limit = Map::new();
    match RateLimitUnit::try_from(policy.unit) {
        Ok(RateLimitUnit::Unknown) => {}
        Ok(unit) => {
            limit.insert("unit".into(), unit.as_str_name().into());
        }
        Err(_) => errors.push(ConfigError {
            file: file.to_owned(),
            message: format!(
                "{at}.unit: unknown unit number {} (expected SECOND, MINUTE, HOUR, DAY, WEEK, \
                 MONTH or YEAR)",
                policy.unit
            ),
        }),
    }
    if !policy.unlimited {
        limit.insert("requests_per_unit".into(), policy.requests_per_unit.into());
    }
    if policy.unlimited {
        limit.insert("unlimited".into(), true.into());
    }
    if !policy.name.is_empty() {
        limit.insert("name".into(), policy.name.clone().into());
    }
    if !policy.replaces.is_empty() {
        let replaces: Vec<Value> = policy
            .replaces
            .iter()
            .map(|r| json!({ "name": r.name }))
            .collect();
        limit.insert("replaces".into(), replaces.into());
    }
    Value::Object(limit)
}

#[cfg(test)]
mod tests {
    use super::proto::{RateLimitReplace, RateLimitUnit};
    use super::*;

    fn any(config: &RateLimitConfig) -> Any {
        Any {
            type_url: RESOURCE_TYPE.to_owned(),
            value: config.encode_to_vec(),
        }
    }

    fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit.into(),
            requests_per_unit,
            ..Default::default()
        })
    }

    #[test]
    fn every_mapped_field_reaches_the_rule() {
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "user".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Week.into(),
                    requests_per_unit: 5,
                    name: "weekly".into(),
                    replaces: vec![RateLimitReplace {
                        name: "free".into(),
                    }],
                    ..Default::default()
                }),
                shadow_mode: true,
                detailed_metric: true,
                descriptors: vec![RateLimitDescriptor {
                    key: "path".into(),
                    value: "/free".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        name: "free".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let rules = rules_from(&[any(&config)]).expect("valid");
        let lines: Vec<String> = rules.rules().iter().map(|r| r.to_string()).collect();
        assert_eq!(
            lines,
            [
                "edge user: 5 per WEEK (window 7days, exact) name=weekly replaces=free shadow_mode \
                 detailed_metric [xds:edge]",
                "edge user.path_/free: unlimited name=free [xds:edge]",
            ]
        );
    }

    #[test]
    fn what_envoyproxy_ratelimit_accepts_is_accepted() {
        let mut metadata = envoy_types::pb::google::protobuf::Struct::default();
        metadata.fields.insert(
            "team".into(),
            envoy_types::pb::google::protobuf::Value::default(),
        );
        // Envoy Gateway's shadow chain: `shadow_mode` on every node, the limit on the last.
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "route".into(),
                value: "route".into(),
                shadow_mode: true,
                detailed_metric: true,
                quota_mode: true,
                metadata: Some(metadata),
                descriptors: vec![
                    RateLimitDescriptor {
                        key: "b".into(),
                        rate_limit: policy(RateLimitUnit::Month, 1),
                        shadow_mode: true,
                        ..Default::default()
                    },
                    RateLimitDescriptor {
                        key: "q".into(),
                        rate_limit: policy(RateLimitUnit::Week, 2),
                        quota_mode: true,
                        ..Default::default()
                    },
                    RateLimitDescriptor {
                        key: "free".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unlimited: true,
                            requests_per_unit: 7,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
        };
        let rules = rules_from(&[any(&config)]).expect("accepted");
        let mut lines: Vec<String> = rules.rules().iter().map(|r| r.to_string()).collect();
        lines.sort();
        assert_eq!(
            lines,
            [
                "edge route_route.b: 1 per MONTH (window 30days, exact) shadow_mode [xds:edge]",
                "edge route_route.free: unlimited [xds:edge]",
                "edge route_route.q: 2 per WEEK (window 7days, exact) quota_mode [xds:edge]",
            ]
        );
    }

    /// The rules of one resource: `user`, 5 per minute, with `metadata`.
    fn limited_with(
        metadata: envoy_types::pb::google::protobuf::Struct,
    ) -> Result<RuleSet, ConfigErrors> {
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "user".into(),
                rate_limit: policy(RateLimitUnit::Minute, 5),
                metadata: Some(metadata),
                ..Default::default()
            }],
        };
        rules_from(&[any(&config)])
    }

    #[test]
    fn a_limited_nodes_metadata_reaches_its_rule() {
        use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as PValue};
        let value = |kind| PValue { kind: Some(kind) };
        let mut runbook = Struct::default();
        runbook
            .fields
            .insert("severity".into(), value(Kind::NumberValue(2.0)));
        let mut metadata = Struct::default();
        metadata
            .fields
            .insert("owner".into(), value(Kind::StringValue("payments".into())));
        metadata
            .fields
            .insert("runbook".into(), value(Kind::StructValue(runbook)));
        let tags = ListValue {
            values: vec![
                value(Kind::BoolValue(true)),
                value(Kind::NumberValue(f64::NAN)),
            ],
        };
        metadata
            .fields
            .insert("tags".into(), value(Kind::ListValue(tags)));
        let rules = limited_with(metadata).expect("accepted");
        let rule = &rules.rules()[0];
        let metadata = rule.metadata.as_deref().expect("metadata kept");
        assert_eq!(
            Value::Object(metadata.clone()),
            json!({"owner": "payments", "runbook": {"severity": 2.0}, "tags": [true, null]})
        );
    }

    #[test]
    fn metadata_over_the_bounds_is_left_out_not_refused() {
        use envoy_types::pb::google::protobuf::{Struct, Value as PValue};
        let mut metadata = Struct::default();
        metadata.fields.insert(
            "note".into(),
            PValue {
                kind: Some(Kind::StringValue("x".repeat(20_000))),
            },
        );
        let rules = limited_with(metadata).expect("accepted: the rule still limits");
        assert_eq!(rules.rules()[0].metadata, None);
    }

    #[test]
    fn an_unknown_unit_number_is_refused_with_its_path() {
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "a".into(),
                rate_limit: policy(RateLimitUnit::Second, 1),
                descriptors: vec![RateLimitDescriptor {
                    key: "b".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: 42,
                        requests_per_unit: 1,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let errors = rules_from(&[any(&config)])
            .expect_err("refused")
            .to_string();
        let expected =
            "xds:edge: descriptors[0].descriptors[0].rate_limit.unit: unknown unit number 42";
        assert!(errors.contains(expected), "{expected:?} in {errors}");
    }

    #[test]
    fn validation_is_the_rule_files_own() {
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "a".into(),
                rate_limit: policy(RateLimitUnit::Unknown, 3),
                ..Default::default()
            }],
        };
        let errors = rules_from(&[any(&config)])
            .expect_err("no unit")
            .to_string();
        assert!(
            errors.starts_with("xds:edge: descriptors[0].rate_limit.unit: missing `unit`"),
            "{errors}"
        );
        let mut valid = config;
        valid.descriptors[0].rate_limit = policy(RateLimitUnit::Second, 3);
        let other = RateLimitConfig {
            name: "other".into(),
            ..valid.clone()
        };
        let twice = [any(&valid), any(&other)];
        let errors = rules_from(&twice)
            .expect_err("duplicate domain")
            .to_string();
        assert!(errors.contains("duplicate domain `edge`"), "{errors}");
    }

    #[test]
    fn no_resources_is_an_empty_rule_set_and_order_does_not_matter() {
        let rules = rules_from(&[]).expect("empty is valid");
        assert!(rules.domain_names().is_empty());
        let config = |domain: &str| RateLimitConfig {
            name: domain.into(),
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: policy(RateLimitUnit::Minute, 1),
                ..Default::default()
            }],
        };
        let ab = rules_from(&[any(&config("a")), any(&config("b"))]).expect("valid");
        let ba = rules_from(&[any(&config("b")), any(&config("a"))]).expect("valid");
        assert_eq!(ab.checksum(), ba.checksum());
        assert_eq!(ab.domain_names().len(), 2);
    }

    #[test]
    fn values_are_kept_as_sent_whatever_yaml_would_make_of_them() {
        let tricky = [
            "yes",
            "no",
            "on",
            "off",
            "y",
            "n",
            "true",
            "~",
            "null",
            "010",
            "0x1F",
            "1_000",
            "1e3",
            ".5",
            "-",
            "*",
            "a: b",
            "#x",
            "'q'",
            "\"d\"",
            "<<",
            "&a",
            "*a",
            "[1]",
            "{}",
            " lead",
            "trail ",
            "multi\nline",
            "tab\t",
            "é",
            "",
        ];
        let descriptors = tricky
            .iter()
            .map(|value| RateLimitDescriptor {
                key: format!("k{value}"),
                value: (*value).to_owned(),
                rate_limit: policy(RateLimitUnit::Second, 1),
                ..Default::default()
            })
            .collect();
        let config = RateLimitConfig {
            name: "edge".into(),
            domain: "010".into(),
            descriptors,
        };
        let rules = rules_from(&[any(&config)]).expect("valid");
        assert_eq!(rules.domain_names(), ["010"]);
        let mut paths: Vec<String> = rules.rules().iter().map(|r| r.path.clone()).collect();
        let mut expected: Vec<String> = tricky
            .iter()
            .map(|v| {
                if v.is_empty() {
                    "k".to_owned()
                } else {
                    format!("k{v}_{v}")
                }
            })
            .collect();
        paths.sort();
        expected.sort();
        assert_eq!(paths, expected);
    }

    #[test]
    fn a_resource_of_another_type_is_refused() {
        let resource = Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: Vec::new(),
        };
        let errors = rules_from(&[resource]).expect_err("wrong type").to_string();
        assert!(
            errors.starts_with("xds:resources[0]: type_url:"),
            "{errors}"
        );
    }
}
