//! What a prompt token costs the target forward, by where it sits in its context.
//!
//! Why it exists: prompts are prefilled in chunks so that a long one does not stall other
//! sequences' decoding, but a chunk of 256 tokens costs 0.2 s near a context's start and 1.8
//! s near depth 8000 on SmolLM2 (2 threads): each token's attention reads every key before it.
//! Chunks are therefore sized by price: a round's prompt tokens together may cost what
//! `engine.prefill_chunk` tokens cost at the context's start, each priced as its matmuls plus
//! its attention over the keys it reads (full layers every earlier token, windowed layers at
//! most their window). The two rates come from timing the model's own kernels at start-up.
//! Pure: the plan reads it, the engine builds it.

/// Seconds a prompt token costs by its position: its weights' share plus its attention's,
/// per key it reads, in each kind of layer.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillPrice {
    /// Seconds of a token's matmuls.
    per_token: f64,
    /// Seconds a key adds over the layers that attend to every earlier token.
    per_key: f64,
    /// Seconds a key adds over each window's layers, with that window (keys a query sees).
    windowed: Vec<(f64, usize)>,
}

impl PrefillPrice {
    /// Every token the same price: chunks of exactly `engine.prefill_chunk` tokens (a backend
    /// whose kernels were not timed).
    pub fn flat() -> Self {
        Self {
            per_token: 1.0,
            per_key: 0.0,
            windowed: Vec::new(),
        }
    }

    /// From seconds of a token's matmuls and, per layer, seconds per key it reads and the
    /// window it attends within (`None`: every earlier token). Non-finite or negative figures
    /// (a timing that failed) leave the price flat.
    pub fn new(per_token: f64, layers: &[(f64, Option<usize>)]) -> Self {
        let sane = |x: f64| x.is_finite() && x >= 0.0;
        if !(per_token.is_finite() && per_token > 0.0 && layers.iter().all(|l| sane(l.0))) {
            return Self::flat();
        }
        let per_key = layers.iter().filter(|l| l.1.is_none()).map(|l| l.0).sum();
        let mut windowed: Vec<(f64, usize)> = Vec::new();
        for &(seconds, window) in layers {
            let Some(window) = window else { continue };
            match windowed.iter_mut().find(|w| w.1 == window) {
                Some(w) => w.0 += seconds,
                None => windowed.push((seconds, window)),
            }
        }
        Self {
            per_token,
            per_key,
            windowed,
        }
    }

    /// Seconds of the token at `position` (it reads `position + 1` keys).
    pub fn token(&self, position: usize) -> f64 {
        let keys = position + 1;
        let windowed: f64 = self
            .windowed
            .iter()
            .map(|&(s, w)| s * keys.min(w) as f64)
            .sum();
        self.per_token + self.per_key * keys as f64 + windowed
    }

    /// Seconds of the `len` tokens from position `start`.
    pub fn chunk(&self, start: usize, len: usize) -> f64 {
        (start..start + len).map(|p| self.token(p)).sum()
    }

    /// The most of `left` tokens from `start` whose price fits `budget`, and that price.
    pub fn fit(&self, start: usize, left: usize, budget: f64) -> (usize, f64) {
        let mut spent = 0.0;
        for len in 0..left {
            let next = spent + self.token(start + len);
            if next > budget {
                return (len, spent);
            }
            spent = next;
        }
        (left, spent)
    }

    /// What a token at `position` costs against one at the context's start.
    pub fn relative(&self, position: usize) -> f64 {
        self.token(position) / self.token(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_price_fits_exactly_the_chunk_at_any_depth() {
        let p = PrefillPrice::flat();
        let budget = p.chunk(0, 256);
        assert_eq!(p.fit(0, 1000, budget).0, 256);
        assert_eq!(p.fit(7000, 1000, budget).0, 256);
        assert_eq!(p.fit(7000, 10, budget), (10, 10.0));
    }

    #[test]
    fn deep_tokens_cost_their_keys_so_chunks_shrink_with_depth() {
        // A token's matmuls cost what 1000 keys' attention costs.
        let p = PrefillPrice::new(1e-3, &[(0.5e-6, None), (0.5e-6, None)]);
        let budget = p.chunk(0, 256);
        assert_eq!(p.fit(0, 1000, budget).0, 256);
        let (deep, spent) = p.fit(8000, 1000, budget);
        // At depth 8000 a token costs about 9 at the start (1 + 8000/1000).
        assert!((28..=33).contains(&deep), "{deep}");
        assert!(spent <= budget && spent + p.token(8000 + deep) > budget);
        assert!((p.relative(7999) - 9e-3 / 1.001e-3).abs() < 1e-9);
    }

    #[test]
    fn windowed_layers_stop_costing_past_their_window() {
        let p = PrefillPrice::new(1e-3, &[(1e-6, Some(512)), (1e-6, Some(512)), (1e-6, None)]);
        // Past the window only the full layer's keys add.
        let step = p.token(5000) - p.token(4999);
        assert!((step - 1e-6).abs() < 1e-12);
        assert!((p.token(511) - (1e-3 + 3.0 * 512e-6)).abs() < 1e-12);
        assert!((p.token(600) - (1e-3 + 2.0 * 512e-6 + 601e-6)).abs() < 1e-12);
    }

    #[test]
    fn failed_timings_leave_the_price_flat() {
        assert_eq!(PrefillPrice::new(f64::NAN, &[]), PrefillPrice::flat());
        assert_eq!(PrefillPrice::new(0.0, &[]), PrefillPrice::flat());
        assert_eq!(
            PrefillPrice::new(1e-3, &[(f64::INFINITY, None)]),
            PrefillPrice::flat()
        );
    }
}
