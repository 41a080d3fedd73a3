//! Where a round's drafts are accepted or rejected (docs/speculation.md, "One round"): the
//! request's logits processors and grammar applied to each target row exactly as plain
//! decoding would apply them, then the acceptance rule. One function per proposal shape
//! (`verify`, `verify_tree`), used by the reference loop and the Verifier actor alike, so both
//! accept exactly the same drafts. (The Verifier actor, `verifier`, runs the forward and rolls
//! the cache back to what this step accepted.)

use super::error::EngineError;
use super::governor::DraftChances;
use crate::constraint::{SequenceConstraint, TokenMask};
use crate::draft::Proposal;
use crate::sampling::rejection::{
    accept_greedy, accept_sampled, acceptance_probability, DraftDist, RoundOutcome,
};
use crate::sampling::tree::{accept_tree_greedy, accept_tree_sampled, DraftTree, TreeOutcome};
use crate::sampling::{
    apply_penalties, argmax, probabilities, token_logprob, Lenience, ProposalEvidence,
    SamplingParams, SeededRng, TokenLogprob,
};

/// How a constrained sequence's grammar reaches the rows the target computed for it.
#[derive(Debug, Default)]
pub enum RowGrammar {
    /// Unconstrained.
    #[default]
    Free,
    /// One mask per row of a Verify item (one for the sampled token of a PrefillLast item),
    /// computed before the forward: what sampling, lenient acceptance and logprobs need, since
    /// they read the whole masked row.
    Masks(Vec<TokenMask>),
    /// An exact greedy Verify item's grammar as the round starts (a fork of the sequence's):
    /// each row's argmax is checked against it and the row's mask is computed only when the
    /// grammar refuses that token. Exact: a row's argmax that the grammar allows is the argmax
    /// of the masked row too (masking only lowers other tokens to -inf).
    Checked(Box<SequenceConstraint>),
}

impl RowGrammar {
    /// Row `i`'s mask, when it was computed before the forward.
    pub fn mask(&self, i: usize) -> Option<&TokenMask> {
        match self {
            Self::Masks(m) => m.get(i),
            _ => None,
        }
    }

    pub fn is_free(&self) -> bool {
        matches!(self, Self::Free)
    }
}

/// Per-round scratch, reused so rounds do not allocate.
#[derive(Default)]
pub struct Scratch {
    logits: Vec<f32>,
    target_probs: Vec<Vec<f32>>,
    residual: Vec<f32>,
    next_residual: Vec<f32>,
    /// Each row's processed logits, kept only when the request asked for logprobs.
    processed: Vec<Vec<f32>>,
}

/// What one sequence's verification reads: its sampling settings, its text so far, what was
/// drafted, and the rows the target computed for it (one per input token).
pub struct VerifyInput<'a> {
    pub params: &'a SamplingParams,
    /// Prompt and output so far; the round's first input token is its last.
    pub context: &'a [u32],
    pub prompt_len: usize,
    pub proposal: &'a Proposal,
    pub rows: Vec<Vec<f32>>,
    /// Report each emitted token's logprob with this many alternatives.
    pub logprobs: Option<usize>,
    /// A constrained request's grammar, applied after the penalties, exactly where plain
    /// decoding applies it.
    pub grammar: &'a mut RowGrammar,
}

