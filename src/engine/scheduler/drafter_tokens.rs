//! A sequence's context counted in its drafter's own tokens, so that a catch-up is priced by
//! what the drafter will take in.
//!
//! Why it exists: a drafter of another vocabulary reads a target token it has as one token and
//! one it lacks as that token's text tokenized, often several. How many a request's text
//! becomes depends on the text: SmolLM2 reads a German prompt for Gemma 3 as about 1.6 of its
//! tokens a token (106 for 67), an English one as about one. Priced per target token, at what
//! earlier requests' text cost, a German prompt's catch-up was forecast at 23 ms and took 38.
//! Counted here, the price per drafter token applies to each request's own text.

#[cfg(doc)]
use super::draft_coverage::DraftCoverage;

/// `ends[i]`: the drafter's tokens of the context's first `i + 1` target tokens, for the
/// tokens counted so far. Empty for a drafter of the target's vocabulary: a token is a token.
#[derive(Debug, Default)]
pub(super) struct DrafterTokens {
    ends: Vec<u32>,
}

impl DrafterTokens {
    /// Counts what of `context` is not counted yet, each target token as `pieces` of the
    /// drafter's ([`DraftCoverage::piece_count`]). A scheduler's context only grows (its
    /// rounds push the tokens they keep), so what was counted stays right.
    pub fn extend(&mut self, context: &[u32], pieces: impl Fn(u32) -> usize) {
        let mut total = self.ends.last().copied().unwrap_or(0);
        for &id in context.iter().skip(self.ends.len()) {
            total += pieces(id) as u32;
            self.ends.push(total);
        }
    }

    /// The drafter's tokens of the context's target tokens `from..to`; where they are not all
    /// counted (a drafter of the target's vocabulary), one each.
    pub fn between(&self, from: usize, to: usize) -> usize {
        if to <= from {
            return 0;
        }
        if to > self.ends.len() {
            return to - from;
        }
        let before = match from {
            0 => 0,
            f => self.ends[f - 1],
        };
        (self.ends[to - 1] - before) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(ends: &[u32]) -> DrafterTokens {
        DrafterTokens {
            ends: ends.to_vec(),
        }
    }

    #[test]
    fn spans_count_the_drafter_tokens_their_target_tokens_became() {
        // Target tokens becoming 1, 3, 1 and 2 drafter tokens.
        let t = counted(&[1, 4, 5, 7]);
        assert_eq!(t.between(0, 4), 7);
        assert_eq!(t.between(1, 3), 4);
        assert_eq!(t.between(3, 4), 2);
        assert_eq!(t.between(2, 2), 0);
        assert_eq!(t.between(3, 1), 0);
    }

    #[test]
    fn a_growing_context_is_counted_once_and_only_its_new_tokens() {
        // Even ids are tokens the drafter has; an odd id is its own value in pieces.
        let pieces = |id: u32| if id.is_multiple_of(2) { 1 } else { id as usize };
        let mut t = DrafterTokens::default();
        t.extend(&[2, 3, 4], pieces);
        assert_eq!(t.between(0, 3), 5);
        t.extend(&[2, 3, 4, 5, 6], |id| {
            assert!(id >= 5, "token {id} was counted already");
            pieces(id)
        });
        assert_eq!(t.between(0, 5), 11);
        assert_eq!(t.between(3, 5), 6);
        assert_eq!(t.between(1, 2), 3);
    }

    #[test]
    fn uncounted_spans_count_one_drafter_token_a_target_token() {
        let t = counted(&[1, 4]);
        assert_eq!(t.between(0, 5), 5);
        assert_eq!(DrafterTokens::default().between(2, 9), 7);
    }
}
