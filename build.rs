//! Compiles `proto/` into a file descriptor set for gRPC server reflection.
//!
//! envoy-types ships generated Rust code for Envoy's API but no descriptor set, so the server keeps
//! its own wire-compatible protos (see `proto/envoy/service/ratelimit/v3/rls.proto`). protox is a
//! pure-Rust protobuf compiler (no `protoc` needed); it also knows the well-known
//! `google/protobuf/*.proto` types.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("rls_descriptor.bin");
    std::fs::write(out, protox::prost::Message::encode_to_vec(&descriptors))?;
    Ok(())
}
