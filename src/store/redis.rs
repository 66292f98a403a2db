//! The Redis store: one sorted set per counter, one Lua script call per request.
