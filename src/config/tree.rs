//! The compiled descriptor-matching tree.
//!
//! Each level maps a descriptor key to the nodes for that key: exact values in a `HashMap`,
//! wildcard values in a short list kept in config order, and at most one key-only node. A request
//! entry therefore costs two hash lookups (plus the wildcards of its key, if any), however many
//! rules there are. Matching borrows from the tree and the request; the only allocation on the hot
//! path is `RuleMatch::counter_entries`.
//!
//! Each key's nodes also hold the [`TagTemplate`] of their path (`{domain:key1=:key2=...`,
//! escaped), built once when the rule set is, so that a match's counter tag only escapes the
//! request's values ([`RuleMatch::counter_tag`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::Rule;
use super::checksum::Checksum;
use crate::store::key::{CounterTag, TagTemplate};

/// A map of the rule tree, keyed by what the operator configured and only read with what
/// clients send: nothing a client sends is inserted, so no client can flood it with colliding
/// keys, and a fast hasher (foldhash, seeded per process) replaces SipHash on every lookup.
type Map<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// All domains' rules, immutable once built.
#[derive(Debug, Default)]
pub struct RuleSet {
    domains: Map<DomainRules>,
    /// Every rule, sorted by domain then path (for `/rlconfig` and `rule_count`).
    rules: Vec<Arc<Rule>>,
    /// The checksum of the files this set was built from, so a reload can tell whether the
    /// files differ from what is live (their text is not kept).
    checksum: Checksum,
}

/// The rules of one domain.
#[derive(Debug, Default)]
pub struct DomainRules {
    root: Level,
}

/// The rule a request descriptor matched.
#[derive(Debug, Clone)]
pub struct RuleMatch<'a> {
    pub rule: &'a Arc<Rule>,
    /// The entries that identify the counter: the request's entries, except that a value matched
    /// by a `share_threshold` wildcard is replaced by the pattern (all such values share one counter).
    pub counter_entries: Cow<'a, [(&'a str, &'a str)]>,
    /// The metrics name. In order of precedence:
    /// - `detailed_metric` on the rule: every request entry as `key_value`, joined with `.`;
    /// - `value_to_metric` on any node of the path: the static path, except that key-only and
    ///   wildcard levels whose node has `value_to_metric` show the request's value (`key_value`);
    /// - in both, a value matched by a `share_threshold` wildcard shows as the pattern
    ///   (`route_api/*`), as in envoyproxy/ratelimit;
    /// - else the rule's `name`, else its static path ([`Rule::stats_name`]), borrowed.
    ///
    /// Runtime values appear only when the config asks for them, so metric cardinality stays
    /// bounded by the config, not by clients.
    pub stats_name: Cow<'a, str>,
    /// The escaped domain and keys of the matched path, for [`RuleMatch::counter_tag`].
    tag_template: &'a TagTemplate,
}

/// One step of [`DomainRules::trace`]. It carries the request's value, which
/// [`TraceStep::render`] can leave out (the operator listener's `--operator-hide-values`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceStep {
    /// The entry found this node (its segment in the rules), by `how`.
    Found {
        entry: (String, String),
        node: String,
        how: String,
    },
    /// No descriptor of this level has the entry's key with this value: nothing matches.
    NoMatch { entry: (String, String) },
    /// The descriptor ends at a node without a limit; `deeper` when its children have some.
    EndsAbove { deeper: bool },
}

impl TraceStep {
    /// The step as a line; the request's value shown as `value` says (`None`: as it is).
    pub fn render(&self, value: Option<&str>) -> String {
        let shown = |(key, v): &(String, String)| format!("{key}={}", value.unwrap_or(v));
        match self {
            TraceStep::Found { entry, node, how } => {
                format!("{}: `{node}`, by {how}", shown(entry))
            }
            TraceStep::NoMatch { entry } => format!(
                "{}: no descriptor with key `{}` and this value at this level; nothing matches",
                shown(entry),
                entry.0
            ),
            TraceStep::EndsAbove { deeper: true } => "the descriptor ends at a level without a \
                limit; the limits are deeper (more entries)"
                .to_owned(),
            TraceStep::EndsAbove { deeper: false } => {
                "the descriptor ends at a level without a limit".to_owned()
            }
        }
    }
}

