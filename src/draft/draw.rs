//! Drawing one drafted token from a drafter's logits row: the request's processors, its
//! grammar (a greedy draft's argmax checked, the mask where it is refused or the whole row is
//! read), the confidence gate, then argmax or a sample, with the draft distribution
//! and confidences recorded in the proposal. Every model drafter (a draft model, `self:K`, a
//! draft head) draws through here, so their drafts are processed exactly alike.

use super::siblings::Siblings;
use super::{DraftError, DraftJob};
use crate::sampling::{
    apply_penalties, argmax, confidence, confidence_of_logits, probabilities, sample_from,
    GateRound,
};
use crate::telemetry;

/// Buffers reused from draw to draw.
#[derive(Default)]
pub struct DrawScratch {
    logits: Vec<f32>,
    probs: Vec<f32>,
}

/// One lane's state while a batch drafts: which step this is, its gate, its runners-up, and
/// its text so far (context and drafts).
pub(super) struct DrawLane<'a> {
    pub step: usize,
    pub gate: &'a mut GateRound,
    pub siblings: &'a mut Siblings,
    pub history: &'a [u32],
}

/// Draws the next draft of `job` from `row`: logits over the whole vocabulary, or over the
/// draft vocabulary `vocab_ids` (its columns' target ids), in which case every other token
/// gets probability 0, so `q` is a distribution over the reduced set. `None`: the gate ended
/// the round here.
pub(super) fn draw_draft(
    row: &[f32],
    vocab_ids: Option<&[u32]>,
    job: &mut DraftJob,
    lane: DrawLane,
    s: &mut DrawScratch,
) -> Result<Option<u32>, DraftError> {
    let j = lane.step;
    s.logits.clear();
    match vocab_ids {
        None => s.logits.extend_from_slice(row),
        Some(ids) => {
            s.logits.resize(job.out.vocab, f32::NEG_INFINITY);
            for (&id, &v) in ids.iter().zip(row) {
                s.logits[id as usize] = v;
            }
        }
    }
    apply_penalties(
        &mut s.logits,
        job.params,
        lane.history,
        &lane.history[job.generated_from..],
    );
    let greedy = job.params.is_greedy();
    // A greedy draft read for its argmax alone (no gate, no confidences) needs the grammar's
    // mask only where the grammar refuses that argmax: an allowed argmax is the masked one.
    let argmax_only = greedy && !job.gate.is_on() && job.tree_nodes == 0 && !job.confidence;
    let mut checked = None;
    if let Some(g) = job.grammar.as_deref_mut() {
        if argmax_only {
            let best = argmax(&s.logits)?;
            checked = g.allows(best)?.then_some(best);
        }
        if checked.is_none() {
            g.mask()?.apply(&mut s.logits);
        }
    }
    // The gate sees the distribution this token is drafted from: the sampling one, or the
    // softmax of what greedy takes the argmax of.
    if !greedy {
        probabilities(&s.logits, job.params, &mut s.probs)?;
    }
    if job.gate.is_on() {
        let c = if greedy {
            confidence_of_logits(&s.logits, &mut s.probs)
        } else {
            confidence(&s.probs)
        };
        telemetry::record_draft_entropy(c.entropy);
        if !lane.gate.admit(&job.gate, job.min_tokens, c) {
            telemetry::record_draft_gate_stop();
            tracing::debug!(
                seq = job.seq,
                planned = job.gamma,
                drafted = j,
                entropy = c.entropy,
                ema = lane.gate.ema().unwrap_or(0.0),
                top = c.top,
                "draft gate: drafter unsure, round ends early"
            );
            return Ok(None);
        }
    }
    let token = if let Some(t) = checked {
        t
    } else if greedy {
        argmax(&s.logits)?
    } else {
        job.out.dists.extend_from_slice(&s.probs);
        if job.likeliest {
            // A point mass, the same whatever the round's draws: the rule stays exact.
            job.out.point_masses = true;
            argmax(&s.probs)?
        } else {
            sample_from(&s.probs, job.rng.next_f64())
        }
    };
    if job.tree_nodes > 0 || job.confidence {
        if greedy && !job.gate.is_on() {
            confidence_of_logits(&s.logits, &mut s.probs);
        }
        let q_t = s.probs.get(token as usize).copied().unwrap_or(0.0);
        job.out.confidence.push(q_t);
        if job.tree_nodes > 0 {
            lane.siblings.record(j, token, q_t, &s.probs);
        }
    }
    if let Some(g) = job.grammar.as_deref_mut() {
        g.advance(&[token])?;
    }
    Ok(Some(token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draft::Proposal;
    use crate::sampling::{DraftGate, SamplingParams, SeededRng};

    /// A reduced draft vocabulary: only its tokens are drafted, and `q` is 0 everywhere else,
    /// even where the whole vocabulary's best token lies outside it.
    #[test]
    fn a_draft_vocabulary_confines_the_draws_and_q() {
        let ids = [3u32, 5];
        let row = [0.5f32, 2.0];
        for params in [
            SamplingParams::greedy(),
            SamplingParams {
                temperature: 1.0,
                ..Default::default()
            },
        ] {
            let mut rng = SeededRng::new(9);
            let mut out = Proposal {
                vocab: 8,
                ..Proposal::default()
            };
            let mut scratch = DrawScratch::default();
            let history = [0u32, 7];
            for step in 0..20 {
                let mut job = DraftJob {
                    seq: 1,
                    scope: 0,
                    context: &history,
                    generated_from: 2,
                    gamma: 20,
                    params: &params,
                    rng: &mut rng,
                    out: &mut out,
                    gate: DraftGate::OFF,
                    min_tokens: 0,
                    confidence: false,
                    tree_nodes: 0,
                    grammar: None,
                    lookup: true,
                    likeliest: false,
                    result: Ok(()),
                };
                let lane = DrawLane {
                    step,
                    gate: &mut GateRound::default(),
                    siblings: &mut Siblings::new(),
                    history: &history,
                };
                let t = draw_draft(&row, Some(&ids), &mut job, lane, &mut scratch)
                    .unwrap()
                    .unwrap();
                assert!(ids.contains(&t), "drafted {t}");
                if params.is_greedy() {
                    assert_eq!(t, 5);
                }
            }
            for q in out.dists.chunks(8) {
                let outside: f32 = (0..8)
                    .filter(|i| !ids.contains(&(*i as u32)))
                    .map(|i| q[i])
                    .sum();
                assert_eq!(outside, 0.0, "{q:?}");
                assert!((q[3] + q[5] - 1.0).abs() < 1e-6, "{q:?}");
            }
        }
    }
}
