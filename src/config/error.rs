//! The config layer's error: which key is wrong and why, or why the file cannot be read.

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("config: {0}")]
    Parse(String),
    #[error("config: {key} {reason}")]
    Invalid { key: String, reason: String },
}

impl ConfigError {
    /// A bad value for `key`, for callers outside the config module (CLI flags).
    pub fn invalid_key(key: &str, reason: impl ToString) -> Self {
        Self::invalid(key, reason)
    }

    pub(super) fn invalid(key: impl Into<String>, reason: impl ToString) -> Self {
        Self::Invalid {
            key: key.into(),
            reason: reason.to_string(),
        }
    }
}