impl RuleSet {
    /// Builds a rule set; `rules` are sorted here.
    pub(super) fn new(
        domains: HashMap<String, DomainRules>,
        mut rules: Vec<Arc<Rule>>,
        checksum: Checksum,
    ) -> Self {
        let mut domains: Map<DomainRules> = domains.into_iter().collect();
        // Here, not in `DomainRules::new`: the domain's name is known from this map.
        for (name, domain) in &mut domains {
            domain.root.build_tag_templates(&TagTemplate::new(name));
        }
        rules.sort_by(|a, b| (&a.domain, &a.path).cmp(&(&b.domain, &b.path)));
        RuleSet {
            domains,
            rules,
            checksum,
        }
    }

    /// The checksum of the rule files this set was built from (see [`Checksum`]).
    pub fn checksum(&self) -> Checksum {
        self.checksum
    }

    /// The rules of a domain, if it is configured.
    pub fn domain(&self, name: &str) -> Option<&DomainRules> {
        self.domains.get(name)
    }

    /// The configured domains, sorted.
    pub fn domain_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Number of rules (nodes with a `rate_limit`/`rate_limits`/`unlimited`) over all domains.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// Every rule, for `/rlconfig`, sorted by domain then path.
    pub fn rules(&self) -> Vec<&Arc<Rule>> {
        self.rules.iter().collect()
    }
}

impl DomainRules {
    pub(super) fn new(root: Level) -> Self {
        DomainRules { root }
    }

    /// Matches one request descriptor's entries (key, value), level by level. `None` when no rule
    /// applies (no match, or the node reached by the last entry has no limit).
    ///
    /// At each level: the exact `key`+`value` node, else the first wildcard of that key (config
    /// order) that matches, else the key-only node. The request must end exactly at a node with a
    /// rule: a longer or shorter descriptor than the config's path matches nothing, as in
    /// envoyproxy/ratelimit.
    pub fn match_entries<'a>(&'a self, entries: &'a [(&'a str, &'a str)]) -> Option<RuleMatch<'a>> {
        let mut shared = false;
        let last = self.walk(entries, |step| shared |= step.shares_value())?;
        let rule = last.node.rule.as_ref()?;
        let counter_entries = if shared {
            let mut out = Vec::with_capacity(entries.len());
            self.walk(entries, |step| out.push((step.key, step.counter_value())));
            Cow::Owned(out)
        } else {
            Cow::Borrowed(entries)
        };
        let stats_name = if rule.detailed_metric {
            // The counter's entries: a value shared by `share_threshold` shows as its pattern.
            Cow::Owned(detailed_name(&counter_entries))
        } else if rule.value_to_metric {
            let mut name = String::new();
            self.walk(entries, |step| step.push_metric_segment(&mut name));
            Cow::Owned(name)
        } else {
            Cow::Borrowed(rule.stats_name())
        };
        Some(RuleMatch {
            rule,
            counter_entries,
            stats_name,
            tag_template: last.tag_template,
        })
    }

    /// How `entries` go down the tree, one step per entry, for `slidegate explain` and
    /// `POST /explain`: the node each found and how (an exact value, a wildcard, a key-only
    /// level), or that none was found (the walk stops there); then whether the node reached has a
    /// limit.
    pub fn trace(&self, entries: &[(&str, &str)]) -> Vec<TraceStep> {
        let mut steps = Vec::with_capacity(entries.len() + 1);
        let mut level = &self.root;
        let mut reached: Option<&Node> = None;
        for &(key, value) in entries {
            let entry = (key.to_owned(), value.to_owned());
            let Some((_, node, how)) = level.find(key, value) else {
                steps.push(TraceStep::NoMatch { entry });
                return steps;
            };
            let how = match how {
                Matched::Exact => "its exact value".to_owned(),
                Matched::Wildcard(pattern) => format!("the wildcard `{}`", pattern.as_str()),
                Matched::KeyOnly => "its key (any value)".to_owned(),
            };
            steps.push(TraceStep::Found {
                entry,
                node: node.segment.to_string(),
                how,
            });
            level = &node.children;
            reached = Some(node);
        }
        if let Some(node) = reached.filter(|node| node.rule.is_none()) {
            steps.push(TraceStep::EndsAbove {
                deeper: !node.children.keys.is_empty(),
            });
        }
        steps
    }

