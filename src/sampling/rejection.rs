//! Acceptance rule of one speculation round (docs/speculation.md, "One round"; Leviathan et al. 2023, with the
//! lenience of their appendix A.5).
//!
//! It lives apart from the model and engine code because losslessness is a property of this
//! arithmetic alone: given the drafted tokens, their draft distributions and the target's
//! distributions, these functions decide which drafts survive and what token follows them. With
//! lenience 1 the emitted tokens are distributed exactly as plain sampling from the target (or,
//! greedy, identical to the target's argmax), which the tests prove by exact enumeration of
//! [`accept_sampled`]'s own branches at γ = 1..4 (its random choices go through [`RoundChoices`]),
//! and by millions of rounds with a real RNG. Below lenience 1 each round token is drawn from
//! `min(q, p/l) + β·norm(max(0, p − l·q))` (β the rejection probability), which the
//! enumeration checks too. Kept pure (no I/O, no async, no model) so those proofs stay cheap
//! and independent of everything else.
//!
//! All distributions are expected already processed with the request's sampling settings
//! (penalties, temperature, top-k/p, min-p; see [`super::probabilities`]), so the rule compares
//! like with like.

use super::{argmax, sample_from, Lenience, SamplingError, SeededRng};

/// What the drafter knows about the token it proposed at one position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DraftDist<'a> {
    /// The full processed draft distribution `q_i` (same vocabulary as the target).
    Full(&'a [f32]),
    /// The drafter proposes its token deterministically (e.g. prompt lookup): `q_i = δ(t_i)`.
    PointMass,
}

