//! The sampling layer's error type.

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("invalid sampling parameter {name}: {reason}")]
    InvalidParam { name: &'static str, reason: String },
    #[error("logits contain NaN or +inf at token {0}; the model produced invalid numbers")]
    InvalidLogits(usize),
    #[error("every token was masked out (all logits are -inf)")]
    Empty,
}
