//! A draft model: any model the model layer loads, with the target's vocabulary. It keeps its
//! own KV cache, filled lazily from the context on the first round and rolled back after each.
//!
//! One `ModelDrafter` drafts for many sequences at once (the engine's drafter holds one for all
//! its sequences): each draft step is a single forward over every sequence still drafting, so
//! the draft weights are read once per step rather than once per sequence.

use std::collections::HashMap;
use std::ops::Deref;
use std::time::Instant;

use super::draw::{draw_draft, DrawLane, DrawScratch};
use super::siblings::Siblings;
use super::{DraftError, Proposal, Proposer};
use crate::constraint::SequenceConstraint;
use crate::model::cache::prefix_index::PrefixIndex;
use crate::model::{BatchLogits, Kept, KvCache, Llama, LogitsRows, SeqInput};
use crate::sampling::{DraftGate, GateRound, SamplingParams, SeededRng};

/// `M` is how the model is held: `&Llama` for one generation, `Arc<Llama>` in the engine.
pub struct ModelDrafter<M: Deref<Target = Llama>> {
    pub(super) model: M,
    pub(super) name: String,
    pub(super) cache: KvCache,
    /// Which cache slot each sequence drafts in.
    pub(super) slots: HashMap<u64, usize>,
    /// The tokens each sequence's cache holds (for the prefix cache).
    pub(super) held: HashMap<u64, Vec<u32>>,
    /// Slots of ended sequences kept for their prefix, when `prefix_cache` is on.
    pub(super) retained: PrefixIndex,
    pub(super) prefix_cache: bool,
    pub(super) scratch: DrawScratch,
}

/// One sequence's share of a batched draft: its context (last token not yet verified), where
/// its output starts (for penalties), how many tokens to draft, and where they go.
pub struct DraftJob<'a> {
    pub seq: u64,
    pub context: &'a [u32],
    pub generated_from: usize,
    pub gamma: usize,
    pub params: &'a SamplingParams,
    pub rng: &'a mut SeededRng,
    pub out: &'a mut Proposal,
    /// When to stop drafting early ([`DraftGate`]; `DraftGate::OFF` never does), after at
    /// least `min_tokens` tokens.
    pub gate: DraftGate,
    pub min_tokens: usize,
    /// Report the confidence in each drafted token (the governor prices chains by it).
    pub confidence: bool,
    /// Up to this many alternatives beside the chain, making the proposal a token tree: the
    /// drafter's runners-up where it was least sure (see [`Siblings`]).
    pub tree_nodes: usize,
    /// A constrained request's grammar state (a fork of it): each draft is taken from the
    /// draft model's distribution masked by the grammar, which is then the `q` the drafts are
    /// verified against, and the state follows the drafts.
    pub grammar: Option<&'a mut SequenceConstraint>,
    /// A drafter that drafts prompt lookup's match first may do so this round; `false`: the
    /// scheduler judged its model likelier to be right here than this match.
    pub lookup: bool,
    pub result: Result<(), DraftError>,
}

/// What a batched draft cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DraftTiming {
    /// Forwards of the draft steps (one per step, all sequences together).
    pub steps: usize,
    /// All the steps together.
    pub step_seconds: f64,
    /// The first step alone (0 = not timed apart: steps cost alike). After a round whose
    /// drafts all stood it also takes in the last draft and the target's bonus token, so it
    /// costs ~1.3x a later step, and pricing every step at the average made long drafts look
    /// dearer than they are to a request drafting 1 token a round.
    pub first_step_seconds: f64,
    /// Context tokens the cache had to take in before drafting (a prompt, or output decoded
    /// while speculation was off), beyond the one or two every round feeds.
    pub catch_up_tokens: usize,
    pub catch_up_seconds: f64,
}

/// The sequence id the single-sequence [`Proposer`] interface drafts under.
const SOLO: u64 = u64::MAX;

/// A draft step's logits: every sequence's last row over the whole vocabulary, or over the
/// model's reduced draft vocabulary (rows of `width` values, in batch order).
enum StepLogits {
    Full(BatchLogits),
    Reduced((Vec<f32>, usize)),
}

/// Per-job state while a batch drafts.
struct Lane {
    slot: usize,
    gamma: usize,
    feed: Vec<u32>,
    history: Vec<u32>,
    gate: GateRound,
    siblings: Siblings,
}

impl<M: Deref<Target = Llama>> ModelDrafter<M> {
    /// A drafter for one sequence at a time (the [`Proposer`] interface).
    pub fn new(model: M, name: impl Into<String>) -> Self {
        Self::with_slots(model, name, 1)
    }

