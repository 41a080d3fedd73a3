//! The one interface the Drafter actor drafts through: every kind of drafter (a draft model, a
//! draft head, prompt lookup) drafts a batch of sequences, forgets an ended one, drops kept
//! caches, and times itself for the governor.
//!
//! Why it exists: the actor, its calibration and its messages are the same for every drafter;
//! what differs is how a batch is drafted. A new drafter is one `impl BatchDrafter`, not an
//! arm in every message handler.

use std::sync::Arc;

use super::messages::{DraftBatchResult, DraftItem, DraftOutcome};
use crate::draft::{DraftError, DraftJob, DraftTiming, HeadDrafter, ModelDrafter, Proposal};
use crate::model::Decoder;
use crate::sampling::{DraftGate, SamplingParams, SeededRng};

/// A drafter as the Drafter actor's compute worker holds it (see the module docs).
pub trait BatchDrafter: Send {
    /// Every item's drafts, one outcome per item in order, and what drafting them took.
    fn draft(&mut self, items: Vec<DraftItem>) -> DraftBatchResult;

    /// The sequence `seq` ended with `text` (prompt and output); `keep`: its cache may serve
    /// later prompts as a prefix.
    fn end(&mut self, seq: u64, keep: bool, text: &[u32]);

    /// Frees the caches kept for prefixes.
    fn clear_prefix_cache(&mut self) -> Result<(), DraftError> {
        Ok(())
    }

    /// Token ids it drafts over (at most 256), for a calibration context as long in its own
    /// tokens as in the target's.
    fn calibration_ids(&self) -> Vec<u32>;

    /// Timings of drafting 4 greedy tokens after `context` with a throwaway copy of itself,
    /// `tries` times: where it keeps a cache, once from an empty one (the catch-up) and once
    /// from a filled one (the steps).
    fn time_drafting(
        &mut self,
        context: &[u32],
        tries: usize,
    ) -> Result<Vec<DraftTiming>, DraftError>;
}

impl BatchDrafter for ModelDrafter<Arc<Decoder>> {
    /// Every sequence's drafts in one batched draft per step.
    fn draft(&mut self, items: Vec<DraftItem>) -> DraftBatchResult {
        // Everything but the last (unverified) token of each context stands.
        let failed = items
            .iter()
            .map(|it| {
                let standing = &it.context[..it.context.len().saturating_sub(1)];
                self.keep_standing(it.seq, standing)
                    .err()
                    .map(|e| e.to_string())
            })
            .collect();
        draft_jobs(items, failed, |jobs| self.propose_batch(jobs))
    }

    fn end(&mut self, seq: u64, keep: bool, _: &[u32]) {
        ModelDrafter::end(self, seq, keep);
    }

    fn clear_prefix_cache(&mut self) -> Result<(), DraftError> {
        ModelDrafter::clear_prefix_cache(self)
    }

    fn calibration_ids(&self) -> Vec<u32> {
        match self.translation() {
            Some(t) => t.columns().target_ids().iter().take(256).copied().collect(),
            None => (0..self.model().hparams().vocab_size.clamp(1, 256) as u32).collect(),
        }
    }

    fn time_drafting(
        &mut self,
        context: &[u32],
        tries: usize,
    ) -> Result<Vec<DraftTiming>, DraftError> {
        let mut d = ModelDrafter::new(self.model(), "calibration")
            .with_draft_vocab(self.draft_vocab())
            .with_translation(self.translation());
        let mut timings = Vec::with_capacity(2 * tries);
        for _ in 0..tries {
            for keep in [0, context.len() - 1] {
                d.keep_seq(0, keep)?;
                timings.push(time_one(context, |jobs| d.propose_batch(jobs))?);
            }
        }
        Ok(timings)
    }
}

impl BatchDrafter for HeadDrafter {
    /// Every sequence's drafts from the head, after it takes in the features each carries.
    fn draft(&mut self, mut items: Vec<DraftItem>) -> DraftBatchResult {
        let failed = items
            .iter_mut()
            .map(|it| {
                std::mem::take(&mut it.features)
                    .into_iter()
                    .try_for_each(|(from, rows)| self.give_features(it.seq, from, &rows))
                    .err()
                    .map(|e| e.to_string())
            })
            .collect();
        draft_jobs(items, failed, |jobs| self.propose_batch(jobs))
    }

