//! A draft model: any model the model layer loads, with the target's vocabulary or, through a
//! [`Translation`], another one. It keeps its own KV cache, filled lazily from the context on
//! the first round and rolled back after each.
//!
//! One `ModelDrafter` drafts for many sequences at once (the engine's drafter holds one for all
//! its sequences): each draft step is a single forward over every sequence still drafting, so
//! the draft weights are read once per step rather than once per sequence.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use super::draw::{draw_draft, DrawLane, DrawScratch};
use super::stepping::{draft_in_steps, Lane, Stepper};
use super::translation::{GreedyAcross, Translation, Translator};
use super::{DraftError, DraftJob, DraftTiming, PromptLookup, Proposal, Proposer};
use crate::model::cache::prefix_store::PrefixStore;
use crate::model::{
    BatchLogits, Decoder, DraftVocab, FeatureTaps, Kept, KvCache, LogitsRows, ModelError, SeqInput,
    WeightsDtype,
};
use crate::sampling::{DraftGate, SamplingParams, SeededRng};

/// `M` is how the model is held: `&Decoder` for one generation, `Arc<Decoder>` in the engine.
pub struct ModelDrafter<M: Deref<Target = Decoder>> {
    pub(super) model: M,
    pub(super) name: String,
    pub(super) cache: KvCache,
    /// Which cache slot each sequence drafts in.
    pub(super) slots: HashMap<u64, usize>,
    /// The tokens each sequence's cache holds (for the prefix cache).
    pub(super) held: HashMap<u64, Vec<u32>>,
    /// Each sequence's prefix-cache scope.
    pub(super) scopes: HashMap<u64, u64>,
    /// Ended sequences' keys and values, by text (`None`: no prefix cache).
    pub(super) prefix: Option<PrefixStore>,
    pub(super) scratch: DrawScratch,
    /// The reduced vocabulary it drafts over (`None`: the model's whole vocabulary).
    vocab: Option<Arc<DraftVocab>>,
    /// Its contexts in its own tokens and its proposals in the target's, when the target's
    /// vocabulary is another (`None`: the same).
    pub(super) translator: Option<Translator>,
    /// A row's logits of the shared tokens (a translating drafter's draws).
    shared_row: Vec<f32>,
    /// Prompt lookup, drafting first where the text has a match (`draft+lookup`).
    lookup: Option<PromptLookup>,
}

/// The reduced vocabulary a draft model drafts over: the `k` tokens `ranking` puts first (all
/// it holds when fewer), projected through `model`'s own output-head rows; `None` for the
/// whole vocabulary (`k` = 0, no ranking, or one covering every token).
pub fn reduced_vocab(
    model: &Decoder,
    ranking: &[u32],
    k: usize,
) -> Result<Option<DraftVocab>, DraftError> {
    let Some(ids) = DraftVocab::ids_of(ranking, k, model.hparams().vocab_size) else {
        return Ok(None);
    };
    let rows = model
        .output_rows(&ids)?
        .to_device(&candle_core::Device::Cpu)
        .map_err(ModelError::from)?;
    Ok(Some(DraftVocab::new(ids, rows, WeightsDtype::Auto)?))
}

/// The sequence id the single-sequence [`Proposer`] interface drafts under.
const SOLO: u64 = u64::MAX;

/// What a lane feeds the draft model: tokens of its own vocabulary. `own_drafts`: the lane
/// drafts the model's own best tokens (string-level, for a target of another vocabulary), fed
/// back as they are rather than mapped from the target's.
pub(super) struct Feed {
    tokens: Vec<u32>,
    own_drafts: bool,
}

/// A draft step's logits: every sequence's last row over the whole vocabulary, or over the
/// model's reduced draft vocabulary (rows of `width` values, in batch order).
pub(super) enum StepLogits {
    Full(BatchLogits),
    Reduced((Vec<f32>, usize)),
}

