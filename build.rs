//! Compiles `proto/`: a file descriptor set for gRPC server reflection, and Rust types for the
//! xDS rule resource.
//!
//! envoy-types ships generated Rust code for Envoy's API but no descriptor set, so the server keeps
//! its own wire-compatible protos (see `proto/envoy/service/ratelimit/v3/rls.proto`). protox is a
//! pure-Rust protobuf compiler (no `protoc` needed); it also knows the well-known
//! `google/protobuf/*.proto` types.
//!
//! `RateLimitConfig` (envoyproxy/ratelimit's xDS resource) is in no crate: prost-build generates it
//! from protox's descriptors, with the well-known types taken from envoy-types, whose
//! `google.protobuf` types the discovery protocol already uses.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    let out = out_dir.join("rls_descriptor.bin");
    std::fs::write(out, protox::prost::Message::encode_to_vec(&descriptors))?;

    let rule_resource =
        protox::compile(["ratelimit/config/ratelimit/v3/rls_conf.proto"], ["proto"])?;
    prost_build::Config::new()
        .extern_path(
            ".google.protobuf.Struct",
            "::envoy_types::pb::google::protobuf::Struct",
        )
        .out_dir(&out_dir)
        .compile_fds(rule_resource)?;
    Ok(())
}
