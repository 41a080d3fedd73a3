//! Prompt lookup: propose the continuation of the most recent earlier occurrence of the
//! context's last n tokens (longest n first). No model and near-zero cost; it pays off where the
//! output repeats its input (summaries, code edits, retrieval answers). Across requests
//! (`suffix`), the engine's drafter also looks in earlier requests' texts
//! ([`super::RequestHistory`]) when the request's own text has no match.

use super::{DraftError, Proposal, Proposer};
use crate::sampling::{SamplingParams, SeededRng};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PromptLookup {
    min_ngram: usize,
    max_ngram: usize,
    /// Also look in earlier requests' prompts and outputs (the request's own text first).
    across_requests: bool,
}

/// The longest n-gram a lookup may match: longer ones never occur in practice, and each size
/// is a scan of the context.
pub const MAX_NGRAM: usize = 16;

impl PromptLookup {
    /// Reads n-gram sizes written `MIN-MAX` (or `N` for one size), each in 1..=16, MIN <= MAX.
    pub fn parse_ngrams(sizes: &str) -> Result<Self, String> {
        let bad =
            || format!("n-gram sizes `{sizes}`: want MIN-MAX, 1 <= MIN <= MAX <= {MAX_NGRAM}");
        let (lo, hi) = sizes.split_once('-').unwrap_or((sizes, sizes));
        let lo: usize = lo.trim().parse().map_err(|_| bad())?;
        let hi: usize = hi.trim().parse().map_err(|_| bad())?;
        if lo == 0 || lo > hi || hi > MAX_NGRAM {
            return Err(bad());
        }
        Ok(Self::new(lo, hi))
    }

    /// The smallest and largest n-gram sizes it matches.
    pub fn ngrams(&self) -> (usize, usize) {
        (self.min_ngram, self.max_ngram)
    }

    pub fn new(min_ngram: usize, max_ngram: usize) -> Self {
        let min_ngram = min_ngram.max(1);
        Self {
            min_ngram,
            max_ngram: max_ngram.max(min_ngram),
            across_requests: false,
        }
    }

    /// The same lookup, also in earlier requests' texts (the `suffix` drafter).
    pub fn across_requests(self) -> Self {
        Self {
            across_requests: true,
            ..self
        }
    }

    pub fn looks_across_requests(&self) -> bool {
        self.across_requests
    }

    /// The same n-gram sizes, across requests or not as `self`.
    pub fn with_ngrams_of(self, other: PromptLookup) -> Self {
        Self {
            min_ngram: other.min_ngram,
            max_ngram: other.max_ngram,
            ..self
        }
    }

    /// The tokens that followed an earlier match of the longest matching suffix: the latest
    /// match with a full γ-token continuation, or else the match with the longest one (inside
    /// a run of repeats the latest match has only one token after it).
    pub fn lookup<'c>(&self, context: &'c [u32], gamma: usize) -> &'c [u32] {
        (self.min_ngram..=self.max_ngram)
            .rev()
            .map(|n| Self::lookup_at(context, gamma, n))
            .find(|c| !c.is_empty())
            .unwrap_or(&[])
    }

    /// [`PromptLookup::lookup`] for one n-gram size `n`.
    pub fn lookup_at(context: &[u32], gamma: usize, n: usize) -> &[u32] {
        let len = context.len();
        if n == 0 || len < n + 1 {
            return &[];
        }
        let suffix = &context[len - n..];
        let mut best: &[u32] = &[];
        for i in (0..len - n).rev() {
            if &context[i..i + n] == suffix {
                let from = i + n;
                let cont = &context[from..(from + gamma).min(len)];
                if cont.len() > best.len() {
                    best = cont;
                }
                if best.len() >= gamma {
                    break;
                }
            }
        }
        best
    }
}

impl Default for PromptLookup {
    fn default() -> Self {
        Self::new(1, 3)
    }
}

impl Proposer for PromptLookup {
    fn name(&self) -> String {
        let kind = if self.across_requests {
            "suffix"
        } else {
            "prompt-lookup"
        };
        format!("{kind}(n={}..{})", self.min_ngram, self.max_ngram)
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

    #[test]
    fn ngram_sizes_are_read_and_a_larger_minimum_ignores_shorter_matches() {
        let got = |s: &str| PromptLookup::parse_ngrams(s).map(|p| p.ngrams());
        assert_eq!(got("2-5"), Ok((2, 5)));
        assert_eq!(got("4"), Ok((4, 4)));
        for bad in ["0-3", "3-2", "1-17", "x"] {
            let err = got(bad).unwrap_err();
            assert!(err.contains("n-gram sizes"), "{bad}: {err}");
        }
        let ctx = [5, 6, 1, 9, 7, 2, 6];
        assert_eq!(PromptLookup::new(1, 3).lookup(&ctx, 2), &[1, 9]);
        assert!(PromptLookup::new(2, 3).lookup(&ctx, 2).is_empty());
    }

    #[test]
    fn inside_a_run_of_repeats_a_full_continuation_is_found() {
        let pl = PromptLookup::new(1, 3);
        // The latest match of [7, 7, 7] has one token after it; an earlier one has three.
        assert_eq!(pl.lookup(&[7; 7], 3), &[7, 7, 7]);
        // The latest match with a full continuation still beats an earlier one.
        let ctx = [1, 2, 8, 8, 8, 1, 2, 9, 9, 9, 1, 2];
        assert_eq!(pl.lookup(&ctx, 3), &[9, 9, 9]);
    }
}
