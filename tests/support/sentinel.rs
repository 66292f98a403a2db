//! Redis Sentinel for tests: a primary, a replica and three sentinels on free ports, each sentinel
//! `redis-server FILE --sentinel` with a config file of its own (sentinels rewrite it).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{
    KillOnDrop, RedisServer, on_a_free_port, redis_server_program, try_spawn_listening, wait_until,
};

/// The master name the test sentinels monitor.
pub const MASTER: &str = "mymaster";

/// One sentinel process and the directory holding its config file.
pub struct SentinelServer {
    pub port: u16,
    // Held until drop, which kills the sentinel and removes its config file.
    #[allow(dead_code)]
    pub process: KillOnDrop,
    #[allow(dead_code)]
    pub dir: tempfile::TempDir,
}

impl SentinelServer {
    /// A sentinel monitoring `primary_port` under [`MASTER`] (quorum 2), marking it down after
    /// 1 s of silence; `extra` config lines are appended (e.g. `requirepass x`).
    pub fn start(primary_port: u16, extra: &[&str]) -> Option<SentinelServer> {
        let bin = redis_server_program()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("sentinel.conf");
        let (port, process) = on_a_free_port(|port| {
            let mut config = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 4000\n",
                dir = dir.path().display()
            );
            for line in extra {
                config.push_str(line);
                config.push('\n');
            }
            std::fs::write(&file, config).expect("sentinel config");
            let mut command = Command::new(&bin);
            command.arg(&file).arg("--sentinel");
            try_spawn_listening(&mut command, port, "redis-server --sentinel")
                .map(|process| (port, process))
        });
        Some(SentinelServer { port, process, dir })
    }

    /// Runs `redis-cli` against this sentinel and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        crate::support::redis_cli(self.port, args)
    }

    /// The port of the primary this sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        let answer = self.cli(&["SENTINEL", "get-master-addr-by-name", MASTER]);
        answer.lines().nth(1)?.trim().parse().ok()
    }
}

/// A primary, its replica and three sentinels that agree on both.
pub struct SentinelSet {
    /// `None` once killed.
    pub primary: Option<RedisServer>,
    pub replica: RedisServer,
    pub sentinels: Vec<SentinelServer>,
}

impl SentinelSet {
    /// Starts everything and waits until each sentinel knows the replica and the two other
    /// sentinels (a failover needs their agreement).
    pub fn start() -> Option<SentinelSet> {
        let primary = RedisServer::start()?;
        let primary_port = primary.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary_port])?;
        let linked = wait_until(Duration::from_secs(10), || {
            replica
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        assert!(linked, "the replica did not sync with the primary");
        let sentinels = (0..3)
            .map(|_| SentinelServer::start(primary.port, &[]))
            .collect::<Option<Vec<_>>>()?;
        let agreed = wait_until(Duration::from_secs(20), || {
            sentinels.iter().all(|s| {
                let master = s.cli(&["SENTINEL", "master", MASTER]);
                field(&master, "num-slaves") == Some(1)
                    && field(&master, "num-other-sentinels") == Some(2)
            })
        });
        assert!(
            agreed,
            "the sentinels did not discover each other and the replica"
        );
        Some(SentinelSet {
            primary: Some(primary),
            replica,
            sentinels,
        })
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`, as `--redis-sentinel` takes them.
    pub fn addrs(&self) -> String {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILLs the primary and returns when it was killed.
    pub fn kill_primary(&mut self) -> Instant {
        let mut primary = self.primary.take().expect("the primary runs");
        let _ = primary.process.0.kill();
        let killed = Instant::now();
        let _ = primary.process.0.wait();
        killed
    }
}

/// A numeric field of a `redis-cli` answer given as alternating name and value lines.
fn field(answer: &str, name: &str) -> Option<u64> {
    let lines: Vec<&str> = answer.lines().collect();
    let at = lines.iter().position(|l| l.trim() == name)?;
    lines.get(at + 1)?.trim().parse().ok()
}
