//! What one xDS response may hold, checked on its wire bytes before anything is decoded.
//!
//! Why: a response is turned into rules in steps that each take more memory than the one before
//! (the protobuf messages, a YAML text per resource, the parsed documents, the rule tree), and a
//! response of many tiny descriptors multiplies its size most: a 5 MB response once took about
//! 950 MiB while converted. So before any of it, the resources' bytes are summed and their
//! descriptors counted by walking the protobuf wire format (no allocation), and a response over
//! either bound is refused with a NACK that names the bound; the rules in force stay.

use envoy_types::pb::google::protobuf::Any;

use crate::config::{ConfigError, ConfigErrors};

/// Most bytes of all resources of one response together: a rule file's own limit.
pub const MAX_RESOURCE_BYTES: usize = 8 << 20;

/// Most descriptors (rule nodes, at every level) in one response. Envoy Gateway writes a few per
/// rate-limit rule; this is tens of thousands of rules.
pub const MAX_DESCRIPTORS: usize = 50_000;

/// Deepest nesting of descriptors accepted (a real rule tree has a few levels).
const MAX_DEPTH: usize = 64;

/// `Err` naming the bound a response's resources pass, if they pass one.
pub fn check(resources: &[Any]) -> Result<(), ConfigErrors> {
    let refuse = |message: String| {
        Err(ConfigErrors(vec![ConfigError {
            file: "xds".to_owned(),
            message,
        }]))
    };
    let bytes: usize = resources.iter().map(|r| r.value.len()).sum();
    if bytes > MAX_RESOURCE_BYTES {
        return refuse(format!(
            "the response's resources are {bytes} bytes, more than the {MAX_RESOURCE_BYTES} \
             bytes slidegate accepts in one response"
        ));
    }
    let mut descriptors = 0usize;
    for (i, resource) in resources.iter().enumerate() {
        let Some(count) = count(&resource.value, CONFIG_DESCRIPTORS, 0) else {
            return refuse(format!(
                "resources[{i}] is not a well-formed message or nests descriptors deeper than \
                 {MAX_DEPTH} levels"
            ));
        };
        descriptors += count;
        if descriptors > MAX_DESCRIPTORS {
            return refuse(format!(
                "the response holds more than {MAX_DESCRIPTORS} descriptors, the most slidegate \
                 accepts in one response"
            ));
        }
    }
    Ok(())
}

/// The field of `RateLimitConfig` that holds its descriptors.
const CONFIG_DESCRIPTORS: u64 = 3;
/// The field of `RateLimitDescriptor` that holds its children.
const CHILD_DESCRIPTORS: u64 = 4;

/// The descriptors in the message `bytes`, whose descriptors are field `field`, and in theirs;
/// `None` if the bytes are not a well-formed message or nest deeper than [`MAX_DEPTH`].
fn count(mut bytes: &[u8], field: u64, depth: usize) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut total = 0usize;
    while !bytes.is_empty() {
        let tag = varint(&mut bytes)?;
        match tag & 7 {
            0 => {
                varint(&mut bytes)?;
            }
            1 => bytes = bytes.get(8..)?,
            5 => bytes = bytes.get(4..)?,
            2 => {
                let length = usize::try_from(varint(&mut bytes)?).ok()?;
                let (inner, rest) = (bytes.get(..length)?, bytes.get(length..)?);
                if tag >> 3 == field {
                    total = total.checked_add(1 + count(inner, CHILD_DESCRIPTORS, depth + 1)?)?;
                }
                bytes = rest;
            }
            _ => return None,
        }
    }
    Some(total)
}

/// Reads a base-128 varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::config::source::xds::resource::RESOURCE_TYPE;
    use crate::config::source::xds::resource::proto::{RateLimitConfig, RateLimitDescriptor};

    fn node(key: &str, children: Vec<RateLimitDescriptor>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_owned(),
            value: "v".repeat(3),
            descriptors: children,
            ..RateLimitDescriptor::default()
        }
    }

    fn any(descriptors: Vec<RateLimitDescriptor>) -> Any {
        let config = RateLimitConfig {
            name: "n".into(),
            domain: "d".into(),
            descriptors,
        };
        Any {
            type_url: RESOURCE_TYPE.to_owned(),
            value: config.encode_to_vec(),
        }
    }

    #[test]
    fn counts_every_level() {
        let tree = vec![
            node(
                "a",
                vec![node("b", vec![node("c", vec![])]), node("d", vec![])],
            ),
            node("e", vec![]),
        ];
        let resource = any(tree);
        assert_eq!(count(&resource.value, CONFIG_DESCRIPTORS, 0), Some(5));
        assert!(check(&[resource.clone(), resource]).is_ok());
        assert_eq!(
            count(&[0x1a, 0x05, 0x00], CONFIG_DESCRIPTORS, 0),
            None,
            "cut short"
        );
    }

    #[test]
    fn a_response_over_a_bound_is_refused_naming_it() {
        let flat = (0..MAX_DESCRIPTORS / 2 + 1)
            .map(|_| node("k", vec![]))
            .collect::<Vec<_>>();
        let resource = any(flat);
        let refused = check(&[resource.clone(), resource])
            .err()
            .map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|m| m.contains("more than 50000 descriptors")),
            "{refused:?}"
        );
        let big = Any {
            type_url: RESOURCE_TYPE.to_owned(),
            value: vec![0; MAX_RESOURCE_BYTES + 1],
        };
        let refused = check(&[big]).err().map(|e| e.to_string());
        assert!(
            refused.as_deref().is_some_and(|m| m.contains("bytes")),
            "{refused:?}"
        );
        let mut deep = node("k", vec![]);
        for _ in 0..MAX_DEPTH + 2 {
            deep = node("k", vec![deep]);
        }
        let refused = check(&[any(vec![deep])]).err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|m| m.contains("deeper than 64")),
            "{refused:?}"
        );
    }
}
