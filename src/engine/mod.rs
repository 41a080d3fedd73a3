//! The engine: generation on top of the model, sampling and draft layers.
//!
//! - The single-sequence loops: plain decoding (`plain`), the reference, and speculative
//!   decoding (`speculative`), which must reproduce it, with the stop conditions both share
//!   (`emitter`, `stop`).
//! - The serving engine (`handle::Engine`): kameo actors — `Scheduler`, `Drafter`, `Verifier`,
//!   `CacheManager` (`messages` holds what they say to each other) — with compute workers
//!   (`worker`) for forward passes, continuous batching, pipelining and the governor.

pub mod cache_manager;
pub mod drafter;
pub mod emitter;
pub mod governor;
pub mod handle;
pub mod messages;
pub mod plain;
pub mod scheduler;
pub mod settings;
pub mod speculative;
pub mod stop;
pub mod verifier;
pub mod worker;

pub use drafter::DraftSource;
pub use handle::{Completion, Engine, EngineConfig, EventStream};
pub use messages::{CacheStats, EngineEvent, EngineRequest, GammaPolicy, SchedulerStats, Usage};
pub use plain::{
    generate_plain, FinishReason, GenerationOutput, GenerationRequest, GenerationStats, OnOutput,
    OutputPiece,
};
pub use settings::{LiveSettings, SettingsError, SettingsUpdate, SpeculationSettings};
pub use speculative::{generate_speculative, SpecSettings, SpecStats};

use crate::model::ModelError;
use crate::sampling::SamplingError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("overloaded: {queued} requests are already waiting; retry later")]
    Overloaded { queued: usize },
    #[error("engine worker: {0}")]
    Worker(String),
    #[error("generation failed: {0}")]
    Failed(String),
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