    /// A drafter for up to `slots` sequences at once ([`ModelDrafter::propose_batch`]).
    pub fn with_slots(model: M, name: impl Into<String>, slots: usize) -> Self {
        let cache = model.new_cache(slots.max(1));
        Self {
            model,
            name: name.into(),
            cache,
            slots: HashMap::new(),
            held: HashMap::new(),
            retained: PrefixIndex::default(),
            prefix_cache: false,
            scratch: DrawScratch::default(),
        }
    }

    /// Keeps ended sequences' caches and starts new ones from the longest prefix a kept or
    /// running cache holds, as the target's prefix cache does (the same bits as computing it).
    pub fn with_prefix_cache(mut self, on: bool) -> Self {
        self.prefix_cache = on;
        self
    }

    /// The model it drafts with.
    pub fn model(&self) -> M
    where
        M: Clone,
    {
        self.model.clone()
    }

    /// Drafts for every job at once; each job's outcome lands in its `result`. A failure of a
    /// shared forward fails every job still drafting; a sampling failure fails only its job.
    pub fn propose_batch(&mut self, jobs: &mut [DraftJob]) -> DraftTiming {
        let mut timing = DraftTiming::default();
        let vocab = self.model.hparams().vocab_size;
        // Set up lanes; a job that cannot draft (no slot) fails here and gets no lane.
        let mut lanes: Vec<Option<Lane>> = Vec::with_capacity(jobs.len());
        for job in jobs.iter_mut() {
            job.out.clear();
            job.out.vocab = vocab;
            job.result = Ok(());
            let lane = self.lane(job);
            match lane {
                Ok(l) => lanes.push(Some(l)),
                Err(e) => {
                    job.result = Err(e);
                    lanes.push(None);
                }
            }
        }
        // Catch-up: context the cache has not seen (a prompt, plain-decoded output) goes in
        // first, all but its last token, so the draft steps below are uniform and cheap.
        let catch_up: Vec<(usize, usize)> = lanes
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.as_ref().filter(|l| l.feed.len() > 2).map(|_| (i, 0)))
            .collect();
        if !catch_up.is_empty() {
            let start = Instant::now();
            let mut inputs = Vec::with_capacity(catch_up.len());
            for &(i, _) in &catch_up {
                let l = lanes[i].as_ref().expect("filtered");
                let n = l.feed.len() - 1;
                timing.catch_up_tokens += n;
                inputs.push(SeqInput {
                    slot: l.slot,
                    start_pos: self.cache.len(l.slot).unwrap_or(0),
                    tokens: &l.feed[..n],
                    logits: LogitsRows::None,
                    parents: &[],
                });
            }
            let done = self.model.forward(&mut self.cache, &inputs);
            drop(inputs);
            for &(i, _) in &catch_up {
                match &done {
                    Ok(_) => {
                        let l = lanes[i].as_mut().expect("filtered");
                        l.feed.drain(..l.feed.len() - 1);
                    }
                    Err(e) => {
                        jobs[i].result = Err(DraftError::Forward(e.to_string()));
                        lanes[i] = None;
                    }
                }
            }
            timing.catch_up_seconds = start.elapsed().as_secs_f64();
        }
        let start = Instant::now();
        let steps = lanes.iter().flatten().map(|l| l.gamma).max().unwrap_or(0);
        let vocab = self.model.draft_vocab();
        for j in 0..steps {
            let order: Vec<usize> = (0..jobs.len())
                .filter(|&i| lanes[i].as_ref().is_some_and(|l| j < l.gamma))
                .collect();
            if order.is_empty() {
                break;
            }
            let inputs: Vec<SeqInput> = order
                .iter()
                .map(|&i| {
                    let l = lanes[i].as_ref().expect("filtered");
                    SeqInput {
                        slot: l.slot,
                        start_pos: self.cache.len(l.slot).unwrap_or(0),
                        tokens: &l.feed,
                        // A reduced vocabulary projects the output states itself.
                        logits: if vocab.is_some() {
                            LogitsRows::None
                        } else {
                            LogitsRows::Last
                        },
                        parents: &[],
                    }
                })
                .collect();
            let logits = match vocab {
                Some(v) => v
                    .forward_last(&self.model, &mut self.cache, &inputs)
                    .map(StepLogits::Reduced),
                None => self
                    .model
                    .forward(&mut self.cache, &inputs)
                    .map(StepLogits::Full),
            };
            drop(inputs);
            timing.steps += 1;
            if j == 0 {
                timing.first_step_seconds = start.elapsed().as_secs_f64();
            }
            let logits = match logits {
                Ok(l) => l,
                Err(e) => {
                    for &i in &order {
                        jobs[i].result = Err(DraftError::Forward(e.to_string()));
                        lanes[i] = None;
                    }
                    break;
                }
            };
            for (row_idx, &i) in order.iter().enumerate() {
                let lane = lanes[i].as_mut().expect("filtered");
                let job = &mut jobs[i];
                let draw = DrawLane {
                    step: j,
                    gate: &mut lane.gate,
                    siblings: &mut lane.siblings,
                    history: &lane.history,
                };
                let picked = match &logits {
                    StepLogits::Full(l) => {
                        l.seq_rows(row_idx)
                            .map_err(DraftError::Model)
                            .and_then(|mut rows| {
                                let row = rows.pop().expect("asked for the last row");
                                draw_draft(&row, None, job, draw, &mut self.scratch)
                            })
                    }
                    StepLogits::Reduced((rows, width)) => {
                        let row = &rows[row_idx * width..(row_idx + 1) * width];
                        let ids = vocab.map(|v| v.ids());
                        draw_draft(row, ids, job, draw, &mut self.scratch)
                    }
                };
                match picked {
                    Ok(Some(t)) => {
                        job.out.tokens.push(t);
                        lane.history.push(t);
                        lane.feed.clear();
                        lane.feed.push(t);
                    }
                    // The gate stopped: no later step drafts for this lane.
                    Ok(None) => lane.gamma = j,
                    Err(e) => {
                        job.result = Err(e);
                        lanes[i] = None;
                    }
                }
            }
        }
        timing.step_seconds = start.elapsed().as_secs_f64();
        for (job, lane) in jobs.iter_mut().zip(lanes.iter_mut()) {
            if let (Some(l), Ok(())) = (lane, &job.result) {
                l.siblings.attach(job.tree_nodes, job.out);
            }
        }
        // What each cache now holds: its context and the drafts fed back. A lane that failed
        // left its cache unknown, so its slot is not kept for a prefix.
        for (job, lane) in jobs.iter().zip(&lanes) {
            match lane {
                Some(l) => {
                    let len = self.cache.len(l.slot).unwrap_or(0).min(l.history.len());
                    self.held.insert(job.seq, l.history[..len].to_vec());
                }
                None => {
                    self.held.remove(&job.seq);
                }
            }
        }
        timing
    }

    fn lane(&mut self, job: &DraftJob) -> Result<Lane, DraftError> {
        let slot = self.slot_for(job.seq, job.context)?;
        if self.cache.len(slot)? >= job.context.len() {
            // Out of step with the caller (it should have rolled us back): start over.
            self.cache.keep(slot, Kept::First(0))?;
        }
        let cached = self.cache.len(slot)?;
        // Room for the context and γ-1 fed drafts.
        let gamma = job
            .gamma
            .min((self.cache.max_len() + 1).saturating_sub(job.context.len()));
        Ok(Lane {
            slot,
            gamma,
            feed: job.context[cached..].to_vec(),
            history: job.context.to_vec(),
            gate: GateRound::default(),
            siblings: Siblings::new(),
        })
    }
}

