//! The `xds` target: see `entries/xds.rs`.
#![no_main]

#[path = "../entries/mod.rs"]
mod entries;

libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::xds::run(data));
