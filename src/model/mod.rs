//! The model layer: token ids in, logits out, and the text on either side of them.
//!
//! It exists so that everything above it (sampling, drafters, the engine) sees one Llama
//! forward that is batch-invariant: a token's logits are the same bits whether it is decoded
//! alone, verified with drafts, or batched with other sequences, which is what lets
//! speculative decoding reproduce plain greedy decoding exactly. candle supplies the tensors,
//! the thread pool, the row-wise operations (RMS norm, SiLU) and the matmul for weight types
//! we have no kernel for; the heavy arithmetic is our own CPU kernels:
//!
//! * matrix multiplies for Q4_0/Q4_1 (`q4_gemm`), Q8_0 (`q8_gemm`) and f16 (`f16_gemm`)
//!   weights, with the candle glue in `packed_gemm` and the per-layer choice in `linear`;
//! * attention written by hand with scalar definitions and AVX2/AVX-512 kernels that match
//!   them bit for bit (`attention`), and rotary embeddings per token (`rope`);
//! * an explicit KV cache (`kv_cache`), f16 or f32, with slots that can be truncated when
//!   drafts are rejected or copied from one another, and the prefix cache's index of which
//!   slot holds which tokens (`prefix_index`);
//! * a batched forward (`llama`) that runs new tokens of many sequences in one pass;
//! * loading from GGUF or Hugging Face safetensors (`loader`, `weights`, `hparams`), with
//!   weights converted at load time to the type the kernels run;
//! * the tokenizer with incremental decoding (`tokenizer`) and the chat template
//!   (`chat_template`).

pub mod attention;
pub mod batch;
pub mod chat_template;
pub mod cpu_kernels;
pub mod device;
pub mod elementwise;
pub mod f16_gemm;
mod fast_exp;
pub mod hparams;
pub mod kv_cache;
pub mod linear;
pub mod llama;
mod llama_weights;
pub mod loader;
pub mod op_profile;
mod own_forward;
pub mod packed_gemm;
pub mod parallel;
pub mod prefix_index;
pub mod q4_gemm;
pub mod q8_gemm;
pub mod rope;
mod tensor_forward;
pub mod tokenizer;
pub mod weights;

pub use batch::{BatchLogits, LogitsRows, SeqInput, TREE_ROOT};
pub use chat_template::{ChatMessage, ChatTemplate};
pub use device::{BackendChoice, DeviceSpec, ForwardKind};
pub use hparams::{LlamaHparams, RopeScaling};
pub use kv_cache::{KvCache, KvDtype};
pub use linear::WeightsDtype;
pub use llama::Llama;
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
    #[error("{0}")]
    Device(String),
    #[error("invalid forward input: {0}")]
    BadInput(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;
