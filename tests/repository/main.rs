//! What the repository promises: the docs' snippets, the Kubernetes manifests, envoyproxy/ratelimit's
//! environment, rule files, and the module layering.

#[path = "../support/mod.rs"]
mod support;

mod compat;
mod config;
mod docs;
mod kubernetes;
mod layers;
