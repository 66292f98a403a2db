//! A YAML map read into a [`Record`] field by field: merge keys (`<<`) in document order,
//! duplicate keys (the last one counts), and unknown keys named with a hint where one can be
//! guessed. Problems go to the findings and reading goes on, so one run reports them all.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::scalar::{Key, KeySeed, Scalar};
use super::{Cx, Findings, Record, child};

/// A record at `at`. `partial` for a map being merged in (`<<`), whose required fields may come
/// from elsewhere.
pub(super) struct RecordSeed<'a, T> {
    at: &'a str,
    findings: &'a RefCell<Findings>,
    partial: bool,
    record: PhantomData<T>,
}

impl<'a, T> RecordSeed<'a, T> {
    pub(super) fn new(at: &'a str, findings: &'a RefCell<Findings>, partial: bool) -> Self {
        RecordSeed {
            at,
            findings,
            partial,
            record: PhantomData,
        }
    }
}

impl<'de, T: Record> DeserializeSeed<'de> for RecordSeed<'_, T> {
    type Value = Option<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, T: Record> Visitor<'de> for RecordSeed<'_, T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
        let mut record = T::default();
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let name = match key {
                Key::Text(name) => name,
                Key::Other(found) => {
                    self.findings.borrow_mut().error(
                        self.at,
                        format!("keys must be strings, found {found} as a key"),
                    );
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if name == "<<" {
                self.merge_in(&mut record, &mut map)?;
                continue;
            }
            let cx = Cx {
                at: child(self.at, &name),
                findings: self.findings,
            };
            if !seen.insert(name.clone()) {
                cx.note(
                    "duplicate key: the last one is used, as envoyproxy/ratelimit does; remove \
                     the others",
                );
            }
            if !record.read_field(&name, &mut map, &cx)? {
                self.findings
                    .borrow_mut()
                    .error(self.at, unknown_field::<T>(&name));
                map.next_value::<IgnoredAny>()?;
            }
        }
        if !self.partial {
            record.check_required(self.at, &mut self.findings.borrow_mut());
        }
        Ok(Some(record))
    }

    fn visit_unit<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_none<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Option<T>, E> {
        Ok(self.not_a_map(Scalar::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Option<T>, E> {
        Ok(self.not_a_map(Scalar::Int(v.into())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Option<T>, E> {
        Ok(self.not_a_map(Scalar::Int(v.into())))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Option<T>, E> {
        Ok(self.not_a_map(Scalar::Float(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<T>, E> {
        Ok(self.not_a_map(Scalar::Str(v.to_owned())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(self.not_a_map(Scalar::Seq))
    }
}

impl<T: Record> RecordSeed<'_, T> {
    fn not_a_map(&self, found: Scalar) -> Option<T> {
        let mut findings = self.findings.borrow_mut();
        findings.error(
            self.at,
            format!("invalid type: {found}, expected {}", T::EXPECTING),
        );
        findings.unreadable.insert(self.at.to_owned());
        None
    }

    /// `<<: *alias` or `<<: [*a, *b]`: the merged maps' fields are set here, in document order
    /// (as yaml.v2 does); among several maps the first wins.
    fn merge_in<'de, A: MapAccess<'de>>(
        &self,
        record: &mut T,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let at = child(self.at, "<<");
        let merged = map.next_value_seed(MergeSeed::<T> {
            at: &at,
            findings: self.findings,
            record: PhantomData,
        })?;
        let mut findings = self.findings.borrow_mut();
        findings.note(
            &at,
            "merge key: the merged map's keys are used as if written here (YAML 1.1, as \
             envoyproxy/ratelimit reads it)",
        );
        for maps in merged.into_iter().rev() {
            for field in record.merge(maps) {
                findings.note(
                    &child(self.at, field),
                    "set before `<<` and replaced by the merged map's value (envoyproxy/ratelimit \
                     reads keys in order); put `<<` first",
                );
            }
        }
        Ok(())
    }
}

/// The maps of a merge key, in the order written.
struct MergeSeed<'a, T> {
    at: &'a str,
    findings: &'a RefCell<Findings>,
    record: PhantomData<T>,
}

impl<'de, T: Record> DeserializeSeed<'de> for MergeSeed<'_, T> {
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<T>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<T: Record> MergeSeed<'_, T> {
    fn wrong(&self, found: &Scalar) -> Vec<T> {
        self.findings.borrow_mut().error(
            self.at,
            format!("invalid type: {found}, expected a map or a list of maps to merge"),
        );
        Vec::new()
    }
}

impl<'de, T: Record> Visitor<'de> for MergeSeed<'_, T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map or a list of maps to merge")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
        let seed = RecordSeed::<T>::new(self.at, self.findings, true);
        Ok(seed.visit_map(map)?.into_iter().collect())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut maps = Vec::new();
        let mut i = 0;
        loop {
            let at = format!("{}[{i}]", self.at);
            let Some(map) =
                seq.next_element_seed(RecordSeed::<T>::new(&at, self.findings, true))?
            else {
                break;
            };
            maps.extend(map);
            i += 1;
        }
        Ok(maps)
    }

    fn visit_unit<E>(self) -> Result<Vec<T>, E> {
        Ok(self.wrong(&Scalar::Null))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Vec<T>, E> {
        Ok(self.wrong(&Scalar::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Vec<T>, E> {
        Ok(self.wrong(&Scalar::Int(v.into())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Vec<T>, E> {
        Ok(self.wrong(&Scalar::Int(v.into())))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Vec<T>, E> {
        Ok(self.wrong(&Scalar::Float(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Vec<T>, E> {
        Ok(self.wrong(&Scalar::Str(v.to_owned())))
    }
}

/// "unknown field `X`, expected one of `a`, `b`", with a hint where one can be guessed.
fn unknown_field<T: Record>(name: &str) -> String {
    let expected: Vec<String> = T::FIELDS.iter().map(|f| format!("`{f}`")).collect();
    let message = format!(
        "unknown field `{name}`, expected one of {}",
        expected.join(", ")
    );
    match hint(name, T::FIELDS) {
        Some(hint) => format!("{message} ({hint})"),
        None => message,
    }
}

/// A hint for an unknown field: a misspelling of a known one.
fn hint(unknown: &str, fields: &[&str]) -> Option<String> {
    let squash = |s: &str| s.replace(['_', '-'], "").to_ascii_lowercase();
    fields
        .iter()
        .find(|field| squash(field) == squash(unknown))
        .map(|field| format!("did you mean `{field}`?"))
}

#[cfg(test)]
mod tests {
    use super::hint;

    #[test]
    fn hints_for_misspelled_fields() {
        let fields = ["key", "rate_limit", "rate_limits"];
        assert_eq!(
            hint("ratelimit", &fields).as_deref(),
            Some("did you mean `rate_limit`?")
        );
        assert_eq!(hint("zzz", &fields), None);
    }
}
