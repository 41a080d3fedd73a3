//! The engine: generation on top of the model and sampling layers. Today it holds the plain
//! single-sequence decoding loop (`plain`), which `tandem generate` runs and which later
//! speculative paths are checked against token for token.

pub mod plain;

pub use plain::{
    generate_plain, FinishReason, GenerationOutput, GenerationRequest, GenerationStats,
};

use crate::model::ModelError;
use crate::sampling::SamplingError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("no free KV cache slot")]
    NoFreeSlot,
}
