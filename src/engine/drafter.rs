//! The Drafter actor: proposes drafts for a set of sequences on its own compute worker, keeping
//! each sequence's drafter state (a draft model's KV cache) between rounds. A draft model
//! drafts for all the sequences of a batch together, one forward per draft step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kameo::message::{Context, Message};
use kameo::Actor;

use super::error::EngineError;
use super::messages::{
    DraftBatch, DraftBatchResult, DraftItem, DraftOutcome, DropRetained, EndSequence,
    MeasureDraftCosts,
};
use super::worker::ComputeWorker;
use crate::draft::{
    DraftJob, DraftTiming, HeadDrafter, ModelDrafter, PromptLookup, Proposal, Proposer,
    RequestHistory, Translation, HISTORY_TOKENS,
};
use crate::model::head::DraftHead;
use crate::model::{DraftVocab, Llama};
use crate::sampling::{DraftGate, SamplingParams, SeededRng};

/// Where the engine's drafts come from: a loaded drafter (`setup::LoadedDrafter`) as the
/// Drafter actor takes it, its model shared.
#[derive(Clone)]
pub enum DraftSource {
    /// Prompt lookup with these n-gram sizes.
    PromptLookup(PromptLookup),
    Model {
        model: Arc<Llama>,
        /// The reduced vocabulary it drafts over (`None`: its whole vocabulary).
        vocab: Option<Arc<DraftVocab>>,
        /// How it drafts for a target of another vocabulary (`None`: the same one).
        translation: Option<Arc<Translation>>,
        /// Prompt lookup drafting first, the model where the text has no match
        /// (`draft+lookup`).
        lookup: Option<PromptLookup>,
        name: String,
    },
    /// A draft head on the target's own features; with `lookup`, prompt lookup drafts first
    /// and the head where the text has no n-gram match.
    Head {
        head: Arc<DraftHead>,
        name: String,
        lookup: Option<PromptLookup>,
    },
}

/// What the Drafter actor's compute worker owns, made from a [`DraftSource`]: one draft model
/// drafting for every sequence at once, or one prompt-lookup index per sequence.
pub enum DraftWorkerState {
    /// (Boxed: it is several times the other variants' size.)
    Model(Box<ModelDrafter<Arc<Llama>>>),
    Head(HeadDrafter),
    /// Prompt lookup: its settings, each sequence's lookup, and earlier requests' texts when
    /// it looks across requests (`suffix`).
    Lookup(
        PromptLookup,
        HashMap<u64, PromptLookup>,
        Option<RequestHistory>,
    ),
}

#[derive(Actor)]
pub struct Drafter {
    worker: ComputeWorker<DraftWorkerState>,
}

impl Drafter {
    /// `max_seqs`: how many sequences may draft at once (the draft model's cache slots).
    /// `prefix_cache`: a draft model keeps ended sequences' caches for their prefixes.
    /// `target`: the model a draft head drafts for (its embedding and output head).
    pub fn new(
        source: DraftSource,
        target: Arc<Llama>,
        threads: usize,
        max_seqs: usize,
        prefix_cache: bool,
    ) -> Result<Self, EngineError> {
        let state = match source {
            DraftSource::Model {
                model,
                vocab,
                translation,
                lookup,
                name,
            } => DraftWorkerState::Model(Box::new(
                ModelDrafter::with_slots(model, name, max_seqs)
                    .with_prefix_cache(prefix_cache)
                    .with_draft_vocab(vocab)
                    .with_translation(translation)
                    .with_lookup(lookup),
            )),
            DraftSource::Head { head, lookup, .. } => {
                DraftWorkerState::Head(HeadDrafter::new(head, target, max_seqs).with_lookup(lookup))
            }
            DraftSource::PromptLookup(p) => {
                let (lo, hi) = p.ngrams();
                let history = p
                    .looks_across_requests()
                    .then(|| RequestHistory::new(HISTORY_TOKENS, lo, hi));
                DraftWorkerState::Lookup(p, HashMap::new(), history)
            }
        };
        Ok(Self {
            worker: ComputeWorker::spawn("tandem-draft", threads, state)?,
        })
    }
}

