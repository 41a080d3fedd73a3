//! The Verifier actor: batched target forwards (prompt chunks, plain steps and verification of
//! drafts) on its compute worker. A round has three phases, each a function here: `forward`
//! (one batched pass), `accept` (the acceptance rule of `acceptance.rs` per item) and the
//! target slot's `keep` (rejected tokens leave the cache: [`KvCache::keep`]).

use std::sync::Arc;
use std::time::Instant;

use kameo::message::{Context, Message};
use kameo::Actor;

use super::acceptance::{verify, verify_tree, Scratch, VerifyInput};
use super::error::EngineError;
use super::messages::{
    CopyPrefix, Failure, FreeSlot, KeepSlot, TargetBatch, TargetBatchResult, TargetItem,
    TargetOutcome, TargetWork, TreeWalk,
};
use super::worker::ComputeWorker;
use crate::draft::Proposal;
use crate::model::{
    BatchFeatures, BatchLogits, FeatureTaps, Kept, KvCache, Llama, LogitsRows, ModelError, SeqInput,
};
use crate::sampling::tree::TreeOutcome;
use crate::sampling::{apply_penalties, token_logprob, Sampler, SeededRng};

/// What the verifier's worker owns.
pub struct TargetState {
    model: Arc<Llama>,
    cache: KvCache,
    scratch: Scratch,
    sampler: Sampler,
    /// Return the standing positions' features, these ones (a draft head drafts from them).
    features: Option<FeatureTaps>,
}

#[derive(Actor)]
pub struct Verifier {
    worker: ComputeWorker<TargetState>,
}

impl Verifier {
    /// `features`: outcomes carry these hidden states of the positions that stand.
    pub fn new(
        model: Arc<Llama>,
        slots: usize,
        threads: usize,
        features: Option<FeatureTaps>,
    ) -> Result<Self, EngineError> {
        let cache = model.new_cache(slots);
        let state = TargetState {
            model,
            cache,
            scratch: Scratch::default(),
            sampler: Sampler::default(),
            features,
        };
        Ok(Self {
            worker: ComputeWorker::spawn("tandem-target", threads, state)?,
        })
    }

    /// Times target forwards of each of `widths` new tokens at a small depth on `slot` (free
    /// at start-up), best of `repeats`, for the governor's cost model: `(width, seconds)`.
    pub async fn calibrate(
        &self,
        slot: usize,
        widths: Vec<usize>,
        repeats: usize,
    ) -> Result<Vec<(usize, f64)>, EngineError> {
        self.worker
            .run(move |s| calibrate(s, slot, &widths, repeats))
            .await?
    }
}

fn calibrate(
    s: &mut TargetState,
    slot: usize,
    widths: &[usize],
    repeats: usize,
) -> Result<Vec<(usize, f64)>, EngineError> {
    let vocab = s.model.hparams().vocab_size as u32;
    let max_len = s.cache.max_len();
    let widths: Vec<usize> = widths
        .iter()
        .copied()
        .filter(|&w| w > 0 && w < max_len)
        .collect();
    let max_width = widths.iter().copied().max().unwrap_or(0);
    let depth = 32.min(s.cache.max_len().saturating_sub(max_width + 1));
    s.cache.allocate_slot(slot)?;
    let ids: Vec<u32> = (0..depth.max(1) + max_width)
        .map(|i| (i as u32 * 7919 + 13) % vocab)
        .collect();
    let run = |s: &mut TargetState| -> Result<Vec<(usize, f64)>, EngineError> {
        s.model.forward(
            &mut s.cache,
            &[SeqInput {
                slot,
                start_pos: 0,
                tokens: &ids[..depth.max(1)],
                logits: LogitsRows::None,
                parents: &[],
            }],
        )?;
        let base = s.cache.len(slot)?;
        let mut best = vec![f64::INFINITY; widths.len()];
        for _ in 0..repeats.max(1) {
            for (b, &w) in best.iter_mut().zip(&widths) {
                let t = Instant::now();
                s.model.forward(
                    &mut s.cache,
                    &[SeqInput {
                        slot,
                        start_pos: base,
                        tokens: &ids[base..base + w],
                        logits: LogitsRows::All,
                        parents: &[],
                    }],
                )?;
                *b = b.min(t.elapsed().as_secs_f64());
                s.cache.keep(slot, Kept::First(base))?;
            }
        }
        Ok(widths.iter().copied().zip(best).collect())
    };
    let result = run(s);
    s.cache.free(slot)?;
    result
}

