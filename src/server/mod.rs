//! Thread-per-core serving: the gRPC and HTTP listeners feed a fixed set of worker threads, each
//! with a single-threaded tokio runtime of its own.
//!
//! Why not one multi-threaded runtime: a rate-limit call does a few microseconds of work of
//! its own, and HTTP/2 servers run calls as tasks of their own (hyper, for the HTTP port, one
//! per stream). On a work-stealing runtime those tasks, the connection task and the socket
//! wake-ups hop between threads (futex wake-ups, the LIFO slot running the connection task
//! after every single response), so each response costs a system call and a cross-thread
//! wake-up. On a single-threaded runtime the calls that one read brought in all run before the
//! connection writes, and their responses leave in one `writev`. Measured on two cores: less
//! than half the CPU per request (see docs/benchmarks.md). The gRPC port goes one step further and
//! runs its calls inside the connection's task ([`grpc_port`]).
//!
//! One acceptor per listener runs on the main runtime and hands each accepted connection to the
//! next worker in turn. Round robin rather than `SO_REUSEPORT`: Envoy opens few, long-lived
//! connections (one per Envoy worker), and a kernel hash over so few would often put two on one
//! thread. A connection stays on its worker for its whole life.
//!
//! The acceptors admit a connection only under the connection caps ([`limits`]); each worker
//! runs the TLS handshake when TLS is on ([`tls`], within the handshake timeout), holds its
//! connections to the timeouts there, and reads the decrypted bytes through [`flood::Metered`].

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;

pub mod budget;
pub mod flood;
pub mod grpc_port;
pub mod http_budget;
mod http_port;
pub mod limits;
pub mod metrics;
pub mod socket;
pub mod tls;

use crate::service::Caller;
use crate::throttle::Throttle;
use flood::Metered;
use grpc_port::{GrpcApp, Serving};
use http_budget::HttpBudget;
use limits::{Admission, ServerLimits, Ticket};
use metrics::ServerMetrics;
use socket::{Bound, Conn, Io, Peer};
use tls::{Listener, Tls};

/// What every worker serves: the gRPC services, the HTTP app and the operator listener's app.
/// Cloned once per worker.
#[derive(Clone)]
pub struct Apps {
    pub grpc: GrpcApp,
    pub http: axum::Router,
    pub admin: axum::Router,
    /// Whether the data ports name each request's caller ([`crate::service::Caller`]) for the
    /// decision log: once per connection, only when a line may use it. The operator listener
    /// always does.
    pub name_callers: bool,
}

/// The bound listeners: gRPC, HTTP and the operator listener.
pub struct Listeners {
    pub grpc: Bound,
    pub http: Bound,
    pub admin: Bound,
}

/// A connection on its way from an acceptor to a worker, with its place under the caps.
type Handoff = (Conn, Peer, Ticket);

/// The running workers.
pub struct Workers {
    /// One message per worker that stopped: its name and how it ended.
    exited: mpsc::UnboundedReceiver<(String, String)>,
    count: usize,
}

