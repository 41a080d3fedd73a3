//! Structured logs (`tracing`) for the server: one line per event with key-value fields, as
//! text or JSON, at a level from the config (`[logging]`) or `TANDEM_LOG`.
//!
//! Why it exists: operators grep and ship logs; every request-scoped line carries the request
//! id (the one the client sees in the response's `id` and `x-request-id`), so one request's
//! story can be pulled out of a busy server's log.

use tracing_subscriber::EnvFilter;

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("logging.level: `{0}` is not a valid level or filter ({1})")]
    Filter(String, String),
    #[error("logging.format must be text or json, got `{0}`")]
    Format(String),
    #[error("logging: a subscriber is already installed")]
    AlreadySet,
}

/// Installs the process-wide subscriber, writing to stderr. `filter` is a level (`info`) or an
/// `EnvFilter` directive list (`info,tandem::engine=debug`); `TANDEM_LOG` overrides it.
pub fn init(filter: &str, format: &str) -> Result<(), LoggingError> {
    let filter = std::env::var("TANDEM_LOG")
        .ok()
        .filter(|f| !f.trim().is_empty())
        .unwrap_or_else(|| filter.to_string());
    let env_filter = EnvFilter::try_new(&filter)
        .map_err(|e| LoggingError::Filter(filter.clone(), e.to_string()))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false);
    match format {
        "text" => builder.try_init(),
        "json" => builder.json().flatten_event(true).try_init(),
        other => return Err(LoggingError::Format(other.to_string())),
    }
    .map_err(|_| LoggingError::AlreadySet)
}

/// Checks a `logging` config section without installing anything.
pub fn validate(filter: &str, format: &str) -> Result<(), LoggingError> {
    EnvFilter::try_new(filter)
        .map_err(|e| LoggingError::Filter(filter.to_string(), e.to_string()))?;
    match format {
        "text" | "json" => Ok(()),
        other => Err(LoggingError::Format(other.to_string())),
    }
}
