//! A YAML list of records: each entry read as a record at its index (`descriptors[2]`), a null
//! or unreadable entry kept as `None` so that later entries keep their index.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::record::RecordSeed;
use super::scalar::Scalar;
use super::{Findings, Record};

/// A list of records at `at`.
pub(super) struct ListSeed<'a, T> {
    pub(super) at: &'a str,
    pub(super) findings: &'a RefCell<Findings>,
    pub(super) record: PhantomData<T>,
}

impl<'de, T: Record> DeserializeSeed<'de> for ListSeed<'_, T> {
    type Value = Option<Vec<Option<T>>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let found = deserializer.deserialize_any(ListVisitor {
            at: self.at,
            findings: self.findings,
            record: PhantomData,
        })?;
        Ok(match found {
            Ok(list) => list,
            Err(other) => {
                let mut findings = self.findings.borrow_mut();
                findings.error(self.at, format!("invalid type: {other}, expected a list"));
                findings.unreadable.insert(self.at.to_owned());
                None
            }
        })
    }
}

/// `Ok(None)` for null, `Err(found)` for anything but a list.
struct ListVisitor<'a, T> {
    at: &'a str,
    findings: &'a RefCell<Findings>,
    record: PhantomData<T>,
}

type ListOrNot<T> = Result<Option<Vec<Option<T>>>, Scalar>;

impl<'de, T: Record> Visitor<'de> for ListVisitor<'_, T> {
    type Value = ListOrNot<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ListOrNot<T>, A::Error> {
        let mut list = Vec::new();
        loop {
            let at = format!("{}[{}]", self.at, list.len());
            let errors_before = self.findings.borrow().errors.len();
            match seq.next_element_seed(RecordSeed::<T>::new(&at, self.findings, false))? {
                Some(entry) => {
                    if entry.is_none() && self.findings.borrow().errors.len() == errors_before {
                        // A null entry (`- ~`, or `-` alone): not a rule to skip in silence.
                        let mut findings = self.findings.borrow_mut();
                        findings.error(
                            &at,
                            format!("invalid type: null, expected {}", T::EXPECTING),
                        );
                    }
                    list.push(entry);
                }
                None => break,
            }
        }
        Ok(Ok(Some(list)))
    }

    fn visit_unit<E>(self) -> Result<ListOrNot<T>, E> {
        Ok(Ok(None))
    }
    fn visit_none<E>(self) -> Result<ListOrNot<T>, E> {
        Ok(Ok(None))
    }
    fn visit_bool<E>(self, v: bool) -> Result<ListOrNot<T>, E> {
        Ok(Err(Scalar::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<ListOrNot<T>, E> {
        Ok(Err(Scalar::Int(v.into())))
    }
    fn visit_u64<E>(self, v: u64) -> Result<ListOrNot<T>, E> {
        Ok(Err(Scalar::Int(v.into())))
    }
    fn visit_f64<E>(self, v: f64) -> Result<ListOrNot<T>, E> {
        Ok(Err(Scalar::Float(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<ListOrNot<T>, E> {
        Ok(Err(Scalar::Str(v.to_owned())))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListOrNot<T>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Err(Scalar::Map))
    }
}
