//! The text side of a mapper: `name` and `labels` templates expanded with a rule's captures
//! (upstream's glob formatter, Go's `Regexp.ExpandString`), Go's regex syntax rewritten for the
//! `regex` crate, and upstream's escaping of metric names. Apart from the matching because these
//! are pure string functions with their own Go quirks to reproduce.

use regex::Regex;

/// Upstream's glob `TemplateFormatter`: each `\$\{?([a-zA-Z0-9_$]+)\}?` is replaced by capture
/// n when the group is a number from 1 to the number of `*`, and by nothing otherwise (so
/// `$1_total` is the named reference `1_total`, which is empty).
pub(super) fn expand_glob(template: &str, captures: &[&str], stars: usize) -> String {
    let is_ref = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let body = after.strip_prefix('{').unwrap_or(after);
        let len = body.find(|c| !is_ref(c)).unwrap_or(body.len());
        let (group, tail) = if len > 0 {
            (&body[..len], &body[len..])
        } else {
            // `\{?` gives the brace back, and a brace is no reference: no match at this `$`.
            let len = after.find(|c| !is_ref(c)).unwrap_or(after.len());
            (&after[..len], &after[len..])
        };
        if group.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        let tail = tail.strip_prefix('}').unwrap_or(tail);
        if let Ok(n) = group.parse::<usize>()
            && (1..=stars).contains(&n)
        {
            out.push_str(captures.get(n - 1).copied().unwrap_or(""));
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// Regex rules: Go's regexp

/// Go's `Regexp.ExpandString`: `$$` is `$`; `$name` or `${name}` takes the longest run of
/// letters, digits and `_`; a number (no leading zero) is a group index, anything else a group
/// name; an unknown or unmatched group is empty; a malformed reference leaves the `$`.
pub(super) fn expand_go(template: &str, re: &Regex, caps: &regex::Captures<'_>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
            continue;
        }
        let Some((name, after)) = go_template_name(rest) else {
            out.push('$');
            continue;
        };
        rest = after;
        let group = match go_group_number(name) {
            Some(n) => caps.get(n),
            None => re
                .capture_names()
                .position(|n| n == Some(name))
                .and_then(|i| caps.get(i)),
        };
        if let Some(g) = group {
            out.push_str(g.as_str());
        }
    }
    out.push_str(rest);
    out
}

/// Go's `extract`: the reference name after a `$`, and the text after it.
fn go_template_name(s: &str) -> Option<(&str, &str)> {
    let (body, brace) = match s.strip_prefix('{') {
        Some(b) => (b, true),
        None => (s, false),
    };
    let len = body
        .find(|c: char| !(c.is_alphabetic() || c.is_numeric() || c == '_'))
        .unwrap_or(body.len());
    if len == 0 {
        return None;
    }
    let (name, after) = body.split_at(len);
    if brace {
        return after.strip_prefix('}').map(|a| (name, a));
    }
    Some((name, after))
}

/// Go's group number: ASCII digits, no leading zero, below 10^8 (else it is a name).
fn go_group_number(name: &str) -> Option<usize> {
    if !name.bytes().all(|b| b.is_ascii_digit()) || (name.len() > 1 && name.starts_with('0')) {
        return None;
    }
    name.parse::<usize>().ok().filter(|&n| n < 100_000_000)
}

/// Rewrites what Go's RE2 syntax means differently from the `regex` crate: Go's `\d`, `\w`,
/// `\s` (and their negations) and `\b`/`\B` are ASCII-only, where the crate's are Unicode; a
/// `[` inside a class is a literal in Go and a nested class in the crate, as are `&&` and
/// `~~`; and Go's `\Q...\E` quotes text. Everything else is passed through, so a pattern Go
/// refuses is mostly refused here too.
pub(super) fn go_regex_to_rust(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.char_indices().peekable();
    let mut in_class = false;
    // Right after `[` or `[^`, where `]` is a literal.
    let mut class_start = false;
    while let Some((at, c)) = chars.next() {
        let was_start = std::mem::take(&mut class_start);
        match c {
            '\\' => {
                let Some((_, e)) = chars.next() else {
                    out.push('\\');
                    break;
                };
                let replacement = match (e, in_class) {
                    ('d', false) => Some("[0-9]"),
                    ('D', false) => Some("[^0-9]"),
                    ('w', false) => Some("[0-9A-Za-z_]"),
                    ('W', false) => Some("[^0-9A-Za-z_]"),
                    ('s', false) => Some(r"[\t\n\f\r ]"),
                    ('S', false) => Some(r"[^\t\n\f\r ]"),
                    ('b', false) => Some(r"(?-u:\b)"),
                    ('B', false) => Some(r"(?-u:\B)"),
                    ('d', true) => Some("0-9"),
                    ('w', true) => Some("0-9A-Za-z_"),
                    ('s', true) => Some(r"\t\n\f\r "),
                    ('D', true) => Some("[^0-9]"),
                    ('W', true) => Some("[^0-9A-Za-z_]"),
                    ('S', true) => Some(r"[^\t\n\f\r ]"),
                    _ => None,
                };
                if let Some(r) = replacement {
                    out.push_str(r);
                } else if e == 'Q' && !in_class {
                    let from = at + 2;
                    let quoted = match pattern[from..].find(r"\E") {
                        Some(len) => &pattern[from..from + len],
                        None => &pattern[from..],
                    };
                    out.push_str(&regex::escape(quoted));
                    // Skip the quoted text and the `\E`.
                    let end = from + quoted.len() + 2;
                    while chars.peek().is_some_and(|&(i, _)| i < end) {
                        chars.next();
                    }
                } else {
                    out.push('\\');
                    out.push(e);
                }
            }
            '[' if !in_class => {
                out.push('[');
                in_class = true;
                class_start = true;
                if let Some((_, '^')) = chars.peek() {
                    chars.next();
                    out.push('^');
                }
            }
            '[' => {
                // A POSIX class such as `[:alpha:]` is the only `[` that means something.
                let rest = &pattern[at..];
                match rest.strip_prefix("[:").and_then(|r| r.find(":]")) {
                    Some(len) => {
                        let end = at + 2 + len + 2;
                        out.push_str(&pattern[at..end]);
                        while chars.peek().is_some_and(|&(i, _)| i < end) {
                            chars.next();
                        }
                    }
                    None => out.push_str(r"\["),
                }
            }
            ']' if in_class && was_start => out.push_str(r"\]"),
            ']' if in_class => {
                out.push(']');
                in_class = false;
            }
            '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Upstream's `EscapeMetricName`: `_` before a leading digit, and `_` for each character outside
/// `[A-Za-z0-9_]`, except that a `-` right after a `-` is dropped, so a run of dashes becomes
/// one `_` (`with---dashes` → `with_dashes`).
pub fn escape_metric_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        out.push('_');
    }
    let mut prev = None;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && prev == Some('-')) {
            out.push('_');
        }
        prev = Some(c);
    }
    out
}
