//! The model layer's error type, in a file of its own so the layer's modules import it without
//! pointing back at the module root.

/// Errors of the model layer.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model file not found: {0}")]
    NotFound(std::path::PathBuf),
    #[error(
        "the default model is not installed at {0}; run scripts/fetch-default-model to fetch it"
    )]
    DefaultModelMissing(std::path::PathBuf),
    #[error("cannot read {path}: {reason}")]
    Unreadable {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error(
        "the model does not fit in memory: its weights take {need_gb:.1} GB and {available_gb:.1} GB \
         is available (MemAvailable, or the cgroup's memory.max less what is used)"
    )]
    TooLarge { need_gb: f64, available_gb: f64 },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("bad model config: {0}")]
    BadConfig(String),
    #[error("missing tensor {0}")]
    MissingTensor(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("kv cache: {0}")]
    Cache(String),
    #[error("{0}")]
    Device(String),
    #[error("the model's numbers are broken: {0}")]
    NonFinite(String),
    #[error("invalid forward input: {0}")]
    BadInput(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    /// A file or folder that could not be read as a model, and why.
    pub fn unreadable(path: &std::path::Path, reason: impl std::fmt::Display) -> Self {
        Self::Unreadable {
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }
}
