//! Keeping Redis credentials out of logs and error messages.
//!
//! Operators paste URLs such as `rediss://app:s3cret@redis:6379/0` into flags and environment
//! variables; every message slidegate produces about a Redis endpoint goes through [`redact_url`],
//! and every error text that comes back from the client library goes through [`Redactor`], which
//! knows the actual passwords and blanks them wherever they appear.

/// What replaces a secret.
const MASK: &str = "***";

/// The URL with its password (userinfo after `:`, or a `pass`/`password` query parameter)
/// replaced by `***`. Never fails: text that is not a URL comes back unchanged, except that anything
/// before an `@` is treated as credentials.
///
/// ```
/// use slidegate::store::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@db:6379/2"), "redis://app:***@db:6379/2");
/// assert_eq!(redact_url("rediss://:s3cret@db"), "rediss://:***@db");
/// assert_eq!(redact_url("redis://db:6379"), "redis://db:6379");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.find(':') {
                Some(colon) => format!("{}:{MASK}{host}", &userinfo[..colon]),
                // `redis://secret@host` is a username to redis-rs, but some clients read it as a
                // password: mask it too rather than guess.
                None => format!("{MASK}{host}"),
            }
        }
        None => authority.to_string(),
    };
    format!("{scheme}{authority}{}", redact_query(tail))
}

/// Masks `pass=`/`password=` query parameters (redis-rs reads `pass` for unix sockets).
fn redact_query(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_string();
    };
    let (path, query) = tail.split_at(q + 1);
    let (query, fragment) = match query.find('#') {
        Some(f) => query.split_at(f),
        None => (query, ""),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _)) if matches!(name, "pass" | "password") => format!("{name}={MASK}"),
            _ => param.to_string(),
        })
        .collect();
    format!("{path}{}{fragment}", params.join("&"))
}

/// Removes known secrets from any text (error messages from the Redis client, for instance).
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// Remembers a secret; empty ones are ignored (they would mask everything).
    pub fn add(&mut self, secret: &str) {
        if !secret.is_empty() && !self.secrets.iter().any(|s| s == secret) {
            self.secrets.push(secret.to_string());
            // A percent-encoded password appears encoded in URLs and decoded elsewhere.
            let encoded =
                percent_encoding::utf8_percent_encode(secret, percent_encoding::NON_ALPHANUMERIC)
                    .to_string();
            if encoded != secret {
                self.secrets.push(encoded);
            }
        }
    }

    /// `text` with every known secret replaced by `***`.
    pub fn clean(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), MASK);
            }
        }
        out
    }
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_passwords_in_urls() {
        let cases = [
            ("redis://u:p@h:1/0", "redis://u:***@h:1/0"),
            ("rediss://:p@h", "rediss://:***@h"),
            ("redis://u:p:with:colons@h", "redis://u:***@h"),
            ("redis://u:p@ss@h", "redis://u:***@h"),
            ("redis://secret@h", "redis://***@h"),
            ("redis://h:6379/3", "redis://h:6379/3"),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=p",
                "redis+unix:///tmp/r.sock?db=1&pass=***",
            ),
            ("redis://h/?password=p#x", "redis://h/?password=***#x"),
            ("", ""),
            ("not a url", "not a url"),
            ("u:p@h", "u:***@h"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn redactor_blanks_decoded_and_encoded_secrets() {
        let mut r = Redactor::default();
        r.add("p@ss word");
        r.add("");
        assert_eq!(
            r.clean("auth p@ss word failed for p%40ss%20word"),
            "auth *** failed for ***"
        );
        assert!(!format!("{r:?}").contains("p@ss"));
    }
}
