//! The share of a new request's prompt a drafter of another vocabulary could propose, taken
//! at admission, beside the pooled share its acceptance was earned on
//! ([`PromptCoverage`]: the governor starts the model's drafts' rate from the one over the
//! other).

use std::sync::Arc;

use crate::draft::Translation;
use crate::engine::governor::{PooledCoverage, PromptCoverage};

/// A drafter of another vocabulary, as its prompts' coverage is taken.
#[derive(Clone)]
pub struct DraftCoverage(Arc<Translation>);

impl DraftCoverage {
    /// For a drafter drafting through `translation`.
    pub fn new(translation: Arc<Translation>) -> Self {
        Self(translation)
    }

    /// The prompt's coverage against `pooled`'s; `None` for a prompt of control tokens alone.
    pub fn of(&self, prompt: &[u32], pooled: &PooledCoverage) -> Option<PromptCoverage> {
        let share = self.0.text_coverage(prompt)?;
        Some(PromptCoverage {
            prompt: share,
            pooled: pooled.mean(share),
        })
    }
}

impl std::fmt::Debug for DraftCoverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DraftCoverage")
            .field(&self.0.shared())
            .finish()
    }
}
