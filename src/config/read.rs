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

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

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

/// yaml.v2's booleans that YAML 1.2 reads as strings.
fn yaml11_bool(text: &str) -> Option<bool> {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// yaml.v2's integers that YAML 1.2 reads as strings: `_` between digits, or a leading 0
/// (octal; Go's `strconv.ParseInt(text, 0, 64)` after dropping `_`, then its float fallback,
/// which reads `09` as 9). Anything YAML 1.2 reads as a string for another reason (it was
/// quoted: `"10"`) is `None`: yaml.v2 rejects a quoted number too.
fn yaml11_int(text: &str) -> Option<u64> {
    let plain = text.replace('_', "");
    let unsigned = plain.strip_prefix('+').unwrap_or(&plain);
    let all_digits = !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = all_digits && unsigned.len() > 1 && unsigned.starts_with('0');
    if !text.contains('_') && !leading_zero {
        return None;
    }
    let prefixed = |prefix: &str| {
        unsigned
            .strip_prefix(prefix)
            .or_else(|| unsigned.strip_prefix(&prefix.to_ascii_uppercase()))
    };
    let (digits, radix) = if let Some(hex) = prefixed("0x") {
        (hex, 16)
    } else if let Some(binary) = prefixed("0b") {
        (binary, 2)
    } else if let Some(octal) = prefixed("0o") {
        (octal, 8)
    } else if leading_zero {
        (&unsigned[1..], 8)
    } else {
        (unsigned, 10)
    };
    if digits.starts_with(['+', '-']) {
        return None;
    }
    u64::from_str_radix(digits, radix)
        .ok()
        .or_else(|| all_digits.then(|| unsigned.parse().ok()).flatten())
}

/// One scalar as yaml_serde resolves it (YAML 1.2), or the kind of collection found instead.
#[derive(Debug)]
enum Scalar {
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

struct ScalarSeed;

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
struct TextSeed;

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
enum Key {
    Text(String),
    Other(Scalar),
}

struct KeySeed;

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

/// A record at `at`. `partial` for a map being merged in (`<<`), whose required fields may come
/// from elsewhere.
struct RecordSeed<'a, T> {
    at: &'a str,
    findings: &'a RefCell<Findings>,
    partial: bool,
    record: PhantomData<T>,
}

impl<'a, T> RecordSeed<'a, T> {
    fn new(at: &'a str, findings: &'a RefCell<Findings>, partial: bool) -> Self {
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

/// A list of records at `at`.
struct ListSeed<'a, T> {
    at: &'a str,
    findings: &'a RefCell<Findings>,
    record: PhantomData<T>,
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

/// envoyproxy/ratelimit features that slidegate does not implement, with what to do instead.
const UNSUPPORTED: &[(&str, &str)] = &[(
    "quota_mode",
    "envoyproxy/ratelimit's quota_mode is not supported by slidegate",
)];

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

/// A hint for an unknown field: unsupported, or a misspelling of a known one.
fn hint(unknown: &str, fields: &[&str]) -> Option<String> {
    if let Some((_, hint)) = UNSUPPORTED.iter().find(|(field, _)| *field == unknown) {
        return Some((*hint).to_owned());
    }
    let squash = |s: &str| s.replace(['_', '-'], "").to_ascii_lowercase();
    fields
        .iter()
        .find(|field| squash(field) == squash(unknown))
        .map(|field| format!("did you mean `{field}`?"))
}

#[cfg(test)]
mod tests {
    use super::{hint, yaml11_bool, yaml11_int};

    #[test]
    fn hints_for_misspelled_and_unsupported_fields() {
        let fields = ["key", "rate_limit", "rate_limits"];
        assert_eq!(
            hint("ratelimit", &fields).as_deref(),
            Some("did you mean `rate_limit`?")
        );
        assert!(hint("quota_mode", &fields).is_some_and(|h| h.contains("not supported")));
        assert_eq!(hint("zzz", &fields), None);
    }

    #[test]
    fn yaml11_integers_as_yaml_v2_reads_them() {
        assert_eq!(yaml11_int("010"), Some(8));
        assert_eq!(yaml11_int("0777"), Some(511));
        assert_eq!(yaml11_int("1_000"), Some(1000));
        assert_eq!(yaml11_int("0x_10"), Some(16));
        assert_eq!(yaml11_int("+0_10"), Some(8));
        // Go's float fallback: not octal, but a number.
        assert_eq!(yaml11_int("09"), Some(9));
        // What YAML 1.2 also reads, or a quoted number: not ours to reinterpret.
        assert_eq!(yaml11_int("10"), None);
        assert_eq!(yaml11_int("ten"), None);
        assert_eq!(yaml11_int("-1_0"), None);
        assert_eq!(yaml11_int("1_0.5"), None);
        assert_eq!(yaml11_int("0"), None);
    }

    #[test]
    fn yaml11_booleans() {
        for word in ["y", "Y", "yes", "Yes", "YES", "on", "On", "ON"] {
            assert_eq!(yaml11_bool(word), Some(true), "{word}");
        }
        for word in ["n", "N", "no", "No", "NO", "off", "Off", "OFF"] {
            assert_eq!(yaml11_bool(word), Some(false), "{word}");
        }
        assert_eq!(yaml11_bool("true"), None);
        assert_eq!(yaml11_bool("yEs"), None);
    }
}
