//! The training job's error type.

use crate::engine::EngineError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("generating the training answers: {0}")]
    Engine(#[from] EngineError),
    #[error("{path}: {reason}")]
    File {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("{0}")]
    Options(String),
}
