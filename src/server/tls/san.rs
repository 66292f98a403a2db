//! The client SAN allow-list (`--tls-client-san`), matched by the SAN's type.
//!
//! Why typed: a certificate's subject alternative names are typed (URI, DNS name, IP address),
//! and a CA that signs DNS names for one purpose may sign a URI that spells another entry's name
//! (or the reverse). So each entry is read once as what it names, and matches that type only:
//! - a URI (`spiffe://cluster.local/ns/x/sa/y`, `urn:…`: a scheme, then `//` or a URN) matches
//!   URI SANs, exactly but for the scheme's case (SPIFFE IDs compare as strings);
//! - an IP address (`10.0.0.7`, `::1`) matches IP SANs, as addresses (an IPv4-mapped IPv6
//!   address as its IPv4 one);
//! - a DNS name (`envoy.internal`) matches DNS SANs, without regard to ASCII case or a final
//!   dot. A certificate's wildcard SAN (`*.mesh.internal`) matches as TLS matches a server's:
//!   the `*` stands for exactly one whole left-most label (`a.mesh.internal`, never
//!   `mesh.internal` or `a.b.mesh.internal`), and only over two labels or more. An entry that
//!   is itself a wildcard matches only that same wildcard SAN.
//!
//! An entry that is none of these is refused at start, with the entry named: a host and port
//! (`envoy.internal:443`), an IPv6 address with a zone, a name whose last label is a number
//! (`10.0.0.7.`: it would match a DNS SAN spelling an address), a bare `*`.

use std::net::IpAddr;

use x509_parser::extensions::GeneralName;

/// One entry of the allow-list, by the type of SAN it matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowedSan {
    Uri(String),
    /// Lower-case, without a final dot.
    Dns(String),
    Ip(IpAddr),
}

/// Why an entry is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--tls-client-san entry {entry:?} is not a URI (scheme:…), an IP address or a DNS name: {why}"
)]
pub struct BadSan {
    pub entry: String,
    pub why: &'static str,
}

impl std::str::FromStr for AllowedSan {
    type Err = BadSan;

    fn from_str(entry: &str) -> Result<AllowedSan, BadSan> {
        let bad = |why| BadSan {
            entry: entry.to_owned(),
            why,
        };
        if let Ok(ip) = entry.parse::<IpAddr>() {
            return Ok(AllowedSan::Ip(ip.to_canonical()));
        }
        if let Some(uri) = uri_form(entry) {
            if entry.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad("a URI has no spaces or control characters"));
            }
            return Ok(AllowedSan::Uri(uri));
        }
        if entry.contains(':') {
            return Err(bad(
                "a URI is scheme://… or urn:…, and a DNS name has no port or colon",
            ));
        }
        if !entry.is_ascii() {
            return Err(bad(
                "a DNS name in another script is written in its xn-- form",
            ));
        }
        let name = dns_form(entry);
        if name.is_empty() || name.len() > 253 {
            return Err(bad("a DNS name has 1 to 253 characters"));
        }
        for (i, label) in name.split('.').enumerate() {
            let wildcard = i == 0 && label == "*";
            let valid = (1..=63).contains(&label.len())
                && (label.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !wildcard && !valid {
                return Err(bad(
                    "each label of a DNS name has 1 to 63 letters, digits, '-' or '_' \
                     (a '*' only as the whole first label)",
                ));
            }
        }
        let labels: Vec<&str> = name.split('.').collect();
        if labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad(
                "a DNS name's last label is not a number (an address is 1.2.3.4)",
            ));
        }
        if labels[0] == "*" && labels.len() < 3 {
            return Err(bad(
                "a wildcard stands over two labels or more (*.example.com)",
            ));
        }
        Ok(AllowedSan::Dns(name))
    }
}

/// `text` as a URI is compared, its scheme (case-insensitive) in lower case: when it starts with
/// a scheme (RFC 3986: a letter, then letters, digits, `+`, `-` or `.`) followed by `://`, or is
/// a URN. A host and port (`envoy.internal:443`) or an address is not one.
fn uri_form(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once(':')?;
    let mut chars = scheme.chars();
    let is_scheme = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let scheme = scheme.to_ascii_lowercase();
    (is_scheme && (rest.starts_with("//") || scheme == "urn") && rest.len() > 2)
        .then(|| format!("{scheme}:{rest}"))
}

/// A DNS name as compared: lower-case, without a final dot.
fn dns_form(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

impl AllowedSan {
    /// Whether the certificate's SAN `name` is this entry.
    pub fn matches(&self, name: &GeneralName<'_>) -> bool {
        match (self, name) {
            (AllowedSan::Uri(entry), GeneralName::URI(uri)) => {
                uri_form(uri).is_some_and(|uri| uri == *entry)
            }
            (AllowedSan::Dns(entry), GeneralName::DNSName(dns)) => dns_matches(entry, dns),
            (AllowedSan::Ip(entry), GeneralName::IPAddress(bytes)) => ip_of(bytes) == Some(*entry),
            _ => false,
        }
    }
}

/// Whether the DNS SAN `presented` (maybe a wildcard) names `entry` (see the module docs).
fn dns_matches(entry: &str, presented: &str) -> bool {
    let presented = dns_form(presented);
    if presented == entry {
        return true;
    }
    let Some(parent) = presented.strip_prefix("*.") else {
        return false;
    };
    if !parent.contains('.') || parent.contains('*') {
        return false;
    }
    entry
        .split_once('.')
        .is_some_and(|(label, rest)| !label.is_empty() && label != "*" && rest == parent)
}

/// An IP SAN's address: 4 or 16 bytes.
fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
    .map(|ip| ip.to_canonical())
}

