//! A draft model's runners-up as a token tree's alternatives: kept while drafting, and the
//! likeliest attached to the proposal when the round's chain is done.

use super::Proposal;
use crate::sampling::tree::chain_parent;

/// A draft model's alternatives for a token tree: at each drafted position, its runners-up
/// (the likeliest tokens other than the one drafted), as point-mass siblings of the drafted
/// node. A runner-up is right, if the drafted token is not, about as often as the drafter's
/// own probability says: judged by the drafter alone, the chance the walk reaches and accepts
/// it is the product of the chain's probabilities before it times its own probability, and the
/// likeliest of those are kept.
pub(super) struct Siblings {
    /// The chain's probability up to the position being drafted.
    reach: f32,
    /// `(position, token, confidence: its probability given the drafted token is wrong,
    /// reach)`.
    found: Vec<(usize, u32, f32, f32)>,
}

/// Runners-up looked at per drafted position.
const RUNNERS_UP: usize = 2;

impl Siblings {
    pub(super) fn new() -> Self {
        Self {
            reach: 1.0,
            found: Vec::new(),
        }
    }

    /// Position `j` drafted `token`, of probability `q_t`, from `probs`.
    pub(super) fn record(&mut self, j: usize, token: u32, q_t: f32, probs: &[f32]) {
        let mut best = [(0u32, 0f32); RUNNERS_UP];
        for (x, &p) in probs.iter().enumerate() {
            if x as u32 == token || p <= best[RUNNERS_UP - 1].1 {
                continue;
            }
            let at = best
                .iter()
                .position(|b| p > b.1)
                .expect("checked against the last");
            best.copy_within(at..RUNNERS_UP - 1, at + 1);
            best[at] = (x as u32, p);
        }
        let rest = (1.0 - q_t).max(f32::EPSILON);
        for (x, p) in best {
            if p > 0.0 {
                self.found.push((j, x, (p / rest).min(1.0), self.reach * p));
            }
        }
        self.reach *= q_t;
    }

    /// Appends the `n` likeliest runners-up (of positions the chain reached) to `out`.
    pub(super) fn attach(&mut self, n: usize, out: &mut Proposal) {
        let chain = out.tokens.len();
        self.found.retain(|f| f.0 < chain);
        if n == 0 || self.found.is_empty() {
            return;
        }
        self.found
            .sort_by(|a, b| b.3.total_cmp(&a.3).then(a.0.cmp(&b.0)));
        self.found.truncate(n);
        self.found.sort_by_key(|f| f.0);
        out.parents.clear();
        out.parents.extend((0..chain).map(chain_parent));
        // The chain's own confidences (its probabilities) were set while drafting.
        out.confidence.resize(chain, 1.0);
        for &(j, token, conf, _) in &self.found {
            out.tokens.push(token);
            out.parents.push(chain_parent(j));
            out.confidence.push(conf);
        }
    }
}
