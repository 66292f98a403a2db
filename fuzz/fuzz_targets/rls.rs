//! The `rls` target: see `entries/rls.rs`.
#![no_main]

#[path = "../entries/mod.rs"]
mod entries;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::rls::run(data));