/// Whether a certificate (DER) carries a SAN one of `allowed` matches; not when it does not
/// parse (the chain verification before this has parsed it already).
pub fn allows(allowed: &[AllowedSan], cert: &[u8]) -> bool {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return false;
    };
    let Ok(Some(sans)) = parsed.subject_alternative_name() else {
        return false;
    };
    (sans.value.general_names.iter()).any(|name| allowed.iter().any(|entry| entry.matches(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(text: &str) -> AllowedSan {
        text.parse().expect("a valid entry")
    }

    #[test]
    fn each_entry_is_read_as_what_it_names() {
        assert_eq!(
            entry("spiffe://cluster.local/ns/a/sa/envoy"),
            AllowedSan::Uri("spiffe://cluster.local/ns/a/sa/envoy".into())
        );
        assert_eq!(entry("urn:x:y"), AllowedSan::Uri("urn:x:y".into()));
        assert_eq!(entry("10.0.0.7"), AllowedSan::Ip([10, 0, 0, 7].into()));
        assert_eq!(
            entry("::1"),
            AllowedSan::Ip(std::net::Ipv6Addr::LOCALHOST.into())
        );
        assert_eq!(
            entry("Envoy.Internal."),
            AllowedSan::Dns("envoy.internal".into())
        );
        assert_eq!(
            entry("*.mesh.internal"),
            AllowedSan::Dns("*.mesh.internal".into())
        );
        assert_eq!(
            entry("SPIFFE://cluster.local/x"),
            AllowedSan::Uri("spiffe://cluster.local/x".into())
        );
        assert_eq!(entry("::ffff:10.0.0.7"), entry("10.0.0.7"));
        for bad in [
            "",
            "a b",
            "a..b",
            "a.*.b",
            "*a.b",
            "ex ample.com",
            "spiffe://a b",
            "envoy.internal:443",
            "localhost:8080",
            "fe80::1%eth0",
            "fd00::7::1",
            "10.0.0.7.",
            "010.0.0.7",
            "10.7",
            "*",
            "*.internal",
            "b\u{fc}cher.example",
        ] {
            let refused = bad.parse::<AllowedSan>().expect_err(bad);
            assert!(
                refused.to_string().contains("--tls-client-san"),
                "{refused}"
            );
        }
    }

    #[test]
    fn an_entry_matches_its_own_type_of_san_only() {
        let uri = GeneralName::URI("spiffe://a/b");
        let dns = GeneralName::DNSName("envoy.internal");
        let ip = GeneralName::IPAddress(&[10, 0, 0, 7]);
        assert!(entry("spiffe://a/b").matches(&uri));
        assert!(!entry("spiffe://a/b").matches(&GeneralName::DNSName("spiffe://a/b")));
        assert!(entry("envoy.internal").matches(&dns));
        assert!(entry("ENVOY.internal").matches(&GeneralName::DNSName("envoy.INTERNAL.")));
        assert!(!entry("envoy.internal").matches(&GeneralName::URI("envoy.internal")));
        assert!(entry("10.0.0.7").matches(&ip));
        assert!(!entry("10.0.0.7").matches(&GeneralName::DNSName("10.0.0.7")));
        assert!(!entry("10.0.0.8").matches(&ip));
        assert!(entry("spiffe://a/b").matches(&GeneralName::URI("Spiffe://a/b")));
        assert!(!entry("spiffe://a/b").matches(&GeneralName::URI("spiffe://A/b")));
        let mapped = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7];
        assert!(entry("10.0.0.7").matches(&GeneralName::IPAddress(&mapped)));
    }

    #[test]
    fn a_wildcard_san_stands_for_one_whole_left_most_label() {
        let wildcard = GeneralName::DNSName("*.mesh.internal");
        assert!(entry("a.mesh.internal").matches(&wildcard));
        assert!(!entry("mesh.internal").matches(&wildcard));
        assert!(!entry("a.b.mesh.internal").matches(&wildcard));
        assert!(!entry("a.mesh.internal.evil").matches(&wildcard));
        // Over one label only: never a whole top-level domain.
        assert!(!entry("a.internal").matches(&GeneralName::DNSName("*.internal")));
        // A wildcard entry is that wildcard SAN, never a name under it.
        assert!(entry("*.mesh.internal").matches(&wildcard));
        assert!(!entry("*.mesh.internal").matches(&GeneralName::DNSName("a.mesh.internal")));
        // Partial-label wildcards are not TLS's.
        assert!(!entry("api.mesh.internal").matches(&GeneralName::DNSName("a*.mesh.internal")));
    }
}
