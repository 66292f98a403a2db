//! Where the rules come from: rule files (`--config`) or a control plane over xDS.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::BoolishValueParser;

use super::{Given, LOG_TARGET, spelled};
use crate::config::source::xds::{XdsOptions, XdsTls, parse_metadata_pair};
use crate::config::{ConfigErrors, RuleSet, load_path};

/// The rule path when neither --config nor --xds-server is given.
pub const DEFAULT_CONFIG: &str = "config";

/// The first wait before connecting to the control plane again.
const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(3);

/// Settings that contradict each other.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("--force-start-without-initial-config needs --xds-server (rule files must load)")]
    ForceStartWithoutXds,
    #[error(
        "--config {config} and --xds-server {server} both given: rules come either from files \
         or from a control plane"
    )]
    ConfigAndXds { config: String, server: String },
    #[error("cannot load rules from {path}:\n{errors}")]
    Rules { path: String, errors: ConfigErrors },
}

#[derive(clap::Args, Debug, Clone)]
pub struct RulesSettings {
    /// Rule file or directory of rule files (every file not starting with `.`); reloaded on
    /// change and on SIGHUP [default: config]. Not with --xds-server (which overrides
    /// SLIDEGATE_CONFIG).
    #[arg(long, env = "SLIDEGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Control plane that serves the rules over xDS instead of rule files (as Envoy Gateway serves
    /// envoyproxy/ratelimit: `RateLimitConfig` resources, ADS, state of the world): `host:port`,
    /// `http://host:port` or `https://host:port`. With it no rule files are read.
    #[arg(long, env = "SLIDEGATE_XDS_SERVER")]
    pub xds_server: Option<String>,
    /// Node id sent to the control plane, which chooses the rules by it (Envoy Gateway serves
    /// `envoy-ratelimit`).
    #[arg(long, env = "SLIDEGATE_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,
    /// Node metadata sent to the control plane: `key=value` pairs, comma-separated.
    #[arg(long, env = "SLIDEGATE_XDS_NODE_METADATA", value_delimiter = ',',
          value_parser = parse_metadata_pair)]
    pub xds_node_metadata: Vec<(String, String)>,
    /// First wait before connecting to the control plane again after a failure, e.g. `3s`; it
    /// doubles after each failed attempt, up to 60 s.
    #[arg(long, env = "SLIDEGATE_XDS_CONNECT_RETRY_INTERVAL", default_value = spelled!(DEFAULT_RETRY_INTERVAL), value_parser = humantime::parse_duration)]
    pub xds_connect_retry_interval: Duration,
    /// PEM file of CA certificates to verify the control plane with (turns TLS on) [default: the
    /// system roots, for `https://`].
    #[arg(long, env = "SLIDEGATE_XDS_TLS_CA_FILE")]
    pub xds_tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain shown to the control plane (mutual TLS; turns TLS on; needs
    /// --xds-tls-key-file).
    #[arg(long, env = "SLIDEGATE_XDS_TLS_CERT_FILE")]
    pub xds_tls_cert_file: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert-file.
    #[arg(long, env = "SLIDEGATE_XDS_TLS_KEY_FILE")]
    pub xds_tls_key_file: Option<PathBuf>,
    /// Name to verify in the control plane's certificate when it is not the host of
    /// --xds-server (turns TLS on).
    #[arg(long, env = "SLIDEGATE_XDS_TLS_SERVER_NAME")]
    pub xds_tls_server_name: Option<String>,
    /// With --xds-server: report ready before the control plane has sent rules. Until they arrive
    /// no request matches a rule, so every request is allowed.
    #[arg(long, env = "SLIDEGATE_FORCE_START_WITHOUT_INITIAL_CONFIG", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub force_start_without_initial_config: bool,
}

impl RulesSettings {
    /// The rule path: --config, else [`DEFAULT_CONFIG`].
    pub fn config_path(&self) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG))
    }

    /// The rules at start: none yet with `xds` (the control plane sends them), else the rule
    /// files, which must load (without them slidegate does not start).
    pub fn initial_rules(&self, xds: bool, max_entries: usize) -> Result<RuleSet, SettingsError> {
        if xds {
            return Ok(RuleSet::empty());
        }
        let path = self.config_path();
        let rules = load_path(&path).map_err(|errors| SettingsError::Rules {
            path: path.display().to_string(),
            errors,
        })?;
        log_loaded(&rules, &path, max_entries);
        Ok(rules)
    }

    /// The xDS settings when --xds-server is given; an error for settings that contradict each
    /// other. `--config` on the command line contradicts it; `SLIDEGATE_CONFIG` may be an image's
    /// default (slidegate's own sets it), so --xds-server overrides it with a warning.
    pub fn xds(&self, given: &Given) -> Result<Option<XdsOptions>, SettingsError> {
        let Some(server) = &self.xds_server else {
            if self.force_start_without_initial_config {
                return Err(SettingsError::ForceStartWithoutXds);
            }
            return Ok(None);
        };
        let options = XdsOptions {
            server: server.clone(),
            node_id: self.xds_node_id.clone(),
            node_metadata: self.xds_node_metadata.clone(),
            retry_interval: self.xds_connect_retry_interval,
            tls: XdsTls {
                ca_file: self.xds_tls_ca_file.clone(),
                cert_file: self.xds_tls_cert_file.clone(),
                key_file: self.xds_tls_key_file.clone(),
                server_name: self.xds_tls_server_name.clone(),
            },
            force_start: self.force_start_without_initial_config,
        };
        if let Some(config) = &self.config {
            if given.from_env("config") {
                // slidegate's own image sets SLIDEGATE_CONFIG for its bundled rules.
                tracing::warn!(
                    target: LOG_TARGET,
                    config = %config.display(),
                    "SLIDEGATE_CONFIG is ignored: rules come from --xds-server"
                );
            } else {
                return Err(SettingsError::ConfigAndXds {
                    config: config.display().to_string(),
                    server: server.clone(),
                });
            }
        }
        Ok(Some(options))
    }
}

/// Logs the rules loaded from `path`, each rule, and a warning for each rule deeper than
/// `max_entries`.
fn log_loaded(rules: &RuleSet, path: &Path, max_entries: usize) {
    tracing::info!(
        target: LOG_TARGET,
        rules = rules.rule_count(),
        domains = rules.domain_names().len(),
        path = %path.display(),
        "rules loaded"
    );
    for rule in rules.rules() {
        tracing::info!(target: LOG_TARGET, %rule, "rule");
    }
    for warning in super::unreachable_rules(rules, max_entries) {
        tracing::warn!(target: LOG_TARGET, "{warning}");
    }
}
