//! The gRPC services beside RateLimitService on the same port: `grpc.health.v1.Health` (what
//! Kubernetes' gRPC probes and Envoy's health checks call) and server reflection (v1 and v1alpha,
//! so `grpcurl` works without the protos).

use tonic::service::Routes;
use tonic_health::server::HealthReporter;

use super::rls::FILE_DESCRIPTOR_SET;

/// Health and reflection requests are a few hundred bytes: their streams may buffer no more than
/// this each (tonic's default is 4 MiB), so that 100 streams on one connection hold little.
const SIDE_MESSAGE: usize = 16 << 10;

/// The health and reflection services as routes, and the reporter that sets the health status.
pub fn routes() -> Result<(HealthReporter, Routes), tonic_reflection::server::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    let health = health.max_decoding_message_size(SIDE_MESSAGE);
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let v1 = reflection()
        .build_v1()?
        .max_decoding_message_size(SIDE_MESSAGE);
    let v1alpha = (reflection().build_v1alpha()?).max_decoding_message_size(SIDE_MESSAGE);
    let routes = Routes::new(health).add_service(v1).add_service(v1alpha);
    Ok((reporter, routes))
}
