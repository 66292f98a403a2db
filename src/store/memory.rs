//! The embedded in-memory store: an exact sliding log per counter, sharded.
