//! The `slidegate` binary and its listeners: gRPC and HTTP services, hostile clients, Unix
//! sockets, TLS, reloads, traces and the xDS rule source.

#[path = "../support/otlp.rs"]
mod otlp;
#[path = "../support/mod.rs"]
mod support;

mod hostile;
mod reload;
mod service;
mod tls;
mod traces;
mod unix;
mod xds;
