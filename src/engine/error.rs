//! The engine's error type, at the bottom of the engine so every part of it can use it without
//! pointing back up at the module root.

use crate::constraint::ConstraintError;
use crate::draft::DraftError;
use crate::model::ModelError;
use crate::sampling::rejection::SpecError;
use crate::sampling::SamplingError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the engine holds as many sequences as it may ({capacity}: engine.max_seqs running plus engine.max_queue waiting); retry later")]
    Overloaded { capacity: usize },
    #[error("engine worker: {0}")]
    Worker(String),
    #[error("generation failed: {0}")]
    Failed(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request's grammar grew past llguidance's per-token limits while generating.
    #[error("{0}")]
    GrammarTooComplex(String),
    #[error("cannot decode the output: {0}")]
    Detokenize(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("model.context_length: one sequence of {context} tokens needs {need_gb:.2} GB of KV cache, and {available_gb:.2} GB of memory is available after loading (the caches may take 80% of it, less the prefix cache); set model.context_length (--context-length) to at most {fits}, or free memory")]
    ContextTooLong {
        context: usize,
        need_gb: f64,
        available_gb: f64,
        fits: usize,
    },
    #[error("no free KV cache slot")]
    NoFreeSlot,
    #[error("drafter: {0}")]
    Draft(String),
    #[error("speculation: {0}")]
    Speculation(String),
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
}

impl From<DraftError> for EngineError {
    fn from(e: DraftError) -> Self {
        EngineError::Draft(e.to_string())
    }
}

impl From<SpecError> for EngineError {
    fn from(e: SpecError) -> Self {
        EngineError::Speculation(e.to_string())
    }
}
