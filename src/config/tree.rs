//! The compiled descriptor-matching tree.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::Rule;

/// All domains' rules, immutable once built.
#[derive(Debug, Default)]
pub struct RuleSet {
    domains: HashMap<String, DomainRules>,
}

/// The rules of one domain.
#[derive(Debug, Default)]
pub struct DomainRules {
    // filled in by the config implementation
}

/// The rule a request descriptor matched.
#[derive(Debug, Clone)]
pub struct RuleMatch<'a> {
    pub rule: &'a Arc<Rule>,
    /// The entries that identify the counter: the request's entries, except that a value matched
    /// by a `share_threshold` wildcard is replaced by the pattern (all such values share one counter).
    pub counter_entries: Vec<(&'a str, &'a str)>,
    /// The metrics name: the rule's `name`, else its path; with `detailed_metric` /
    /// `value_to_metric` the runtime values are part of it.
    pub stats_name: Cow<'a, str>,
}

impl RuleSet {
    /// The rules of a domain, if it is configured.
    pub fn domain(&self, name: &str) -> Option<&DomainRules> {
        self.domains.get(name)
    }

    /// Number of rules (nodes with a `rate_limit`/`rate_limits`/`unlimited`) over all domains.
    pub fn rule_count(&self) -> usize {
        0
    }

    /// Every rule, for `/rlconfig`, sorted by domain then path.
    pub fn rules(&self) -> Vec<&Arc<Rule>> {
        Vec::new()
    }
}

impl DomainRules {
    /// Matches one request descriptor's entries (key, value), level by level. `None` when no rule
    /// applies (no match, or the node reached by the last entry has no limit).
    pub fn match_entries<'a>(&'a self, entries: &[(&'a str, &'a str)]) -> Option<RuleMatch<'a>> {
        let _ = entries;
        None
    }
}
