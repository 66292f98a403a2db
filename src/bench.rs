//! `slidegate bench`: a gRPC load generator for any RateLimitService v3 server.