    /// The order of a quota bucket's entries that reaches a rule. An RLQS bucket id is a map
    /// without order, a descriptor a path down the tree: the one order of the entries (sorted
    /// by key, as a map has none) that matches a path ending at a limit, as
    /// [`DomainRules::match_entries`] matches. Several orders can (two key-only levels in either
    /// order): the first found in key order is taken and the answer says so. The search visits at
    /// most [`MAX_ORDER_VISITS`] nodes, so a bucket a client shapes cannot make it long; one that
    /// outlasts it is [`BucketOrder::Unsettled`].
    pub fn bucket_order<'a>(&self, entries: &[(&'a str, &'a str)]) -> BucketOrder<'a> {
        let mut sorted = entries.to_vec();
        sorted.sort_unstable();
        let mut search = OrderSearch {
            path: Vec::with_capacity(sorted.len()),
            used: vec![false; sorted.len()],
            found: Vec::new(),
            visits: 0,
        };
        search.descend(&self.root, &sorted);
        let exhausted = search.visits >= MAX_ORDER_VISITS;
        let mut found = search.found.into_iter();
        match (found.next(), found.next()) {
            (None, _) if exhausted => BucketOrder::Unsettled,
            (None, _) => BucketOrder::None,
            (Some(order), None) => BucketOrder::One(order),
            (Some(order), Some(_)) => BucketOrder::Several(order),
        }
    }

    /// Follows `entries` down the tree, calling `visit` for each level, and returns the step of the
    /// last entry. Deterministic, so callers may walk twice instead of allocating a path.
    fn walk<'a>(
        &'a self,
        entries: &[(&'a str, &'a str)],
        mut visit: impl FnMut(Step<'a>),
    ) -> Option<Step<'a>> {
        let mut level = &self.root;
        let mut reached = None;
        for &(key, value) in entries {
            let (nodes, node, how) = level.find(key, value)?;
            let step = Step {
                key,
                value,
                node,
                how,
                tag_template: &nodes.tag_template,
            };
            visit(step);
            level = &node.children;
            reached = Some(step);
        }
        reached
    }
}

impl RuleMatch<'_> {
    /// The tag every counter of this match shares (`{domain:k1=v1:...}`); each limit's key is
    /// the tag plus its window ([`CounterTag::counter_key`]). The domain and keys were escaped at
    /// config load: only the counter values are escaped here, once per descriptor.
    pub fn counter_tag(&self) -> CounterTag {
        // The template has one key per level of the path, and the match one entry per level.
        self.tag_template
            .tag(self.counter_entries.iter().map(|&(_, value)| value))
    }

    /// [`RuleMatch::counter_tag`] with `values` in place of the counter values (one per entry,
    /// in order): the limiter counts a long value under its digest.
    pub fn counter_tag_with<'v>(
        &self,
        values: impl Iterator<Item = &'v str> + Clone,
    ) -> CounterTag {
        self.tag_template.tag(values)
    }
}

/// `key_value` for every entry (`key` alone for an empty value), joined with `.`.
fn detailed_name(entries: &[(&str, &str)]) -> String {
    let mut name = String::with_capacity(entries.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 {
            name.push('.');
        }
        push_segment(&mut name, key, value);
    }
    name
}

fn push_segment(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    if !value.is_empty() {
        out.push('_');
        out.push_str(value);
    }
}

