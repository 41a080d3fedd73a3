//! The engine: generation on top of the model, sampling and draft layers. Today it holds the
//! single-sequence loops: plain decoding (`plain`), the reference, and speculative decoding
//! (`speculative`), which must reproduce it, with the stop conditions both share (`emitter`,
//! `stop`).

pub mod emitter;
pub mod plain;
pub mod speculative;
pub mod stop;

pub use plain::{
    generate_plain, FinishReason, GenerationOutput, GenerationRequest, GenerationStats, OnOutput,
    OutputPiece,
};
pub use speculative::{generate_speculative, SpecSettings, SpecStats};

use crate::model::ModelError;
use crate::sampling::SamplingError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("cannot decode the output: {0}")]
    Detokenize(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("no free KV cache slot")]
    NoFreeSlot,
    #[error("drafter: {0}")]
    Draft(String),
    #[error("speculation: {0}")]
    Speculation(String),
}
