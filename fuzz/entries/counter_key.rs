//! Counter-key encoding: a domain and entries (lines of the input; `key<TAB>value`) and a window
//! make a key that decodes to exactly them, so distinct inputs never share a counter; the
//! per-request path (a rule's template, then the request's values) makes the same key; a
//! compacted key stays within its length; descriptor bytes read as text keep distinct bytes
//! distinct.

use std::time::Duration;

use slidegate::limiter::{entry_text, entry_text_owned};
use slidegate::store::key::{CounterKey, TagTemplate};

pub fn run(data: &[u8]) {
    // Bytes as a descriptor's key or value: two different byte strings never read as one text.
    let (a, b) = data.split_at(data.len() / 2);
    if a != b {
        assert_ne!(entry_text(a), entry_text(b));
    }
    assert_eq!(entry_text(a), entry_text_owned(a.to_vec()).0);

    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let domain = lines.next().unwrap_or_default();
    let entries: Vec<(&str, &str)> = lines
        .map(|line| line.split_once('\t').unwrap_or((line, "")))
        .collect();
    let millis = data.iter().map(|b| u64::from(*b)).sum::<u64>() * 977;
    let window = Duration::from_millis(millis);
    let key = CounterKey::new(domain, entries.iter().copied(), window);
    let owned: Vec<(String, String)> = (entries.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(key.decode(), Some((domain.to_string(), owned)));
    let (tag, window_part) = key.as_str().rsplit_once('}').expect("a closing brace");
    assert_eq!(window_part, millis.to_string());
    assert_eq!(key.hash_tag(), &tag[1..]);

    let template = (entries.iter()).fold(TagTemplate::new(domain), |t, (k, _)| t.with_key(k));
    let mut tag = template.tag(entries.iter().map(|(_, v)| *v));
    assert_eq!(tag.counter_key(window), key);

    let compact = key.compact(64);
    if key.as_str().len() > 64 {
        assert!(compact.as_str().len() <= 200, "{compact}");
        assert!(compact.decode().is_none());
    } else {
        assert_eq!(compact, key);
    }
}
