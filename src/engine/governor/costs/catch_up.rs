//! What a drafter's catch-up costs: the price per token by the catch-up's size class, and the
//! forecast for a catch-up of any size. Part of [`CostModel`]; a catch-up taking in a long
//! prompt attends over a deep context on every token, so its price grows with its size.

use super::{CostEstimate, CostModel};

impl CostModel {
    /// Time the drafter spent taking in `tokens` context tokens it had not seen.
    pub fn record_catch_up(&mut self, seconds: f64, tokens: usize) {
        if self.frozen {
            return;
        }
        if tokens > 0 {
            let b = catch_up_bucket(tokens);
            if self.catch_up_token.len() <= b {
                self.catch_up_token.resize(b + 1, CostEstimate::default());
                self.catch_up_size.resize(b + 1, 0);
            }
            self.catch_up_token[b].record(seconds / tokens as f64);
            self.catch_up_size[b] = tokens;
        }
    }

    /// Seconds for the drafter to take in `tokens` unseen context tokens (nothing until
    /// measured: prompt lookup never has any), priced per token at its size class's price,
    /// or for an unmeasured class at the nearest measured size (the larger one on a tie:
    /// deeper catch-ups cost more per token, and guessing low is what lets an unpayable
    /// catch-up through) and never below a smaller measured size. Past the deepest measured
    /// size the per-token price is extrapolated along the line through the two deepest: every
    /// token of a long prompt attends over the ones before it, so the per-token price keeps
    /// growing with size.
    pub fn catch_up_seconds(&self, tokens: usize) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let want = catch_up_bucket(tokens);
        let measured: Vec<(usize, f64)> = self
            .catch_up_token
            .iter()
            .enumerate()
            .filter_map(|(b, c)| c.get().map(|v| (b, v)))
            .collect();
        if let Some(&(_, own)) = measured.iter().find(|&&(b, _)| b == want) {
            return own * tokens as f64;
        }
        let estimate = match measured.as_slice() {
            [.., (b0, p0), (b1, p1)] if want > *b1 => {
                let (n0, n1) = (self.catch_up_size[*b0], self.catch_up_size[*b1]);
                let slope = ((p1 - p0) / (n1 as f64 - n0 as f64)).max(0.0);
                p1 + slope * (tokens - n1) as f64
            }
            _ => measured
                .iter()
                .min_by_key(|&&(b, _)| (b.abs_diff(want), std::cmp::Reverse(b)))
                .map_or(0.0, |&(_, v)| v),
        };
        // A longer catch-up attends over more with every token, so an unmeasured size is
        // never priced per token below a smaller measured one. A small catch-up taken in deep
        // in a context (after a plain stretch) costs more per token than its size says; on
        // the line through the two deepest sizes it bent the extrapolation flat, and a
        // 770-token prompt was priced at 0.29 ms a token, taken in at 0.49.
        let floor = measured
            .iter()
            .filter(|&&(b, _)| b < want)
            .map(|&(_, v)| v)
            .fold(0.0, f64::max);
        estimate.max(floor) * tokens as f64
    }
}

/// The size class of a catch-up of `tokens` tokens: ⌊log2 tokens⌋.
fn catch_up_bucket(tokens: usize) -> usize {
    tokens.max(1).ilog2() as usize
}
