//! Drafters: cheap proposers of the next γ tokens, which the target model then verifies.
//!
//! A drafter sees the whole sequence so far (prompt and output) and proposes up to γ tokens,
//! with their processed draft distributions when it has them (a draft model) or none when its
//! proposal is deterministic (prompt lookup: a point mass). After verification it is told how
//! many tokens of the sequence stand, and rolls back whatever state it keeps past that.

mod history;
mod model;
mod prompt_lookup;
mod spec;
mod vocabulary;

pub use history::{RequestHistory, HISTORY_TOKENS};
pub use model::{DraftJob, DraftTiming, ModelDrafter};
pub use prompt_lookup::PromptLookup;
pub use spec::{DraftSpec, InvalidDraftSpec};
pub use vocabulary::check_same_vocabulary;

use crate::model::ModelError;
use crate::sampling::{SamplingError, SamplingParams, SeededRng};

#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error("draft model: {0}")]
    Model(#[from] ModelError),
    /// A forward shared by several sequences failed (each of them gets this).
    #[error("draft model: {0}")]
    Forward(String),
    #[error("draft sampling: {0}")]
    Sampling(#[from] SamplingError),
    #[error(
        "the draft model ({draft}) and the target ({target}) have different vocabularies: {reason}"
    )]
    VocabMismatch {
        draft: String,
        target: String,
        reason: String,
    },
}

/// Drafted tokens and, for drafters that sample, their distributions (`vocab` values per token).
#[derive(Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Flat `tokens.len() * vocab` probabilities; empty for point-mass drafters.
    pub dists: Vec<f32>,
    pub vocab: usize,
}

impl Proposal {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.dists.clear();
    }

    /// Drops the first drafted token and its distribution (a guess that was checked against
    /// the target's own token: see the scheduler's drafting ahead).
    pub fn drop_first(&mut self) {
        if self.tokens.is_empty() {
            return;
        }
        self.tokens.remove(0);
        if !self.dists.is_empty() {
            self.dists.drain(..self.vocab);
        }
    }

    /// Draft distribution of token `i`, or `None` for a point mass.
    pub fn dist(&self, i: usize) -> Option<&[f32]> {
        if self.dists.is_empty() {
            None
        } else {
            Some(&self.dists[i * self.vocab..(i + 1) * self.vocab])
        }
    }
}

pub trait Proposer {
    /// A short name for logs and stats.
    fn name(&self) -> String;

    /// Proposes up to `gamma` tokens to follow `context` (prompt and output so far, its last
    /// token not yet verified). `generated_from` is where the output starts in `context` (for
    /// penalties). Proposing fewer, or none, is allowed.
    fn propose(
        &mut self,
        context: &[u32],
        generated_from: usize,
        gamma: usize,
        params: &SamplingParams,
        rng: &mut SeededRng,
        out: &mut Proposal,
    ) -> Result<(), DraftError>;

    /// Prepares for a sequence whose prompt is `prompt` (a draft model fills its cache here, in
    /// the prefill phase, rather than inside the first round). Optional.
    fn prefill(&mut self, _prompt: &[u32]) -> Result<(), DraftError> {
        Ok(())
    }

    /// The first `keep` tokens of the context stand; forget anything past them.
    fn rollback(&mut self, keep: usize) -> Result<(), DraftError>;
}

#[cfg(test)]
mod tests {
    use super::Proposal;

    #[test]
    fn dropping_the_first_draft_keeps_each_later_token_with_its_own_distribution() {
        let mut p = Proposal {
            tokens: vec![4, 7, 1],
            dists: (0..9).map(|i| i as f32).collect(),
            vocab: 3,
        };
        p.drop_first();
        assert_eq!(p.tokens, [7, 1]);
        assert_eq!(p.dist(0), Some(&[3.0, 4.0, 5.0][..]));
        assert_eq!(p.dist(1), Some(&[6.0, 7.0, 8.0][..]));
        // A point-mass proposal has no distributions to drop.
        let mut p = Proposal {
            tokens: vec![4, 7],
            dists: Vec::new(),
            vocab: 3,
        };
        p.drop_first();
        assert_eq!(p.tokens, [7]);
        assert_eq!(p.dist(0), None);
        p.drop_first();
        p.drop_first();
        assert!(p.tokens.is_empty());
    }
}
