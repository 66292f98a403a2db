//! The `counter_key` target: see `entries/counter_key.rs`.
#![no_main]

#[path = "../entries/mod.rs"]
mod entries;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::counter_key::run(data));
