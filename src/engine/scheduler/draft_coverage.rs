//! What the scheduler knows of a drafter of another vocabulary's reading of a request: the
//! share of a new request's prompt it could propose, taken at admission, beside the pooled
//! share its acceptance was earned on ([`PromptCoverage`]: the governor starts the model's
//! drafts' rate from the one over the other); and how many of its own tokens the target's
//! tokens become, which is what a catch-up costs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::draft::Translation;
use crate::engine::governor::{PooledCoverage, PromptCoverage};

/// A drafter of another vocabulary, as its prompts' coverage is taken.
#[derive(Clone)]
pub struct DraftCoverage(Arc<Translation>, Arc<Mutex<HashMap<u32, u32>>>);

impl DraftCoverage {
    /// For a drafter drafting through `translation`.
    pub fn new(translation: Arc<Translation>) -> Self {
        Self(translation, Arc::default())
    }

    /// How many of the drafter's tokens target token `id` becomes. The pieces of a token the
    /// drafter lacks are worked out once (a tokenization of its text) and kept: a text's rare
    /// tokens recur, and a prompt's are counted at admission.
    pub fn piece_count(&self, id: u32) -> usize {
        if self.0.draft_of(id).is_some() {
            return 1;
        }
        let mut known = self.1.lock().unwrap_or_else(|e| e.into_inner());
        *known
            .entry(id)
            .or_insert_with(|| self.0.piece_count(id) as u32) as usize
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