/// Applies the request's processors to each verified row (row i sees the context plus the
/// first i drafts, exactly the history plain decoding would have had) and runs the acceptance
/// rule. With `logprobs: Some(n)`, `emitted` receives one entry per emitted token (the
/// accepted drafts, then the sampled token), each from the processed row it was chosen at,
/// with its `n` most likely alternatives: the same rows plain decoding would have had.
pub fn verify(
    input: VerifyInput<'_>,
    lenience: Lenience,
    s: &mut Scratch,
    rng: &mut SeededRng,
    emitted: &mut Vec<TokenLogprob>,
) -> Result<RoundOutcome, EngineError> {
    let VerifyInput {
        params,
        context,
        prompt_len,
        proposal,
        rows,
        logprobs,
        grammar,
    } = input;
    let drafts = &proposal.tokens[..];
    if let RowGrammar::Checked(g) = grammar {
        if !params.is_greedy() || !lenience.is_exact() || logprobs.is_some() {
            return Err(EngineError::Worker(
                "a checked grammar verifies exact greedy rows without logprobs only".into(),
            ));
        }
        return verify_checked(params, (context, prompt_len), drafts, &rows, g, s);
    }
    let mut history = context.to_vec();
    s.target_probs.resize_with(rows.len(), Vec::new);
    if logprobs.is_some() && s.processed.len() < rows.len() {
        s.processed.resize_with(rows.len(), Vec::new);
    }
    for (i, row) in rows.into_iter().enumerate() {
        if i > 0 {
            history.push(drafts[i - 1]);
        }
        process_row(
            params,
            lenience,
            (&history, prompt_len),
            (i, row, grammar.mask(i)),
            s,
            logprobs.is_some(),
        )?;
    }
    let p: Vec<&[f32]> = s.target_probs[..drafts.len() + 1]
        .iter()
        .map(Vec::as_slice)
        .collect();
    let outcome = if params.is_greedy() {
        accept_greedy(drafts, &p, lenience)?
    } else {
        let q: Vec<DraftDist> = (0..drafts.len())
            .map(|i| {
                proposal
                    .dist(i)
                    .map_or(DraftDist::PointMass, DraftDist::Full)
            })
            .collect();
        accept_sampled(drafts, &q, &p, lenience, rng, &mut s.residual)?
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

/// What a sampled chain's verification says about proposing the drafter's likeliest tokens
/// against drawing from its distribution ([`ProposalEvidence`]), read from the rows [`verify`]
/// just processed in `s`: every position verified in the context both proposals share (the
/// first, and each after a draft that stood). `None` for greedy requests and for proposals
/// made without a drafter's distribution (prompt lookup's copies: nothing to choose).
pub fn proposal_evidence(
    params: &SamplingParams,
    proposal: &Proposal,
    accepted: usize,
    lenience: Lenience,
    s: &Scratch,
) -> Option<ProposalEvidence> {
    let drafted = proposal.tokens.len();
    let from_model = proposal.point_masses || proposal.dist_rows() > 0;
    if params.is_greedy() || proposal.is_tree() || !from_model || drafted == 0 {
        return None;
    }
    let mut e = ProposalEvidence::default();
    for i in 0..=accepted.min(drafted - 1) {
        let p = s.target_probs.get(i)?;
        match proposal.drawn_from(i) {
            Some(q) => e.add_distribution(q, p, lenience),
            None if proposal.point_masses => e.add_point(proposal.tokens[i], p, lenience),
            None => break,
        }
    }
    (e.rows > 0).then_some(e)
}

/// A sampled chain's drafts as [`verify`]'s acceptance rule saw them, read from the rows it
/// just processed in `s`: each tested draft's chance of standing ([`DraftChances`]), over the
/// drafts up to and including the first rejection (`accepted` stood). `None` for greedy
/// requests (a greedy draft's chance is whether it stood), trees and rounds without drafts.
pub fn draft_chances(
    params: &SamplingParams,
    proposal: &Proposal,
    accepted: usize,
    lenience: Lenience,
    s: &Scratch,
) -> Option<DraftChances> {
    let drafted = proposal.tokens.len();
    if params.is_greedy() || proposal.is_tree() || drafted == 0 {
        return None;
    }
    let tested = (accepted + 1).min(drafted);
    let mut sum = 0f64;
    for (i, &x) in proposal.tokens[..tested].iter().enumerate() {
        let p = s.target_probs.get(i)?.get(x as usize).copied()?;
        let q = proposal
            .dist(i)
            .map_or(Some(1.0), |q| q.get(x as usize).copied())?;
        sum += acceptance_probability(p, q, lenience.get());
    }
    Some(DraftChances { tested, sum })
}

/// Exact greedy verification against a [`RowGrammar::Checked`] grammar: row by row, the
/// processed row's argmax, checked against the grammar after the drafts before it (the mask
/// computed and applied only when the grammar refuses it), compared with the row's draft.
/// Rows past the first mismatch are never read, as in [`accept_greedy`].
fn verify_checked(
    params: &SamplingParams,
    (context, prompt_len): (&[u32], usize),
    drafts: &[u32],
    rows: &[Vec<f32>],
    grammar: &mut SequenceConstraint,
    s: &mut Scratch,
) -> Result<RoundOutcome, EngineError> {
    if rows.len() != drafts.len() + 1 {
        return Err(EngineError::Worker(format!(
            "{} target rows for {} drafts",
            rows.len(),
            drafts.len()
        )));
    }
    let mut history = context.to_vec();
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            history.push(drafts[i - 1]);
            grammar.advance(&drafts[i - 1..i])?;
        }
        s.logits.clear();
        s.logits.extend_from_slice(row);
        apply_penalties(&mut s.logits, params, &history, &history[prompt_len..]);
        let mut best = argmax(&s.logits)?;
        if !grammar.allows(best)? {
            grammar.mask()?.apply(&mut s.logits);
            best = argmax(&s.logits)?;
        }
        if drafts.get(i) != Some(&best) {
            return Ok(RoundOutcome {
                accepted: i,
                next_token: best,
                bonus: i == drafts.len(),
            });
        }
    }
    unreachable!("the last row has no draft to match")
}

