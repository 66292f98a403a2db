//! Counter identities and their injective encoding.
//!
//! A counter is identified by its domain, the descriptor entries as matched and the window length.
//! The encoding must be injective: no descriptor value (which clients choose) may produce another
//! counter's key. Every component is percent-encoded with `%`, the separators `:` and `=`, the hash
//! tag braces `{`/`}`, whitespace, controls and non-ASCII escaped, so the separators that remain are
//! unambiguous.
//!
//! The form is `{domain:k1=v1:k2=v2}W` where `W` is the window in milliseconds
//! (`{api:user=alice}86400000`). The representation (exact log or buckets of a width) is not part
//! of it, as envoyproxy/ratelimit keys a counter by its entries and window only: a descriptor has
//! one counter per window whatever precision a rule or a limit override asks for, and a reload that
//! changes the precision carries the counter's hits over instead of starting a new one. The braces make the
//! domain and entries a Redis Cluster hash tag: all windows of one descriptor land on one slot, so
//! several limits on one descriptor stay atomic even in a cluster. Because `{` and `}` never occur
//! inside the tag, the tag is always exactly that part, whatever the values.
//!
//! The encoding is built in two steps, so that the hot path escapes as little as possible:
//! - a [`TagTemplate`] holds what the config fixes for one rule path, escaped once at config load:
//!   `{domain` and each `:key=`;
//! - a [`CounterTag`] is one descriptor's `{...}`, built once per request descriptor (from a
//!   template, escaping only the request's values; or from scratch for a limit override), and
//!   each of the descriptor's windows derives its [`CounterKey`] from it.
//!
//! All paths produce the same bytes as [`CounterKey::new`]: keys already in Redis keep their meaning.

use std::fmt::{self, Write};
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

/// Bytes escaped in key components (plus all non-ASCII, which `percent_encoding` always escapes).
/// [`is_plain`] is its complement and must change with it.
const ESCAPED: &AsciiSet = &CONTROLS
    .add(b'%')
    .add(b':')
    .add(b'=')
    .add(b'{')
    .add(b'}')
    .add(b' ');

/// Room reserved after a tag for the window's digits (`u128::MAX` has 39; a window of 100 years
/// takes 13), so that deriving a counter key never grows the buffer.
const WINDOW_DIGITS: usize = 39;

/// The bytes of a long key kept readable in its [`CounterKey::compact`] form.
pub const COMPACT_PREFIX: usize = 48;

/// The encoded identity of one counter. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey(Arc<str>);

impl CounterKey {
    /// Encodes a counter identity, escaping every component. The hot path derives keys from a
    /// [`CounterTag`] instead; this is the reference it must agree with.
    pub fn new<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
        window: Duration,
    ) -> Self {
        CounterTag::new(domain, entries).counter_key(window)
    }

    /// The encoded form, e.g. `{api:user=alice}60000`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This key if it is at most `max` bytes long, else a short stand-in that names the same
    /// counter: `#`, the key's first bytes (up to [`COMPACT_PREFIX`], for whoever reads it), `#` and
    /// the SHA-256 of the whole key in hex. Every encoded key starts with `{`, so no key stands
    /// for itself in this form: distinct keys keep distinct stand-ins. The memory store keeps long
    /// keys this way, so a client that sends 4 KiB values makes counters of about 150 bytes.
    pub fn compact(&self, max: usize) -> CounterKey {
        if self.0.len() <= max {
            return self.clone();
        }
        let mut prefix = COMPACT_PREFIX.min(self.0.len());
        while !self.0.is_char_boundary(prefix) {
            prefix -= 1;
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, self.0.as_bytes());
        let mut text = String::with_capacity(2 + prefix + 2 * digest.as_ref().len());
        text.push('#');
        text.push_str(&self.0[..prefix]);
        text.push('#');
        for byte in digest.as_ref() {
            // Writing to a String cannot fail.
            let _ = write!(text, "{byte:02x}");
        }
        CounterKey(text.into())
    }

    /// The domain and entries this key encodes, decoded (bytes that are not UTF-8 replaced);
    /// `None` for a [`CounterKey::compact`] stand-in, which no longer holds them.
    pub fn decode(&self) -> Option<(String, Vec<(String, String)>)> {
        if !self.0.starts_with('{') {
            return None;
        }
        let text = |part: &str| percent_decode_str(part).decode_utf8_lossy().into_owned();
        let mut parts = self.hash_tag().split(':');
        let domain = text(parts.next()?);
        let entries = parts
            .map(|entry| {
                let (key, value) = entry.split_once('=')?;
                Some((text(key), text(value)))
            })
            .collect::<Option<Vec<_>>>()?;
        Some((domain, entries))
    }

    /// The Redis Cluster hash tag: the part between the braces.
    pub fn hash_tag(&self) -> &str {
        let end = self.0.find('}').unwrap_or(self.0.len());
        &self.0[1.min(self.0.len())..end]
    }
}

