//! Reading a rule file's YAML as envoyproxy/ratelimit's parser (Go's yaml.v2, YAML 1.1) reads it.
//!
//! yaml_serde reads YAML 1.2, where `yes`, `010` and `1_000` are strings and a key may appear once.
//! Rule files written for envoyproxy/ratelimit rely on YAML 1.1 as yaml.v2 reads it:
//! - merge keys (`<<: *defaults`, or a list of aliases: the first one wins), applied in document
//!   order: keys after `<<` override merged ones, keys before it are overridden;
//! - booleans `y`/`yes`/`on`/`n`/`no`/`off` (any of their capitalisations);
//! - integers with a leading zero (octal: `010` is 8) or `_` between digits (`1_000`);
//! - a duplicate key: the last one counts (a map under a duplicate key is merged field by field);
//! - several documents in a file: the first one counts.
//!
//! Each of these is a [`Findings::notes`] entry, so `check-config` can say what was read
//! differently from a strict reading. Everything else stays strict: unknown keys, wrong types
//! and quoted numbers are errors, and reading goes on past them, so that one run reports every
//! problem of a file. Only a YAML syntax error, or a map or list where text belongs, stops it.
//!
//! Strings are the scalar's text as written (`value: 010` is the string `010`), as yaml.v2
//! gives a Go string field.
//!
//! The parts: `scalar` reads one value as yaml_serde resolves it, or as written; `yaml11` reads
//! the scalars yaml.v2 resolves differently (booleans, integers); `record` reads a map into a
//! [`Record`], merge keys and duplicate keys included, and names unknown fields; `list` reads a
//! list of records. This file holds what a record's fields see ([`Cx`]) and what the reading
//! found ([`Findings`]).

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, MapAccess};

mod list;
mod record;
mod scalar;
mod yaml11;

use list::ListSeed;
use record::RecordSeed;
use scalar::{Scalar, ScalarSeed, TextSeed};
use yaml11::{yaml11_bool, yaml11_int};

/// What reading one file found besides its model.
#[derive(Debug, Default)]
pub(super) struct Findings {
    /// `path: message`, one per problem.
    pub errors: Vec<String>,
    /// `path: message`, one per value read differently from a strict reading.
    pub notes: Vec<String>,
    /// Paths whose value was there but unreadable: checks for a missing value skip them.
    pub unreadable: HashSet<String>,
}

impl Findings {
    fn error(&mut self, at: &str, message: impl fmt::Display) {
        self.errors.push(located(at, message));
    }

    fn note(&mut self, at: &str, message: impl fmt::Display) {
        self.notes.push(located(at, message));
    }
}

fn located(at: &str, message: impl fmt::Display) -> String {
    if at.is_empty() {
        message.to_string()
    } else {
        format!("{at}: {message}")
    }
}

/// `parent.name`, or `name` at the top.
pub(super) fn child(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// Reads the first document of `text` as a `T`. `Err` only for what stops reading (a syntax
/// error); every other problem is in the findings.
pub(super) fn read_document<T: Record>(text: &str) -> Result<(Option<T>, Findings), String> {
    let findings = RefCell::new(Findings::default());
    let mut documents = serde_yaml::Deserializer::from_str(text);
    let model = match documents.next() {
        Some(document) => RecordSeed::<T>::new("", &findings, false)
            .deserialize(document)
            .map_err(|e| e.to_string())?,
        None => None,
    };
    if documents.next().is_some() {
        findings.borrow_mut().note(
            "",
            "more than one document (`---`): only the first is read, as envoyproxy/ratelimit \
             does; put each domain in its own file",
        );
    }
    Ok((model, findings.into_inner()))
}

/// A YAML map read into a struct of optional fields.
pub(super) trait Record: Default + Sized {
    /// What the map should be, for errors: "a descriptor: a map with ...".
    const EXPECTING: &'static str;
    /// The known keys, for "unknown field" errors.
    const FIELDS: &'static [&'static str];

    /// Reads the value of key `name`; `Ok(false)` when `name` is not a field (the value is left
    /// unread).
    fn read_field<'de, A: MapAccess<'de>>(
        &mut self,
        name: &str,
        map: &mut A,
        cx: &Cx<'_>,
    ) -> Result<bool, A::Error>;

    /// Takes every field `other` sets; a record-valued field set on both sides is merged field by
    /// field (yaml.v2 decodes into the existing struct). Returns the fields set on both sides.
    fn merge(&mut self, other: Self) -> Vec<&'static str>;

    /// Errors for required fields that are missing, once the whole map is read.
    fn check_required(&self, _at: &str, _findings: &mut Findings) {}
}

