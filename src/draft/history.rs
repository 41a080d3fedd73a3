//! The cross-request drafter's memory: recent requests' prompts and outputs, with an n-gram
//! index, so a request can draft the continuation an earlier request had after the same words.
//!
//! Why it exists: prompt lookup only sees the request's own text, but the workloads servers see
//! repeat across requests (agents re-sending tool output, templated answers, the same question
//! asked again, code edited turn after turn). Drafts are only proposals that the target
//! verifies, so a draft taken from another request never changes an output; the store is
//! bounded (oldest texts dropped first) and holds token ids only.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use super::prompt_lookup::{kind_of_match, PromptLookup};

/// Ends each stored text, so a continuation never runs into the next one.
const SEPARATOR: u32 = u32::MAX;

/// Tokens the store holds at most (with its index, about 40 bytes a token).
pub const HISTORY_TOKENS: usize = 1 << 17;

/// The store as the drafter and the scheduler share it: the drafter adds finished requests'
/// texts and drafts from them; the scheduler looks up which kind of draft a round will get
/// before it plans the round.
pub type SharedHistory = Arc<RwLock<RequestHistory>>;

/// Reads a shared store. A writer that panicked left a store that is still well formed (it
/// only ever holds whole texts once indexed), so a poisoned lock is read through.
pub fn read_history(h: &SharedHistory) -> RwLockReadGuard<'_, RequestHistory> {
    h.read().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Clone, Debug)]
pub struct RequestHistory {
    /// Stored texts one after another, each followed by [`SEPARATOR`].
    tokens: Vec<u32>,
    /// (n, hash of n tokens) → the latest position right after them.
    index: HashMap<(usize, u64), usize>,
    capacity: usize,
    min_ngram: usize,
    max_ngram: usize,
}

