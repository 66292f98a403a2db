//! The fixture of the fault tests (`faults_*`): their rules, a temporary rules directory, gRPC
//! answers classified (decided by the store, or by a failure mode), load from concurrent callers,
//! and the server's metrics and health.
//!
//! The fault tests run the real `slidegate` binary against real redis-server processes. Windows
//! are short and the assertions tolerant of a slow, shared machine: a bound is checked with a
//! generous margin, never an exact duration. Each test says in its doc comment what it proves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Slidegate, descriptor, http_get};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

pub(crate) const DOMAIN: &str = "faults";

/// `user` has room for every call a test makes (an exact log, whose hits the tests count with
/// `ZCARD`); `tight` allows 2 per minute.
pub(crate) const RULES: &str = r#"
domain: faults
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: minute, requests_per_unit: 100000, precision: exact }
  - key: tight
    rate_limit: { name: tight, unit: minute, requests_per_unit: 2 }
"#;

/// A temporary directory holding `rules/rules.yaml`.
pub(crate) struct Rules {
    dir: tempfile::TempDir,
}

impl Rules {
    pub(crate) fn new(text: &str) -> Rules {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("rules")).expect("rules dir");
        std::fs::write(dir.path().join("rules/rules.yaml"), text).expect("write rules");
        Rules { dir }
    }

    pub(crate) fn dir(&self) -> PathBuf {
        self.dir.path().join("rules")
    }

    pub(crate) fn file(&self) -> PathBuf {
        self.dir().join("rules.yaml")
    }
}

pub(crate) fn request(entries: &[(&str, &str)]) -> RateLimitRequest {
    crate::support::request(DOMAIN, vec![descriptor(entries)])
}

/// What one call got, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A decision the store made: OK or OVER_LIMIT with a reset time.
    Store(Code),
    /// OK without a reset time: the `allow` failure mode.
    FailOpen,
    /// OVER_LIMIT without a reset time: the `deny` failure mode.
    FailClosed,
    /// A gRPC error (code, message): UNAVAILABLE is the `error` failure mode.
    Error(tonic::Code, String),
}

pub(crate) fn classify(
    result: Result<tonic::Response<RateLimitResponse>, tonic::Status>,
) -> Answer {
    match result {
        Err(status) => Answer::Error(status.code(), status.message().to_string()),
        Ok(response) => {
            let r = response.into_inner();
            let from_store = r
                .statuses
                .first()
                .is_some_and(|s| s.duration_until_reset.is_some());
            match (r.overall_code(), from_store) {
                (code, true) => Answer::Store(code),
                (Code::OverLimit, false) => Answer::FailClosed,
                (_, false) => Answer::FailOpen,
            }
        }
    }
}

/// One call of a load run.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) started: Instant,
    pub(crate) elapsed: Duration,
    pub(crate) answer: Answer,
}

/// Calls `req` in a loop from `tasks` tasks (each with its own connection) until `stop` is set,
/// pausing `pause` between calls; returns every call.
pub(crate) async fn load(
    server: &Slidegate,
    req: RateLimitRequest,
    tasks: usize,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let mut client = server.client().await;
        let req = req.clone();
        let stop = Arc::clone(&stop);
        handles.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let answer = classify(client.should_rate_limit(req.clone()).await);
                samples.push(Sample {
                    started,
                    elapsed: started.elapsed(),
                    answer,
                });
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            samples
        }));
    }
    tokio::spawn(async move {
        let mut all = Vec::new();
        for handle in handles {
            all.extend(handle.await.expect("load task"));
        }
        all.sort_by_key(|s| s.started);
        all
    })
}

pub(crate) fn metrics(server: &Slidegate) -> String {
    let (status, body) = server.get("/metrics");
    assert_eq!(status, 200, "GET /metrics");
    body
}

pub(crate) fn healthy(server: &Slidegate) -> bool {
    server.get("/healthcheck").0 == 200
}

pub(crate) fn server_alive(server: &Slidegate) -> bool {
    Path::new(&format!("/proc/{}", server.pid())).exists()
        && http_get(server.http_port, "/healthcheck").0 != 0
}
