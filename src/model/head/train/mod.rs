//! Training a draft head on the CPU with candle's autograd (EAGLE's recipe): on sequences the
//! target wrote, with its features at every position, the head at position `t` reads the
//! token after `t` and the (noised) feature at `t` and is trained to give the feature at
//! `t + 1` (mean squared error) and the target's next-token distribution at `t + 1` over the
//! draft vocabulary (cross-entropy against the target's own probabilities), AdamW on both.
//! Optionally the same losses one step further (EAGLE-3's training-time test, one step deep):
//! the head fed its own output as the next position's feature, as a chain's second draft is.
//! An EAGLE-3 head trains the same way on its three taps (`fc` inside the graph), with its own
//! norms and output head, on the token loss alone.
//!
//! The forward (`forward.rs`) is the inference forward ([`super::DraftHead::forward`])
//! written in differentiable tensor operations over a whole sequence at once: the same fc, the
//! same unnormed-input layer, the same half-split rotary embedding, causal attention over the
//! sequence, the output head's rows frozen.

mod forward;
mod sample;
mod settings;
mod trainer;
mod vars;

pub use super::init::{random_eagle3_head, random_head};
pub use sample::{Losses, TrainSample};
pub use settings::TrainSettings;
pub use trainer::HeadTrainer;
