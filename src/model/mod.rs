//! The model layer: tensors only. A Llama forward written on candle with an explicit KV cache
//! that can be truncated, a batched multi-token forward over many sequences, weight loading
//! (GGUF and Hugging Face safetensors) with load-time conversion, tokenizer and chat template.

pub mod attention;
pub mod chat_template;
pub mod f16_gemm;
pub mod hparams;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod loader;
pub mod packed_gemm;
pub mod parallel;
pub mod q4_gemm;
pub mod q8_gemm;
pub mod rope;
pub mod tokenizer;
pub mod weights;

pub use chat_template::{ChatMessage, ChatTemplate};
pub use hparams::{LlamaHparams, RopeScaling};
pub use kv_cache::{KvCache, KvDtype};
pub use linear::WeightsDtype;
pub use llama::{Llama, LogitsRows, SeqInput};
pub use loader::{default_model_path, LoadedModel, ModelSource};
pub use tokenizer::{IncrementalDecoder, TextTokenizer};

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
    #[error("invalid forward input: {0}")]
    BadInput(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;
