//! Prompt lookup as the Drafter actor runs it: each sequence's own lookup, and for `suffix`
//! the texts of earlier requests too.
//!
//! Why it exists apart from [`PromptLookup`]: the lookup itself is pure (a context in, a match
//! out); what the engine adds is state across sequences and requests, kept here.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::Instant;

use super::batch_drafter::BatchDrafter;
use super::messages::{DraftBatchResult, DraftItem, DraftOutcome};
use crate::draft::{
    read_history, DraftError, DraftTiming, PromptLookup, Proposal, Proposer, RequestHistory,
    SharedHistory,
};
use crate::sampling::{SamplingParams, SeededRng};

/// Prompt lookup for every sequence of the engine (see the module docs).
pub struct LookupDrafter {
    /// The n-gram sizes every sequence's lookup starts from.
    settings: PromptLookup,
    seqs: HashMap<u64, PromptLookup>,
    /// Earlier requests' texts, when it looks across requests (`suffix`): shared with the
    /// scheduler, which foresees the kind of each round's draft from it.
    history: Option<SharedHistory>,
}

impl LookupDrafter {
    /// Prompt lookup with `settings`; across requests, with the store `history` (a store of
    /// its own when none is given).
    pub fn new(settings: PromptLookup, history: Option<SharedHistory>) -> Self {
        let history = history
            .filter(|_| settings.looks_across_requests())
            .or_else(|| RequestHistory::shared_for(settings));
        Self {
            settings,
            seqs: HashMap::new(),
            history,
        }
    }
}

impl BatchDrafter for LookupDrafter {
    fn draft(&mut self, items: Vec<DraftItem>) -> DraftBatchResult {
        let start = Instant::now();
        let steps = items.iter().map(|it| it.gamma).max().unwrap_or(0);
        let store = self.history.as_ref().map(read_history);
        let outcomes = items
            .into_iter()
            .map(|it| {
                let own = self.seqs.entry(it.seq).or_insert(self.settings);
                lookup_one(own, store.as_deref(), it)
            })
            .collect();
        DraftBatchResult {
            outcomes,
            timing: DraftTiming {
                steps,
                step_seconds: start.elapsed().as_secs_f64(),
                ..DraftTiming::default()
            },
        }
    }

    fn end(&mut self, seq: u64, _: bool, text: &[u32]) {
        self.seqs.remove(&seq);
        if let Some(h) = &self.history {
            h.write().unwrap_or_else(PoisonError::into_inner).add(text);
        }
    }

    fn calibration_ids(&self) -> Vec<u32> {
        (0..256).collect()
    }

    fn time_drafting(
        &mut self,
        context: &[u32],
        tries: usize,
    ) -> Result<Vec<DraftTiming>, DraftError> {
        let mut d = self.settings;
        let params = SamplingParams::greedy();
        let mut rng = SeededRng::new(0);
        let mut p = Proposal::default();
        let mut timings = Vec::with_capacity(tries);
        for _ in 0..tries {
            let t = Instant::now();
            d.propose(context, context.len(), 4, &params, &mut rng, &mut p)?;
            timings.push(DraftTiming {
                steps: 4,
                step_seconds: t.elapsed().as_secs_f64(),
                ..DraftTiming::default()
            });
        }
        Ok(timings)
    }
}

/// Prompt lookup in the request's own text; across requests, in earlier requests' texts too.
/// With `tree_nodes`, the own text's disagreeing matches add alternatives (a token tree) when
/// its continuation is the one drafted.
fn lookup_one(
    drafter: &mut PromptLookup,
    history: Option<&RequestHistory>,
    it: DraftItem,
) -> DraftOutcome {
    let mut proposal = Proposal::default();
    drafter.lookup_tree(&it.context, it.gamma, it.tree_nodes, &mut proposal);
    if let Some(h) = history {
        let (chain, kind) = h.match_across(drafter, &it.context, it.gamma);
        if chain != &proposal.tokens[..proposal.chain_len()] {
            proposal.clear();
            proposal.tokens.extend_from_slice(chain);
            proposal.confidence_kind = kind;
        }
    }
    DraftOutcome {
        seq: it.seq,
        proposal: Ok(proposal),
        rng: it.rng,
    }
}