/// Result of one round. The tokens to emit are `drafts[..accepted]`, then `next_token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundOutcome {
    /// How many drafted tokens were accepted, a prefix of the drafts.
    pub accepted: usize,
    /// The correction after the first rejection, or the bonus token when all were accepted.
    pub next_token: u32,
    /// True when every draft was accepted and `next_token` came from the last target row.
    pub bonus: bool,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("expected {expected} {what} rows for this round, got {got}")]
    RowCount {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{what} row {row} has {got} entries but the vocabulary has {expected}")]
    VocabMismatch {
        what: &'static str,
        row: usize,
        expected: usize,
        got: usize,
    },
    #[error("drafted token {token} at position {position} is outside the vocabulary of {vocab}")]
    DraftOutOfVocab {
        position: usize,
        token: u32,
        vocab: usize,
    },
    #[error("{what} row {row} has invalid value {value} at token {token}: {expected}")]
    InvalidValue {
        what: &'static str,
        row: usize,
        token: usize,
        value: f32,
        expected: &'static str,
    },
    #[error("{what} row {row} has no probability mass (all zeros or empty)")]
    NoMass { what: &'static str, row: usize },
    #[error("tree node {node} has parent {parent}, which is not an earlier node")]
    TreeOrder { node: usize, parent: u32 },
    #[error("a point-mass draft has no distribution to draw from; pass the drafted token")]
    MissingDraftToken,
    #[error(transparent)]
    Sampling(#[from] SamplingError),
}

const TARGET: &str = "target distribution p";
const DRAFT: &str = "draft distribution q";
const PROBABILITY: &str = "probabilities must be finite and >= 0";

/// Probability of accepting a drafted token with target probability `p_t` and draft probability
/// `q_t`: `min(1, p_t / (l · q_t))`. Shared by the sampler and the exact enumeration so both use
/// one rule. A token the drafter gave zero probability is accepted whenever the target allows it
/// (the ratio is +∞), and rejected when both are zero (there is nothing to justify it).
pub fn acceptance_probability(p_t: f32, q_t: f32, lenience: f32) -> f64 {
    let p = p_t as f64;
    let lq = lenience as f64 * q_t as f64;
    if lq == 0.0 {
        if p > 0.0 {
            1.0
        } else {
            0.0
        }
    } else {
        (p / lq).min(1.0)
    }
}

/// Writes the correction distribution used after `drafted` is rejected into `out`:
/// `norm(max(0, p − l·q))`, which for `l = 1` is the exact residual of Leviathan et al. For a
/// point-mass draft `q = δ(drafted)`, i.e. `p` with mass `l` removed from `drafted`. If nothing is
/// left (possible only when `p ≤ l·q` everywhere, so a rejection has probability zero up to
/// rounding), it falls back to `p` rather than producing an empty distribution.
///
/// Inputs are assumed valid (as checked by [`accept_sampled`]): `p` and a full `q` of equal
/// length, finite and non-negative, `p` with some mass. `out` is cleared and refilled, normalised.
pub fn residual(p: &[f32], q: DraftDist, drafted: u32, lenience: f32, out: &mut Vec<f32>) {
    out.clear();
    let l = lenience as f64;
    // f64 for the difference: p and l·q are often nearly equal, and f32 cancellation there
    // would be the largest error in the whole round.
    match q {
        DraftDist::Full(q) => {
            debug_assert_eq!(p.len(), q.len());
            out.extend(
                p.iter()
                    .zip(q)
                    .map(|(&p, &q)| (p as f64 - l * q as f64).max(0.0) as f32),
            );
        }
        DraftDist::PointMass => {
            out.extend_from_slice(p);
            if let Some(x) = out.get_mut(drafted as usize) {
                *x = (*x as f64 - l).max(0.0) as f32;
            }
        }
    }
    let mut sum: f64 = out.iter().map(|&x| x as f64).sum();
    if sum == 0.0 {
        out.clear();
        out.extend_from_slice(p);
        sum = out.iter().map(|&x| x as f64).sum();
    }
    if sum > 0.0 {
        let inv = 1.0 / sum;
        for x in out.iter_mut() {
            *x = (*x as f64 * inv) as f32;
        }
    }
}

/// One sampled round for one sequence.
///
/// `drafts` are `t_1..t_γ`, `q` their draft distributions (γ entries), `p` the target's
/// distributions `p_1..p_{γ+1}` (γ + 1 rows; the last one is for the bonus token). For each
/// position one uniform `r` is drawn from `rng` and `t_i` is accepted if
/// `r < p_i(t_i) / (l · q_i(t_i))`; the first rejection draws the correction from
/// [`residual`] and ends the round, otherwise a bonus token is drawn from `p_{γ+1}`. With γ = 0
/// this is a plain sampling step from `p_1`.
///
/// `scratch` holds the residual so the round allocates nothing once it has grown to the
/// vocabulary size. Every row is validated up front, so a bad row is an error whatever the
/// random draws.
pub fn accept_sampled(
    drafts: &[u32],
    q: &[DraftDist],
    p: &[&[f32]],
    lenience: Lenience,
    rng: &mut SeededRng,
    scratch: &mut Vec<f32>,
) -> Result<RoundOutcome, SpecError> {
    accept_sampled_with(drafts, q, p, lenience, rng, scratch)
}

/// Where a sampled round's random choices come from: the request's RNG when serving, or, in
/// the tests, an enumerator that follows every branch with its probability, so the exact
/// distribution of [`accept_sampled`]'s outcomes is computed by running its own code.
pub trait RoundChoices {
    /// True with probability `prob` (a number in [0, 1]).
    fn accept(&mut self, prob: f64) -> bool;
    /// A token drawn from `dist` (non-negative, with some mass; normalised by its sum).
    fn draw(&mut self, dist: &[f32]) -> u32;
}

impl RoundChoices for SeededRng {
    fn accept(&mut self, prob: f64) -> bool {
        // r < min(1, ratio) is the same test as r < ratio because r < 1.
        self.next_f64() < prob
    }

    fn draw(&mut self, dist: &[f32]) -> u32 {
        sample_from(dist, self.next_f64())
    }
}

/// [`accept_sampled`] with its random choices taken from `choices`: one `accept` per drafted
/// token up to the first rejection, then one `draw` of the correction or the bonus.
pub fn accept_sampled_with(
    drafts: &[u32],
    q: &[DraftDist],
    p: &[&[f32]],
    lenience: Lenience,
    choices: &mut impl RoundChoices,
    scratch: &mut Vec<f32>,
) -> Result<RoundOutcome, SpecError> {
    let lenience = lenience.get();
    if q.len() != drafts.len() {
        return Err(SpecError::RowCount {
            what: DRAFT,
            expected: drafts.len(),
            got: q.len(),
        });
    }
    let vocab = check_target_shape(drafts, p)?;
    for (row, &dist) in p.iter().enumerate() {
        check_distribution(TARGET, row, dist, true)?;
    }
    for (row, dist) in q.iter().enumerate() {
        if let DraftDist::Full(dist) = *dist {
            check_vocab(DRAFT, row, dist, vocab)?;
            check_distribution(DRAFT, row, dist, false)?;
        }
    }

    for (i, (&t, &q_i)) in drafts.iter().zip(q).enumerate() {
        let p_i = p[i];
        let q_t = match q_i {
            DraftDist::Full(q_i) => q_i[t as usize],
            DraftDist::PointMass => 1.0,
        };
        if !choices.accept(acceptance_probability(p_i[t as usize], q_t, lenience)) {
            residual(p_i, q_i, t, lenience, scratch);
            return Ok(RoundOutcome {
                accepted: i,
                next_token: choices.draw(scratch),
                bonus: false,
            });
        }
    }
    Ok(RoundOutcome {
        accepted: drafts.len(),
        next_token: choices.draw(p[drafts.len()]),
        bonus: true,
    })
}

/// One greedy (temperature 0) round for one sequence.
///
/// `p` has γ + 1 target rows. With `lenience == 1`, `t_i` is accepted while it equals
/// [`super::argmax`] of `p_i` (lowest index among ties), so the output is token for token that of
/// plain greedy decoding; only the order of the values matters and raw logits work as well as
/// probabilities. With `lenience < 1`, `t_i` is also accepted when `p_i(t_i) ≥ l · max p_i`, which
/// only makes sense for probabilities, so the rows must then be finite and non-negative. The
/// correction is `argmax p_i`, the bonus `argmax p_{γ+1}`.
pub fn accept_greedy(
    drafts: &[u32],
    p: &[&[f32]],
    lenience: Lenience,
) -> Result<RoundOutcome, SpecError> {
    let lenience = lenience.get();
    check_target_shape(drafts, p)?;
    let lenient = lenience < 1.0;
    for (row, &dist) in p.iter().enumerate() {
        if lenient {
            check_distribution(TARGET, row, dist, true)?;
        } else if let Some(token) = super::row_scan::first_invalid(dist) {
            return Err(SpecError::InvalidValue {
                what: TARGET,
                row,
                token,
                value: dist[token],
                expected: "values must not be NaN or +inf",
            });
        }
    }

    for (i, &t) in drafts.iter().enumerate() {
        let p_i = p[i];
        let best = argmax(p_i)?;
        let keep = best == t || (lenient && p_i[t as usize] >= lenience * p_i[best as usize]);
        if !keep {
            return Ok(RoundOutcome {
                accepted: i,
                next_token: best,
                bonus: false,
            });
        }
    }
    Ok(RoundOutcome {
        accepted: drafts.len(),
        next_token: argmax(p[drafts.len()])?,
        bonus: true,
    })
}

/// Exact distribution of the FIRST token emitted by a γ = 1 sampled round, in f64. Used by the
/// tests to prove losslessness by enumeration (with `lenience == 1` it must equal `p`); public so
/// other tests and tools can use the same reference.
///
/// With `drafted == None` the drafted token is random, `t ~ q` (only for [`DraftDist::Full`]):
/// `P(x) = q(x)·α(x) + (1 − Σ_t q(t)·α(t))·residual(x)` with `α(t) = min(1, p(t)/(l·q(t)))`.
/// With `drafted == Some(t)` it is the distribution given that the drafter proposed `t`:
/// `α(t)·[x = t] + (1 − α(t))·residual_t(x)`; this is the whole story for a point-mass drafter.
pub fn first_token_distribution(
    p: &[f32],
    q: DraftDist,
    drafted: Option<u32>,
    lenience: Lenience,
) -> Result<Vec<f64>, SpecError> {
    let lenience = lenience.get();
    check_distribution(TARGET, 0, p, true)?;
    let vocab = p.len();
    if let DraftDist::Full(q) = q {
        check_vocab(DRAFT, 0, q, vocab)?;
        check_distribution(DRAFT, 0, q, false)?;
    }
    let mut res = Vec::with_capacity(vocab);
    let mut out = vec![0f64; vocab];
    match (drafted, q) {
        (Some(t), _) => {
            if t as usize >= vocab {
                return Err(SpecError::DraftOutOfVocab {
                    position: 0,
                    token: t,
                    vocab,
                });
            }
            let q_t = match q {
                DraftDist::Full(q) => q[t as usize],
                DraftDist::PointMass => 1.0,
            };
            let alpha = acceptance_probability(p[t as usize], q_t, lenience);
            residual(p, q, t, lenience, &mut res);
            for (o, &r) in out.iter_mut().zip(&res) {
                *o = (1.0 - alpha) * r as f64;
            }
            out[t as usize] += alpha;
        }
        (None, DraftDist::Full(q_row)) => {
            // A full draft's residual does not depend on which token was drafted.
            residual(p, q, 0, lenience, &mut res);
            let mut accepted = 0f64;
            for (x, o) in out.iter_mut().enumerate() {
                *o = q_row[x] as f64 * acceptance_probability(p[x], q_row[x], lenience);
                accepted += *o;
            }
            // An f32 q can sum to a hair over 1; a rejection probability cannot go below 0.
            let rejected = (1.0 - accepted).max(0.0);
            for (o, &r) in out.iter_mut().zip(&res) {
                *o += rejected * r as f64;
            }
        }
        (None, DraftDist::PointMass) => return Err(SpecError::MissingDraftToken),
    }
    Ok(out)
}

/// Checks γ + 1 target rows of one vocabulary and drafts inside it; returns the vocabulary size.
pub(super) fn check_target_shape(drafts: &[u32], p: &[&[f32]]) -> Result<usize, SpecError> {
    if p.len() != drafts.len() + 1 {
        return Err(SpecError::RowCount {
            what: TARGET,
            expected: drafts.len() + 1,
            got: p.len(),
        });
    }
    let vocab = p[0].len();
    for (row, &dist) in p.iter().enumerate() {
        check_vocab(TARGET, row, dist, vocab)?;
    }
    if let Some((position, &token)) = drafts
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(SpecError::DraftOutOfVocab {
            position,
            token,
            vocab,
        });
    }
    Ok(vocab)
}

pub(super) fn check_vocab(
    what: &'static str,
    row: usize,
    dist: &[f32],
    vocab: usize,
) -> Result<(), SpecError> {
    if dist.len() == vocab {
        Ok(())
    } else {
        Err(SpecError::VocabMismatch {
            what,
            row,
            expected: vocab,
            got: dist.len(),
        })
    }
}

/// Finite and non-negative everywhere; with `needs_mass`, not all zero (something must be
/// sampleable from it).
pub(super) fn check_distribution(
    what: &'static str,
    row: usize,
    dist: &[f32],
    needs_mass: bool,
) -> Result<(), SpecError> {
    if let Some(token) = super::row_scan::first_not_probability(dist) {
        return Err(SpecError::InvalidValue {
            what,
            row,
            token,
            value: dist[token],
            expected: PROBABILITY,
        });
    }
    if needs_mass && !dist.iter().any(|&v| v > 0.0) {
        return Err(SpecError::NoMass { what, row });
    }
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod error_tests;

#[cfg(test)]
mod round_tests;

#[cfg(test)]
mod masked_round_tests;
#[cfg(test)]
mod monte_carlo_tests;
