//! What draft steps cost: a round's first step by the tokens fed into it (`FirstStep`), later
//! steps by how many sequences draft together, and how a step's price grows with the context it
//! attends over. Part of [`CostModel`]; drafting is noisier than a target forward, so forecasts
//! are scaled by how far measured drafting has lately run over them.

use super::{CostEstimate, CostModel};

impl CostModel {
    /// Time spent on `steps` draft steps of `seqs` sequences together, `first` of it on the
    /// first step with the tokens fed into it in all (`(0.0, _)`: not timed apart; `(_, 0)`:
    /// not counted, one a sequence).
    pub fn record_draft(
        &mut self,
        seconds: f64,
        (first, fed): (f64, usize),
        steps: usize,
        seqs: usize,
    ) {
        if self.frozen {
            return;
        }
        if steps == 0 || seqs == 0 {
            return;
        }
        if self.draft_step.len() < seqs {
            self.draft_step.resize(seqs, CostEstimate::default());
        }
        if first <= 0.0 || first > seconds {
            let each = seconds / steps as f64;
            self.draft_first.record(each, 0, seqs);
            self.draft_step[seqs - 1].record(each);
            return;
        }
        self.draft_first.record(first, fed, seqs);
        if steps > 1 {
            self.draft_step[seqs - 1].record((seconds - first) / (steps - 1) as f64);
        }
    }

    /// A round's drafting took `measured` seconds where `forecast` (from [`Self::draft_seconds`],
    /// bias included) was expected: later forecasts are scaled by the recent ratio.
    pub fn record_draft_forecast(&mut self, forecast: f64, measured: f64) {
        if self.frozen {
            return;
        }
        if !(forecast > 0.0 && measured.is_finite() && measured > 0.0) {
            return;
        }
        let ratio = (measured / (forecast / self.draft_bias)).clamp(0.5, 3.0);
        self.draft_bias = 0.9 * self.draft_bias + 0.1 * ratio;
    }

    /// A draft step's seconds measured at two context depths (tokens): a step attends over
    /// the whole context, so at depth it costs more than the shallow steps that price it
    /// until drafting runs there.
    pub fn record_draft_depths(&mut self, shallow: (usize, f64), deep: (usize, f64)) {
        if self.frozen {
            return;
        }
        let (d0, s0) = (shallow.0 as f64, shallow.1);
        let (d1, s1) = (deep.0 as f64, deep.1);
        if d1 > d0 && s0.is_finite() && s1.is_finite() && s0 > 0.0 {
            self.draft_depth = Some(DepthLine {
                depth: d0,
                step: s0,
                slope: ((s1 - s0) / (d1 - d0)).max(0.0),
            });
        }
    }

    /// The least a draft step costs with `depth` context tokens: the start-up line through
    /// its two depths, from its shallower one on (0 when not measured, or shallower).
    pub fn draft_step_floor(&self, depth: usize) -> f64 {
        match self.draft_depth {
            Some(l) if depth as f64 > l.depth => l.step + l.slope * (depth as f64 - l.depth),
            _ => 0.0,
        }
    }

    /// Seconds of `steps` draft steps of `seqs` sequences together, once any step is measured:
    /// the first step at its own price (as wide as recent feeds), the rest at the later steps'
    /// (each standing in for the other until measured). A batch size not measured yet is
    /// interpolated between its nearest measured neighbours, or priced as the nearest one (the
    /// first round at that size then measures it).
    pub fn draft_seconds(&self, steps: usize, seqs: usize) -> Option<f64> {
        if steps == 0 || seqs == 0 {
            return Some(0.0);
        }
        let first = self.draft_first.seconds(seqs);
        let later = by_batch_size(&self.draft_step, seqs);
        let (first, later) = match (first, later) {
            (Some(f), Some(l)) => (f, l),
            (Some(c), None) | (None, Some(c)) => (c, c),
            (None, None) => return None,
        };
        Some((first + later * (steps - 1) as f64) * self.draft_bias)
    }
}

/// A straight line of draft-step seconds over context depth, from `depth` on.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct DepthLine {
    depth: f64,
    step: f64,
    slope: f64,
}

/// A per-batch-size price for `seqs` sequences: measured, interpolated between the nearest
/// measured sizes, or the nearest one's.
fn by_batch_size(prices: &[CostEstimate], seqs: usize) -> Option<f64> {
    let measured = |n: usize| prices.get(n - 1).and_then(CostEstimate::get);
    let below = (1..=seqs.min(prices.len()))
        .rev()
        .find_map(|n| measured(n).map(|c| (n, c)));
    let above = (seqs + 1..=prices.len()).find_map(|n| measured(n).map(|c| (n, c)));
    match (below, above) {
        (Some((nb, cb)), Some((na, ca))) if nb < seqs => {
            Some(cb + (seqs - nb) as f64 / (na - nb) as f64 * (ca - cb))
        }
        (Some((_, c)), _) | (None, Some((_, c))) => Some(c),
        (None, None) => None,
    }
}