impl<M: Deref<Target = Decoder>> ModelDrafter<M> {
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
            scopes: HashMap::new(),
            prefix: None,
            scratch: DrawScratch::default(),
            vocab: None,
            translator: None,
            shared_row: Vec::new(),
            lookup: None,
        }
    }

    /// Drafts prompt lookup's match first where the text has one (and the round allows it),
    /// the model elsewhere.
    pub fn with_lookup(mut self, lookup: Option<PromptLookup>) -> Self {
        self.lookup = lookup;
        self
    }

    /// Drafts for a target of another vocabulary (`None`: the same one): it reads contexts
    /// through `translation` and proposes the shared tokens alone, as target ids.
    pub fn with_translation(mut self, translation: Option<Arc<Translation>>) -> Self {
        self.translator = translation.map(Translator::new);
        self
    }

    /// The translation it drafts through, if the target's vocabulary is another.
    pub fn translation(&self) -> Option<Arc<Translation>> {
        self.translator
            .as_ref()
            .map(|t| Arc::clone(t.translation()))
    }

    /// `context` (target ids) as `seq`'s cache holds it: in the drafter's tokens when it
    /// translates.
    pub(super) fn in_own_tokens<'a>(
        &'a mut self,
        seq: u64,
        context: &'a [u32],
    ) -> Result<&'a [u32], DraftError> {
        match &mut self.translator {
            Some(t) => t.translate(seq, context),
            None => Ok(context),
        }
    }

    /// Drafts over `vocab`'s tokens alone, projected through its own rows of the model's
    /// output head (`None`: the whole vocabulary).
    pub fn with_draft_vocab(mut self, vocab: Option<Arc<DraftVocab>>) -> Self {
        self.vocab = vocab;
        self
    }

    /// Whether `job` drafts the model's own best tokens and proposes their text in the
    /// target's tokens (string-level): a translating drafter set to, for a request whose
    /// drafts are point masses (greedy, or sampled proposing its likeliest tokens) and that
    /// nothing else reads (no grammar, tree, gate or confidences).
    fn drafts_own_tokens(&self, job: &DraftJob) -> bool {
        self.translator
            .as_ref()
            .is_some_and(|t| t.translation().greedy() == GreedyAcross::StringLevel)
            && (job.params.is_greedy() || job.likeliest)
            && job.grammar.is_none()
            && job.tree_nodes == 0
            && !job.confidence
            && !job.gate.is_on()
    }

    /// A string-level lane's end: its drafts (the model's own tokens) become the target's
    /// tokens of their text, and what its cache holds (its context and those drafts, in its
    /// own tokens) is returned; `None` (the job failed) where the text cannot be tokenized.
    fn in_target_tokens(&mut self, job: &mut DraftJob) -> Option<Vec<u32>> {
        let mut own = self.in_own_tokens(job.seq, job.context).ok()?.to_vec();
        own.extend_from_slice(&job.out.tokens);
        let t = self
            .translator
            .as_ref()
            .expect("a string-level lane translates");
        match t.translation().retokenize(&job.out.tokens) {
            Ok(ids) => {
                job.out.tokens = ids;
                Some(own)
            }
            Err(e) => {
                job.out.clear();
                job.result = Err(e.into());
                None
            }
        }
    }

    /// The reduced vocabulary it drafts over, if any.
    pub fn draft_vocab(&self) -> Option<Arc<DraftVocab>> {
        self.vocab.clone()
    }

    /// Stores ended sequences' keys and values (at most `budget` bytes) and starts new ones
    /// from the longest prefix the store or a running sequence's cache holds, as the target's
    /// prefix cache does (the same bits as computing it). `None`: no prefix cache.
    pub fn with_prefix_cache(mut self, budget: Option<usize>) -> Self {
        self.prefix = budget.map(|b| PrefixStore::new(b, self.cache.bytes_per_token()));
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
        draft_in_steps(self, jobs)
    }
}

/// A draft model steps over token feeds; its rows are the whole vocabulary's or, with a
/// reduced draft vocabulary, projected onto it from the last normed states.
impl<M: Deref<Target = Decoder>> Stepper for ModelDrafter<M> {
    type Feed = Feed;
    type Step = StepLogits;

    fn vocab(&self) -> usize {
        match &self.translator {
            Some(t) => t.translation().target_rows(),
            None => self.model.hparams().vocab_size,
        }
    }

    fn drafted_without_steps(&mut self, job: &mut DraftJob) -> bool {
        PromptLookup::drafted_first(self.lookup.as_ref(), job)
    }

    /// The lane's feed is in the drafter's tokens, its history (what the draws' penalties
    /// read, and the proposals) in the target's.
    fn lane(&mut self, job: &DraftJob) -> Result<Lane<Feed>, DraftError> {
        let own = self.in_own_tokens(job.seq, job.context)?.to_vec();
        let slot = self.slot_for(job.seq, job.scope, &own)?;
        if self.cache.len(slot)? >= own.len() {
            // Out of step with the caller (it should have rolled us back): start over.
            self.cache.keep(slot, Kept::First(0))?;
        }
        let cached = self.cache.len(slot)?;
        // Room for the context and γ-1 fed drafts; nothing to draft from an empty context
        // (a translation may come to no tokens).
        let gamma = match own.len() {
            0 => 0,
            n => job.gamma.min((self.cache.max_len() + 1).saturating_sub(n)),
        };
        let feed = Feed {
            tokens: own[cached..].to_vec(),
            own_drafts: self.drafts_own_tokens(job),
        };
        Ok(Lane::new(slot, gamma, feed, job.context.to_vec()))
    }

    fn fed_tokens(feed: &Feed) -> usize {
        feed.tokens.len()
    }

