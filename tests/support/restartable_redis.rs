//! A redis-server that a test can kill and start again on the same port and data directory, with
//! or without persistence: for restarts (AOF) and memory pressure. Kept apart from the shared support's
//! throwaway [`RedisServer`](crate::support::RedisServer), which always starts empty and never persists.

use std::process::Stdio;
use std::time::Duration;

use crate::support::{
    KillOnDrop, free_port, redis_cli, redis_server_command, redis_server_program, wait_until,
};

pub struct RestartableRedis {
    pub port: u16,
    /// The data directory (AOF files, `dir`), kept across restarts.
    pub dir: tempfile::TempDir,
    args: Vec<String>,
    process: Option<KillOnDrop>,
}

impl RestartableRedis {
    /// Starts redis-server on a free port with `args` after the defaults (bound to 127.0.0.1, no
    /// RDB snapshots, AOF off unless `args` turn it on); `None` when redis-server is missing
    /// outside CI.
    pub fn start(args: &[&str]) -> Option<RestartableRedis> {
        redis_server_program()?;
        let mut redis = RestartableRedis {
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            args: args.iter().map(|a| a.to_string()).collect(),
            process: None,
        };
        redis.spawn();
        Some(redis)
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let args: Vec<&str> = ["--port", port.as_str()]
            .into_iter()
            .chain(self.args.iter().map(String::as_str))
            .collect();
        let bin = redis_server_program().expect("redis-server was found at start");
        let child = redis_server_command(&bin, self.dir.path(), &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.process = Some(KillOnDrop(child));
        let port = self.port;
        // Up once it answers PING (with AOF, after loading the file).
        let up = wait_until(Duration::from_secs(10), || self.cli(&["PING"]) == "PONG");
        assert!(up, "redis-server did not start on port {port}");
    }

    /// SIGKILL: no shutdown, no final write (what a crash or an OOM kill does).
    pub fn kill(&mut self) {
        self.process = None;
    }

    /// Starts it again on the same port, directory and arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its stdout, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }
}
