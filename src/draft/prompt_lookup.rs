//! Prompt lookup: propose the continuation of the most recent earlier occurrence of the
//! context's last n tokens (longest n first). No model and near-zero cost; it pays off where the
//! output repeats its input (summaries, code edits, retrieval answers).

use super::{DraftError, Drafter, Proposal};
use crate::sampling::{SamplingParams, SeededRng};

#[derive(Clone, Copy, Debug)]
pub struct PromptLookup {
    min_ngram: usize,
    max_ngram: usize,
}

impl PromptLookup {
    pub fn new(min_ngram: usize, max_ngram: usize) -> Self {
        let min_ngram = min_ngram.max(1);
        Self {
            min_ngram,
            max_ngram: max_ngram.max(min_ngram),
        }
    }

    /// The tokens that followed the latest earlier match of the longest matching suffix.
    pub fn lookup<'c>(&self, context: &'c [u32], gamma: usize) -> &'c [u32] {
        let len = context.len();
        for n in (self.min_ngram..=self.max_ngram).rev() {
            if len < n + 1 {
                continue;
            }
            let suffix = &context[len - n..];
            // Latest start i < len - n whose n-gram equals the suffix and has a continuation.
            for i in (0..len - n).rev() {
                if &context[i..i + n] == suffix {
                    let from = i + n;
                    return &context[from..(from + gamma).min(len)];
                }
            }
        }
        &[]
    }
}

impl Default for PromptLookup {
    fn default() -> Self {
        Self::new(1, 3)
    }
}

impl Drafter for PromptLookup {
    fn name(&self) -> String {
        format!("prompt-lookup(n={}..{})", self.min_ngram, self.max_ngram)
    }

    fn propose(
        &mut self,
        context: &[u32],
        _generated_from: usize,
        gamma: usize,
        _params: &SamplingParams,
        _rng: &mut SeededRng,
        out: &mut Proposal,
    ) -> Result<(), DraftError> {
        out.clear();
        out.tokens.extend_from_slice(self.lookup(context, gamma));
        Ok(())
    }

    fn rollback(&mut self, _keep: usize) -> Result<(), DraftError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_latest_match_wins() {
        let pl = PromptLookup::new(1, 3);
        // suffix [2, 3] occurs at 1 and 5; the latest (5) continues with 9
        let ctx = [1, 2, 3, 4, 7, 2, 3, 9, 8, 2, 3];
        assert_eq!(pl.lookup(&ctx, 2), &[9, 8]);
        // a 3-gram match beats a 1-gram one
        let ctx = [5, 6, 7, 1, 9, 7, 2, 5, 6, 7];
        assert_eq!(pl.lookup(&ctx, 3), &[1, 9, 7]);
        assert!(pl.lookup(&[1, 2, 3], 4).is_empty());
        assert!(pl.lookup(&[], 4).is_empty());
        // continuation is cut at the end of the context and at gamma
        assert_eq!(pl.lookup(&[4, 4, 4], 5), &[4]);
    }
}
