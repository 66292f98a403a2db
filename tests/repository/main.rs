//! What the repository promises: the docs' snippets, the Kubernetes manifests, envoyproxy/ratelimit's
//! environment, rule files, and the module layering.

// Every binary compiles all of the shared support and uses part of it (the repository checks
// start no Redis, the store tests no slidegate process).
#[allow(dead_code, unused_imports)]
#[path = "../support/mod.rs"]
mod support;

mod alerts;
mod compat;
mod compat_env;
mod config_binary;
mod config_reload;
mod config_rules;
mod docs;
mod explain;
mod image;
mod kubernetes;
mod layers;
mod secrets;