impl Message<TargetBatch> for Verifier {
    type Reply = Result<TargetBatchResult, EngineError>;

    async fn handle(
        &mut self,
        msg: TargetBatch,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.worker.run(move |s| run_batch(s, msg.items)).await?
    }
}

impl Message<CopyPrefix> for Verifier {
    type Reply = Result<(), EngineError>;

    async fn handle(&mut self, msg: CopyPrefix, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker
            .run(move |s| Ok(s.cache.copy_prefix(msg.from, msg.to, msg.len)?))
            .await?
    }
}

impl Message<KeepSlot> for Verifier {
    type Reply = Result<(), EngineError>;

    async fn handle(&mut self, msg: KeepSlot, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker
            .run(move |s| Ok(s.cache.keep(msg.slot, Kept::First(msg.len))?))
            .await?
    }
}

impl Message<FreeSlot> for Verifier {
    type Reply = Result<(), EngineError>;

    async fn handle(&mut self, msg: FreeSlot, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.worker
            .run(move |s| {
                if s.cache.is_allocated(msg.slot) {
                    s.cache.free(msg.slot)?;
                }
                Ok(())
            })
            .await?
    }
}

/// The chain's nodes a round tried (those up to the first rejected one) with their
/// confidences and whether each stood; empty when the drafter judged none.
fn tried_chain(p: &Proposal, accepted: usize) -> Vec<(f32, bool)> {
    let chain = p.chain_len().min(p.confidence.len());
    (0..chain.min(accepted + 1))
        .map(|i| (p.confidence[i], i < accepted))
        .collect()
}

/// What a tree walk did, as the scheduler records it.
fn tree_walk(p: &Proposal, walk: &TreeOutcome) -> TreeWalk {
    let chain_len = p.chain_len();
    let chain_accepted = walk
        .path
        .iter()
        .enumerate()
        .take_while(|&(d, &n)| d == n && n < chain_len)
        .count();
    TreeWalk {
        nodes: p.tokens.len(),
        chain_len,
        chain_accepted,
        branched: chain_accepted < walk.path.len(),
        tried_branches: walk
            .tried
            .iter()
            .filter(|&&n| n >= chain_len)
            .map(|&n| {
                let conf = p.confidence.get(n).copied().unwrap_or(0.0);
                (conf, walk.path.contains(&n))
            })
            .collect(),
        kind: p.confidence_kind,
    }
}

