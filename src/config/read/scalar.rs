//! One value as yaml_serde resolves it (YAML 1.2), for checking its type and saying what was
//! found instead; text as written (yaml.v2 gives a Go string field the scalar's text); map keys.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// One scalar as yaml_serde resolves it (YAML 1.2), or the kind of collection found instead.
#[derive(Debug)]
pub(super) enum Scalar {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq,
    Map,
}

impl fmt::Display for Scalar {
    /// As serde's `Unexpected`: "integer `-5`", "string \"ten\"".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Null => f.write_str("null"),
            Scalar::Bool(b) => write!(f, "boolean `{b}`"),
            Scalar::Int(n) => write!(f, "integer `{n}`"),
            Scalar::Float(x) => write!(f, "floating point `{x}`"),
            Scalar::Str(s) => write!(f, "string {s:?}"),
            Scalar::Seq => f.write_str("sequence"),
            Scalar::Map => f.write_str("map"),
        }
    }
}

pub(super) struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Scalar, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }
    fn visit_u128<E>(self, v: u128) -> Result<Scalar, E> {
        // Beyond i128 is beyond any field's range anyway.
        Ok(Scalar::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Map)
    }
}

/// Text as written, or `None` for null.
pub(super) struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        // `deserialize_str` gives a plain scalar's text as written, whatever it resolves to.
        d.deserialize_str(AsWritten).map(Some)
    }
}

struct AsWritten;

impl Visitor<'_> for AsWritten {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
}

/// A map key: text, or a description of a key that is not text.
pub(super) enum Key {
    Text(String),
    Other(Scalar),
}

pub(super) struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key, D::Error> {
        Ok(match ScalarSeed.deserialize(deserializer)? {
            Scalar::Str(text) => Key::Text(text),
            // yaml.v2 gives a struct key's text as written; these are never field names.
            other => Key::Other(other),
        })
    }
}