fn hash(tokens: &[u32]) -> u64 {
    // FNV-1a over the ids: cheap, and a collision only costs a check.
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl RequestHistory {
    /// A store of at most `capacity` tokens, matching suffixes of `min_ngram..=max_ngram` tokens.
    pub fn new(capacity: usize, min_ngram: usize, max_ngram: usize) -> Self {
        let min_ngram = min_ngram.max(1);
        Self {
            tokens: Vec::new(),
            index: HashMap::new(),
            capacity: capacity.max(2),
            min_ngram,
            max_ngram: max_ngram.max(min_ngram),
        }
    }

    /// A store to share for `lookup`'s n-gram sizes, where it looks across requests (`suffix`).
    pub fn shared_for(lookup: PromptLookup) -> Option<SharedHistory> {
        let (lo, hi) = lookup.ngrams();
        lookup
            .looks_across_requests()
            .then(|| Arc::new(RwLock::new(Self::new(HISTORY_TOKENS, lo, hi))))
    }

    /// The match `lookup` drafts from after `context` across requests: for each n-gram size,
    /// longest first, the request's own text and then this store's (the own text wins a match of
    /// equal length); at most `gamma` tokens, with the draft's kind
    /// (`Proposal::confidence_kind`: the matched n-gram's length, as the own text's lookup).
    pub fn match_across<'a>(
        &'a self,
        lookup: &PromptLookup,
        context: &'a [u32],
        gamma: usize,
    ) -> (&'a [u32], u8) {
        let (lo, hi) = lookup.ngrams();
        for n in (lo..=hi).rev() {
            let own = PromptLookup::lookup_at(context, gamma, n);
            if !own.is_empty() {
                return (own, kind_of_match(n));
            }
            let earlier = self.lookup_at(context, gamma, n);
            if !earlier.is_empty() {
                return (earlier, kind_of_match(n));
            }
        }
        (&[], 0)
    }

    /// Tokens held, separators included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Remembers a finished request's text (its prompt and output). The oldest texts go when the
    /// store is full: it keeps about half its capacity of the newest, then indexes anew.
    pub fn add(&mut self, text: &[u32]) {
        let text = &text[text.len().saturating_sub(self.capacity - 1)..];
        if text.is_empty() {
            return;
        }
        if self.tokens.len() + text.len() + 1 > self.capacity {
            let keep = (self.capacity / 2).saturating_sub(text.len() + 1);
            // Cut at a text boundary: right after a separator.
            let from = self.tokens.len().saturating_sub(keep);
            let from = self.tokens[from..]
                .iter()
                .position(|&t| t == SEPARATOR)
                .map_or(self.tokens.len(), |i| from + i + 1);
            self.tokens.drain(..from);
            self.index.clear();
            self.index_range(0, self.tokens.len());
        }
        let start = self.tokens.len();
        self.tokens.extend_from_slice(text);
        self.tokens.push(SEPARATOR);
        self.index_range(start, self.tokens.len());
    }

    /// Indexes the positions `start+1..end` of the stored tokens (each one after an n-gram
    /// that lies inside one text).
    fn index_range(&mut self, start: usize, end: usize) {
        for p in start + 1..end {
            if self.tokens[p - 1] == SEPARATOR || self.tokens[p] == SEPARATOR {
                continue;
            }
            for n in self.min_ngram..=self.max_ngram {
                if n > p {
                    break;
                }
                let gram = &self.tokens[p - n..p];
                if gram.contains(&SEPARATOR) {
                    break;
                }
                self.index.insert((n, hash(gram)), p);
            }
        }
    }

    /// What followed the latest stored occurrence of the longest matching suffix of `context`,
    /// at most `gamma` tokens and never past the end of that text.
    pub fn lookup(&self, context: &[u32], gamma: usize) -> &[u32] {
        (self.min_ngram..=self.max_ngram)
            .rev()
            .map(|n| self.lookup_at(context, gamma, n))
            .find(|c| !c.is_empty())
            .unwrap_or(&[])
    }

    /// [`RequestHistory::lookup`] for one n-gram size `n`.
    pub fn lookup_at(&self, context: &[u32], gamma: usize, n: usize) -> &[u32] {
        if n == 0 || context.len() < n {
            return &[];
        }
        let suffix = &context[context.len() - n..];
        let Some(&p) = self.index.get(&(n, hash(suffix))) else {
            return &[];
        };
        if &self.tokens[p - n..p] != suffix {
            return &[];
        }
        let cont = &self.tokens[p..(p + gamma).min(self.tokens.len())];
        &cont[..cont
            .iter()
            .position(|&t| t == SEPARATOR)
            .unwrap_or(cont.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_requests_continuation_is_proposed() {
        let mut h = RequestHistory::new(1000, 1, 3);
        h.add(&[1, 2, 3, 4, 5, 6]);
        h.add(&[9, 2, 3, 7, 8]);
        // The latest text with the longest match wins.
        assert_eq!(h.lookup(&[0, 2, 3], 4), &[7, 8]);
        assert_eq!(h.lookup(&[1, 2, 3], 2), &[4, 5], "a 3-gram beats a 2-gram");
        // Never past the end of a text, never a token of the next.
        assert_eq!(h.lookup(&[5], 4), &[6]);
        assert!(h.lookup(&[42], 3).is_empty());
        assert!(
            h.lookup(&[6], 3).is_empty(),
            "nothing follows a text's last token"
        );
    }

    #[test]
    fn the_store_stays_within_its_capacity_and_keeps_the_newest() {
        let mut h = RequestHistory::new(64, 1, 2);
        for i in 0..100u32 {
            h.add(&[i, i + 1000, i + 2000]);
            assert!(h.len() <= 64, "{}", h.len());
        }
        assert_eq!(h.lookup(&[99], 2), &[1099, 2099]);
        assert!(h.lookup(&[0], 2).is_empty(), "the oldest texts are gone");
        // A text longer than the store keeps its end.
        h.add(&(0..200).collect::<Vec<u32>>());
        assert!(h.len() <= 64);
        assert_eq!(h.lookup(&[197], 2), &[198, 199]);
    }
}
