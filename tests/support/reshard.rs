//! Live resharding of a [`RedisCluster`]: who serves which slots, `redis-cli --cluster reshard`
//! between two masters, descriptor values whose counters land on chosen slots, and what the
//! nodes answered with redirections (`INFO errorstats`).

use std::ops::Range;
use std::process::Command;
use std::time::Duration;

use redis::cluster_routing::Slot;
use slidegate::store::CounterKey;

use crate::support::{RedisCluster, RedisServer, run_ok, wait_until};

/// One master as `CLUSTER NODES` describes it: its port, node id and slot ranges.
#[derive(Clone, Debug)]
pub struct Master {
    pub port: u16,
    pub id: String,
    pub slots: Vec<Range<u16>>,
}

impl Master {
    /// Its lowest `count` slots: what `redis-cli --cluster reshard --cluster-slots count` takes
    /// from it.
    pub fn lowest_slots(&self, count: u16) -> Range<u16> {
        let first = self
            .slots
            .iter()
            .map(|r| r.start)
            .min()
            .expect("a master has slots");
        first..first + count
    }

    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| r.contains(&slot))
    }
}

/// The masters of `cluster` as node 0 sees them, in the order of `cluster.nodes`.
pub fn masters(cluster: &RedisCluster) -> Vec<Master> {
    let text = cluster.nodes[0].cli(&["CLUSTER", "NODES"]);
    let mut masters: Vec<Master> = text.lines().filter_map(parse_node).collect();
    masters.sort_by_key(|m| cluster.nodes.iter().position(|n| n.port == m.port));
    masters
}

/// A `CLUSTER NODES` line of a master: `id host:port@bus flags master - ping pong epoch state
/// slots...` (slots `a-b` or `a`; `[slot->-id]` entries of open slots are skipped).
fn parse_node(line: &str) -> Option<Master> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if !fields.get(2)?.contains("master") {
        return None;
    }
    let port = fields[1].split(['@', ':']).nth(1)?.parse().ok()?;
    let slots = fields
        .iter()
        .skip(8)
        .filter(|f| !f.starts_with('['))
        .filter_map(|range| {
            let mut ends = range.split('-').map(|n| n.parse::<u16>().ok());
            match (ends.next()?, ends.next()) {
                (Some(a), Some(Some(b))) => Some(a..b + 1),
                (Some(a), None) => Some(a..a + 1),
                _ => None,
            }
        })
        .collect();
    Some(Master {
        port,
        id: fields[0].to_string(),
        slots,
    })
}

/// `redis-cli --cluster reshard` of `slots` slots from `from` to `to` (it moves `from`'s lowest
/// slots, one at a time: `SETSLOT IMPORTING` and `MIGRATING`, `MIGRATE` of their keys, `SETSLOT
/// NODE` on every master), then waits until every node agrees on the new owner.
pub fn reshard(cluster: &RedisCluster, from: &Master, to: &Master, slots: u16) {
    let seed = format!("127.0.0.1:{}", cluster.nodes[0].port);
    run_ok(
        Command::new("redis-cli")
            .args(["--cluster", "reshard", &seed])
            .args(["--cluster-from", &from.id, "--cluster-to", &to.id])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"]),
        "redis-cli --cluster reshard",
    );
    let moved = from.lowest_slots(slots);
    let agreed = wait_until(Duration::from_secs(10), || {
        cluster.nodes.iter().all(|node| {
            let view = node_view(node);
            moved
                .clone()
                .all(|slot| view.iter().any(|m| m.id == to.id && m.serves(slot)))
        })
    });
    assert!(
        agreed,
        "the nodes do not agree that {moved:?} moved to {}",
        to.port
    );
}

fn node_view(node: &RedisServer) -> Vec<Master> {
    node.cli(&["CLUSTER", "NODES"])
        .lines()
        .filter_map(parse_node)
        .collect()
}

/// `count` values of descriptor key `key` in `domain` whose counters land on `slots` (see
/// [`lands_on`]), tried in the order `{stem}0`, `{stem}1`, ...
pub fn values_on_slots(
    domain: &str,
    key: &str,
    stem: &str,
    slots: &Range<u16>,
    count: usize,
) -> Vec<String> {
    (0u64..)
        .map(|i| format!("{stem}{i}"))
        .filter(|value| lands_on(domain, key, value, slots))
        .take(count)
        .collect()
}

/// Whether the counters of `domain`'s descriptor `key=value` (any window: they share the hash
/// tag) hash to a slot in `slots`.
pub fn lands_on(domain: &str, key: &str, value: &str, slots: &Range<u16>) -> bool {
    let counter = CounterKey::new(domain, [(key, value)], Duration::from_secs(1));
    let slot = Slot::for_key(counter.as_str());
    slots.clone().filter_map(Slot::new).any(|s| s == slot)
}

/// Error replies of kind `code` (`MOVED`, `ASK`, `TRYAGAIN`) the masters sent, summed
/// (`INFO errorstats`, `errorstat_MOVED:count=N`).
pub fn error_replies(cluster: &RedisCluster, code: &str) -> u64 {
    let prefix = format!("errorstat_{code}:count=");
    cluster
        .nodes
        .iter()
        .map(|node| {
            node.cli(&["INFO", "errorstats"])
                .lines()
                .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Writes `count` small keys with the hash tag of `key` (so on its slot) on the node serving it:
/// a slot with more keys takes longer to migrate, and stays longer in the state where
/// multi-key commands on it get `TRYAGAIN`.
pub fn fill_slot(cluster: &RedisCluster, key: &str, count: usize) {
    let tag = &key[..key.find('}').map_or(key.len(), |end| end + 1)];
    let fill = "for i = 1, tonumber(ARGV[1]) do redis.call('SET', KEYS[1] .. i, 'x') end";
    let node = cluster.node_for(key);
    let out = node.cli(&["EVAL", fill, "1", &format!("{tag}fill"), &count.to_string()]);
    assert!(out.is_empty(), "filling the slot of {key}: {out}");
}
