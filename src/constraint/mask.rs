//! The set of tokens a grammar allows at one position, applied to a row of logits.

use llguidance::toktrie::SimpleVob;

/// Allowed tokens at one position (one bit per token of the model's vocabulary).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask(SimpleVob);

impl TokenMask {
    pub(super) fn new(bits: SimpleVob) -> Self {
        Self(bits)
    }

    /// Whether the mask allows `token` (tokens past its vocabulary are forbidden).
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }

    /// Sets every forbidden token's logit to -inf, so every later step of the logits pipeline
    /// (softmax, top-k/p, the draw, argmax) gives it exactly zero. Logits past the mask's
    /// vocabulary are forbidden too.
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.0.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX && chunk.len() == 32 {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_tokens_get_minus_infinity_and_allowed_keep_their_logits() {
        let mut bits = SimpleVob::alloc(70);
        for t in [0u32, 33, 69] {
            bits.allow_token(t);
        }
        let mask = TokenMask::new(bits);
        let mut logits: Vec<f32> = (0..72).map(|i| i as f32).collect();
        mask.apply(&mut logits);
        assert!(mask.allows(33) && !mask.allows(34) && !mask.allows(70) && !mask.allows(9999));
        for (i, &l) in logits.iter().enumerate() {
            if [0, 33, 69].contains(&i) {
                assert_eq!(l, i as f32);
            } else {
                assert_eq!(l, f32::NEG_INFINITY, "token {i}");
            }
        }
    }
}
