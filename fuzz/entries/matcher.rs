//! The descriptor matcher: entries split from the input (`key=value` per line) against the
//! fixture rules; a match has one counter entry per request entry.

use std::sync::LazyLock;

use slidegate::config::RuleSet;

use super::common;

static RULES: LazyLock<RuleSet> = LazyLock::new(common::rules);

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let entries: Vec<(&str, &str)> = text
        .lines()
        .map(|line| line.split_once('=').unwrap_or((line, "")))
        .collect();
    let domain = RULES.domain("matching").expect("domain");
    if let Some(m) = domain.match_entries(&entries) {
        assert_eq!(m.counter_entries.len(), entries.len());
        assert!(!m.stats_name.is_empty());
    }
}
