//! Drafters: cheap proposers of the next γ tokens, which the target model then verifies.
//!
//! A drafter sees the whole sequence so far (prompt and output) and proposes up to γ tokens,
//! with their processed draft distributions when it has them (a draft model) or none when its
//! proposal is deterministic (prompt lookup: a point mass). After verification it is told how
//! many tokens of the sequence stand, and rolls back whatever state it keeps past that.

mod drafter_spec;
mod draw;
mod error;
mod head;
mod history;
mod job;
mod loaded;
mod lookup_rehearsal;
mod model_drafter;
mod model_slots;
mod origin;
mod prompt_lookup;
mod proposal;
mod same_vocabulary;
mod siblings;
mod stepping;
mod translation;

pub use drafter_spec::{canonical_drafter_name, DraftSpec, InvalidDraftSpec, DRAFTER_ALIASES};
pub use error::DraftError;
pub use head::HeadDrafter;
pub use history::{read_history, RequestHistory, SharedHistory, HISTORY_TOKENS};
pub use job::{DraftJob, DraftTiming};
pub use loaded::LoadedDrafter;
pub use lookup_rehearsal::Rehearsal;
pub use model_drafter::{reduced_vocab, ModelDrafter};
pub use origin::{DraftOrigin, DraftOrigins};
pub use prompt_lookup::PromptLookup;
pub use proposal::Proposal;
pub use same_vocabulary::check_same_vocabulary;
pub use translation::{GreedyAcross, SharedColumns, Translation, MIN_COVERAGE};

use crate::sampling::{SamplingParams, SeededRng};

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

    /// The first `len` tokens of the context stand; forget anything past them (a round's
    /// rejected drafts leave the drafter here).
    fn keep(&mut self, len: usize) -> Result<(), DraftError>;
}
