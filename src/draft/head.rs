//! The draft head as a drafter: drafts from the target's own hidden states (EAGLE, EAGLE-3).
//!
//! Per sequence it keeps a slot in the head's one-layer cache and the target's features it has
//! not taken in yet. Position `t` of the head's cache is computed from the target's feature at
//! `t` and the token after `t`; positions so computed stand for good (the tokens and features
//! they come from never change). A round takes in every standing position the cache lacks (the
//! last one's output gives the first draft), then drafts a chain, each step fed the token just
//! drafted and the head's own output state in place of the target's feature. The drafted
//! positions are dropped at the next round. Positions whose features it never got (a prompt
//! prefix the target took from its prefix cache) are taken in with zero features: drafts get
//! worse, never wrong.

use std::collections::HashMap;
use std::sync::Arc;

use super::draw::{draw_draft, DrawLane, DrawScratch};
use super::stepping::{draft_in_steps, Lane, Stepper};
use super::{DraftError, DraftJob, DraftTiming, PromptLookup};
use crate::model::head::{DraftHead, HeadStep};
use crate::model::{Decoder, Kept, KvCache, LogitsRows, SeqInput};

/// One sequence's head state.
struct HeadSeq {
    slot: usize,
    /// Head cache positions computed from the target's features (they stand).
    standing: usize,
    /// Target features from position `from` on, `hidden` values a row.
    from: usize,
    features: Vec<f32>,
}

pub struct HeadDrafter {
    head: Arc<DraftHead>,
    target: Arc<Decoder>,
    cache: KvCache,
    seqs: HashMap<u64, HeadSeq>,
    scratch: DrawScratch,
    /// Prompt lookup drafted first: a job whose text has an n-gram match drafts the match.
    lookup: Option<PromptLookup>,
}

/// What a lane feeds the head's next forward: tokens and, per token, the feature it is
/// computed from.
pub(super) struct HeadFeed {
    tokens: Vec<u32>,
    features: Vec<f32>,
}

/// A head's draft step: its output, and where each lane's input rows end (its last row's
/// output state is the lane's next feature).
pub(super) struct HeadStepRows {
    step: HeadStep,
    ends: Vec<usize>,
}

impl HeadDrafter {
    /// A drafter for up to `slots` sequences at once.
    pub fn new(head: Arc<DraftHead>, target: Arc<Decoder>, slots: usize) -> Self {
        let cache = head.new_cache(slots.max(1));
        Self {
            head,
            target,
            cache,
            seqs: HashMap::new(),
            scratch: DrawScratch::default(),
            lookup: None,
        }
    }

    /// Drafts with prompt lookup first: a sequence whose text has an n-gram match drafts the
    /// match (a point mass, as prompt lookup alone does), and the head drafts where the text
    /// has none, or where the job says not to look (`DraftJob::lookup`). The head's cache catches up on the positions it skipped at its next
    /// round, from the features it was given meanwhile.
    pub fn with_lookup(mut self, lookup: Option<PromptLookup>) -> Self {
        self.lookup = lookup;
        self
    }

    pub fn target(&self) -> &Arc<Decoder> {
        &self.target
    }

    /// A drafter with the same head and target and one empty slot, to time the head's
    /// drafting (without prompt lookup, whose drafts cost next to nothing).
    pub fn fresh(&self) -> Self {
        Self::new(Arc::clone(&self.head), Arc::clone(&self.target), 1)
    }

    /// The target's features for `seq` at positions `from..` (rows of what the head's
    /// `feature_taps` names), from a prefill chunk or the rows of a verification that stood.
    /// They are kept as the head's input states (an EAGLE-3 head's `fc` of its taps).
    pub fn give_features(&mut self, seq: u64, from: usize, rows: &[f32]) -> Result<(), DraftError> {
        if rows.is_empty() {
            return Ok(());
        }
        let states = self
            .head
            .input_states(rows)
            .map_err(|e| DraftError::Forward(e.to_string()))?;
        let rows: &[f32] = &states;
        let h = self.head.hidden_size();
        let s = self.seq_state(seq)?;
        let end = s.from + s.features.len() / h;
        if s.features.is_empty() || from < s.from || from > end {
            s.from = from;
            s.features.clear();
        } else {
            s.features.truncate((from - s.from) * h);
        }
        s.features.extend_from_slice(rows);
        Ok(())
    }

    /// Forgets a sequence and frees its slot.
    pub fn end(&mut self, seq: u64) {
        if let Some(s) = self.seqs.remove(&seq) {
            let _ = self.cache.free(s.slot);
        }
    }

    fn seq_state(&mut self, seq: u64) -> Result<&mut HeadSeq, DraftError> {
        if !self.seqs.contains_key(&seq) {
            let slot = self.cache.allocate().ok_or_else(|| {
                DraftError::Forward("the draft head has no free cache slot".into())
            })?;
            self.seqs.insert(
                seq,
                HeadSeq {
                    slot,
                    standing: 0,
                    from: 0,
                    features: Vec::new(),
                },
            );
        }
        Ok(self.seqs.get_mut(&seq).expect("inserted"))
    }

    /// Drafts for every job at once; each job's outcome lands in its `result`.
    pub fn propose_batch(&mut self, jobs: &mut [DraftJob]) -> DraftTiming {
        draft_in_steps(self, jobs)
    }