impl<M: Deref<Target = Llama>> Proposer for ModelDrafter<M> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn propose(
        &mut self,
        context: &[u32],
        generated_from: usize,
        gamma: usize,
        params: &SamplingParams,
        rng: &mut SeededRng,
        out: &mut Proposal,
    ) -> Result<(), DraftError> {
        let mut jobs = [DraftJob {
            seq: SOLO,
            context,
            generated_from,
            gamma,
            params,
            rng,
            out,
            gate: DraftGate::OFF,
            min_tokens: 0,
            grammar: None,
            confidence: false,
            tree_nodes: 0,
            lookup: true,
            result: Ok(()),
        }];
        self.propose_batch(&mut jobs);
        let [job] = jobs;
        job.result
    }

    fn prefill(&mut self, prompt: &[u32]) -> Result<(), DraftError> {
        let slot = self.slot_for(SOLO, &[])?;
        self.cache.keep(slot, Kept::First(0))?;
        let tokens = &prompt[..prompt.len().min(self.cache.max_len())];
        if !tokens.is_empty() {
            self.model.forward(
                &mut self.cache,
                &[SeqInput {
                    slot,
                    start_pos: 0,
                    tokens,
                    logits: LogitsRows::None,
                    parents: &[],
                }],
            )?;
        }
        self.held.insert(SOLO, tokens.to_vec());
        Ok(())
    }

    fn keep(&mut self, len: usize) -> Result<(), DraftError> {
        self.keep_seq(SOLO, len)
    }
}