/// Applies the request's processors to target row `i`, whose history (prompt and output up
/// to it) is `history`: the processed row goes to `s.target_probs[i]` (probabilities, or for
/// exact greedy the processed logits), and to `s.processed[i]` when logprobs are wanted.
/// The row is processed where it lies and, for exact greedy, moved rather than copied: on a
/// 262,144-token vocabulary each copy is a megabyte, and a round verifies γ + 1 rows.
fn process_row(
    params: &SamplingParams,
    lenience: Lenience,
    (history, prompt_len): (&[u32], usize),
    (i, mut row, mask): (usize, Vec<f32>, Option<&TokenMask>),
    s: &mut Scratch,
    keep_processed: bool,
) -> Result<(), EngineError> {
    apply_penalties(&mut row, params, history, &history[prompt_len..]);
    if let Some(mask) = mask {
        mask.apply(&mut row);
    }
    if keep_processed {
        s.processed[i].clear();
        s.processed[i].extend_from_slice(&row);
    }
    if params.is_greedy() {
        if !lenience.is_exact() {
            // Lenient greedy compares probabilities: softmax of the processed logits.
            probabilities(
                &row,
                &SamplingParams {
                    temperature: 1.0,
                    ..SamplingParams::default()
                },
                &mut s.target_probs[i],
            )?;
        } else {
            s.target_probs[i] = row;
        }
    } else {
        probabilities(&row, params, &mut s.target_probs[i])?;
    }
    Ok(())
}

