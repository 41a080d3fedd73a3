//! What loading or running a tokenizer can fail with.
//!
//! Why it exists: both loaders and the tokenizer itself report through one type, which names
//! the file or GGUF key at fault.

use std::path::PathBuf;

use crate::model::text::chat_template::ChatTemplateError;

/// Errors of loading or running a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("invalid {path}: {reason}")]
    BadFile { path: PathBuf, reason: String },
    #[error("GGUF metadata `{0}` is missing")]
    MissingMetadata(String),
    #[error("GGUF metadata `{key}` is invalid: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error(
        "unsupported GGUF tokenizer model `{0}`: only byte-level BPE (`gpt2`) and SentencePiece (`llama`) tokenizers are supported"
    )]
    UnsupportedModel(String),
    #[error(
        "unsupported GGUF pre-tokenizer `{0}`: its splitting rules are unknown here, and guessing would silently change the token ids"
    )]
    UnsupportedPreTokenizer(String),
    #[error("cannot build tokenizer: {0}")]
    Build(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    UnknownId { id: u32, vocab_size: usize },
    #[error(transparent)]
    ChatTemplate(#[from] ChatTemplateError),
}