/// Where a value is, and where to report.
pub(super) struct Cx<'a> {
    pub at: String,
    findings: &'a RefCell<Findings>,
}

impl Cx<'_> {
    fn invalid(&self, found: &Scalar, expected: &str) {
        let mut findings = self.findings.borrow_mut();
        findings.error(
            &self.at,
            format!("invalid type: {found}, expected {expected}"),
        );
        findings.unreadable.insert(self.at.clone());
    }

    fn note(&self, message: impl fmt::Display) {
        self.findings.borrow_mut().note(&self.at, message);
    }

    /// Text as written; `None` for null (`~`, `null`, nothing), as yaml.v2's empty string.
    pub fn text<'de, A: MapAccess<'de>>(&self, map: &mut A) -> Result<Option<String>, A::Error> {
        map.next_value_seed(TextSeed)
    }

    /// A boolean, YAML 1.1's words included.
    pub fn flag<'de, A: MapAccess<'de>>(&self, map: &mut A) -> Result<Option<bool>, A::Error> {
        let scalar = map.next_value_seed(ScalarSeed)?;
        Ok(match scalar {
            Scalar::Null => None,
            Scalar::Bool(b) => Some(b),
            Scalar::Str(ref text) => match yaml11_bool(text) {
                Some(b) => {
                    self.note(format!(
                        "`{text}` read as {b} (a YAML 1.1 boolean, as envoyproxy/ratelimit reads \
                         it; write `{b}`)"
                    ));
                    Some(b)
                }
                None => {
                    self.invalid(&scalar, "a boolean (true or false)");
                    None
                }
            },
            other => {
                self.invalid(&other, "a boolean (true or false)");
                None
            }
        })
    }

    /// A whole number, 0 or more, YAML 1.1's octal and `_` forms included.
    pub fn count<'de, A: MapAccess<'de>>(&self, map: &mut A) -> Result<Option<u64>, A::Error> {
        const EXPECTED: &str = "a whole number, 0 or more";
        let scalar = map.next_value_seed(ScalarSeed)?;
        Ok(match scalar {
            Scalar::Null => None,
            Scalar::Int(n) => match u64::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    self.invalid(&scalar, EXPECTED);
                    None
                }
            },
            Scalar::Str(ref text) => match yaml11_int(text) {
                Some(n) => {
                    self.note(format!(
                        "`{text}` read as {n} (a YAML 1.1 integer: a leading 0 means octal and \
                         `_` separates digits, as envoyproxy/ratelimit reads it; write `{n}`)"
                    ));
                    Some(n)
                }
                None => {
                    self.invalid(&scalar, EXPECTED);
                    None
                }
            },
            other => {
                self.invalid(&other, EXPECTED);
                None
            }
        })
    }

    /// A nested record.
    pub fn record<'de, T: Record, A: MapAccess<'de>>(
        &self,
        map: &mut A,
    ) -> Result<Option<T>, A::Error> {
        map.next_value_seed(RecordSeed::<T>::new(&self.at, self.findings, false))
    }

    /// A list of records; an entry that is not a map is `None` (and an error), so that later
    /// entries keep their index.
    pub fn list<'de, T: Record, A: MapAccess<'de>>(
        &self,
        map: &mut A,
    ) -> Result<Option<Vec<Option<T>>>, A::Error> {
        map.next_value_seed(ListSeed::<T> {
            at: &self.at,
            findings: self.findings,
            record: PhantomData,
        })
    }
}

/// `Some(new)` merged into `old` field by field when both are set (see [`Record::merge`]).
pub(super) fn merge_record<T: Record>(old: &mut Option<T>, new: Option<T>) {
    match (old.as_mut(), new) {
        (Some(old), Some(new)) => {
            old.merge(new);
        }
        (None, Some(new)) => *old = Some(new),
        (_, None) => {}
    }
}