/// [`verify`] for a tree proposal (lenience 1): row 0 is the root's (the context's), row
/// `i + 1` node `i`'s, each processed with the history of its own path; then the tree walk.
/// With `logprobs`, `emitted` gets one entry per emitted token, from the row it was chosen at.
pub fn verify_tree(
    input: VerifyInput<'_>,
    s: &mut Scratch,
    rng: &mut SeededRng,
    emitted: &mut Vec<TokenLogprob>,
) -> Result<TreeOutcome, EngineError> {
    let VerifyInput {
        params,
        context,
        prompt_len,
        proposal,
        rows,
        logprobs,
        grammar,
    } = input;
    if !grammar.is_free() {
        return Err(EngineError::Worker(
            "a constrained request is verified as a chain, never a tree".into(),
        ));
    }
    let parents = proposal.parents_or_chain();
    let tree = DraftTree {
        tokens: &proposal.tokens,
        parents: &parents,
    };
    tree.check()?;
    s.target_probs.resize_with(rows.len(), Vec::new);
    if logprobs.is_some() && s.processed.len() < rows.len() {
        s.processed.resize_with(rows.len(), Vec::new);
    }
    let mut history = Vec::with_capacity(context.len() + 16);
    let rows_len = rows.len();
    for (r, row) in rows.into_iter().enumerate() {
        history.clear();
        history.extend_from_slice(context);
        if r > 0 {
            history.extend(tree.path_to(r - 1).iter().map(|&n| proposal.tokens[n]));
        }
        let exact = Lenience::default();
        process_row(
            params,
            exact,
            (&history, prompt_len),
            (r, row, None),
            s,
            logprobs.is_some(),
        )?;
    }
    let p: Vec<&[f32]> = s.target_probs[..rows_len]
        .iter()
        .map(Vec::as_slice)
        .collect();
    let outcome = if params.is_greedy() {
        accept_tree_greedy(&tree, &p)?
    } else {
        let q: Vec<DraftDist> = (0..proposal.tokens.len())
            .map(|i| {
                proposal
                    .dist(i)
                    .map_or(DraftDist::PointMass, DraftDist::Full)
            })
            .collect();
        accept_tree_sampled(&tree, &q, &p, rng, &mut s.residual, &mut s.next_residual)?
    };
    if let Some(n) = logprobs {
        let rows_at = std::iter::once(0).chain(outcome.path.iter().map(|&i| i + 1));
        let chosen = outcome
            .path
            .iter()
            .map(|&i| proposal.tokens[i])
            .chain([outcome.next_token]);
        for (r, token) in rows_at.zip(chosen) {
            emitted.push(token_logprob(&s.processed[r], token, n));
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sampled 2-token chain over 3 tokens whose first draft stood: both proposals are
    /// measured at positions 0 and 1 (the context they share), never past the rejection.
    fn verified(proposal: &Proposal, params: &SamplingParams) -> Option<ProposalEvidence> {
        let s = Scratch {
            target_probs: vec![
                vec![0.6, 0.3, 0.1],
                vec![0.2, 0.2, 0.6],
                vec![1.0, 0.0, 0.0],
            ],
            ..Scratch::default()
        };
        proposal_evidence(params, proposal, 1, Lenience::EXACT, &s)
    }

    fn at_t08() -> SamplingParams {
        SamplingParams {
            temperature: 0.8,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn a_sampled_chain_is_measured_where_both_proposals_share_the_context() {
        let t08 = at_t08();
        let drawn = Proposal {
            tokens: vec![1, 2],
            dists: vec![0.2, 0.7, 0.1, 0.1, 0.1, 0.8],
            vocab: 3,
            ..Proposal::default()
        };
        let e = verified(&drawn, &t08).unwrap();
        assert_eq!((e.rows, e.sampled_rows), (2, 2));
        // Σ min(q, p): 0.2 + 0.3 + 0.1, then 0.1 + 0.1 + 0.6; the likeliest: p(1), then p(2).
        assert!((e.sampled - 1.4).abs() < 1e-6, "{e:?}");
        assert!((e.likeliest - 0.9).abs() < 1e-6, "{e:?}");
        // The likeliest proposed string-level, without its distribution: only its own.
        let points = Proposal {
            tokens: vec![0, 2],
            vocab: 3,
            point_masses: true,
            ..Proposal::default()
        };
        let e = verified(&points, &t08).unwrap();
        assert_eq!((e.rows, e.sampled_rows, e.sampled), (2, 0, 0.0));
        assert!((e.likeliest - 1.2).abs() < 1e-6, "{e:?}");
        // Prompt lookup's copies, and greedy requests: nothing to choose.
        let copies = Proposal {
            tokens: vec![0, 2],
            vocab: 3,
            ..Proposal::default()
        };
        assert_eq!(verified(&copies, &t08), None);
        assert_eq!(verified(&drawn, &SamplingParams::greedy()), None);
    }

    #[test]
    fn a_sampled_chains_tested_drafts_count_by_their_chances_of_standing() {
        let t08 = at_t08();
        let s = Scratch {
            target_probs: vec![
                vec![0.6, 0.3, 0.1],
                vec![0.2, 0.2, 0.6],
                vec![0.5, 0.25, 0.25],
                vec![1.0, 0.0, 0.0],
            ],
            ..Scratch::default()
        };
        let chances = |proposal: &Proposal, accepted, params: &SamplingParams| {
            draft_chances(params, proposal, accepted, Lenience::EXACT, &s)
        };
        // Prompt lookup's copies (q = 1): p(x) of each draft tested, the first rejection's
        // included, none after it.
        let copies = Proposal {
            tokens: vec![1, 2, 0],
            vocab: 3,
            ..Proposal::default()
        };
        let c = chances(&copies, 1, &t08).unwrap();
        assert_eq!(c.tested, 2);
        assert!((c.sum - (0.3 + 0.6)).abs() < 1e-6, "{c:?}");
        let all = chances(&copies, 3, &t08).unwrap();
        assert_eq!(all.tested, 3);
        assert!((all.sum - (0.3 + 0.6 + 0.5)).abs() < 1e-6, "{all:?}");
        // Drawn from q: min(1, p(x) / q(x)).
        let drawn = Proposal {
            tokens: vec![1, 2],
            dists: vec![0.2, 0.7, 0.1, 0.1, 0.1, 0.8],
            vocab: 3,
            ..Proposal::default()
        };
        let c = chances(&drawn, 0, &t08).unwrap();
        assert_eq!(c.tested, 1);
        assert!((c.sum - 0.3 / 0.7).abs() < 1e-6, "{c:?}");
        // A relaxed rule (l = 0.5) doubles each chance, up to 1.
        let relaxed =
            draft_chances(&t08, &copies, 1, Lenience::try_from(0.5).unwrap(), &s).unwrap();
        assert!((relaxed.sum - (0.6 + 1.0)).abs() < 1e-6, "{relaxed:?}");
        // Greedy drafts and rounds without drafts: the counts say it all.
        assert_eq!(chances(&copies, 1, &SamplingParams::greedy()), None);
        assert_eq!(chances(&Proposal::default(), 0, &t08), None);
    }
}
