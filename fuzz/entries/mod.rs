//! What each fuzz target does with its input, one module per target, each a `run(&[u8])`.
//!
//! Why apart from `fuzz_targets/`: the same functions run under libFuzzer (nightly, `fuzz/run`)
//! and, on stable, in `cargo test`, which replays every file of `fuzz/corpus/<target>/` through
//! them (`tests/listeners/hostile/corpus.rs` includes this module). A target that no longer
//! compiles, or a corpus input that panics, fails the ordinary test run.
#![allow(dead_code)]

pub mod check;
pub mod common;
pub mod counter_key;
pub mod json;
pub mod matcher;
pub mod pem;
pub mod rls;
pub mod xds;
pub mod yaml;

/// A target's entry point: what it does with one input.
pub type Run = fn(&[u8]);

/// Every target: its name (its corpus directory) and its entry point.
pub const TARGETS: &[(&str, Run)] = &[
    ("check", check::run),
    ("counter_key", counter_key::run),
    ("json", json::run),
    ("matcher", matcher::run),
    ("pem", pem::run),
    ("rls", rls::run),
    ("xds", xds::run),
    ("yaml", yaml::run),
];