/// One forward for every item, then each item settled on its own: its acceptance, what its
/// slot keeps, the features of what stands. A failure that belongs to one item (bad logits, a
/// sampling error) fails that item only.
fn run_batch(
    s: &mut TargetState,
    items: Vec<TargetItem>,
) -> Result<TargetBatchResult, EngineError> {
    let start = Instant::now();
    let (logits, features) = forward(s, &items)?;
    let outcomes = items
        .into_iter()
        .enumerate()
        .map(|(i, it)| settle(s, &logits, features.as_ref(), i, it))
        .collect();
    Ok(TargetBatchResult {
        outcomes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The round's one forward: every item's tokens, in slots allocated on first use, with the
/// logits rows each item's work reads (and the features, for a head).
fn forward(
    s: &mut TargetState,
    items: &[TargetItem],
) -> Result<(BatchLogits, Option<BatchFeatures>), EngineError> {
    for it in items {
        if !s.cache.is_allocated(it.slot) {
            s.cache.allocate_slot(it.slot)?;
        }
    }
    let inputs: Vec<SeqInput> = items
        .iter()
        .map(|it| SeqInput {
            slot: it.slot,
            start_pos: it.start_pos,
            tokens: &it.tokens,
            logits: match it.work {
                _ if it.prompt_logprobs.is_some() && it.work != TargetWork::Verify => {
                    LogitsRows::All
                }
                TargetWork::PrefillChunk => LogitsRows::None,
                TargetWork::PrefillLast => LogitsRows::Last,
                TargetWork::Verify => LogitsRows::All,
            },
            parents: &it.parents,
        })
        .collect();
    Ok(if let Some(taps) = &s.features {
        let (l, f) = s.model.forward_with_features(&mut s.cache, &inputs, taps)?;
        (l, Some(f))
    } else {
        (s.model.forward(&mut s.cache, &inputs)?, None)
    })
}

/// What of an item's input stands once it is accepted: the rows (by input index) whose
/// features go back, and how its slot drops the rest.
struct Standing {
    rows: Vec<usize>,
    cut: Cut,
}

enum Cut {
    /// A prompt chunk: every row stands, nothing to drop.
    Nothing,
    /// A chain's accepted drafts: the slot keeps its first tokens.
    Chain,
    /// A tree's accepted path: the slot keeps those rows, moved into place.
    Path,
}

impl Standing {
    /// What the item's slot keeps, `None` when it keeps everything.
    fn kept(&self, start_pos: usize) -> Option<Kept<'_>> {
        match self.cut {
            Cut::Nothing => None,
            Cut::Chain => Some(Kept::First(start_pos + self.rows.len())),
            Cut::Path => Some(Kept::Path {
                start: start_pos,
                rows: &self.rows,
            }),
        }
    }
}

/// One item's part of the round: accept (or sample), keep what stands, hand back its outcome
/// or the failure that is its alone.
fn settle(
    s: &mut TargetState,
    logits: &BatchLogits,
    features: Option<&BatchFeatures>,
    i: usize,
    mut it: TargetItem,
) -> Result<TargetOutcome, (u64, Failure)> {
    let mut rng = it.rng.clone();
    let mut out = empty_outcome(&it);
    let standing = accept(s, logits.seq_rows(i), &mut it, &mut rng, &mut out).and_then(|st| {
        if let Some(kept) = st.kept(it.start_pos) {
            s.cache.keep(it.slot, kept)?;
        }
        Ok(st)
    });
    out.rng = rng;
    match standing {
        Ok(st) => {
            if let Some(f) = features {
                standing_features(&mut out, f, i, &st.rows);
            }
            Ok(out)
        }
        Err(e) => Err((it.seq, failure(&it, e))),
    }
}

fn empty_outcome(it: &TargetItem) -> TargetOutcome {
    TargetOutcome {
        seq: it.seq,
        accepted: 0,
        accepted_tokens: Vec::new(),
        tree: None,
        tried_chain: Vec::new(),
        confidence_kind: it.proposal.confidence_kind,
        next_token: None,
        rng: it.rng.clone(),
        logprobs: Vec::new(),
        prompt_logprobs: Vec::new(),
        features_from: it.start_pos,
        features: Vec::new(),
    }
}

/// Where drafts are accepted (or a prompt's next token sampled): the item's `rows` of logits
/// read by its work, the outcome filled in, and what of its input stands.
fn accept(
    s: &mut TargetState,
    rows: Result<Vec<Vec<f32>>, ModelError>,
    it: &mut TargetItem,
    rng: &mut SeededRng,
    out: &mut TargetOutcome,
) -> Result<Standing, EngineError> {
    let rows = rows?;
    match it.work {
        TargetWork::PrefillChunk | TargetWork::PrefillLast => {
            sample_after_prompt(s, rows, it, rng, out)
        }
        TargetWork::Verify if it.proposal.is_tree() => accept_tree(s, rows, it, rng, out),
        TargetWork::Verify => accept_chain(s, rows, it, rng, out),
    }
}

/// A prompt chunk's rows: its prompt logprobs, and after its last chunk the first token.
fn sample_after_prompt(
    s: &mut TargetState,
    mut rows: Vec<Vec<f32>>,
    it: &mut TargetItem,
    rng: &mut SeededRng,
    out: &mut TargetOutcome,
) -> Result<Standing, EngineError> {
    let last = match it.work {
        TargetWork::PrefillLast => rows.pop(),
        _ => None,
    };
    if let Some(n) = it.prompt_logprobs {
        // Row j predicts the prompt token after position start_pos + j.
        let next = &it.context[it.start_pos + 1..it.prompt_len];
        out.prompt_logprobs = rows
            .iter()
            .zip(next)
            .map(|(row, &t)| token_logprob(row, t, n))
            .collect();
    }
    if let Some(mut row) = last {
        // The first token's mask goes on the raw row: a mask's -inf survives the penalties
        // unchanged, so the order matches a verified row's.
        if let Some(mask) = it.grammar.mask(0) {
            mask.apply(&mut row);
        }
        let tok = s.sampler.pick(&row, &it.params, &it.context, &[], rng)?;
        if let Some(n) = it.logprobs {
            let mut processed = row;
            apply_penalties(&mut processed, &it.params, &it.context, &[]);
            out.logprobs.push(token_logprob(&processed, tok, n));
        }
        out.next_token = Some(tok);
    }
    Ok(Standing {
        rows: (0..it.tokens.len()).collect(),
        cut: Cut::Nothing,
    })
}

/// A token tree's verification: the accepted path stands.
fn accept_tree(
    s: &mut TargetState,
    rows: Vec<Vec<f32>>,
    it: &mut TargetItem,
    rng: &mut SeededRng,
    out: &mut TargetOutcome,
) -> Result<Standing, EngineError> {
    let walk = verify_tree(
        verify_input(it, rows),
        &mut s.scratch,
        rng,
        &mut out.logprobs,
    )?;
    let kept: Vec<usize> = std::iter::once(0)
        .chain(walk.path.iter().map(|&n| n + 1))
        .collect();
    out.accepted = walk.path.len();
    out.accepted_tokens = walk.path.iter().map(|&n| it.proposal.tokens[n]).collect();
    out.next_token = Some(walk.next_token);
    let t = tree_walk(&it.proposal, &walk);
    out.tried_chain = tried_chain(&it.proposal, t.chain_accepted);
    out.tree = Some(t);
    Ok(Standing {
        rows: kept,
        cut: Cut::Path,
    })
}

/// A chain's verification: the fed token and the accepted drafts stand.
fn accept_chain(
    s: &mut TargetState,
    rows: Vec<Vec<f32>>,
    it: &mut TargetItem,
    rng: &mut SeededRng,
    out: &mut TargetOutcome,
) -> Result<Standing, EngineError> {
    let lenience = it.lenience;
    let outcome = verify(
        verify_input(it, rows),
        lenience,
        &mut s.scratch,
        rng,
        &mut out.logprobs,
    )?;
    out.accepted = outcome.accepted;
    out.accepted_tokens = it.tokens[1..1 + outcome.accepted].to_vec();
    out.next_token = Some(outcome.next_token);
    out.tried_chain = tried_chain(&it.proposal, outcome.accepted);
    Ok(Standing {
        rows: (0..=outcome.accepted).collect(),
        cut: Cut::Chain,
    })
}

/// The features of the rows that stand, for a draft head.
fn standing_features(out: &mut TargetOutcome, f: &BatchFeatures, i: usize, standing: &[usize]) {
    let hidden = f.hidden();
    let rows = f.seq(i);
    out.features.reserve(standing.len() * hidden);
    for &r in standing {
        out.features
            .extend_from_slice(&rows[r * hidden..(r + 1) * hidden]);
    }
}

/// An item's failure as the scheduler reports it: a grammar's, the request's own logits
/// settings', or the engine's.
fn failure(it: &TargetItem, e: EngineError) -> Failure {
    if matches!(e, EngineError::Constraint(_)) {
        return Failure::of_grammar(&e);
    }
    let by_request = matches!(e, EngineError::Sampling(_)) && it.params.modifies_logits();
    Failure {
        message: if by_request {
            format!("{e}: the request's penalties or logit_bias left no valid logit")
        } else {
            e.to_string()
        },
        by_request,
        code: None,
    }
}

/// What the verification of `it` reads, with the target's `rows` for it.
fn verify_input(it: &mut TargetItem, rows: Vec<Vec<f32>>) -> VerifyInput<'_> {
    VerifyInput {
        params: &it.params,
        context: &it.context,
        prompt_len: it.prompt_len,
        proposal: &it.proposal,
        rows,
        logprobs: it.logprobs,
        grammar: &mut it.grammar,
    }
}
