//! The rules' metric families: reload attempts, the live rule count, and whether the served rules
//! are the ones on disk.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec};

use crate::config::reload::{ConfigStatus, ReloadHook, ReloadOutcome};
use crate::config::{LiveRules, RuleSet};
use crate::metrics::Metrics;

/// The configuration's metric families, registered once into the process's [`Metrics`].
#[derive(Clone, Debug)]
pub struct ConfigMetrics {
    config_reloads: IntCounterVec,
    rules_loaded: IntGauge,
    config_loaded: IntGauge,
    config_stale: IntGauge,
    config_checksum: IntGaugeVec,
}

impl ConfigMetrics {
    /// Creates and registers the families into `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        // Constant definitions: registering them can only fail on a programming error (a
        // duplicate or malformed name), which the unit tests catch.
        Self::try_new(metrics).expect("metric definitions are valid")
    }

    fn try_new(metrics: &Metrics) -> prometheus::Result<Self> {
        let config_reloads = metrics.counter_vec(
            "slidegate_config_reloads_total",
            "Rule reload attempts by result (success, failure).",
            &["result"],
        )?;
        let rules_loaded =
            metrics.gauge("slidegate_rules_loaded", "Rules in the live rule set.")?;
        let config_loaded = metrics.gauge(
            "slidegate_config_loaded_timestamp_seconds",
            "When the live rules were loaded (at start or by the last successful reload), Unix time.",
        )?;
        let config_stale = metrics.gauge(
            "slidegate_config_stale",
            "1 when the rule files on disk are not the ones served (the last reload failed).",
        )?;
        let config_checksum = metrics.gauge_vec(
            "slidegate_config_checksum_info",
            "SHA-256 of the served rule files and of the rule files on disk (empty when \
             unreadable); always 1.",
            &["served", "on_disk"],
        )?;
        for result in ["success", "failure"] {
            config_reloads.with_label_values(&[result]);
        }
        Ok(ConfigMetrics {
            config_reloads,
            rules_loaded,
            config_loaded,
            config_stale,
            config_checksum,
        })
    }

    /// A rule reload attempt (the new rules, if any, come through [`ConfigMetrics::set_rules`]).
    pub fn config_reload(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.config_reloads.with_label_values(&[result]).inc();
    }

    /// The live rules changed (at start and after each successful reload).
    pub fn set_rules(&self, rules: &RuleSet) {
        self.rules_loaded
            .set(i64::try_from(rules.rule_count()).unwrap_or(i64::MAX));
    }

    /// The hook a rule source calls after each reload attempt: counts it, and for new rules
    /// updates this family and calls `on_loaded` (the other layers' rule gauges).
    pub fn reload_hook(
        self,
        live: LiveRules,
        on_loaded: impl Fn(&RuleSet) + Send + Sync + 'static,
    ) -> ReloadHook {
        Arc::new(move |outcome, status| {
            let loaded = matches!(outcome, ReloadOutcome::Loaded { .. });
            self.config_reload(loaded);
            if loaded {
                let rules = live.load();
                on_loaded(&rules);
                self.set_rules(&rules);
            }
            self.set_config_status(status);
        })
    }

    /// Whether the served rules are the files on disk, and since when.
    pub fn set_config_status(&self, status: &ConfigStatus) {
        let loaded = status
            .loaded_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.config_loaded.set(loaded);
        self.config_stale.set(i64::from(status.is_stale()));
        let on_disk = status.on_disk.map(|c| c.to_string()).unwrap_or_default();
        self.config_checksum.reset();
        self.config_checksum
            .with_label_values(&[status.served.to_string(), on_disk])
            .set(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Checksum;

    #[test]
    fn renders_the_reloads_and_the_status() {
        let registry = Metrics::new();
        let metrics = ConfigMetrics::new(&registry);
        metrics.config_reload(true);
        let served = Checksum::of(&[]);
        metrics.set_config_status(&ConfigStatus {
            served,
            on_disk: None,
            loaded_at: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            last_error: None,
        });
        let text = registry.render();
        for name in [
            "slidegate_config_reloads_total{result=\"success\"} 1",
            "slidegate_config_reloads_total{result=\"failure\"} 0",
            "slidegate_rules_loaded 0",
            "slidegate_config_loaded_timestamp_seconds 1800000000",
            "slidegate_config_stale 1",
            &format!("slidegate_config_checksum_info{{on_disk=\"\",served=\"{served}\"}} 1"),
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
