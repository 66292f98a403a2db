//! From a request's descriptors to counters, one store decision, and per-descriptor statuses.