impl fmt::Display for CounterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The escaped parts of a counter tag that one rule path fixes: `{domain`, then `:key=` for each
/// level. Every descriptor that reaches the path has exactly these keys (matching compares them
/// exactly), so they are escaped once at config load and only the request's values are escaped
/// per request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TagTemplate {
    /// `{` and the escaped domain.
    domain: Box<str>,
    /// `:key=` with the key escaped, one per descriptor entry, in order.
    keys: Vec<Box<str>>,
    /// The bytes of `domain` and `keys` together, to size a tag's buffer in one allocation.
    fixed_len: usize,
}

impl TagTemplate {
    /// The template of a domain with no entries yet.
    pub fn new(domain: &str) -> Self {
        let mut encoded = String::from("{");
        push_escaped(&mut encoded, domain);
        TagTemplate {
            fixed_len: encoded.len(),
            domain: encoded.into(),
            keys: Vec::new(),
        }
    }

    /// This template one level deeper: the entry `key` follows the existing ones.
    pub fn with_key(&self, key: &str) -> Self {
        let mut encoded = String::from(":");
        push_escaped(&mut encoded, key);
        encoded.push('=');
        let mut deeper = self.clone();
        deeper.fixed_len += encoded.len();
        deeper.keys.push(encoded.into());
        deeper
    }

    /// The tag of a descriptor that matched this template's path, from its counter values (one per
    /// key, in order). Only the values are escaped.
    pub fn tag<'v>(&self, values: impl Iterator<Item = &'v str> + Clone) -> CounterTag {
        debug_assert_eq!(values.clone().count(), self.keys.len(), "one value per key");
        let values_len: usize = values.clone().map(str::len).sum();
        let mut text = String::with_capacity(self.fixed_len + values_len + 1 + WINDOW_DIGITS);
        text.push_str(&self.domain);
        for (key, value) in self.keys.iter().zip(values) {
            text.push_str(key);
            push_escaped(&mut text, value);
        }
        CounterTag::close(text)
    }
}

/// One descriptor's counter tag, `{domain:k1=v1:k2=v2}`: the part every window's counter key
/// shares. Built once per descriptor, so a rule with several windows escapes nothing twice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterTag {
    /// The tag, followed by the digits of the last window asked for.
    text: String,
    /// Where the tag ends in `text`.
    tag_len: usize,
}

impl CounterTag {
    /// Escapes the domain and every key and value. For descriptors without a rule (limit
    /// overrides), which have no [`TagTemplate`].
    pub fn new<'a>(domain: &str, entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut text = String::with_capacity(64);
        text.push('{');
        push_escaped(&mut text, domain);
        for (key, value) in entries {
            text.push(':');
            push_escaped(&mut text, key);
            text.push('=');
            push_escaped(&mut text, value);
        }
        CounterTag::close(text)
    }

    /// Ends an open tag (`{...` with the entries) with its `}`.
    fn close(mut text: String) -> Self {
        text.push('}');
        CounterTag {
            tag_len: text.len(),
            text,
        }
    }

    /// The tag, braces included, e.g. `{api:user=alice}`.
    pub fn as_str(&self) -> &str {
        &self.text[..self.tag_len]
    }

    /// The key of this descriptor's counter for `window`: the tag and the window in
    /// milliseconds, whatever the counter's representation. Takes `&mut self` because the digits
    /// are written after the tag in the tag's own buffer, so the key costs one allocation (its
    /// `Arc<str>`) and no intermediate `String`.
    pub fn counter_key(&mut self, window: Duration) -> CounterKey {
        self.text.truncate(self.tag_len);
        // itoa, not `write!`: the formatting machinery cost some 250 instructions a key.
        self.text
            .push_str(itoa::Buffer::new().format(window.as_millis()));
        CounterKey(Arc::from(self.text.as_str()))
    }
}

