//! The Drafter actor: proposes drafts for a set of sequences on its own compute worker, keeping
//! each sequence's drafter state (a draft model's KV cache) between rounds. A draft model
//! drafts for all the sequences of a batch together, one forward per draft step.

use std::sync::Arc;

use kameo::message::{Context, Message};
use kameo::Actor;

use super::batch_drafter::BatchDrafter;
use super::error::EngineError;
use super::lookup_drafter::LookupDrafter;
use super::messages::{
    ClearPrefixCache, DraftBatch, DraftBatchResult, EndSequence, MeasureDraftCosts,
};
use super::worker::ComputeWorker;
use crate::draft::{
    DraftError, DraftTiming, HeadDrafter, LoadedDrafter, ModelDrafter, SharedHistory,
};
use crate::model::Decoder;

#[derive(Actor)]
pub struct Drafter {
    worker: ComputeWorker<Box<dyn BatchDrafter>>,
}

impl Drafter {
    /// `max_seqs`: how many sequences may draft at once (the draft model's cache slots).
    /// `prefix_cache`: a draft model stores ended sequences' keys and values for their
    /// prefixes, at most this many bytes.
    /// `history`: prompt lookup across requests (`suffix`) keeps earlier requests' texts in this
    /// store, which the scheduler reads too.
    /// `target`: the model a draft head drafts for (its embedding and output head).
    pub fn new(
        drafter: LoadedDrafter,
        target: Arc<Decoder>,
        threads: usize,
        max_seqs: usize,
        (prefix_cache, history): (Option<usize>, Option<SharedHistory>),
    ) -> Result<Self, EngineError> {
        let state: Box<dyn BatchDrafter> = match drafter {
            LoadedDrafter::Model {
                model,
                vocab,
                translation,
                lookup,
                name,
                ..
            } => Box::new(
                ModelDrafter::with_slots(model, name, max_seqs)
                    .with_prefix_cache(prefix_cache)
                    .with_draft_vocab(vocab)
                    .with_translation(translation)
                    .with_lookup(lookup),
            ),
            LoadedDrafter::Head { head, lookup, .. } => {
                Box::new(HeadDrafter::new(head, target, max_seqs).with_lookup(lookup))
            }
            LoadedDrafter::PromptLookup(p) => Box::new(LookupDrafter::new(p, history)),
        };
        Ok(Self {
            worker: ComputeWorker::spawn("tandem-draft", threads, state)?,
        })
    }
}

impl Message<DraftBatch> for Drafter {
    type Reply = Result<DraftBatchResult, EngineError>;

    async fn handle(&mut self, msg: DraftBatch, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker.run(move |d| d.draft(msg.items)).await
    }
}

impl Message<ClearPrefixCache> for Drafter {
    type Reply = Result<(), EngineError>;

    async fn handle(
        &mut self,
        _: ClearPrefixCache,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        Ok(self.worker.run(|d| d.clear_prefix_cache()).await??)
    }
}

impl Message<EndSequence> for Drafter {
    type Reply = Result<(), EngineError>;

    async fn handle(
        &mut self,
        msg: EndSequence,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker
            .run(move |d| d.end(msg.seq, msg.keep, &msg.text))
            .await
    }
}

impl Message<MeasureDraftCosts> for Drafter {
    type Reply = Result<Vec<DraftTiming>, EngineError>;

    /// For each context length, drafts 4 tokens after it with a throwaway drafter: the context
    /// fill (catch-up) from an empty cache, the steps from a filled one; best of a few tries.
    async fn handle(
        &mut self,
        msg: MeasureDraftCosts,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker
            .run(move |d| {
                let mut timings = Vec::with_capacity(msg.contexts.len());
                for (n, &len) in msg.contexts.iter().enumerate() {
                    // Short contexts are cheap, so they get more tries against timing noise.
                    let tries = if n == 0 { 3 } else { 2 };
                    timings.push(measure_draft_costs(d.as_mut(), len.max(2), tries)?);
                }
                Ok::<Vec<DraftTiming>, DraftError>(timings)
            })
            .await?
            .map_err(EngineError::from)
    }
}

/// The best of `tries` timings of drafting after a `len`-token context (see
/// [`MeasureDraftCosts`]): each price its least, the catch-up's from timings that had one.
fn measure_draft_costs(
    d: &mut dyn BatchDrafter,
    len: usize,
    tries: usize,
) -> Result<DraftTiming, DraftError> {
    // Token ids the drafter proposes (a tiny test model may have 16; a drafter of another
    // vocabulary, the shared ones), so the context is as long in its own tokens.
    let ids = d.calibration_ids();
    let context: Vec<u32> = (0..len)
        .map(|i| ids[(i * 7919 + 13) % ids.len().max(1)])
        .collect();
    let mut best = DraftTiming::default();
    let min = |a: f64, b: f64| if a == 0.0 { b } else { a.min(b) };
    for t in d.time_drafting(&context, tries)? {
        best.steps = t.steps;
        best.step_seconds = min(best.step_seconds, t.step_seconds);
        best.first_step_seconds = min(best.first_step_seconds, t.first_step_seconds);
        best.first_step_tokens = t.first_step_tokens;
        if t.catch_up_tokens > 0 {
            best.catch_up_tokens = t.catch_up_tokens;
            best.catch_up_seconds = min(best.catch_up_seconds, t.catch_up_seconds);
        }
    }
    Ok(best)
}