impl Workers {
    /// Starts `count` worker threads serving `apps` within `limits` (through `tls` when set),
    /// and the two acceptors (on the current runtime). Everything stops accepting when `stop`
    /// turns true, then drains.
    pub fn start(
        count: usize,
        listeners: Listeners,
        apps: Apps,
        (limits, tls): (ServerLimits, Option<Arc<Tls>>),
        metrics: Arc<ServerMetrics>,
        stop: watch::Receiver<bool>,
    ) -> io::Result<Workers> {
        let http_budget = HttpBudget::new(
            limits.http_max_buffered_bytes,
            limits.http_max_body_bytes,
            metrics.http_buffer_refused(),
        );
        let admission = Admission::new(&limits, Arc::clone(&metrics));
        let operators = Admission::for_operators(&limits, metrics);
        let limits = Arc::new(limits);
        let buffered = Arc::new(Semaphore::new(
            limits.max_buffered_bytes.min(Semaphore::MAX_PERMITS),
        ));
        let (exit_tx, exited) = mpsc::unbounded_channel();
        let mut grpc_handoffs = Vec::with_capacity(count);
        let mut http_handoffs = Vec::with_capacity(count);
        let mut admin_handoffs = Vec::with_capacity(count);
        for index in 0..count {
            let (grpc_tx, grpc_rx) = mpsc::unbounded_channel();
            let (http_tx, http_rx) = mpsc::unbounded_channel();
            let (admin_tx, admin_rx) = mpsc::unbounded_channel();
            grpc_handoffs.push(grpc_tx);
            http_handoffs.push(http_tx);
            admin_handoffs.push(admin_tx);
            let name = format!("slidegate-worker-{index}");
            let worker = Worker {
                apps: apps.clone(),
                grpc: grpc_rx,
                http: http_rx,
                admin: admin_rx,
                limits: Arc::clone(&limits),
                buffered: Arc::clone(&buffered),
                http_budget: http_budget.clone(),
                tls: tls.clone(),
                stop: stop.clone(),
            };
            let exit_tx = exit_tx.clone();
            std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let outcome = worker.run();
                    let _ = exit_tx.send((name, outcome));
                })?;
        }
        let acceptor = |listener, name, admission: &Arc<Admission>| Acceptor {
            listener,
            name,
            admission: Arc::clone(admission),
        };
        let grpc = acceptor(listeners.grpc, "grpc", &admission);
        tokio::spawn(grpc.run(grpc_handoffs, stop.clone()));
        let http = acceptor(listeners.http, "http", &admission);
        tokio::spawn(http.run(http_handoffs, stop.clone()));
        // The operator listener counts apart: data-port clients at their cap cannot take it.
        let admin = acceptor(listeners.admin, "admin", &operators);
        tokio::spawn(admin.run(admin_handoffs, stop));
        Ok(Workers { exited, count })
    }

    /// Resolves when a worker stops before shutdown (which is a failure): its name and why.
    pub async fn failed(&mut self) -> (String, String) {
        match self.exited.recv().await {
            Some(exit) => exit,
            None => ("workers".to_string(), "all gone".to_string()),
        }
    }

    /// After `stop` turned true: waits until every worker has drained, or `timeout` passed
    /// (then `Err` with the number still running).
    pub async fn drained(mut self, timeout: Duration) -> Result<(), usize> {
        let mut running = self.count;
        let all = async {
            while running > 0 {
                match self.exited.recv().await {
                    Some((name, outcome)) => {
                        tracing::debug!(worker = %name, %outcome, "worker stopped");
                        running -= 1;
                    }
                    None => break,
                }
            }
        };
        let finished = tokio::time::timeout(timeout, all).await;
        finished.map_err(|_| running)
    }
}

/// One listener and the caps its connections are admitted under.
struct Acceptor {
    listener: Bound,
    /// `grpc` or `http`, for the metric of refusals.
    name: &'static str,
    admission: Arc<Admission>,
}

impl Acceptor {
    /// Accepts connections and deals them out to the workers in turn, until `stop`. A
    /// connection over a cap is closed at once (and counted). Dropping the listener on stop
    /// closes the port at once, so new clients are refused rather than left hanging.
    async fn run(
        self,
        workers: Vec<mpsc::UnboundedSender<Handoff>>,
        mut stop: watch::Receiver<bool>,
    ) {
        static REFUSED: Throttle = Throttle::new();
        let mut next = 0;
        loop {
            let accepted = tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let ticket = match self.admission.admit(peer.key(), self.name) {
                Ok(ticket) => ticket,
                Err(refusal) => {
                    if let Some(left_out) = REFUSED.admit() {
                        tracing::warn!(listener = self.name, %peer, reason = refusal.as_str(), refused_before = left_out, "connection refused: a connection cap is reached");
                    }
                    continue;
                }
            };
            if workers[next % workers.len()]
                .send((stream, peer, ticket))
                .is_err()
            {
                return; // The worker is gone: the process is stopping.
            }
            next = next.wrapping_add(1);
        }
    }
}

/// A connection handed over by an acceptor, on this worker's runtime; a connection the client
/// reset meanwhile is only counted (one aggregated warning per interval, see [`throttle`]).
fn take_over(conn: Conn) -> Option<Io> {
    static LOST: Throttle = Throttle::new();
    match conn.into_io() {
        Ok(io) => Some(io),
        Err(error) => {
            if let Some(left_out) = LOST.admit() {
                tracing::warn!(%error, lost_before = left_out, "cannot take over a connection (reset by its client?)");
            }
            None
        }
    }
}

