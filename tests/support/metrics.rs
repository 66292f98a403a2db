//! Prometheus text: one series' value, and `promtool check metrics` on a whole scrape.

use std::process::Command;

use super::{require_program, run_ok};

/// The value of one series in Prometheus text, e.g. `slidegate_unknown_domain_total` or
/// `slidegate_no_rule_total{domain="test"}` (labels in the order the encoder writes them:
/// alphabetical). Missing series are 0.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .unwrap_or(0.0)
}

/// The sum of every series of `family` (e.g. `slidegate_request_duration_seconds_count`) whose
/// labels include `label` (e.g. `transport="grpc"`), whatever its other labels.
pub fn metric_sum(text: &str, family: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            let labels = name.strip_prefix(family)?.strip_prefix('{')?;
            labels
                .split(',')
                .any(|l| l.trim_end_matches('}') == label)
                .then_some(value)
        })
        .filter_map(|value| value.parse::<f64>().ok())
        .sum()
}

/// `promtool check metrics` on `text` (written to a file in `dir`): the exposition format must be
/// valid. Skipped (outside CI) when promtool is missing.
pub fn promtool_check_metrics(dir: &std::path::Path, text: &str) {
    let Some(promtool) = require_program("promtool") else {
        return;
    };
    let file = dir.join("metrics.txt");
    std::fs::write(&file, text).expect("write metrics");
    run_ok(
        Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&file).expect("metrics file")),
        "promtool check metrics",
    );
}
