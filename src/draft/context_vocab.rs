//! The tokens of a sequence's own text that its drafter's reduced vocabulary lacks, added to
//! what that drafter may propose for this sequence alone.
//!
//! Why it exists: a reduced draft vocabulary (the tokens the target writes most often) cannot
//! propose a name, a number or a rare word the answer copies from its question, and those are
//! the tokens a target copies most surely. Ranking more tokens costs every draft step of every
//! request; a sequence's own out-of-vocabulary tokens are a few hundred at most, and scoring
//! them is a few dot products a step.

/// At most this many tokens are added for one sequence (the first ones met).
pub const MAX_CONTEXT_TOKENS: usize = 2048;

/// One sequence's added tokens and their output-head rows.
#[derive(Debug, Default)]
pub struct ContextVocab {
    /// Added target ids, in the order first met.
    ids: Vec<u32>,
    /// Their output-head rows, `hidden` values each.
    rows: Vec<f32>,
    /// Tokens of the sequence's text already looked at.
    scanned: usize,
}

impl ContextVocab {
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Looks at the tokens of `context` not seen yet and adds those `in_vocab` says the draft
    /// vocabulary lacks; `rows(ids)` gives the output head's rows of the new ones (`hidden`
    /// values each, in order).
    pub fn take_in<E>(
        &mut self,
        context: &[u32],
        in_vocab: impl Fn(u32) -> bool,
        rows: impl FnOnce(&[u32]) -> Result<Vec<f32>, E>,
    ) -> Result<(), E> {
        let from = self.scanned.min(context.len());
        let before = self.ids.len();
        for &t in &context[from..] {
            if self.ids.len() >= MAX_CONTEXT_TOKENS {
                break;
            }
            if !in_vocab(t) && !self.ids.contains(&t) {
                self.ids.push(t);
            }
        }
        if self.ids.len() > before {
            match rows(&self.ids[before..]) {
                Ok(r) => self.rows.extend_from_slice(&r),
                Err(e) => {
                    self.ids.truncate(before);
                    return Err(e);
                }
            }
        }
        self.scanned = context.len();
        Ok(())
    }

    /// Appends the added tokens' logits for the drafter's output state `x` to `out`.
    pub fn logits(&self, x: &[f32], out: &mut Vec<f32>) {
        let h = x.len();
        out.extend(self.rows.chunks_exact(h).map(|row| dot(x, row)));
    }
}

/// A dot product in 16 independent lanes (so it vectorizes without reassociating floats
/// behind the compiler's back).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows where row of token t is [t, t, ...] (width 3).
    fn rows(ids: &[u32]) -> Result<Vec<f32>, String> {
        Ok(ids.iter().flat_map(|&t| [t as f32; 3]).collect())
    }

    #[test]
    fn only_unseen_tokens_outside_the_vocabulary_are_added_once() {
        let mut v = ContextVocab::default();
        let in_vocab = |t: u32| t < 10;
        v.take_in(&[1, 12, 3, 15, 12], in_vocab, rows).unwrap();
        assert_eq!(v.ids(), &[12, 15]);
        // The text grew: only its new tokens are looked at.
        v.take_in(&[1, 12, 3, 15, 12, 20, 15, 4], in_vocab, rows)
            .unwrap();
        assert_eq!(v.ids(), &[12, 15, 20]);
        let mut out = vec![7.0];
        v.logits(&[1.0, 2.0, 0.5], &mut out);
        assert_eq!(out, vec![7.0, 12.0 * 3.5, 15.0 * 3.5, 20.0 * 3.5]);
    }

    #[test]
    fn failing_rows_add_nothing() {
        let mut v = ContextVocab::default();
        let failed = v.take_in(&[50, 60], |_| false, |_| Err("no rows"));
        assert_eq!(failed, Err("no rows"));
        assert!(v.ids().is_empty());
        let mut out = Vec::new();
        v.logits(&[1.0; 3], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn at_most_the_cap_is_added() {
        let mut v = ContextVocab::default();
        let text: Vec<u32> = (0..(MAX_CONTEXT_TOKENS as u32 + 50)).collect();
        v.take_in(&text, |_| false, rows).unwrap();
        assert_eq!(v.ids().len(), MAX_CONTEXT_TOKENS);
    }

    #[test]
    fn the_dot_product_is_exact_on_small_integers() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 5) as f32).collect();
        let want: f32 = (0..37).map(|i| (i * (i % 5)) as f32).sum();
        assert_eq!(dot(&a, &b), want);
    }
}
