//! The transports: gRPC RateLimitService v3 and the HTTP endpoints.
