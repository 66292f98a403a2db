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
//! than half the CPU per request (see BENCHMARKS.md). The gRPC port goes one step further and
//! runs its calls inside the connection's task ([`grpc`]).
//!
//! One acceptor per listener runs on the main runtime and hands each accepted connection to the
//! next worker in turn. Round robin rather than `SO_REUSEPORT`: Envoy opens few, long-lived
//! connections (one per Envoy worker), and a kernel hash over so few would often put two on one
//! thread. A connection stays on its worker for its whole life.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

pub mod grpc;

use grpc::GrpcApp;

/// What every worker serves: the gRPC services and the HTTP app. Cloned once per worker.
#[derive(Clone)]
pub struct Apps {
    pub grpc: GrpcApp,
    pub http: axum::Router,
}

/// A connection on its way from an acceptor to a worker.
type Handoff = mpsc::UnboundedSender<std::net::TcpStream>;

/// The running workers.
pub struct Workers {
    /// One message per worker that stopped: its name and how it ended.
    exited: mpsc::UnboundedReceiver<(String, String)>,
    count: usize,
}

impl Workers {
    /// Starts `count` worker threads serving `apps`, and the two acceptors (on the current
    /// runtime). Everything stops accepting when `stop` turns true, then drains.
    pub fn start(
        count: usize,
        grpc: TcpListener,
        http: TcpListener,
        apps: Apps,
        stop: watch::Receiver<bool>,
    ) -> io::Result<Workers> {
        let (exit_tx, exited) = mpsc::unbounded_channel();
        let mut grpc_handoffs = Vec::with_capacity(count);
        let mut http_handoffs = Vec::with_capacity(count);
        for index in 0..count {
            let (grpc_tx, grpc_rx) = mpsc::unbounded_channel();
            let (http_tx, http_rx) = mpsc::unbounded_channel();
            grpc_handoffs.push(grpc_tx);
            http_handoffs.push(http_tx);
            let name = format!("slidegate-worker-{index}");
            let worker = Worker {
                apps: apps.clone(),
                grpc: grpc_rx,
                http: http_rx,
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
        tokio::spawn(accept(grpc, grpc_handoffs, stop.clone()));
        tokio::spawn(accept(http, http_handoffs, stop));
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

/// Accepts connections and deals them out to the workers in turn, until `stop`. Dropping the
/// listener on stop closes the port at once, so new clients are refused rather than left hanging.
async fn accept(listener: TcpListener, workers: Vec<Handoff>, mut stop: watch::Receiver<bool>) {
    let mut next = 0;
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted.and_then(prepare) {
            Ok(stream) => stream,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if workers[next % workers.len()].send(stream).is_err() {
            return; // The worker is gone: the process is stopping.
        }
        next = next.wrapping_add(1);
    }
}

/// Detaches an accepted stream from this runtime so that a worker's runtime can own it.
fn prepare((stream, _peer): (TcpStream, SocketAddr)) -> io::Result<std::net::TcpStream> {
    // Envoy waits on every call: do not let Nagle hold small responses back.
    stream.set_nodelay(true)?;
    stream.into_std()
}

/// One worker thread's share of the connections.
struct Worker {
    apps: Apps,
    grpc: mpsc::UnboundedReceiver<std::net::TcpStream>,
    http: mpsc::UnboundedReceiver<std::net::TcpStream>,
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
        let grpc = serve_grpc(self.grpc, self.apps.grpc, self.stop.clone());
        let http = axum::serve(Handoffs(self.http), self.apps.http)
            .with_graceful_shutdown(stopped(self.stop));
        let ((), http) = tokio::join!(grpc, http);
        format!("gRPC: stopped, HTTP: {}", outcome(http))
    }
}

/// Serves the gRPC connections handed to this worker, each as a task of its own, until `stop`;
/// then waits for them to finish their calls.
async fn serve_grpc(
    mut handoffs: mpsc::UnboundedReceiver<std::net::TcpStream>,
    app: GrpcApp,
    stop: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let mut stopping = std::pin::pin!(stopped(stop.clone()));
    let mut open = true;
    loop {
        tokio::select! {
            () = &mut stopping => break,
            handoff = handoffs.recv(), if open => match handoff.map(TcpStream::from_std) {
                Some(Ok(io)) => {
                    let served = grpc::serve_connection(io, app.clone(), stop.clone());
                    connections.spawn(async move {
                        if let Err(error) = served.await {
                            tracing::debug!(%error, "gRPC connection ended");
                        }
                    });
                }
                Some(Err(error)) => tracing::warn!(%error, "cannot take over a connection"),
                // The acceptor stopped: only the shutdown signal ends this server now.
                None => open = false,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    while connections.join_next().await.is_some() {}
}

fn outcome<E: std::fmt::Display>(result: Result<(), E>) -> String {
    match result {
        Ok(()) => "stopped".to_string(),
        Err(error) => format!("failed: {error}"),
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The connections an acceptor hands to one worker, as an axum listener.
struct Handoffs(mpsc::UnboundedReceiver<std::net::TcpStream>);

impl axum::serve::Listener for Handoffs {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let Some(stream) = self.0.recv().await else {
                // The acceptor stopped: only the shutdown signal ends this server now.
                return std::future::pending().await;
            };
            match TcpStream::from_std(stream).and_then(|s| Ok((s.peer_addr()?, s))) {
                Ok((peer, stream)) => return (stream, peer),
                Err(error) => tracing::warn!(%error, "cannot take over a connection"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        // Not known here (the acceptor owns the socket) and not used by axum::serve.
        Err(io::Error::other(
            "connections are handed over by an acceptor",
        ))
    }
}
