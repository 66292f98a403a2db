//! Where rules come from: rule files, or a control plane over xDS.
//!
//! Both sources end the same way: a validated [`RuleSet`](super::RuleSet) built by
//! [`load_sources`](super::load_sources) (one validation, the same error messages), swapped into
//! the [`LiveRules`](super::LiveRules) all or nothing, and reported to the same
//! [`ReloadHook`](super::reload::ReloadHook) with a [`ConfigStatus`](super::reload::ConfigStatus),
//! so the reload metrics and `/rlconfig` read the same for both. The limiter and the servers only
//! see the live rules and never learn which source filled them.
//!
//! - [`files`]: rule files, watched and reloaded (the default).
//! - [`xds`]: `RateLimitConfig` resources from a control plane, as envoyproxy/ratelimit receives
//!   them from Envoy Gateway.

pub use super::reload as files;
pub mod xds;
