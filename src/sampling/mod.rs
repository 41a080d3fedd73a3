//! Sampling: pure functions from logits to a token, no I/O and no async.
//!
//! Order of processing (the same for the target and, later, the drafter, so speculative
//! acceptance compares like with like): logit bias and penalties on raw logits, then
//! temperature, softmax, top-k, top-p, min-p, renormalisation. Temperature 0 is greedy: the
//! argmax of the penalised logits.

mod draft_gate;
#[cfg(test)]
pub(crate) mod enumeration;
mod error;
mod float_rule;
mod lenience;
mod likeliest;
mod logits;
mod logprobs;
pub mod rejection;
mod rng;
mod row_scan;
pub mod tree;

pub use draft_gate::{
    confidence, confidence_of_logits, Confidence, DraftGate, GateRound, RequestGate,
};
pub use error::SamplingError;
pub use float_rule::{serialize_widened, widen, FloatRule, OutOfRange};
pub use lenience::{InvalidLenience, Lenience};
pub use likeliest::{ProposalEvidence, SampledDrafts};
pub use logits::{
    apply_penalties, argmax, probabilities, sample_from, Sampler, SamplingParams, LOGIT_BIAS_RANGE,
    PENALTY_RANGE, REPETITION_PENALTY_RANGE,
};
pub use logprobs::{token_logprob, TokenLogprob};
pub use rng::SeededRng;

#[cfg(test)]
mod tests;
