//! The one error type of the command-line layer: every way a command can fail, worded for the
//! person who typed it.
//!
//! Why it exists: `main` reports one error with its causes; each layer's own error converts into
//! this one, and the failures only a command knows of (a missing prompt, a bad flag) are named
//! here beside them.

use std::path::PathBuf;

use tandem::bench::BenchError;
use tandem::config::ConfigError;
use tandem::engine::EngineError;
use tandem::logging::LoggingError;
use tandem::model::text::chat_template::ChatTemplateError;
use tandem::model::text::tokenizer::TokenizerError;
use tandem::model::ModelError;
use tandem::sampling::SamplingError;
use tandem::server::ServerError;
use tandem::setup::SetupError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A flag's value is out of range; `reason` is the checked type's rule.
    #[error("{flag} {reason}")]
    Flag { flag: &'static str, reason: String },
    #[error(transparent)]
    Logging(#[from] LoggingError),
    #[error("starting the async runtime")]
    AsyncRuntime(#[source] std::io::Error),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("loading model {path}")]
    LoadModel {
        path: String,
        #[source]
        source: SetupError,
    },
    #[error("loading draft model {spec}")]
    LoadDraft {
        spec: String,
        #[source]
        source: SetupError,
    },
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("making model {path}")]
    MakeModel {
        path: String,
        #[source]
        source: ModelError,
    },
    #[error("give a prompt with --prompt TEXT or --prompt-file FILE")]
    NoPrompt,
    #[error(
        "the model has no chat template; pass --raw to feed the prompt as-is, or a template file \
         with --chat-template"
    )]
    NoChatTemplate,
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The engine ended a request with a failure part-way.
    #[error("generation failed: {0}")]
    Generation(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("reading prompt file {}", .path.display())]
    ReadPrompt {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {}", .path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {}", .path.display())]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing output")]
    Output(#[source] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("no free cache slot")]
    NoCacheSlot,
    #[error("--depth + the largest --tokens exceeds the context length {0}")]
    DepthPastContext(usize),
    #[error(
        "--sequences {sequences}: their caches at --depth take {need_gb:.1} GB and {available_gb:.1} \
         GB is available (MemAvailable, or the cgroup's memory.max less what is used)"
    )]
    CachesPastMemory {
        sequences: usize,
        need_gb: f64,
        available_gb: f64,
    },
    #[error("{url}: not healthy: {reason}")]
    Unhealthy { url: String, reason: String },
}