    /// The head's cache slot `slot` keeps its first `len` positions (those that stand) and drops
    /// the drafted ones after them.
    fn keep_standing(&mut self, slot: usize, len: usize) -> Result<(), DraftError> {
        if self.cache.len(slot)? > len {
            self.cache.keep(slot, Kept::First(len))?;
        }
        Ok(())
    }
}

/// A head steps over tokens with features (the target's, then its own output states); its
/// rows come from its own output head.
impl Stepper for HeadDrafter {
    type Feed = HeadFeed;
    type Step = HeadStepRows;

    fn vocab(&self) -> usize {
        self.target.hparams().vocab_size
    }

    fn drafted_without_steps(&mut self, job: &mut DraftJob) -> bool {
        PromptLookup::drafted_first(self.lookup.as_ref(), job)
    }

    /// Rolls the sequence's head cache back to what stands and lays out the first step: every
    /// standing position the cache lacks, with the target's features (zeros where it has none).
    fn lane(&mut self, job: &DraftJob) -> Result<Lane<HeadFeed>, DraftError> {
        let h = self.head.hidden_size();
        let max_len = self.cache.max_len();
        let ctx = job.context;
        if ctx.len() < 2 {
            return Err(DraftError::Forward(
                "a head drafts after at least two tokens".into(),
            ));
        }
        // Positions 0..ctx.len()-1 have features and a following token.
        let last = ctx.len() - 2;
        let s = self.seq_state(job.seq)?;
        // At least the last position is fed: its output gives the first draft.
        let first = s.standing.min(last);
        let slot = s.slot;
        let mut features = vec![0f32; (last + 1 - first) * h];
        let have_end = s.from + s.features.len() / h;
        for pos in first.max(s.from)..(last + 1).min(have_end) {
            let src = &s.features[(pos - s.from) * h..(pos - s.from + 1) * h];
            features[(pos - first) * h..(pos - first + 1) * h].copy_from_slice(src);
        }
        // Keep only the last fed row's feature (a round that drafts again from the same
        // context feeds it again); earlier ones are in the cache for good.
        if last > s.from {
            let drop = (last - s.from).min(s.features.len() / h);
            s.features.drain(..drop * h);
            s.from += drop;
        }
        s.standing = first;
        self.keep_standing(slot, first)?;
        // Room for the standing positions and γ-1 fed drafts.
        let gamma = job.gamma.min((max_len + 1).saturating_sub(ctx.len()));
        let feed = HeadFeed {
            tokens: ctx[first + 1..].to_vec(),
            features,
        };
        Ok(Lane::new(slot, gamma, feed, ctx.to_vec()))
    }

    fn fed_tokens(feed: &HeadFeed) -> usize {
        feed.tokens.len()
    }

    fn catch_up(&mut self, lanes: &[&Lane<HeadFeed>]) -> Result<(), String> {
        let h = self.head.hidden_size();
        let mut features = Vec::new();
        let inputs: Vec<SeqInput> = lanes
            .iter()
            .map(|l| {
                let n = l.feed.tokens.len() - 1;
                features.extend_from_slice(&l.feed.features[..n * h]);
                SeqInput {
                    slot: l.slot,
                    start_pos: self.cache.len(l.slot).unwrap_or(0),
                    tokens: &l.feed.tokens[..n],
                    logits: LogitsRows::None,
                    parents: &[],
                }
            })
            .collect();
        self.head
            .forward(&self.target, &mut self.cache, &inputs, &features)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn caught_up(&self, feed: &mut HeadFeed) {
        let h = self.head.hidden_size();
        let n = feed.tokens.len() - 1;
        feed.tokens.drain(..n);
        feed.features.drain(..n * h);
    }

    fn step(&mut self, lanes: &[&Lane<HeadFeed>]) -> Result<HeadStepRows, String> {
        let mut features = Vec::new();
        let inputs: Vec<SeqInput> = lanes
            .iter()
            .map(|l| {
                features.extend_from_slice(&l.feed.features);
                SeqInput {
                    slot: l.slot,
                    start_pos: self.cache.len(l.slot).unwrap_or(0),
                    tokens: &l.feed.tokens,
                    logits: LogitsRows::Last,
                    parents: &[],
                }
            })
            .collect();
        let ends = inputs
            .iter()
            .scan(0, |end, s| {
                *end += s.tokens.len();
                Some(*end)
            })
            .collect();
        self.head
            .forward(&self.target, &mut self.cache, &inputs, &features)
            .map(|step| HeadStepRows { step, ends })
            .map_err(|e| e.to_string())
    }

    /// What was fed at the first step stood: the target's features.
    fn first_step_taken(&mut self, lanes: &[(u64, usize)]) {
        for &(seq, slot) in lanes {
            if let Some(s) = self.seqs.get_mut(&seq) {
                s.standing = self.cache.len(slot).unwrap_or(0);
            }
        }
    }

    fn draw(
        &mut self,
        step: &HeadStepRows,
        k: usize,
        job: &mut DraftJob,
        draw: DrawLane,
    ) -> Result<Option<u32>, DraftError> {
        let row = step.step.row(step.step.ranges[k].start);
        draw_draft(row, self.head.vocab_ids(), job, draw, &mut self.scratch)
    }

    fn feed_drawn(&self, step: &HeadStepRows, k: usize, feed: &mut HeadFeed, token: u32) {
        let h = self.head.hidden_size();
        let end = step.ends[k];
        feed.tokens.clear();
        feed.tokens.push(token);
        feed.features.clear();
        feed.features
            .extend_from_slice(&step.step.hidden[(end - 1) * h..end * h]);
    }
}