/// One level of a walk: the request's entry and the node it matched.
#[derive(Clone, Copy)]
struct Step<'a> {
    key: &'a str,
    value: &'a str,
    node: &'a Node,
    how: Matched<'a>,
    /// The counter tag template of the path down to this level.
    tag_template: &'a TagTemplate,
}

/// How an entry matched its node.
#[derive(Clone, Copy)]
enum Matched<'a> {
    Exact,
    Wildcard(&'a Pattern),
    KeyOnly,
}

impl<'a> Step<'a> {
    fn shares_value(&self) -> bool {
        matches!(self.how, Matched::Wildcard(_)) && self.node.share_threshold
    }

    /// The value that identifies the counter at this level.
    fn counter_value(&self) -> &'a str {
        match self.how {
            Matched::Wildcard(pattern) if self.node.share_threshold => pattern.as_str(),
            _ => self.value,
        }
    }

    /// Appends this level to a `value_to_metric` name.
    fn push_metric_segment(&self, name: &mut String) {
        if !name.is_empty() {
            name.push('.');
        }
        // A value shared by `share_threshold` shows as its pattern (the node's segment), as in
        // envoyproxy/ratelimit: one series per pattern, not one per request value.
        let runtime = self.node.value_to_metric
            && !matches!(self.how, Matched::Exact)
            && !self.shares_value();
        if runtime {
            push_segment(name, self.key, self.value);
        } else {
            name.push_str(&self.node.segment);
        }
    }
}

/// The nodes of one level, by key.
#[derive(Debug, Default)]
pub(super) struct Level {
    keys: Map<KeyNodes>,
}

/// The nodes of one key at one level.
#[derive(Debug, Default)]
pub(super) struct KeyNodes {
    exact: Map<Node>,
    /// In config order: the first match wins.
    wildcards: Vec<(Pattern, Node)>,
    key_only: Option<Box<Node>>,
    /// The escaped domain and the keys from the root down to this key. The same for all these
    /// nodes: the path of keys to a level is unique, only values differ. Set by
    /// [`Level::build_tag_templates`] once the tree is complete (nodes are inserted bottom-up, before
    /// their parents' keys are known).
    tag_template: TagTemplate,
}

/// Where a new node would go, for the duplicate check.
pub(super) enum Slot {
    Exact(String),
    Wildcard(Pattern),
    KeyOnly,
}

impl Level {
    fn find<'a>(&'a self, key: &str, value: &str) -> Option<(&'a KeyNodes, &'a Node, Matched<'a>)> {
        let nodes = self.keys.get(key)?;
        if let Some(node) = nodes.exact.get(value) {
            return Some((nodes, node, Matched::Exact));
        }
        if let Some((pattern, node)) = nodes.wildcards.iter().find(|(p, _)| p.matches(value)) {
            return Some((nodes, node, Matched::Wildcard(pattern)));
        }
        nodes
            .key_only
            .as_deref()
            .map(|node| (nodes, node, Matched::KeyOnly))
    }

    /// Gives every key of this level and below its [`TagTemplate`]: `parent`'s plus the key.
    fn build_tag_templates(&mut self, parent: &TagTemplate) {
        for (key, nodes) in &mut self.keys {
            let KeyNodes {
                exact,
                wildcards,
                key_only,
                tag_template,
            } = nodes;
            *tag_template = parent.with_key(key);
            let children = exact
                .values_mut()
                .chain(wildcards.iter_mut().map(|(_, node)| node))
                .chain(key_only.as_deref_mut());
            for node in children {
                node.children.build_tag_templates(tag_template);
            }
        }
    }

    /// Adds a node; gives it back if the slot is taken (a duplicate key/value at this level).
    pub(super) fn insert(&mut self, key: &str, slot: Slot, node: Node) -> Result<(), Node> {
        let nodes = self.keys.entry(key.to_owned()).or_default();
        match slot {
            Slot::Exact(value) => {
                if nodes.exact.contains_key(&value) {
                    return Err(node);
                }
                nodes.exact.insert(value, node);
            }
            Slot::Wildcard(pattern) => {
                if nodes.wildcards.iter().any(|(p, _)| p.text == pattern.text) {
                    return Err(node);
                }
                nodes.wildcards.push((pattern, node));
            }
            Slot::KeyOnly => {
                if nodes.key_only.is_some() {
                    return Err(node);
                }
                nodes.key_only = Some(Box::new(node));
            }
        }
        Ok(())
    }
}

