//! The YAML structures as users write them.