    fn end(&mut self, seq: u64, _: bool, _: &[u32]) {
        HeadDrafter::end(self, seq);
    }

    fn calibration_ids(&self) -> Vec<u32> {
        (0..self.target().hparams().vocab_size.clamp(1, 256) as u32).collect()
    }

    fn time_drafting(
        &mut self,
        context: &[u32],
        tries: usize,
    ) -> Result<Vec<DraftTiming>, DraftError> {
        let mut d = self.fresh();
        let mut timings = Vec::with_capacity(2 * tries);
        for _ in 0..tries {
            // From an empty cache (the catch-up), then from a filled one (the steps).
            d.end(0);
            for _ in 0..2 {
                timings.push(time_one(context, |jobs| d.propose_batch(jobs))?);
            }
        }
        Ok(timings)
    }
}

/// Drafts 4 greedy tokens after `context` as sequence 0 with `propose`, for a timing.
fn time_one(
    context: &[u32],
    propose: impl FnOnce(&mut [DraftJob]) -> DraftTiming,
) -> Result<DraftTiming, DraftError> {
    let params = SamplingParams::greedy();
    let mut rng = SeededRng::new(0);
    let mut out = Proposal::default();
    let mut jobs = [calibration_job(context, &params, &mut rng, &mut out)];
    let t = propose(&mut jobs);
    let [job] = jobs;
    job.result.map(|()| t)
}

/// Drafting 4 greedy tokens after `context`, as sequence 0, to time a drafter.
fn calibration_job<'a>(
    context: &'a [u32],
    params: &'a SamplingParams,
    rng: &'a mut SeededRng,
    out: &'a mut Proposal,
) -> DraftJob<'a> {
    DraftJob {
        seq: 0,
        scope: 0,
        context,
        generated_from: context.len(),
        gamma: 4,
        params,
        rng,
        out,
        gate: DraftGate::OFF,
        min_tokens: 0,
        confidence: false,
        tree_nodes: 0,
        grammar: None,
        lookup: true,
        likeliest: false,
        result: Ok(()),
    }
}

/// Drafts every item not `failed` already with `propose` (a batched drafter), and collects
/// each item's outcome.
fn draft_jobs(
    items: Vec<DraftItem>,
    mut failed: Vec<Option<String>>,
    propose: impl FnOnce(&mut [DraftJob]) -> DraftTiming,
) -> DraftBatchResult {
    let mut rngs: Vec<SeededRng> = items.iter().map(|it| it.rng.clone()).collect();
    let mut proposals: Vec<Proposal> = items.iter().map(|_| Proposal::default()).collect();
    let mut jobs: Vec<DraftJob> = Vec::with_capacity(items.len());
    let mut job_of = Vec::with_capacity(items.len());
    let mut items = items;
    let iter = items.iter_mut().zip(&mut rngs).zip(&mut proposals);
    for (i, ((it, rng), out)) in iter.enumerate() {
        if failed[i].is_none() {
            job_of.push(i);
            jobs.push(DraftJob {
                seq: it.seq,
                scope: it.scope,
                context: &it.context,
                generated_from: it.prompt_len,
                gamma: it.gamma,
                params: &it.params,
                rng,
                out,
                gate: it.gate,
                min_tokens: it.gate_min,
                confidence: it.confidence,
                tree_nodes: it.tree_nodes,
                grammar: it.grammar.as_mut(),
                lookup: it.lookup,
                likeliest: it.likeliest,
                result: Ok(()),
            });
        }
    }
    let timing = propose(&mut jobs);
    for (job, &i) in jobs.into_iter().zip(&job_of) {
        if let Err(e) = job.result {
            failed[i] = Some(e.to_string());
        }
    }
    let outcomes = items
        .into_iter()
        .zip(rngs)
        .zip(proposals)
        .zip(failed)
        .map(|(((it, rng), mut p), f)| DraftOutcome {
            seq: it.seq,
            proposal: match f {
                Some(e) => Err(e),
                None => {
                    p.keep_chain_prefix(it.gamma);
                    Ok(p)
                }
            },
            rng,
        })
        .collect();
    DraftBatchResult { outcomes, timing }
}
