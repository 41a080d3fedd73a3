//! The Verifier's round on its compute worker, in three phases, each a function here:
//! `forward` (one batched pass over every item), `accept` (the acceptance rule of
//! `acceptance.rs` per item, or a prompt's next token sampled) and the item's slot's keep
//! (rejected tokens leave the target's cache: [`KvCache::keep`]); then the features of what
//! stands and any failure that is an item's alone.

use crate::model::cache::prefix_store::PrefixStore;
use std::sync::Arc;
use std::time::Instant;

use super::acceptance::{
    draft_chances, proposal_evidence, verify, verify_tree, Scratch, VerifyInput,
};
use super::error::EngineError;
use super::messages::{
    Failure, TargetBatchResult, TargetItem, TargetOutcome, TargetWork, TreeWalk, NON_FINITE_LOGITS,
};
use crate::draft::Proposal;
use crate::model::decoder::expert_trace;
use crate::model::{
    BatchFeatures, BatchLogits, Decoder, FeatureTaps, Kept, KvCache, LogitsRows, ModelError,
    SeqInput,
};
use crate::sampling::tree::TreeOutcome;
use crate::sampling::{apply_penalties, token_logprob, Sampler, SamplingError, SeededRng};

/// What the verifier's worker owns.
pub struct TargetState {
    pub(super) model: Arc<Decoder>,
    pub(super) cache: KvCache,
    pub(super) scratch: Scratch,
    pub(super) sampler: Sampler,
    /// Return the standing positions' features, these ones (a draft head drafts from them).
    pub(super) features: Option<FeatureTaps>,
    /// The target's prefix cache, beside the cache it copies into.
    pub(super) prefix: PrefixStore,
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
pub(super) fn run_batch(
    s: &mut TargetState,
    items: Vec<TargetItem>,
) -> Result<TargetBatchResult, EngineError> {
    expert_trace::count_reads();
    let start = Instant::now();
    let (logits, features) = forward(s, &items)?;
    let mut expert_reads = Vec::new();
    expert_trace::take_reads(&mut expert_reads);
    let outcomes = items
        .into_iter()
        .enumerate()
        .map(|(i, it)| settle(s, &logits, features.as_ref(), i, it))
        .collect();
    Ok(TargetBatchResult {
        outcomes,
        seconds: start.elapsed().as_secs_f64(),
        steps: 1,
        expert_reads,
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
        proposal_evidence: None,
        draft_chances: None,
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
    out.proposal_evidence = proposal_evidence(
        &it.params,
        &it.proposal,
        outcome.accepted,
        lenience,
        &s.scratch,
    );
    out.draft_chances = draft_chances(
        &it.params,
        &it.proposal,
        outcome.accepted,
        lenience,
        &s.scratch,
    );
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
    let broken = matches!(e, EngineError::Sampling(SamplingError::InvalidLogits(_)));
    Failure {
        message: if by_request {
            format!("{e}: the request's penalties or logit_bias left no valid logit")
        } else {
            e.to_string()
        },
        by_request,
        code: (broken && !by_request).then_some(NON_FINITE_LOGITS),
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
