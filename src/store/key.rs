//! Counter identities and their injective encoding.
//!
//! A counter is identified by its domain, the descriptor entries as matched and the window length.
//! The encoding must be injective: no descriptor value (which clients choose) may produce another
//! counter's key. Every component is percent-encoded with `%`, the separators `:` and `=`, the hash
//! tag braces `{`/`}`, whitespace, controls and non-ASCII escaped, so the separators that remain are
//! unambiguous.
//!
//! The form is `{domain:k1=v1:k2=v2}W` where `W` is the window in milliseconds. The braces make the
//! domain and entries a Redis Cluster hash tag: all windows of one descriptor land on one slot, so
//! several limits on one descriptor stay atomic even in a cluster. Because `{` and `}` never occur
//! inside the tag, the tag is always exactly that part, whatever the values.

use std::fmt::{self, Write};
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

/// Bytes escaped in key components (plus all non-ASCII, which `percent_encoding` always escapes).
const ESCAPED: &AsciiSet = &CONTROLS
    .add(b'%')
    .add(b':')
    .add(b'=')
    .add(b'{')
    .add(b'}')
    .add(b' ');

/// The encoded identity of one counter. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey(Arc<str>);

impl CounterKey {
    /// Encodes a counter identity.
    pub fn new<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
        window: Duration,
    ) -> Self {
        let mut out = String::with_capacity(64);
        out.push('{');
        push_escaped(&mut out, domain);
        for (key, value) in entries {
            out.push(':');
            push_escaped(&mut out, key);
            out.push('=');
            push_escaped(&mut out, value);
        }
        out.push('}');
        // Writing to a String cannot fail.
        let _ = write!(out, "{}", window.as_millis());
        CounterKey(out.into())
    }

    /// The encoded form, e.g. `{api:user=alice}60000`.
    pub fn as_str(&self) -> &str {
        &self.0
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

fn push_escaped(out: &mut String, component: &str) {
    for part in utf8_percent_encode(component, ESCAPED) {
        out.push_str(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn readable_form() {
        let key = CounterKey::new("api", [("user", "alice"), ("path", "/login")], MIN);
        assert_eq!(key.as_str(), "{api:user=alice:path=/login}60000");
        assert_eq!(key.hash_tag(), "api:user=alice:path=/login");
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
}
