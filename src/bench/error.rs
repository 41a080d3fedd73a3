//! Why a benchmark run stopped: its prompts, its options, or the engine.

use crate::engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{}", prompt_location(.origin, *.line, .reason))]
    Prompts {
        origin: String,
        /// 1-based; 0 = the file as a whole.
        line: usize,
        reason: String,
    },
    #[error("bench: {0}")]
    Options(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("bench: generation failed: {0}")]
    Generation(String),
}

fn prompt_location(origin: &str, line: usize, reason: &str) -> String {
    if line == 0 {
        format!("prompt file {origin}: {reason}")
    } else {
        format!("prompt file {origin}:{line}: {reason}")
    }
}
