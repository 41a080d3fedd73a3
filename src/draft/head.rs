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
use std::time::Instant;

use super::draw::{draw_draft, DrawLane, DrawScratch};
use super::siblings::Siblings;
use super::{DraftError, DraftJob, DraftTiming, PromptLookup};
use crate::model::head::DraftHead;
use crate::model::{Kept, KvCache, Llama, LogitsRows, SeqInput};
use crate::sampling::GateRound;

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
    target: Arc<Llama>,
    cache: KvCache,
    seqs: HashMap<u64, HeadSeq>,
    scratch: DrawScratch,
    /// Prompt lookup drafted first: a job whose text has an n-gram match drafts the match.
    lookup: Option<PromptLookup>,
}

/// Per-job state while a batch drafts.
struct Lane {
    slot: usize,
    gamma: usize,
    /// The next head forward's tokens and features.
    tokens: Vec<u32>,
    features: Vec<f32>,
    history: Vec<u32>,
    gate: GateRound,
    siblings: Siblings,
}

impl HeadDrafter {
    /// A drafter for up to `slots` sequences at once.
    pub fn new(head: Arc<DraftHead>, target: Arc<Llama>, slots: usize) -> Self {
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

    pub fn target(&self) -> &Arc<Llama> {
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
        let mut timing = DraftTiming::default();
        let vocab = self.target.hparams().vocab_size;
        let mut lanes: Vec<Option<Lane>> = Vec::with_capacity(jobs.len());
        for job in jobs.iter_mut() {
            job.out.clear();
            job.out.vocab = vocab;
            job.result = Ok(());
            if let Some(p) = self.lookup.as_ref().filter(|_| job.lookup) {
                p.lookup_tree(job.context, job.gamma, job.tree_nodes, job.out);
                if !job.out.tokens.is_empty() {
                    lanes.push(None);
                    continue;
                }
            }
            match self.lane(job) {
                Ok(l) => lanes.push(Some(l)),
                Err(e) => {
                    job.result = Err(e);
                    lanes.push(None);
                }
            }
        }
        let h = self.head.hidden_size();
        // Catch-up: all but the last standing position a lane lacks, no logits, so the steps
        // below are uniform and the cost model sees catch-ups apart.
        let catch_up: Vec<usize> = (0..lanes.len())
            .filter(|&i| lanes[i].as_ref().is_some_and(|l| l.tokens.len() > 2))
            .collect();
        if !catch_up.is_empty() {
            let start = Instant::now();
            let mut inputs = Vec::with_capacity(catch_up.len());
            let mut features = Vec::new();
            for &i in &catch_up {
                let l = lanes[i].as_ref().expect("filtered");
                let n = l.tokens.len() - 1;
                timing.catch_up_tokens += n;
                features.extend_from_slice(&l.features[..n * h]);
                inputs.push(SeqInput {
                    slot: l.slot,
                    start_pos: self.cache.len(l.slot).unwrap_or(0),
                    tokens: &l.tokens[..n],
                    logits: LogitsRows::None,
                    parents: &[],
                });
            }
            let done = self
                .head
                .forward(&self.target, &mut self.cache, &inputs, &features);
            drop(inputs);
            for &i in &catch_up {
                match &done {
                    Ok(_) => {
                        let l = lanes[i].as_mut().expect("filtered");
                        let n = l.tokens.len() - 1;
                        l.tokens.drain(..n);
                        l.features.drain(..n * h);
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
        for j in 0..steps {
            let order: Vec<usize> = (0..jobs.len())
                .filter(|&i| lanes[i].as_ref().is_some_and(|l| j < l.gamma))
                .collect();
            if order.is_empty() {
                break;
            }
            let mut features = Vec::new();
            let inputs: Vec<SeqInput> = order
                .iter()
                .map(|&i| {
                    let l = lanes[i].as_ref().expect("filtered");
                    features.extend_from_slice(&l.features);
                    SeqInput {
                        slot: l.slot,
                        start_pos: self.cache.len(l.slot).unwrap_or(0),
                        tokens: &l.tokens,
                        logits: LogitsRows::Last,
                        parents: &[],
                    }
                })
                .collect();
            let rows_of: Vec<usize> = inputs.iter().map(|s| s.tokens.len()).collect();
            let step = self
                .head
                .forward(&self.target, &mut self.cache, &inputs, &features);
            drop(inputs);
            timing.steps += 1;
            if j == 0 {
                timing.first_step_seconds = start.elapsed().as_secs_f64();
                // What was fed at the first step stood: the target's features.
                for &i in &order {
                    let (slot, job) = (lanes[i].as_ref().expect("filtered").slot, &jobs[i]);
                    if let Some(s) = self.seqs.get_mut(&job.seq) {
                        s.standing = self.cache.len(slot).unwrap_or(0);
                    }
                }
            }
            let step = match step {
                Ok(s) => s,
                Err(e) => {
                    for &i in &order {
                        jobs[i].result = Err(DraftError::Forward(e.to_string()));
                        lanes[i] = None;
                    }
                    break;
                }
            };
            let mut row_end = 0;
            for (k, &i) in order.iter().enumerate() {
                row_end += rows_of[k];
                let lane = lanes[i].as_mut().expect("filtered");
                let job = &mut jobs[i];
                let draw = DrawLane {
                    step: j,
                    gate: &mut lane.gate,
                    siblings: &mut lane.siblings,
                    history: &lane.history,
                };
                let row = step.row(step.ranges[k].start);
                match draw_draft(row, self.head.vocab_ids(), job, draw, &mut self.scratch) {
                    Ok(Some(t)) => {
                        job.out.tokens.push(t);
                        lane.history.push(t);
                        lane.tokens.clear();
                        lane.tokens.push(t);
                        lane.features.clear();
                        lane.features
                            .extend_from_slice(&step.hidden[(row_end - 1) * h..row_end * h]);
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
        timing
    }

    /// Rolls the sequence's head cache back to what stands and lays out the first step: every
    /// standing position the cache lacks, with the target's features (zeros where it has none).
    fn lane(&mut self, job: &DraftJob) -> Result<Lane, DraftError> {
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
        if self.cache.len(slot)? > first {
            self.cache.keep(slot, Kept::First(first))?;
        }
        // Room for the standing positions and γ-1 fed drafts.
        let gamma = job.gamma.min((max_len + 1).saturating_sub(ctx.len()));
        Ok(Lane {
            slot,
            gamma,
            tokens: ctx[first + 1..].to_vec(),
            features,
            history: ctx.to_vec(),
            gate: GateRound::default(),
            siblings: Siblings::new(),
        })
    }
}
