//! Everything `slidegate serve` is told, typed, in one place: built once at start from the command
//! line and the `SLIDEGATE_*` variables (clap), then from envoyproxy/ratelimit's environment
//! ([`crate::compat`]) where those left a setting at its default.
//!
//! Each group is a clap argument group whose fields are the flags, in the order `--help` lists
//! them, and knows how to build the library's own structure from itself ([`ServerSettings::limits`],
//! [`StoreSettings::redis_options`], ...), so that the binary only wires the parts together. A
//! default is written once: where the library has a constant, the flag reads it.

mod listeners;
mod logging;
mod requests;
mod rules;
mod server;
mod store;
mod summary;
mod telemetry;
#[cfg(test)]
mod tests;

use clap::parser::ValueSource;

pub use listeners::{BindError, ListenSettings};
pub use logging::{LogError, LogFormat, LogSettings};
pub use requests::{RequestSettings, unreachable_rules};
pub use rules::{DEFAULT_CONFIG, RulesSettings, SettingsError};
pub use server::ServerSettings;
pub use store::{OpenError, StoreSettings};
pub use telemetry::{TelemetrySettings, parse_listen_addr, parse_metrics_path};

/// The target of the lines the start-up writes (the effective settings, the rules loaded, the
/// envoyproxy/ratelimit environment read): the binary's, as they have always been logged, so
/// that searches and filters naming `slidegate` keep finding them.
pub const LOG_TARGET: &str = "slidegate";

/// The settings of `slidegate serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    #[command(flatten)]
    pub rules: RulesSettings,
    #[command(flatten)]
    pub listen: ListenSettings,
    #[command(flatten)]
    pub store: StoreSettings,
    #[command(flatten)]
    pub requests: RequestSettings,
    #[command(flatten)]
    pub server: ServerSettings,
    #[command(flatten)]
    pub logging: LogSettings,
    #[command(flatten)]
    pub telemetry: TelemetrySettings,
    /// Which settings the user gave, for the settings that yield to them.
    #[arg(skip)]
    pub given: Given,
}

impl Settings {
    /// The settings in `matches` (those of `serve`), remembering which ones the command line or a
    /// `SLIDEGATE_*` variable gave.
    pub fn from_matches(matches: &clap::ArgMatches) -> Result<Settings, clap::Error> {
        let mut settings = <Settings as clap::FromArgMatches>::from_arg_matches(matches)?;
        settings.given = Given(Some(matches.clone()));
        Ok(settings)
    }

    /// What clap cannot check on the command line alone because the environment may complete
    /// it: called once envoyproxy/ratelimit's environment has been applied.
    pub fn check(&self) -> Result<(), clap::Error> {
        self.listen.check(&self.given)
    }
}

/// Where each setting came from: given on the command line or in its `SLIDEGATE_*` variable, or
/// left at its default. envoyproxy/ratelimit's environment fills only what was left, and
/// `SLIDEGATE_CONFIG` (an image's default, perhaps) yields to `--xds-server` where `--config`
/// would contradict it.
#[derive(Clone, Debug, Default)]
pub struct Given(Option<clap::ArgMatches>);

impl Given {
    /// Whether the setting `id` (its field's name) was given rather than left at its default.
    pub fn contains(&self, id: &str) -> bool {
        !matches!(self.source(id), None | Some(ValueSource::DefaultValue))
    }

    /// Whether the setting `id` came from its `SLIDEGATE_*` variable.
    pub fn from_env(&self, id: &str) -> bool {
        self.source(id) == Some(ValueSource::EnvVariable)
    }

    fn source(&self, id: &str) -> Option<ValueSource> {
        self.0.as_ref()?.value_source(id)
    }
}

/// A [`std::time::Duration`] constant as a flag spells it (`50ms`, `5m`): clap's `default_value`
/// takes text, and a `Duration` has no `Display`.
macro_rules! spelled {
    ($duration:expr) => {{
        static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        TEXT.get_or_init(|| humantime::format_duration($duration).to_string())
            .as_str()
    }};
}
pub(crate) use spelled;