    fn catch_up(&mut self, lanes: &[&Lane<Feed>]) -> Result<(), String> {
        let inputs: Vec<SeqInput> = lanes
            .iter()
            .map(|l| SeqInput {
                slot: l.slot,
                start_pos: self.cache.len(l.slot).unwrap_or(0),
                tokens: &l.feed.tokens[..l.feed.tokens.len() - 1],
                logits: LogitsRows::None,
                parents: &[],
            })
            .collect();
        self.model
            .forward(&mut self.cache, &inputs)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn caught_up(&self, feed: &mut Feed) {
        feed.tokens.drain(..feed.tokens.len() - 1);
    }

    fn step(&mut self, lanes: &[&Lane<Feed>]) -> Result<StepLogits, String> {
        let inputs: Vec<SeqInput> = lanes
            .iter()
            .map(|l| SeqInput {
                slot: l.slot,
                start_pos: self.cache.len(l.slot).unwrap_or(0),
                tokens: &l.feed.tokens,
                // A reduced vocabulary projects the output states itself.
                // (A translating drafter has none: its rows are gathered whole.)
                logits: if self.vocab.is_some() {
                    LogitsRows::None
                } else {
                    LogitsRows::Last
                },
                parents: &[],
            })
            .collect();
        let logits = match &self.vocab {
            Some(v) => self
                .model
                .forward_with_features(&mut self.cache, &inputs, &FeatureTaps::LastNormed)
                .and_then(|(_, features)| v.logits_of_last(&features, inputs.len()))
                .map(StepLogits::Reduced),
            None => self
                .model
                .forward(&mut self.cache, &inputs)
                .map(StepLogits::Full),
        };
        logits.map_err(|e| e.to_string())
    }

    fn draw(
        &mut self,
        step: &StepLogits,
        k: usize,
        job: &mut DraftJob,
        draw: DrawLane,
    ) -> Result<Option<u32>, DraftError> {
        match step {
            StepLogits::Full(l) => {
                let row = l.seq_rows(k)?.pop().expect("asked for the last row");
                match &self.translator {
                    Some(t) if self.drafts_own_tokens(job) => {
                        // The drafter's own best token; a control token ends the draft.
                        job.out.point_masses = true;
                        let best = crate::sampling::argmax(&row)?;
                        Ok((!t.translation().is_draft_control(best)).then_some(best))
                    }
                    Some(t) => {
                        let columns = t.translation().columns();
                        columns.gather(&row, &mut self.shared_row);
                        let ids = Some(columns.target_ids());
                        draw_draft(&self.shared_row, ids, job, draw, &mut self.scratch)
                    }
                    None => draw_draft(&row, None, job, draw, &mut self.scratch),
                }
            }
            StepLogits::Reduced((rows, width)) => {
                let row = &rows[k * width..(k + 1) * width];
                let ids = self.vocab.as_deref().map(DraftVocab::ids);
                draw_draft(row, ids, job, draw, &mut self.scratch)
            }
        }
    }

    fn feed_drawn(&self, _step: &StepLogits, _k: usize, feed: &mut Feed, token: u32) {
        feed.tokens.clear();
        feed.tokens.push(match &self.translator {
            Some(_) if feed.own_drafts => token,
            Some(t) => t
                .translation()
                .draft_of(token)
                .expect("a translating drafter proposes shared tokens alone"),
            None => token,
        });
    }

    /// What each cache now holds: its context and the drafts fed back. A lane that failed
    /// left its cache unknown, so its slot is not kept for a prefix; a job prompt lookup
    /// drafted left it as it was.
    fn finish(&mut self, jobs: &mut [DraftJob], lanes: &[Option<Lane<Feed>>]) {
        for (job, lane) in jobs.iter_mut().zip(lanes) {
            let held = match lane {
                Some(l) if l.feed.own_drafts => self.in_target_tokens(job).map(|own| (l.slot, own)),
                Some(l) => self
                    .in_own_tokens(job.seq, &l.history)
                    .ok()
                    .map(|own| (l.slot, own.to_vec())),
                None if job.result.is_ok() => continue,
                None => None,
            };
            match held {
                Some((slot, own)) => {
                    let len = self.cache.len(slot).unwrap_or(0).min(own.len());
                    self.held.insert(job.seq, own[..len].to_vec());
                }
                None => {
                    self.held.remove(&job.seq);
                }
            }
        }
    }
}

impl<M: Deref<Target = Decoder>> Proposer for ModelDrafter<M> {
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
            scope: 0,
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
            likeliest: false,
            result: Ok(()),
        }];
        self.propose_batch(&mut jobs);
        let [job] = jobs;
        job.result
    }

    fn prefill(&mut self, prompt: &[u32]) -> Result<(), DraftError> {
        let slot = self.slot_for(SOLO, 0, &[])?;
        self.cache.keep(slot, Kept::First(0))?;
        let own = self.in_own_tokens(SOLO, prompt)?.to_vec();
        let tokens = &own[..own.len().min(self.cache.max_len())];
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
