//! Redis Cluster on free ports: three masters (optionally with replicas), plain or over TLS.

use std::process::Command;
use std::time::Duration;

use super::RedisServer;
use crate::support::{
    CertFiles, free_port, redis_server_program, require_program, run_ok, wait_until,
};

/// A 3-master Redis Cluster (no replicas) on free ports, killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 3 cluster-enabled servers, joins them with `redis-cli --cluster create` and waits
    /// for `cluster_state:ok` on every node. `None` when redis-server is missing outside CI.
    pub fn start() -> Option<RedisCluster> {
        RedisCluster::start_with(&|_| Vec::new())
    }

    /// [`RedisCluster::start`] with extra flags for node `i`.
    pub fn start_with(per_node: &dyn Fn(usize) -> Vec<String>) -> Option<RedisCluster> {
        let nodes = spawn_cluster(3, 0, &["--cluster-node-timeout", "5000"], per_node)?;
        let ok = wait_until(Duration::from_secs(20), || {
            nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        });
        assert!(ok, "cluster did not reach cluster_state:ok");
        Some(RedisCluster { nodes })
    }

    /// Seed URLs of all nodes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node serving `key` (by asking any node with `CLUSTER KEYSLOT` and `CLUSTER NODES`).
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot: u16 = self.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("keyslot");
        let nodes = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(addr) = fields.get(1) else { continue };
            let port: u16 = addr
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let serves = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').filter_map(|n| n.parse::<u16>().ok());
                match (ends.next(), ends.next()) {
                    (Some(a), Some(b)) => (a..=b).contains(&slot),
                    (Some(a), None) => a == slot,
                    _ => false,
                }
            });
            if let Some(node) = self.nodes.iter().find(|n| serves && n.port == port) {
                return node;
            }
        }
        panic!("no node serves slot {slot}");
    }

    /// `INFO commandstats` calls of `command` summed over all nodes.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.nodes.iter().map(|n| n.command_calls(command)).sum()
    }
}

/// A 3-master Redis Cluster whose nodes also serve TLS, with `tls-cluster yes`: the cluster bus
/// is TLS, and a client connected over TLS is given the nodes' TLS ports (`CLUSTER SLOTS`,
/// redirections). The plain ports stay open for [`RedisServer::cli`].
pub struct TlsRedisCluster {
    pub cluster: RedisCluster,
    pub tls_ports: Vec<u16>,
    pub ca: CertFiles,
}

impl TlsRedisCluster {
    /// Starts one; `extra` is added to every node's flags (e.g. `--tls-auth-clients yes`: the
    /// nodes present their server certificate, which allows client auth, to each other).
    pub fn start(extra: &[&str]) -> Option<TlsRedisCluster> {
        redis_server_program()?;
        let ca = CertFiles::new();
        let tls_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let per_node = |i: usize| {
            let mut args = vec!["--tls-port".to_string(), tls_ports[i].to_string()];
            args.extend(ca.server_args());
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            args.extend(extra.iter().map(|a| a.to_string()));
            args
        };
        let cluster = RedisCluster::start_with(&per_node)?;
        Some(TlsRedisCluster {
            cluster,
            tls_ports,
            ca,
        })
    }

    /// `rediss://127.0.0.1:TLS_PORT` of every node.
    pub fn urls(&self) -> Vec<String> {
        let url = |port: &u16| format!("rediss://127.0.0.1:{port}");
        self.tls_ports.iter().map(url).collect()
    }
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas)` cluster-enabled servers with a short
    /// `cluster-node-timeout` (so a replica takes over quickly), joins them with
    /// `redis-cli --cluster create ... --cluster-replicas N` (with `cluster-require-full-coverage
    /// no`, so other masters keep serving during a failover) and waits until every node reports
    /// `cluster_state:ok` and every replica's link to its master is up.
    pub fn start_with_replicas(
        masters: usize,
        replicas: usize,
        node_timeout_ms: u64,
    ) -> Option<RedisCluster> {
        let timeout = node_timeout_ms.to_string();
        let settings = [
            "--cluster-node-timeout",
            &timeout,
            // The other masters keep serving while a failed one's slots are uncovered.
            "--cluster-require-full-coverage",
            "no",
        ];
        let nodes = spawn_cluster(masters, replicas, &settings, &|_| Vec::new())?;
        let ok = wait_until(Duration::from_secs(30), || {
            nodes.iter().all(|n| {
                let info = n.cli(&["CLUSTER", "INFO"]);
                let repl = n.cli(&["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            })
        });
        assert!(ok, "cluster with replicas did not become ready");
        Some(RedisCluster { nodes })
    }
}

/// Starts `masters * (1 + replicas)` cluster-enabled servers with `settings` and joins them with
/// `redis-cli --cluster create ... --cluster-replicas N`. `None` when redis is missing outside CI.
fn spawn_cluster(
    masters: usize,
    replicas: usize,
    settings: &[&str],
    per_node: &dyn Fn(usize) -> Vec<String>,
) -> Option<Vec<RedisServer>> {
    spawn_cluster_attempt(masters, replicas, settings, per_node, 1)
}

fn spawn_cluster_attempt(
    masters: usize,
    replicas: usize,
    settings: &[&str],
    per_node: &dyn Fn(usize) -> Vec<String>,
    attempt: u32,
) -> Option<Vec<RedisServer>> {
    require_program("redis-cli")?;
    let mut nodes = Vec::new();
    for index in 0..masters * (1 + replicas) {
        let port = free_port();
        let (port_arg, conf) = (port.to_string(), format!("nodes-{port}.conf"));
        let mut args = vec![
            "--port",
            &port_arg,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &conf,
        ];
        args.extend_from_slice(settings);
        let own = per_node(index);
        args.extend(own.iter().map(String::as_str));
        match RedisServer::try_spawn(&args, port)? {
            Ok(node) => nodes.push(node),
            // Its port or its bus port (port + 10000) went to another test's server between
            // `free_port` and the bind: the cluster is made again on new ports.
            Err(_) if attempt < 3 => {
                drop(nodes);
                return spawn_cluster_attempt(masters, replicas, settings, per_node, attempt + 1);
            }
            Err(why) => panic!("{why}"),
        }
    }
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
        .output()
        .unwrap_or_else(|e| panic!("redis-cli --cluster create: {e}"));
    if !created.status.success() {
        // A node can lose its port (or its bus port, port + 10000) to another test's server
        // between `free_port` and its bind, and exit: the cluster is made again on new ports.
        if attempt < 3 {
            drop(nodes);
            return spawn_cluster_attempt(masters, replicas, settings, per_node, attempt + 1);
        }
        panic!(
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
    }
    Some(nodes)
}