impl Message<DraftBatch> for Drafter {
    type Reply = Result<DraftBatchResult, EngineError>;

    async fn handle(&mut self, msg: DraftBatch, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker.run(move |s| draft_batch(s, msg.items)).await
    }
}

fn draft_batch(s: &mut DraftWorkerState, items: Vec<DraftItem>) -> DraftBatchResult {
    match s {
        DraftWorkerState::Model(drafter) => draft_with_model(drafter, items),
        DraftWorkerState::Head(drafter) => draft_with_head(drafter, items),
        DraftWorkerState::Lookup(config, seqs, history) => {
            let start = Instant::now();
            let steps = items.iter().map(|it| it.gamma).max().unwrap_or(0);
            let outcomes = items
                .into_iter()
                .map(|it| {
                    let own = seqs.entry(it.seq).or_insert(*config);
                    lookup_one(own, history.as_ref(), it)
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
    }
}

/// Every sequence's drafts in one batched draft per step.
fn draft_with_model(
    drafter: &mut ModelDrafter<Arc<Llama>>,
    items: Vec<DraftItem>,
) -> DraftBatchResult {
    // Everything but the last (unverified) token of each context stands.
    let failed = items
        .iter()
        .map(|it| {
            let standing = &it.context[..it.context.len().saturating_sub(1)];
            drafter
                .keep_standing(it.seq, standing)
                .err()
                .map(|e| e.to_string())
        })
        .collect();
    draft_jobs(items, failed, |jobs| drafter.propose_batch(jobs))
}

/// Every sequence's drafts from the head, after it takes in the features each carries.
fn draft_with_head(drafter: &mut HeadDrafter, mut items: Vec<DraftItem>) -> DraftBatchResult {
    let failed = items
        .iter_mut()
        .map(|it| {
            std::mem::take(&mut it.features)
                .into_iter()
                .try_for_each(|(from, rows)| drafter.give_features(it.seq, from, &rows))
                .err()
                .map(|e| e.to_string())
        })
        .collect();
    draft_jobs(items, failed, |jobs| drafter.propose_batch(jobs))
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

/// The longest suffix of `context` that occurs in its own text or in an earlier request's,
/// the own text first at equal length.
fn across_requests<'a>(
    lookup: &PromptLookup,
    history: &'a RequestHistory,
    context: &'a [u32],
    gamma: usize,
) -> &'a [u32] {
    let (lo, hi) = lookup.ngrams();
    for n in (lo..=hi).rev() {
        let own = PromptLookup::lookup_at(context, gamma, n);
        if !own.is_empty() {
            return own;
        }
        let earlier = history.lookup_at(context, gamma, n);
        if !earlier.is_empty() {
            return earlier;
        }
    }
    &[]
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
        let chain = across_requests(drafter, h, &it.context, it.gamma);
        if chain != &proposal.tokens[..proposal.chain_len()] {
            proposal.clear();
            proposal.tokens.extend_from_slice(chain);
        }
    }
    DraftOutcome {
        seq: it.seq,
        proposal: Ok(proposal),
        rng: it.rng,
    }
}

impl Message<DropRetained> for Drafter {
    type Reply = Result<(), EngineError>;

    async fn handle(&mut self, _: DropRetained, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker
            .run(|s| match s {
                DraftWorkerState::Model(drafter) => Ok(drafter.drop_retained()?),
                DraftWorkerState::Head(_) | DraftWorkerState::Lookup(..) => Ok(()),
            })
            .await?
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
            .run(move |s| match s {
                DraftWorkerState::Model(drafter) => drafter.end(msg.seq, msg.keep),
                DraftWorkerState::Head(drafter) => drafter.end(msg.seq),
                DraftWorkerState::Lookup(_, seqs, history) => {
                    seqs.remove(&msg.seq);
                    if let Some(h) = history {
                        h.add(&msg.text);
                    }
                }
            })
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
            .run(move |s| {
                let mut timings = Vec::with_capacity(msg.contexts.len());
                for (n, &len) in msg.contexts.iter().enumerate() {
                    // Short contexts are cheap, so they get more tries against timing noise.
                    let tries = if n == 0 { 3 } else { 2 };
                    timings.push(measure_draft_costs(s, len.max(2), tries)?);
                }
                Ok::<Vec<DraftTiming>, String>(timings)
            })
            .await?
            .map_err(EngineError::Draft)
    }
}

/// Best-of-`tries` timings of drafting after a `len`-token context (see [`MeasureDraftCosts`]).
fn measure_draft_costs(
    s: &mut DraftWorkerState,
    len: usize,
    tries: usize,
) -> Result<DraftTiming, String> {
    // Token ids the drafter proposes (a tiny test model may have 16; a drafter of another
    // vocabulary, the shared ones), so the context is as long in its own tokens.
    let ids: Vec<u32> = match s {
        DraftWorkerState::Model(d) => match d.translation() {
            Some(t) => t.columns().target_ids().iter().take(256).copied().collect(),
            None => (0..d.model().hparams().vocab_size.clamp(1, 256) as u32).collect(),
        },
        DraftWorkerState::Head(d) => {
            (0..d.target().hparams().vocab_size.clamp(1, 256) as u32).collect()
        }
        DraftWorkerState::Lookup(..) => (0..256).collect(),
    };
    let context: Vec<u32> = (0..len)
        .map(|i| ids[(i * 7919 + 13) % ids.len().max(1)])
        .collect();
    let params = SamplingParams::greedy();
    let mut rng = SeededRng::new(0);
    let mut best = DraftTiming::default();
    let mut keep_best = |t: DraftTiming| {
        let min = |a: f64, b: f64| if a == 0.0 { b } else { a.min(b) };
        best.steps = t.steps;
        best.step_seconds = min(best.step_seconds, t.step_seconds);
        best.first_step_seconds = min(best.first_step_seconds, t.first_step_seconds);
        if t.catch_up_tokens > 0 {
            best.catch_up_tokens = t.catch_up_tokens;
            best.catch_up_seconds = min(best.catch_up_seconds, t.catch_up_seconds);
        }
    };
    match s {
        DraftWorkerState::Model(drafter) => {
            let mut d = ModelDrafter::new(drafter.model(), "calibration")
                .with_draft_vocab(drafter.draft_vocab())
                .with_translation(drafter.translation());
            for _ in 0..tries {
                for keep in [0, context.len() - 1] {
                    d.keep_seq(0, keep).map_err(|e| e.to_string())?;
                    let mut out = Proposal::default();
                    let mut jobs = [calibration_job(&context, &params, &mut rng, &mut out)];
                    let t = d.propose_batch(&mut jobs);
                    let [job] = jobs;
                    job.result.map_err(|e| e.to_string())?;
                    keep_best(t);
                }
            }
        }
        DraftWorkerState::Head(drafter) => {
            let mut d = drafter.fresh();
            for _ in 0..tries {
                // From an empty cache (the catch-up), then from a filled one (the steps).
                d.end(0);
                for _ in 0..2 {
                    let mut out = Proposal::default();
                    let mut jobs = [calibration_job(&context, &params, &mut rng, &mut out)];
                    let t = d.propose_batch(&mut jobs);
                    let [job] = jobs;
                    job.result.map_err(|e| e.to_string())?;
                    keep_best(t);
                }
            }
        }
        DraftWorkerState::Lookup(config, _, _) => {
            let mut d = *config;
            let mut p = Proposal::default();
            for _ in 0..tries {
                let t = Instant::now();
                d.propose(&context, context.len(), 4, &params, &mut rng, &mut p)
                    .map_err(|e| e.to_string())?;
                keep_best(DraftTiming {
                    steps: 4,
                    step_seconds: t.elapsed().as_secs_f64(),
                    ..DraftTiming::default()
                });
            }
        }
    }
    Ok(best)
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
        result: Ok(()),
    }
}
