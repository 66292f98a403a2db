//! The `check` target: see `entries/check.rs`.
#![no_main]

#[path = "../entries/mod.rs"]
mod entries;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::check::run(data));