/// Appends `component` escaped. Most components (ids, addresses, paths) need no escaping: a scan of
/// their bytes finds that and copies them whole, without going through the encoder.
fn push_escaped(out: &mut String, component: &str) {
    if component.bytes().all(is_plain) {
        out.push_str(component);
    } else {
        for part in utf8_percent_encode(component, ESCAPED) {
            out.push_str(part);
        }
    }
}

/// Whether `byte` stays as it is: printable ASCII that is not in [`ESCAPED`] (which holds the
/// controls, space and `%:={}`; non-ASCII bytes are always escaped).
fn is_plain(byte: u8) -> bool {
    byte.is_ascii_graphic() && !matches!(byte, b'%' | b':' | b'=' | b'{' | b'}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn readable_form() {
        let key = CounterKey::new("api", [("user", "alice"), ("path", "/login")], MIN);
        assert_eq!(key.as_str(), "{api:user=alice:path=/login}60000");
        assert_eq!(key.hash_tag(), "api:user=alice:path=/login");
    }

    #[test]
    fn long_keys_compact_to_distinct_stand_ins() {
        let short = CounterKey::new("api", [("user", "alice")], MIN);
        assert_eq!(short.compact(64), short);
        let long = |value: &str| CounterKey::new("api", [("user", value)], MIN);
        let a = long(&"é".repeat(100)).compact(64);
        let b = long(&format!("{}x", "é".repeat(100))).compact(64);
        assert_ne!(a, b);
        assert_eq!(
            a,
            long(&"é".repeat(100)).compact(64),
            "the same key, the same stand-in"
        );
        assert!(a.as_str().starts_with("#{api:user=%C3%A9"), "{a}");
        assert!(a.as_str().len() <= 2 + COMPACT_PREFIX + 64, "{a}");
        // The stand-in's own text, as a key, is kept as it is or compacted again: never the same.
        assert_ne!(a.compact(1000), long(a.as_str()).compact(1000));
    }

    #[test]
    fn separators_in_values_cannot_collide() {
        let a = CounterKey::new("d", [("k", "a:b=c")], MIN);
        let b = CounterKey::new("d", [("k", "a"), ("b", "c")], MIN);
        assert_ne!(a, b);
        let c = CounterKey::new("d", [("k", "v}1000{x")], MIN);
        assert_eq!(c.hash_tag(), "d:k=v%7D1000%7Bx");
        let d = CounterKey::new("d:k=v", [], MIN);
        let e = CounterKey::new("d", [("k", "v")], MIN);
        assert_ne!(d, e);
        let f = CounterKey::new("d", [("k", "%3A")], MIN);
        let g = CounterKey::new("d", [("k", ":")], MIN);
        assert_ne!(f, g);
        let h = CounterKey::new("d", [("k", "a\nb")], MIN);
        assert!(!h.as_str().contains('\n'));
    }

    #[test]
    fn window_is_part_of_identity_but_not_of_the_tag() {
        let a = CounterKey::new("d", [("k", "v")], MIN);
        let b = CounterKey::new("d", [("k", "v")], Duration::from_secs(1));
        assert_ne!(a, b);
        assert_eq!(a.hash_tag(), b.hash_tag());
    }

    #[test]
    fn one_tag_gives_every_window_its_key() {
        let template = TagTemplate::new("api").with_key("user").with_key("path");
        let mut tag = template.tag(["a b", "/login"].into_iter());
        assert_eq!(tag.as_str(), "{api:user=a%20b:path=/login}");
        assert_eq!(
            tag.counter_key(MIN).as_str(),
            "{api:user=a%20b:path=/login}60000"
        );
        let second = tag.counter_key(Duration::from_secs(1));
        assert_eq!(second.as_str(), "{api:user=a%20b:path=/login}1000");
        assert_eq!(tag.as_str(), "{api:user=a%20b:path=/login}");
        assert_eq!(tag.counter_key(MIN).hash_tag(), second.hash_tag());
    }

    /// Pins the escaped set byte by byte, as keys in production were written: printable ASCII
    /// except `%:={}` stays, everything else becomes `%XX` (upper-case hex) per UTF-8 byte. The
    /// fast path ([`is_plain`]) and the encoder ([`ESCAPED`]) must agree on every byte.
    #[test]
    fn keys_decode_to_their_domain_and_entries() {
        let key = CounterKey::new(
            "api:v1",
            [("user", "al=ice:{x}"), ("path", "/é %")],
            Duration::from_secs(60),
        );
        let (domain, entries) = key.decode().expect("decodes");
        assert_eq!(domain, "api:v1");
        assert_eq!(
            entries,
            [
                ("user".to_string(), "al=ice:{x}".to_string()),
                ("path".to_string(), "/é %".to_string())
            ]
        );
        assert_eq!(key.compact(10).decode(), None);
    }

    #[test]
    fn escaped_bytes_are_pinned() {
        for byte in 0u8..=127 {
            let text = char::from(byte).to_string();
            let plain = (0x21..=0x7e).contains(&byte) && !b"%:={}".contains(&byte);
            let expected = if plain {
                text.clone()
            } else {
                format!("%{byte:02X}")
            };
            let mut fast = String::new();
            push_escaped(&mut fast, &text);
            assert_eq!(fast, expected, "byte {byte:#04x}");
            let encoder = utf8_percent_encode(&text, ESCAPED).to_string();
            assert_eq!(encoder, expected, "byte {byte:#04x}");
        }
        let mut non_ascii = String::new();
        push_escaped(&mut non_ascii, "é€");
        assert_eq!(non_ascii, "%C3%A9%E2%82%AC");
    }

    /// The encoding as first written, with the encoder on every component: the reference that
    /// every way of building a key must reproduce byte for byte.
    fn reference(domain: &str, entries: &[(String, String)], window: Duration) -> String {
        let escape = |text: &str| utf8_percent_encode(text, ESCAPED).to_string();
        let mut out = format!("{{{}", escape(domain));
        for (key, value) in entries {
            out.push_str(&format!(":{}={}", escape(key), escape(value)));
        }
        out.push_str(&format!("}}{}", window.as_millis()));
        out
    }

    /// Plain text (the fast path), the escaped characters, and anything at all.
    fn component() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9/._~-]{0,10}",
            "[%:={} a-z\\x00-\\x1f\\x7f\u{e9}\u{20ac}\u{1f600}]{0,10}",
            any::<String>(),
        ]
    }

    /// Config-like windows and arbitrary ones (sub-millisecond parts are dropped by the encoding).
    fn window() -> impl Strategy<Value = Duration> {
        prop_oneof![
            prop::sample::select(vec![1u64, 60, 3_600, 86_400, 30 * 86_400])
                .prop_map(Duration::from_secs),
            (any::<u64>(), 0u32..1_000_000_000)
                .prop_map(|(secs, nanos)| Duration::new(secs, nanos)),
        ]
    }

    proptest! {
        #[test]
        fn template_and_scratch_paths_encode_like_counter_key_new(
            domain in component(),
            entries in prop::collection::vec((component(), component()), 1..=3),
            windows in prop::collection::vec(window(), 1..=4),
        ) {
            let borrowed = || entries.iter().map(|(key, value)| (key.as_str(), value.as_str()));
            let template = entries
                .iter()
                .fold(TagTemplate::new(&domain), |template, (key, _)| template.with_key(key));
            let mut from_template = template.tag(entries.iter().map(|(_, value)| value.as_str()));
            let mut from_scratch = CounterTag::new(&domain, borrowed());
            prop_assert_eq!(from_template.as_str(), from_scratch.as_str());
            for &window in &windows {
                let expected = reference(&domain, &entries, window);
                let new = CounterKey::new(&domain, borrowed(), window);
                prop_assert_eq!(new.as_str(), expected.as_str());
                prop_assert_eq!(from_template.counter_key(window), new.clone());
                prop_assert_eq!(from_scratch.counter_key(window), new);
            }
        }
    }
}
