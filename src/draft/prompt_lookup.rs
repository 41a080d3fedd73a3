//! Prompt lookup: propose the continuation of the most recent earlier occurrence of the
//! context's last n tokens (longest n first). No model and near-zero cost; it pays off where the
//! output repeats its input (summaries, code edits, retrieval answers). Across requests
//! (`suffix`), the engine's drafter also looks in earlier requests' texts
//! ([`super::RequestHistory`]) when the request's own text has no match.

use super::{DraftError, Proposal, Proposer};
use crate::sampling::tree::TREE_ROOT;
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
        self.lookup_with_length(context, gamma).0
    }

    /// [`PromptLookup::lookup`] and the length of the n-gram it matched (0 for none).
    pub fn lookup_with_length<'c>(&self, context: &'c [u32], gamma: usize) -> (&'c [u32], usize) {
        (self.min_ngram..=self.max_ngram)
            .rev()
            .map(|n| (Self::lookup_at(context, gamma, n), n))
            .find(|(c, _)| !c.is_empty())
            .unwrap_or((&[], 0))
    }

    /// Drafts `job` from `lookup`'s match first, where a drafter has one (`head+lookup`,
    /// `draft+lookup`) and the round allows it; `true` when it found one.
    pub(super) fn drafted_first(lookup: Option<&Self>, job: &mut super::DraftJob) -> bool {
        match lookup.filter(|_| job.lookup) {
            Some(p) => {
                p.lookup_tree(job.context, job.gamma, job.tree_nodes, job.out);
                !job.out.tokens.is_empty()
            }
            None => false,
        }
    }

    /// The kind of draft a lookup after `context` makes (its `Proposal::confidence_kind`: the
    /// matched n-gram's length, 3 for 3 or more), or `None` when the context has no match.
    pub fn match_kind(&self, context: &[u32]) -> Option<u8> {
        let (_, ngram) = self.lookup_with_length(context, 1);
        (ngram > 0).then(|| kind_of_match(ngram))
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

/// A draft's kind after a match of `ngram` tokens: 1 and 2 apart, 3 for 3 or more (longer
/// matches stand about as often as 3-token ones).
pub(super) fn kind_of_match(ngram: usize) -> u8 {
    ngram.min(3) as u8
}

/// The most earlier matches a tree looks at (the latest ones, longest n-grams first).
const TREE_MATCHES: usize = 16;

impl PromptLookup {
    /// The lookup's continuation as a tree's main chain, with up to `extra` alternative nodes
    /// from other earlier matches that continue differently (see [`Proposal`]). A node's
    /// confidence is the share of the matches reaching its parent that go on with its token:
    /// whether earlier matches agree on the continuation; its kind is the matched n-gram's
    /// length (3 for 3 or more), the other half of prompt lookup's evidence. Alternatives are
    /// taken in order of how likely their paths look (the product of those shares). With
    /// `extra == 0`, or no disagreeing match, `out` is the plain chain, with its confidences.
    pub fn lookup_tree(&self, context: &[u32], gamma: usize, extra: usize, out: &mut Proposal) {
        out.clear();
        let (main, ngram) = self.lookup_with_length(context, gamma);
        out.tokens.extend_from_slice(main);
        out.confidence_kind = kind_of_match(ngram);
        if main.is_empty() {
            return;
        }
        let conts = self.continuations(context, gamma);
        let mut trie = Trie::default();
        trie.insert(main, 0);
        for c in &conts {
            trie.insert(c, 1);
        }
        let roots = conts.len().max(1) as f32;
        let share = |i: usize| {
            let parent = trie.parent[i];
            let above = if parent == TREE_ROOT {
                roots
            } else {
                trie.count[parent as usize].max(1) as f32
            };
            (trie.count[i].max(1) as f32 / above).min(1.0)
        };
        let n = trie.token.len();
        let mut reach = vec![0f32; n];
        for i in 0..n {
            let up = match trie.parent[i] {
                TREE_ROOT => 1.0,
                p => reach[p as usize],
            };
            reach[i] = up * share(i);
        }
        // Alternatives by how likely their paths look; a parent comes before its children.
        let mut order: Vec<usize> = (main.len()..n).collect();
        order.sort_by(|&a, &b| {
            reach[b]
                .total_cmp(&reach[a])
                .then(trie.depth[a].cmp(&trie.depth[b]))
                .then(a.cmp(&b))
        });
        let mut new_index: Vec<u32> = (0..n as u32)
            .map(|i| {
                if (i as usize) < main.len() {
                    i
                } else {
                    TREE_ROOT
                }
            })
            .collect();
        let mut picked = Vec::new();
        for i in order {
            if picked.len() == extra {
                break;
            }
            let parent = trie.parent[i];
            if parent == TREE_ROOT || new_index[parent as usize] != TREE_ROOT {
                new_index[i] = (main.len() + picked.len()) as u32;
                picked.push(i);
            }
        }
        out.confidence.extend((0..main.len()).map(share));
        if picked.is_empty() {
            return;
        }
        out.parents
            .extend(trie.parent[..main.len()].iter().copied());
        for &i in &picked {
            out.tokens.push(trie.token[i]);
            let parent = trie.parent[i];
            out.parents.push(if parent == TREE_ROOT {
                TREE_ROOT
            } else {
                new_index[parent as usize]
            });
            out.confidence.push(share(i));
        }
    }

    /// The continuations (up to `gamma` tokens) of the latest earlier matches of the context's
    /// suffix, longest n-grams first, each continuation start once.
    fn continuations<'c>(&self, context: &'c [u32], gamma: usize) -> Vec<&'c [u32]> {
        let len = context.len();
        let mut starts: Vec<usize> = Vec::new();
        let mut out = Vec::new();
        for n in (self.min_ngram..=self.max_ngram).rev() {
            if len < n + 1 {
                continue;
            }
            let suffix = &context[len - n..];
            for i in (0..len - n).rev() {
                if out.len() == TREE_MATCHES {
                    return out;
                }
                let from = i + n;
                if &context[i..from] == suffix && !starts.contains(&from) {
                    starts.push(from);
                    out.push(&context[from..(from + gamma).min(len)]);
                }
            }
        }
        out
    }
}

