//! The verification step of a speculation round (DESIGN.md §3): the request's logits
//! processors applied to each target row exactly as plain decoding would apply them, then the
//! acceptance rule. One function, used by the reference loop and the Verifier actor alike, so
//! both accept exactly the same drafts.

use super::error::EngineError;
use crate::draft::Proposal;
use crate::sampling::speculative::{accept_greedy, accept_sampled, DraftDist, RoundOutcome};
use crate::sampling::{
    apply_penalties, probabilities, token_logprob, Lenience, SamplingParams, SeededRng,
    TokenLogprob,
};

/// Per-round scratch, reused so rounds do not allocate.
#[derive(Default)]
pub struct Scratch {
    logits: Vec<f32>,
    target_probs: Vec<Vec<f32>>,
    residual: Vec<f32>,
    /// Each row's processed logits, kept only when the request asked for logprobs.
    processed: Vec<Vec<f32>>,
}

/// Applies the request's processors to each verified row (row i sees the context plus the
/// first i drafts, exactly the history plain decoding would have had) and runs the acceptance
/// rule. With `logprobs: Some(n)`, `emitted` receives one entry per emitted token (the
/// accepted drafts, then the sampled token), each from the processed row it was chosen at,
/// with its `n` most likely alternatives: the same rows plain decoding would have had.
#[allow(clippy::too_many_arguments)]
pub fn verify(
    params: &SamplingParams,
    lenience: Lenience,
    context: &[u32],
    prompt_len: usize,
    drafts: &[u32],
    proposal: &Proposal,
    rows: Vec<Vec<f32>>,
    s: &mut Scratch,
    rng: &mut SeededRng,
    logprobs: Option<usize>,
    emitted: &mut Vec<TokenLogprob>,
) -> Result<RoundOutcome, EngineError> {
    let mut history = context.to_vec();
    s.target_probs.resize_with(rows.len(), Vec::new);
    if logprobs.is_some() && s.processed.len() < rows.len() {
        s.processed.resize_with(rows.len(), Vec::new);
    }
    for (i, row) in rows.into_iter().enumerate() {
        if i > 0 {
            history.push(drafts[i - 1]);
        }
        s.logits.clear();
        s.logits.extend_from_slice(&row);
        apply_penalties(&mut s.logits, params, &history, &history[prompt_len..]);
        if logprobs.is_some() {
            s.processed[i].clear();
            s.processed[i].extend_from_slice(&s.logits);
        }
        if params.is_greedy() {
            if !lenience.is_exact() {
                // Lenient greedy compares probabilities: softmax of the processed logits.
                probabilities(
                    &s.logits,
                    &SamplingParams {
                        temperature: 1.0,
                        ..SamplingParams::default()
                    },
                    &mut s.target_probs[i],
                )?;
            } else {
                s.target_probs[i].clear();
                s.target_probs[i].extend_from_slice(&s.logits);
            }
        } else {
            probabilities(&s.logits, params, &mut s.target_probs[i])?;
        }
    }
    let p: Vec<&[f32]> = s.target_probs[..drafts.len() + 1]
        .iter()
        .map(Vec::as_slice)
        .collect();
    let outcome = if params.is_greedy() {
        accept_greedy(drafts, &p, lenience.get())?
    } else {
        let q: Vec<DraftDist> = (0..drafts.len())
            .map(|i| {
                proposal
                    .dist(i)
                    .map_or(DraftDist::PointMass, DraftDist::Full)
            })
            .collect();
        accept_sampled(drafts, &q, &p, lenience.get(), rng, &mut s.residual)?
    };
    if let Some(n) = logprobs {
        let chosen = drafts[..outcome.accepted]
            .iter()
            .copied()
            .chain([outcome.next_token]);
        for (row, token) in s.processed.iter().zip(chosen) {
            emitted.push(token_logprob(row, token, n));
        }
    }
    Ok(outcome)
}