/// What [`DomainRules::bucket_order`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketOrder<'a> {
    /// No order of the entries reaches a limit.
    None,
    /// Exactly one order does.
    One(Vec<(&'a str, &'a str)>),
    /// Several do; the first in key order.
    Several(Vec<(&'a str, &'a str)>),
    /// The search ran out of visits before finding one: an order may exist (a caller must not
    /// take this as no rule).
    Unsettled,
}

/// The most nodes [`DomainRules::bucket_order`] visits.
pub const MAX_ORDER_VISITS: usize = 4096;

/// A depth-first search for the orders of a bucket's entries that end at a limit; stops at the
/// second found.
struct OrderSearch<'a> {
    path: Vec<(&'a str, &'a str)>,
    used: Vec<bool>,
    found: Vec<Vec<(&'a str, &'a str)>>,
    visits: usize,
}

impl<'a> OrderSearch<'a> {
    fn descend(&mut self, level: &Level, entries: &[(&'a str, &'a str)]) {
        for (i, &(key, value)) in entries.iter().enumerate() {
            if self.used[i] || self.found.len() >= 2 || self.visits >= MAX_ORDER_VISITS {
                continue;
            }
            let Some((_, node, _)) = level.find(key, value) else {
                continue;
            };
            self.visits += 1;
            self.used[i] = true;
            self.path.push((key, value));
            if self.path.len() == entries.len() {
                if node.rule.is_some() {
                    self.found.push(self.path.clone());
                }
            } else {
                self.descend(&node.children, entries);
            }
            self.path.pop();
            self.used[i] = false;
        }
    }
}

/// One descriptor node of the config.
#[derive(Debug)]
pub(super) struct Node {
    /// This level's part of the static path: `key`, or `key_value` (the pattern for wildcards).
    pub segment: String,
    pub rule: Option<Arc<Rule>>,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub children: Level,
}

/// A wildcard value: `*` matches any run of characters (including none), anywhere in the value.
/// There is no escape: a value containing `*` is always a pattern, as in envoyproxy/ratelimit.
#[derive(Debug, Clone)]
pub(super) struct Pattern {
    text: String,
    /// The literal parts between the `*`s; at least two (the text contains a `*`).
    parts: Vec<String>,
}

impl Pattern {
    /// `None` when `text` has no `*` (an exact value).
    pub(super) fn new(text: &str) -> Option<Pattern> {
        text.contains('*').then(|| Pattern {
            text: text.to_owned(),
            parts: text.split('*').map(str::to_owned).collect(),
        })
    }

    pub(super) fn as_str(&self) -> &str {
        &self.text
    }

