//! The operator page, `GET /` on the operator listener: the rules, what they decide, who is limited,
//! an explain form, the store's health; resets when the token is set.
//!
//! Self-contained: the HTML, its stylesheet and its script are compiled into the binary and served
//! from this listener with `Content-Security-Policy: default-src 'self'`, so the page loads nothing
//! from anywhere else. The rules and the store are written into the HTML by the server and read
//! without JavaScript; the script refreshes the rest every two seconds from `/status.json`,
//! `/limited`, and asks `/explain` and `/counters`.

use std::fmt::Write as _;

use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::service::http_routes::AppState;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");
const STYLE: &str = include_str!("page/page.css");

/// Nothing but this listener: no script, style, font or image from elsewhere, no inline script.
const POLICY: &str =
    "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

pub(super) fn index(state: &AppState) -> Response {
    let rules = state.front.limiter().rules().load();
    let mut rows = String::new();
    for rule in rules.rules() {
        let limits = super::limits_text(rule);
        let mut flags = String::new();
        for (set, flag) in [
            (rule.shadow_mode, "shadow"),
            (rule.quota_mode, "quota"),
            (!rule.replaces.is_empty(), "replaces"),
        ] {
            if set {
                let _ = write!(flags, "<span class=\"flag\">{flag}</span>");
            }
        }
        if !rule.replaces.is_empty() {
            flags.push_str(&escape(&rule.replaces.join(", ")));
        }
        let label = rule.name.as_deref().unwrap_or(&rule.path);
        let _ = writeln!(
            rows,
            "      <tr><td>{domain}</td><td>{label}<br><small>{path}</small></td><td>{limits}</td>\
             <td>{flags}</td><td>{source}</td>\
             <td class=\"history\" data-domain=\"{domain}\" data-rules=\"{metric}\"></td></tr>",
            domain = escape(&rule.domain),
            label = escape(label),
            path = escape(&rule.path),
            limits = escape(&limits),
            source = escape(&rule.source),
            metric = escape(&metric_names(rule).join(",")),
        );
    }
    let config = state.config_status.load();
    let stale = match (config.is_stale(), config.on_disk) {
        (false, _) => String::new(),
        (true, Some(on_disk)) => format!(
            " · <b class=\"down\">the files on disk (checksum <code title=\"{on_disk}\">{short}</code>) \
             are not the ones served</b>",
            short = short(&on_disk.to_string()),
        ),
        (true, None) => " · <b class=\"down\">the files on disk cannot be read</b>".to_owned(),
    };
    let served = config.served.to_string();
    let health = if state.health.is_serving() {
        "<span class=\"up\">serving</span>"
    } else {
        "<span class=\"down\">NOT SERVING</span>"
    };
    let html = INDEX
        .replace("{{STORE}}", &escape(state.front.limiter().store().kind()))
        .replace("{{HEALTH}}", health)
        .replace(
            "{{LOADED_AT}}",
            &humantime::format_rfc3339_seconds(config.loaded_at).to_string(),
        )
        .replace(
            "{{CHECKSUM}}",
            &format!("<code title=\"{served}\">{}</code>", short(&served)),
        )
        .replace("{{STALE}}", &stale)
        .replace("{{RULES}}", &rows);
    with_policy("text/html; charset=utf-8", html)
}

/// The first 12 hex digits of a checksum, as the page shows it (the whole in its title).
fn short(checksum: &str) -> &str {
    checksum.get(..12).unwrap_or(checksum)
}

pub(super) fn script() -> Response {
    with_policy("text/javascript; charset=utf-8", SCRIPT.to_owned())
}

pub(super) fn style() -> Response {
    with_policy("text/css; charset=utf-8", STYLE.to_owned())
}

/// The `rule` labels a rule's decisions are counted under: its name (or path), and each of its
/// limits' own names.
fn metric_names(rule: &crate::config::Rule) -> Vec<&str> {
    let mut names = vec![rule.stats_name()];
    names.extend(rule.limits.iter().filter_map(|l| l.name.as_deref()));
    names.dedup();
    names
}

fn with_policy(content_type: &'static str, body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// Text made safe inside HTML elements and quoted attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            super::escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}
