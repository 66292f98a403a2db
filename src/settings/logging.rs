//! The log: its format and filter.

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
}

impl LogSettings {
    /// Installs the process's logger, writing to stderr (in colour on a terminal).
    pub fn init(&self) -> Result<(), LogError> {
        use tracing_subscriber::EnvFilter;
        let filter = match &self.log_level {
            Some(level) => EnvFilter::try_new(level)?,
            None => EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new("info"))?,
        };
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