    /// Glob match. The prefix and suffix are anchored; the middle parts are found left to right,
    /// each at its earliest position, which is correct for patterns with only `*`.
    pub(super) fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        if value.len() < first.len() + last.len()
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let Some(mut rest) = value.get(first.len()..value.len() - last.len()) else {
            return false;
        };
        let middle = self.parts.get(1..self.parts.len() - 1).unwrap_or(&[]);
        for part in middle {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::Pattern;
    use crate::config::{RuleSet, load_sources};
    use crate::store::CounterKey;
    use proptest::prelude::*;

    /// Escaping everywhere: a domain and keys with separators, space and non-ASCII, an exact
    /// value, a shared wildcard (its counter value is the pattern) and key-only levels.
    const ESCAPING: &str = r#"
domain: "e d:{ge}%\u00e9"
descriptors:
  - key: "user id"
    descriptors:
      - key: "pa:th="
        value: "/api/*"
        share_threshold: true
        descriptors:
          - key: "m{e}thod"
            rate_limits:
              - { unit: second, requests_per_unit: 1 }
              - { unit: minute, requests_per_unit: 5 }
  - key: plan
    value: "pro plan"
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

    const OTHER: &str = r#"
domain: other
descriptors:
  - key: plan
    value: "pro plan"
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

    fn rule_set() -> RuleSet {
        let sources = [
            ("escaping.yaml".to_string(), ESCAPING.to_string()),
            ("other.yaml".to_string(), OTHER.to_string()),
        ];
        load_sources(&sources).unwrap_or_else(|e| panic!("test rules do not load: {e}"))
    }

    /// Every counter key of the match, from its tag and from scratch with `CounterKey::new`.
    fn keys_both_ways(set: &RuleSet, domain: &str, entries: &[(&str, &str)]) -> [Vec<String>; 2] {
        let rules = set.domain(domain).expect("a configured domain");
        let m = rules.match_entries(entries).expect("a match");
        let windows: Vec<_> = m.rule.limits.iter().map(|limit| limit.window()).collect();
        let mut tag = m.counter_tag();
        let from_tag = windows.iter().map(|&w| tag.counter_key(w).to_string());
        let from_scratch = windows
            .iter()
            .map(|&w| CounterKey::new(domain, m.counter_entries.iter().copied(), w).to_string());
        [from_tag.collect(), from_scratch.collect()]
    }

    #[test]
    fn counter_tags_come_from_the_matched_path_and_domain() {
        let set = rule_set();
        let domain = "e d:{ge}%\u{e9}";
        let entries = [
            ("user id", "a:b c"),
            ("pa:th=", "/api/x"),
            ("m{e}thod", "GET"),
        ];
        let [from_tag, from_scratch] = keys_both_ways(&set, domain, &entries);
        let tag =
            "{e%20d%3A%7Bge%7D%25%C3%A9:user%20id=a%3Ab%20c:pa%3Ath%3D=/api/*:m%7Be%7Dthod=GET}";
        assert_eq!(from_tag, [format!("{tag}1000"), format!("{tag}60000")]);
        assert_eq!(from_tag, from_scratch);
        let [from_tag, from_scratch] = keys_both_ways(&set, "other", &[("plan", "pro plan")]);
        assert_eq!(from_tag, ["{other:plan=pro%20plan}3600000"]);
        assert_eq!(from_tag, from_scratch);
    }

    proptest! {
        #[test]
        fn counter_tags_agree_with_counter_key_new(
            user in any::<String>(),
            path in any::<String>(),
            method in "[%:={} a-z\\x00-\\x1f\u{e9}]{0,8}",
        ) {
            let set = rule_set();
            let path = format!("/api/{path}");
            let entries = [("user id", user.as_str()), ("pa:th=", &path), ("m{e}thod", &method)];
            let [from_tag, from_scratch] = keys_both_ways(&set, "e d:{ge}%\u{e9}", &entries);
            prop_assert_eq!(from_tag, from_scratch);
        }
    }

    fn matches(pattern: &str, value: &str) -> bool {
        Pattern::new(pattern).expect("a pattern").matches(value)
    }

    #[test]
    fn glob_prefix_suffix_middle() {
        assert!(matches("/api/*", "/api/"));
        assert!(matches("/api/*", "/api/users/1"));
        assert!(!matches("/api/*", "/apix"));
        assert!(matches("*.png", "a/b.png"));
        assert!(!matches("*.png", "a/b.png.txt"));
        assert!(matches("/a/*/c", "/a/b/c"));
        assert!(matches("/a/*/c", "/a//c"));
        assert!(!matches("/a/*/c", "/a/c"));
        assert!(matches("*", ""));
        assert!(matches("a*b*c", "abc"));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(!matches("a*b*c", "acb"));
        assert!(!matches("ab*ba", "aba"));
        assert!(matches("ab*ba", "abba"));
        assert!(matches("**", "anything"));
        assert!(matches("é*ü", "éaü"));
        assert!(!matches("é*ü", "éa"));
    }

    #[test]
    fn not_a_pattern_without_star() {
        assert!(Pattern::new("/api").is_none());
    }

    /// A bucket id (a map) finds its rule in the one order of its entries that reaches a limit;
    /// two key-only levels that nest either way give both orders, and the first is taken; an
    /// order that reaches no limit, or an entry no level has, finds nothing.
    #[test]
    fn bucket_ids_find_their_rule_in_the_order_of_the_tree() {
        use super::BucketOrder;
        let rules = load_sources(&[(
            "r.yaml".to_owned(),
            r#"
domain: q
descriptors:
  - key: user
    descriptors:
      - key: path
        value: "/api/*"
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: a
    descriptors:
      - key: b
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: b
    descriptors:
      - key: a
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: lone
    rate_limit: { unit: second, requests_per_unit: 1 }
"#
            .to_owned(),
        )])
        .expect("rules");
        let domain = rules.domain("q").expect("domain");
        assert_eq!(
            domain.bucket_order(&[("path", "/api/x"), ("user", "ann")]),
            BucketOrder::One(vec![("user", "ann"), ("path", "/api/x")])
        );
        assert_eq!(
            domain.bucket_order(&[("b", "2"), ("a", "1")]),
            BucketOrder::Several(vec![("a", "1"), ("b", "2")])
        );
        assert_eq!(
            domain.bucket_order(&[("lone", "x")]),
            BucketOrder::One(vec![("lone", "x")])
        );
        assert_eq!(domain.bucket_order(&[("user", "ann")]), BucketOrder::None);
        assert_eq!(
            domain.bucket_order(&[("path", "/web"), ("user", "ann")]),
            BucketOrder::None
        );
        assert_eq!(domain.bucket_order(&[("other", "x")]), BucketOrder::None);
        assert_eq!(domain.bucket_order(&[]), BucketOrder::None);
    }

    /// A bucket id shaped to outlast the bounded search (seven key-only levels nested in every
    /// order, the limit only at the end of the last order tried) is `Unsettled`, never "no rule".
    #[test]
    fn a_search_that_runs_out_is_unsettled_not_unlimited() {
        use super::{BucketOrder, MAX_ORDER_VISITS};
        fn level(keys: &[&str], path: &mut Vec<String>) -> serde_json::Value {
            let free: Vec<&str> = keys
                .iter()
                .copied()
                .filter(|k| !path.iter().any(|p| p == k))
                .collect();
            let nodes: Vec<serde_json::Value> = free
                .into_iter()
                .map(|key| {
                    path.push(key.to_owned());
                    let mut node = serde_json::json!({ "key": key });
                    if path.len() == keys.len() {
                        let last: Vec<String> =
                            keys.iter().rev().map(|k| (*k).to_owned()).collect();
                        if *path == last {
                            node["rate_limit"] =
                                serde_json::json!({ "unit": "second", "requests_per_unit": 1 });
                        }
                    } else {
                        node["descriptors"] = level(keys, path);
                    }
                    path.pop();
                    node
                })
                .collect();
            serde_json::Value::Array(nodes)
        }
        let keys = ["a", "b", "c", "d", "e", "f", "g"];
        let tree =
            serde_json::json!({ "domain": "q", "descriptors": level(&keys, &mut Vec::new()) });
        let rules = load_sources(&[("r.yaml".to_owned(), tree.to_string())]).expect("rules");
        let domain = rules.domain("q").expect("domain");
        let entries: Vec<(&str, &str)> = keys.iter().map(|k| (*k, "v")).collect();
        const {
            assert!(
                MAX_ORDER_VISITS < 13_699,
                "the tree has more nodes than the search visits"
            )
        };
        assert_eq!(domain.bucket_order(&entries), BucketOrder::Unsettled);
        assert_eq!(
            domain.bucket_order(&entries[..1]),
            BucketOrder::None,
            "a short search that finds nothing is no rule"
        );
    }
}
