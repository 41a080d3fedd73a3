//! The prefix cache's index: which cache slots hold which tokens, and where a new prompt can
//! start from.
//!
//! Why it exists: a chat client sends the whole conversation every turn and many requests share
//! a system prompt, so most of a prompt's keys and values were often computed before. A slot of
//! a finished sequence is kept (retained) with the tokens its cache holds, and a new prompt
//! starts from the longest prefix any retained or running slot holds, prefilling only the rest.
//! Keys and values of a token do not depend on how it was batched, so the output is the same
//! bits as without the cache. This index is pure bookkeeping, shared by the target's scheduler
//! and the draft model's drafter; the caches themselves live on the compute workers.

/// A slot kept after its sequence ended, with the tokens its cache holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retained {
    pub slot: usize,
    pub tokens: Vec<u32>,
    /// When it was retained or last matched (a counter): the least recent is evicted first.
    pub used: u64,
}

/// Where a new prompt's prefix comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixSource {
    /// A retained slot, taken over by the new sequence (its cache is cut to the prefix).
    Retained { slot: usize },
    /// A running sequence's slot, whose first `len` tokens are copied.
    Running { slot: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    pub source: PrefixSource,
    /// Tokens of the prompt that need no prefill.
    pub len: usize,
}

/// The retained slots, least recently used evicted first.
#[derive(Clone, Debug, Default)]
pub struct PrefixIndex {
    retained: Vec<Retained>,
    clock: u64,
}

/// Tokens `a` and `b` share from the start.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixIndex {
    /// The longest prefix of `prompt` that a retained slot or a running one (`running`: slot
    /// and the tokens its cache holds) has, at most `limit` tokens (a prompt's last token is
    /// always fed, to sample from). A retained slot wins a tie: taking it over copies nothing.
    pub fn best_match<'a>(
        &self,
        prompt: &[u32],
        limit: usize,
        running: impl IntoIterator<Item = (usize, &'a [u32])>,
    ) -> Option<PrefixMatch> {
        let retained = self.retained.iter().map(|r| PrefixMatch {
            source: PrefixSource::Retained { slot: r.slot },
            len: common_prefix(&r.tokens, prompt).min(limit),
        });
        let running = running.into_iter().map(|(slot, tokens)| PrefixMatch {
            source: PrefixSource::Running { slot },
            len: common_prefix(tokens, prompt).min(limit),
        });
        let mut best: Option<PrefixMatch> = None;
        for m in retained.chain(running) {
            if m.len > best.map_or(0, |b| b.len) {
                best = Some(m);
            }
        }
        best
    }

    /// Keeps `slot` holding `tokens`. Returns the slots no longer needed, with the tokens each
    /// held: `slot` itself when a retained slot already holds `tokens` or more of the same
    /// text, or the retained slots whose tokens are a prefix of `tokens` (this one serves every
    /// prompt they served).
    pub fn retain(&mut self, slot: usize, tokens: Vec<u32>) -> Vec<(usize, usize)> {
        self.clock += 1;
        if tokens.is_empty()
            || self
                .retained
                .iter()
                .any(|r| common_prefix(&r.tokens, &tokens) == tokens.len())
        {
            return vec![(slot, tokens.len())];
        }
        let mut dropped = Vec::new();
        self.retained.retain(|r| {
            let covered = common_prefix(&r.tokens, &tokens) == r.tokens.len();
            if covered {
                dropped.push((r.slot, r.tokens.len()));
            }
            !covered
        });
        self.retained.push(Retained {
            slot,
            tokens,
            used: self.clock,
        });
        dropped
    }

    /// Takes a retained slot out of the index (a new sequence takes it over); its tokens.
    pub fn take(&mut self, slot: usize) -> Option<Vec<u32>> {
        let i = self.retained.iter().position(|r| r.slot == slot)?;
        Some(self.retained.swap_remove(i).tokens)
    }

    /// Marks a retained slot as just used (a running sequence copied from it is not; only
    /// retained slots age).
    pub fn touch(&mut self, slot: usize) {
        self.clock += 1;
        if let Some(r) = self.retained.iter_mut().find(|r| r.slot == slot) {
            r.used = self.clock;
        }
    }

    /// Removes the least recently used retained slot other than `keep`: its slot and token
    /// count.
    pub fn evict(&mut self, keep: Option<usize>) -> Option<(usize, usize)> {
        let i = self
            .retained
            .iter()
            .enumerate()
            .filter(|(_, r)| Some(r.slot) != keep)
            .min_by_key(|(_, r)| r.used)
            .map(|(i, _)| i)?;
        let r = self.retained.swap_remove(i);
        Some((r.slot, r.tokens.len()))
    }

    pub fn len(&self) -> usize {
        self.retained.len()
    }

    pub fn is_empty(&self) -> bool {
        self.retained.is_empty()
    }

    /// Tokens held by retained slots.
    pub fn tokens(&self) -> usize {
        self.retained.iter().map(|r| r.tokens.len()).sum()
    }

    /// Every retained slot and its token count.
    pub fn slots(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.retained.iter().map(|r| (r.slot, r.tokens.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins_and_a_retained_slot_wins_a_tie() {
        let mut idx = PrefixIndex::default();
        assert!(idx.retain(3, vec![1, 2, 3, 4]).is_empty());
        assert!(idx.retain(5, vec![1, 2, 9]).is_empty());
        let running: Vec<(usize, &[u32])> = vec![(0, &[1, 2, 3, 4, 5, 6]), (1, &[1, 2, 3])];
        let m = idx
            .best_match(&[1, 2, 3, 4, 5, 6, 7], 6, running.clone())
            .unwrap();
        assert_eq!(m.source, PrefixSource::Running { slot: 0 });
        assert_eq!(m.len, 6);
        // The limit keeps the prompt's last token to feed.
        let m = idx.best_match(&[1, 2, 3, 4], 3, running.clone()).unwrap();
        assert_eq!(m.len, 3);
        assert_eq!(m.source, PrefixSource::Retained { slot: 3 });
        let m = idx.best_match(&[1, 2, 3, 4, 8], 4, running).unwrap();
        assert_eq!(
            m,
            PrefixMatch {
                source: PrefixSource::Retained { slot: 3 },
                len: 4
            }
        );
        assert_eq!(idx.best_match(&[7, 7], 1, Vec::new()), None);
    }

    #[test]
    fn retaining_drops_what_a_longer_entry_covers() {
        let mut idx = PrefixIndex::default();
        idx.retain(0, vec![1, 2]);
        // A longer text covers the shorter one, which goes.
        assert_eq!(idx.retain(1, vec![1, 2, 3]), vec![(0, 2)]);
        // A text already covered is not kept: its own slot goes back.
        assert_eq!(idx.retain(2, vec![1, 2]), vec![(2, 2)]);
        assert_eq!(idx.retain(4, Vec::new()), vec![(4, 0)]);
        assert_eq!(idx.len(), 1);
        assert_eq!(idx.tokens(), 3);
    }

    #[test]
    fn eviction_takes_the_least_recently_used() {
        let mut idx = PrefixIndex::default();
        idx.retain(0, vec![1]);
        idx.retain(1, vec![2, 2]);
        idx.retain(2, vec![3, 3, 3]);
        idx.touch(0);
        assert_eq!(idx.evict(Some(1)), Some((2, 3)));
        assert_eq!(idx.evict(None), Some((1, 2)));
        assert_eq!(idx.evict(Some(0)), None);
        assert_eq!(idx.take(0), Some(vec![1]));
        assert_eq!(idx.evict(None), None);
        assert!(idx.is_empty());
    }
}