/// One worker thread's share of the connections.
struct Worker {
    apps: Apps,
    grpc: mpsc::UnboundedReceiver<Handoff>,
    http: mpsc::UnboundedReceiver<Handoff>,
    admin: mpsc::UnboundedReceiver<Handoff>,
    limits: Arc<ServerLimits>,
    buffered: Arc<Semaphore>,
    /// The HTTP port's budget of buffered request bytes, shared by every worker.
    http_budget: HttpBudget,
    tls: Option<Arc<Tls>>,
    stop: watch::Receiver<bool>,
}

impl Worker {
    /// Serves until `stop`, then drains; returns how it ended, for the log.
    fn run(self) -> String {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => return format!("cannot start its runtime: {error}"),
        };
        runtime.block_on(self.serve())
    }

    async fn serve(self) -> String {
        let (drain_tx, drain_over) = watch::channel(false);
        // Calls still open shortly before the drain timeout get an answer (UNAVAILABLE, or a
        // 503 from the HTTP port's connection closing) instead of a dropped connection.
        let deadline = self.limits.drain_timeout.saturating_sub(DRAIN_MARGIN);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            stopped(stop).await;
            tokio::time::sleep(deadline).await;
            let _ = drain_tx.send(true);
        });
        let serving = Serving {
            limits: Arc::clone(&self.limits),
            name_callers: self.apps.name_callers,
            buffered: self.buffered,
            stop: self.stop.clone(),
            drain_over: drain_over.clone(),
        };
        let grpc = serve_grpc(self.grpc, self.apps.grpc, serving, self.tls.clone());
        let http = http_port::serve(
            self.http,
            self.apps.http,
            (&self.limits, Some(self.http_budget)),
            (self.tls.clone(), Listener::Http, self.apps.name_callers),
            self.stop.clone(),
            drain_over.clone(),
        );
        // The operator listener is plaintext unless `--tls-listeners` names it: it belongs on an
        // address only operators reach.
        // It reads no bodies (a body limit of 0): no budget.
        let admin = http_port::serve(
            self.admin,
            self.apps.admin,
            (&self.limits, None),
            (self.tls, Listener::Admin, true),
            self.stop,
            drain_over,
        );
        let ((), (), ()) = tokio::join!(grpc, http, admin);
        "stopped".to_string()
    }
}

/// What a worker keeps of the drain timeout to answer the calls still open and close.
const DRAIN_MARGIN: Duration = Duration::from_millis(250);

/// Serves the gRPC connections handed to this worker, each as a task of its own, until `stop`;
/// then waits for them to finish their calls.
async fn serve_grpc(
    mut handoffs: mpsc::UnboundedReceiver<Handoff>,
    app: GrpcApp,
    serving: Serving,
    tls: Option<Arc<Tls>>,
) {
    let mut connections = JoinSet::new();
    let mut stopping = std::pin::pin!(stopped(serving.stop.clone()));
    let mut open = true;
    loop {
        tokio::select! {
            () = &mut stopping => break,
            handoff = handoffs.recv(), if open => match handoff {
                Some((stream, peer, ticket)) => {
                    let Some(io) = take_over(stream) else { continue };
                    let (app, serving, tls) = (app.clone(), serving.clone(), tls.clone());
                    connections.spawn(async move {
                        // One handshake timeout from accept to the HTTP/2 preface, TLS included.
                        let timeout = serving.limits.handshake_timeout;
                        let preface_by = tokio::time::Instant::now() + timeout;
                        let secured = tls::secure(tls.as_deref(), io, peer, Listener::Grpc, timeout);
                        if let Some((io, revoked)) = secured.await {
                            let caller = serving.name_callers.then(|| Caller::new(peer));
                            let (stop, drain_over) = revoked.or_stop(serving.stop.clone(), serving.drain_over.clone(), serving.limits.drain_timeout);
                            let serving = Serving { stop, drain_over, ..serving };
                            let served = grpc_port::serve_connection(Metered::new(io), app, serving, preface_by, (peer.key(), caller));
                            if let Err(error) = served.await {
                                tracing::debug!(%error, "gRPC connection ended");
                            }
                        }
                        drop(ticket);
                    });
                }
                // The acceptor stopped: only the shutdown signal ends this server now.
                None => open = false,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    while connections.join_next().await.is_some() {}
}

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
