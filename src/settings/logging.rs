//! The log: its format and filter.

use crate::service::decision::log::{LogDecisions, TARGET as DECISIONS};

/// The log cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("invalid --log-level")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("cannot install the logger: {0}")]
    Install(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args, Debug, Clone)]
pub struct LogSettings {
    /// Log format.
    #[arg(long, env = "SLIDEGATE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax, e.g. `info` or `info,slidegate=debug` [default: RUST_LOG,
    /// else info].
    #[arg(long, env = "SLIDEGATE_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// One log line per decision (transport, caller, domain, each descriptor's rule, limit,
    /// remaining and code): `off`, `denied` (requests answered OVER_LIMIT) or `all`; at
    /// most 100 lines a second (the rest counted in slidegate_decision_log_dropped_total), at
    /// info level under the target `slidegate::decisions` whatever --log-level says. Values are
    /// cut to 64 characters, and hidden under --operator-hide-values.
    #[arg(
        long,
        env = "SLIDEGATE_LOG_DECISIONS",
        value_enum,
        default_value = "off"
    )]
    pub log_decisions: LogDecisions,
}

impl LogSettings {
    /// Installs the process's logger, writing to stderr (in colour on a terminal).
    pub fn init(&self) -> Result<(), LogError> {
        use tracing_subscriber::EnvFilter;
        let mut filter = match &self.log_level {
            Some(level) => EnvFilter::try_new(level)?,
            None => EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new("info"))?,
        };
        // The file watcher's own events stay out of a debug or trace log: with the log file in a
        // watched directory, each line written would be an event that writes a line.
        for quiet in ["notify=warn", "notify_debouncer_full=warn"] {
            filter = filter.add_directive(quiet.parse()?);
        }
        if self.log_decisions != LogDecisions::Off {
            filter = filter.add_directive(format!("{DECISIONS}=info").parse()?);
        }
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        }
        .map_err(|e| LogError::Install(e.to_string()))
    }
}
