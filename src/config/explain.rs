//! `slidegate explain`: which rule of the rule files a descriptor matches, without a server or a
//! store, for "which rule does this match?" before a rule change ships.
//!
//! It matches exactly as the limiter does ([`DomainRules::match_entries`]): the same tree, the same
//! precedence (an exact value before a wildcard before a key-only level), the same counter
//! entries (a value a `share_threshold` wildcard matched is counted under the pattern).

use std::fmt::Write as _;

use super::RuleSet;

/// What `explain` cannot answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExplainError {
    #[error("domain `{domain}` is not in the rules (domains: {known})")]
    UnknownDomain { domain: String, known: String },
    #[error("entry `{0}` is not `key=value`")]
    NotAnEntry(String),
    #[error("no entries: give the descriptor as key=value arguments, in order")]
    NoEntries,
}

/// Reads `key=value` arguments as a descriptor's entries, in order. The key ends at the first
/// `=`: a value may contain `=` and `,`; a key cannot contain `=`.
pub fn parse_entries(args: &[String]) -> Result<Vec<(&str, &str)>, ExplainError> {
    if args.is_empty() {
        return Err(ExplainError::NoEntries);
    }
    args.iter()
        .map(|arg| match arg.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key, value)),
            _ => Err(ExplainError::NotAnEntry(arg.clone())),
        })
        .collect()
}

/// The explanation of a descriptor of `domain` with `entries`: the path through the rule tree
/// (each entry's node and how it matched, or where nothing did), the matched rule (its line as
/// `/rlconfig` shows it: limits, windows, representation, name, `replaces`, flags, source), its
/// metrics name and the entries of its counter; or that no rule matches.
pub fn explain(
    rules: &RuleSet,
    domain: &str,
    entries: &[(&str, &str)],
) -> Result<String, ExplainError> {
    let Some(domain_rules) = rules.domain(domain) else {
        let mut known = rules.domain_names();
        known.sort_unstable();
        return Err(ExplainError::UnknownDomain {
            domain: domain.to_owned(),
            known: if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
        });
    };
    let mut out = String::new();
    let _ = writeln!(out, "domain: {domain}");
    let _ = writeln!(out, "descriptor: {}", pairs(entries));
    for step in domain_rules.trace(entries) {
        let _ = writeln!(out, "  {}", step.render(None));
    }
    match domain_rules.match_entries(entries) {
        None => {
            let _ = writeln!(
                out,
                "rule: none: no rule of `{domain}` matches these entries in this order (a \
                 request with this descriptor is OK and counts nothing for it)"
            );
        }
        Some(matched) => {
            let rule = matched.rule;
            let _ = writeln!(out, "rule: {rule}");
            if rule.shadow_mode {
                let _ = writeln!(out, "shadow: counted and reported, never denies");
            }
            if !rule.replaces.is_empty() {
                let _ = writeln!(
                    out,
                    "replaces: {} (skipped when the same request matches it too)",
                    rule.replaces.join(", ")
                );
            }
            let _ = writeln!(out, "metrics name: {}", matched.stats_name);
            if rule.unlimited {
                let _ = writeln!(out, "counter: none (unlimited)");
            } else {
                let _ = writeln!(out, "counter entries: {}", pairs(&matched.counter_entries));
            }
        }
    }
    Ok(out)
}

fn pairs(entries: &[(&str, &str)]) -> String {
    let pairs: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(", ")
}
