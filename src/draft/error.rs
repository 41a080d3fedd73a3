//! The draft layer's error type.

use crate::model::ModelError;
use crate::sampling::SamplingError;

#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error("draft model: {0}")]
    Model(#[from] ModelError),
    /// A forward shared by several sequences failed (each of them gets this).
    #[error("draft model: {0}")]
    Forward(String),
    #[error("draft sampling: {0}")]
    Sampling(#[from] SamplingError),
    #[error("draft under the request's grammar: {0}")]
    Constraint(#[from] crate::constraint::ConstraintError),
    /// A target token could not be put in the drafter's tokens (another vocabulary).
    #[error("draft model of another vocabulary: {0}")]
    Translate(#[from] crate::model::TokenizerError),
    #[error(
        "the draft model ({draft}) and the target ({target}) have different vocabularies: {reason}"
    )]
    VocabMismatch {
        draft: String,
        target: String,
        reason: String,
    },
}
