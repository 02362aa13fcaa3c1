//! Structured logs for both components: text for people, JSON for log pipelines, to stderr.

use clap::ValueEnum;
use tracing_subscriber::{EnvFilter, fmt};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per event (timestamp, level, target, fields).
    Json,
}

/// Logging flags shared by `controller` and `agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "IPKEEP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level or filter directives (`info`, `debug`, `ipkeep_operator=debug,kube=warn`).
    #[arg(long, env = "IPKEEP_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// Errors of setting logging up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `--log-level` is not a valid filter.
    #[error("failed to parse --log-level {directives:?}")]
    Filter {
        /// The directives given.
        directives: String,
        /// What the parser said.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("failed to install the log subscriber")]
    Install(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Installs the process-wide log subscriber writing to stderr.
pub fn init(args: &LogArgs) -> Result<(), LoggingError> {
    let filter = EnvFilter::try_new(&args.log_level).map_err(|source| LoggingError::Filter {
        directives: args.log_level.clone(),
        source,
    })?;
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(LoggingError::Install)
}

pub use ipkeep_reservation::error_chain;
