//! The `matcher` target: see `entries/matcher.rs`.
#![no_main]

#[path = "../entries/mod.rs"]
mod entries;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::matcher::run(data));