/// A prefix tree of continuations: per node its token, parent, depth (1 for the root's
/// children) and how many inserted continuations pass through it.
#[derive(Default)]
struct Trie {
    token: Vec<u32>,
    parent: Vec<u32>,
    depth: Vec<usize>,
    count: Vec<usize>,
}

impl Trie {
    fn insert(&mut self, tokens: &[u32], weight: usize) {
        let mut at = TREE_ROOT;
        for (d, &t) in tokens.iter().enumerate() {
            let found = (0..self.token.len()).find(|&i| self.parent[i] == at && self.token[i] == t);
            let i = match found {
                Some(i) => i,
                None => {
                    self.token.push(t);
                    self.parent.push(at);
                    self.depth.push(d + 1);
                    self.count.push(0);
                    self.token.len() - 1
                }
            };
            self.count[i] += weight;
            at = i as u32;
        }
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

    fn keep(&mut self, _len: usize) -> Result<(), DraftError> {
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
    fn a_tree_adds_the_continuations_of_earlier_matches_that_disagree() {
        let pl = PromptLookup::new(1, 2);
        // [1, 2] was followed by 3 4, then by 5 6, then (latest) by 3 7; the context ends in it.
        let ctx = [1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2, 3, 7, 9, 1, 2];
        let mut p = Proposal::default();
        pl.lookup_tree(&ctx, 2, 0, &mut p);
        assert_eq!(p.tokens, [3, 7]);
        assert!(!p.is_tree(), "no alternatives asked for");
        // The chain's confidences all the same: 3 is where 2 of 3 matches went, 7 where 1 of
        // the 2 after 3 did; the match was a 2-gram.
        assert_eq!(p.confidence.len(), 2);
        assert!((p.confidence[0] - 2.0 / 3.0).abs() < 1e-6);
        assert!((p.confidence[1] - 0.5).abs() < 1e-6);
        assert_eq!(p.confidence_kind, 2);
        pl.lookup_tree(&ctx, 2, 3, &mut p);
        // Main chain 3 → 7; 3 is followed by 4 too (under node 0), and 5 → 6 is the other
        // continuation. The 1-gram [2] matches the same starts, so nothing else.
        assert_eq!(p.chain_len(), 2);
        assert_eq!(&p.tokens[..2], &[3, 7]);
        let alt: Vec<(u32, u32)> = (2..p.tokens.len())
            .map(|i| (p.tokens[i], p.parents[i]))
            .collect();
        assert_eq!(alt.len(), 3);
        assert!(
            alt.contains(&(4, 0)) && alt.contains(&(5, TREE_ROOT)),
            "{alt:?}"
        );
        // 6 hangs under 5.
        let five = (2..p.tokens.len()).find(|&i| p.tokens[i] == 5).unwrap() as u32;
        assert!(alt.contains(&(6, five)), "{alt:?}");
        // 3 is where 2 of 3 matches went.
        assert!((p.confidence[0] - 2.0 / 3.0).abs() < 1e-6);
        // A budget of 1 keeps the likeliest alternative's first node: 4 (reach 2/3 · 1/2) and 5
        // (1/3) tie; the shallower first, then the earlier.
        pl.lookup_tree(&ctx, 2, 1, &mut p);
        assert_eq!(p.tokens.len(), 3);
        // A context whose matches all agree gives no tree.
        let agree = [1, 2, 3, 1, 2, 3, 1, 2];
        pl.lookup_tree(&agree, 1, 3, &mut p);
        assert!(!p.is_tree() && p.tokens == [3]);
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
