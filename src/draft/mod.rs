//! Drafters: cheap proposers of the next γ tokens, which the target model then verifies.
//!
//! A drafter sees the whole sequence so far (prompt and output) and proposes up to γ tokens,
//! with their processed draft distributions when it has them (a draft model) or none when its
//! proposal is deterministic (prompt lookup: a point mass). After verification it is told how
//! many tokens of the sequence stand, and rolls back whatever state it keeps past that.

mod error;
mod history;
mod model;
mod prompt_lookup;
mod siblings;
mod spec;
mod vocabulary;

pub use error::DraftError;
pub use history::{RequestHistory, HISTORY_TOKENS};
pub use model::{DraftJob, DraftTiming, ModelDrafter};
pub use prompt_lookup::PromptLookup;
pub use spec::{DraftSpec, InvalidDraftSpec};
pub use vocabulary::check_same_vocabulary;

use crate::sampling::tree::{chain_parent, ROOT};
use crate::sampling::{SamplingParams, SeededRng};

/// Drafted tokens and, for drafters that sample, their distributions (`vocab` values per token).
///
/// A chain (`parents` empty): each token follows the one before it. A tree: `parents[i]` is
/// node `i`'s parent ([`ROOT`] or an earlier node). A tree's first nodes are its main chain
/// (node `i` the child of node `i − 1`), the chain a drafter would have proposed alone; the
/// nodes after it are alternatives branching off it (or off each other). Distributions, when
/// there are any, belong to the main chain's nodes; an alternative is a point mass (a token
/// chosen deterministically, such as a runner-up of the drafter or another earlier match).
#[derive(Clone, Debug, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Flat `rows * vocab` probabilities for the first `rows` nodes; empty for point masses.
    pub dists: Vec<f32>,
    pub vocab: usize,
    /// Empty for a chain; one parent per node for a tree.
    pub parents: Vec<u32>,
    /// Per node, when the drafter judges its nodes (empty otherwise): its confidence that the
    /// node is right if it is tried, in [0, 1]. Prompt lookup: the share of the earlier matches
    /// reaching the node's parent that go on with its token; a draft model: its probability (a
    /// runner-up's given that the drafted token is wrong).
    pub confidence: Vec<f32>,
    /// What kind of evidence the confidences are, so the governor learns each kind's rates
    /// apart: 0 a draft model's probabilities, `n` (1 to 3) prompt lookup's agreement after a
    /// match of `n` tokens (3 or more).
    pub confidence_kind: u8,
}

impl Proposal {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.dists.clear();
        self.parents.clear();
        self.confidence.clear();
        self.confidence_kind = 0;
    }

    pub fn is_tree(&self) -> bool {
        !self.parents.is_empty()
    }

    /// Nodes of the main chain (all of them for a chain).
    pub fn chain_len(&self) -> usize {
        if !self.is_tree() {
            return self.tokens.len();
        }
        self.parents
            .iter()
            .enumerate()
            .take_while(|&(i, &p)| {
                if i == 0 {
                    p == ROOT
                } else {
                    p as usize == i - 1
                }
            })
            .count()
    }

    /// Keeps the main chain only.
    pub fn to_chain(&mut self) {
        if self.is_tree() {
            let n = self.chain_len();
            self.tokens.truncate(n);
            self.dists.truncate(n * self.vocab);
            self.parents.clear();
            self.confidence.truncate(n);
        }
    }

    /// Keeps the first `k` nodes of the main chain (and of a tree, the alternatives that hang
    /// from what is kept).
    pub fn keep_chain_prefix(&mut self, k: usize) {
        let chain = self.chain_len();
        if k >= chain {
            return;
        }
        if self.is_tree() {
            let keep: Vec<bool> = (0..self.tokens.len())
                .map(|i| i >= chain || i < k)
                .collect();
            self.retain_nodes(&keep);
        } else {
            self.tokens.truncate(k);
            self.dists.truncate(k.min(self.dist_rows()) * self.vocab);
            self.confidence.truncate(k);
        }
    }

    /// Keeps the nodes `keep` says (a subtree: a kept node's parent is kept), in order; a tree
    /// left with no alternative becomes its chain.
    pub fn retain_nodes(&mut self, keep: &[bool]) {
        if !self.is_tree() {
            return;
        }
        let mut new_index = vec![ROOT; self.tokens.len()];
        let (mut tokens, mut parents, mut confidence) = (Vec::new(), Vec::new(), Vec::new());
        let rows = self.dist_rows();
        let mut kept_rows = 0;
        for i in 0..self.tokens.len() {
            let parent = self.parents[i];
            let parent_kept = parent == ROOT || new_index[parent as usize] != ROOT;
            if !(keep[i] && parent_kept) {
                continue;
            }
            new_index[i] = tokens.len() as u32;
            tokens.push(self.tokens[i]);
            parents.push(if parent == ROOT {
                ROOT
            } else {
                new_index[parent as usize]
            });
            if let Some(&c) = self.confidence.get(i) {
                confidence.push(c);
            }
            // Rows belong to a prefix of the main chain, which stays a prefix.
            if i < rows && kept_rows == tokens.len() - 1 {
                kept_rows += 1;
            }
        }
        self.dists.truncate(kept_rows * self.vocab);
        self.tokens = tokens;
        self.parents = parents;
        self.confidence = confidence;
        if self.tokens.len() == self.chain_len() {
            self.to_chain();
        }
    }

    /// How many nodes have a distribution (a prefix of the main chain).
    pub fn dist_rows(&self) -> usize {
        self.dists.len().checked_div(self.vocab).unwrap_or(0)
    }

    /// Drops the first drafted token and its distribution (a guess that was checked against
    /// the target's own token: see the scheduler's drafting ahead). Chains only.
    pub fn drop_first(&mut self) {
        if self.tokens.is_empty() {
            return;
        }
        self.to_chain();
        self.tokens.remove(0);
        if !self.dists.is_empty() {
            self.dists.drain(..self.vocab);
        }
        if !self.confidence.is_empty() {
            self.confidence.remove(0);
        }
    }

    /// Draft distribution of token `i`, or `None` for a point mass.
    pub fn dist(&self, i: usize) -> Option<&[f32]> {
        if i < self.dist_rows() {
            Some(&self.dists[i * self.vocab..(i + 1) * self.vocab])
        } else {
            None
        }
    }

    /// The tree as the acceptance rule reads it (a chain is a tree too).
    pub fn parents_or_chain(&self) -> Vec<u32> {
        if self.is_tree() {
            self.parents.clone()
        } else {
            (0..self.tokens.len()).map(chain_parent).collect()
        }
    }

    /// The parents of a verification's input `[g, nodes…]` as the model reads them (empty for
    /// a chain): `g` first, node `i` at input `i + 1`.
    pub fn input_parents(&self) -> Vec<u32> {
        if !self.is_tree() {
            return Vec::new();
        }
        std::iter::once(crate::model::TREE_ROOT)
            .chain(
                self.parents
                    .iter()
                    .map(|&p| if p == ROOT { 0 } else { p + 1 }),
            )
            .collect()
    }
}

pub trait Proposer {
    /// A short name for logs and stats.
    fn name(&self) -> String;

    /// Proposes up to `gamma` tokens to follow `context` (prompt and output so far, its last
    /// token not yet verified). `generated_from` is where the output starts in `context` (for
    /// penalties). Proposing fewer, or none, is allowed.
    fn propose(
        &mut self,
        context: &[u32],
        generated_from: usize,
        gamma: usize,
        params: &SamplingParams,
        rng: &mut SeededRng,
        out: &mut Proposal,
    ) -> Result<(), DraftError>;

    /// Prepares for a sequence whose prompt is `prompt` (a draft model fills its cache here, in
    /// the prefill phase, rather than inside the first round). Optional.
    fn prefill(&mut self, _prompt: &[u32]) -> Result<(), DraftError> {
        Ok(())
    }

    /// The first `keep` tokens of the context stand; forget anything past them.
    fn rollback(&mut self, keep: usize) -> Result<(), DraftError>;
}

#[cfg(test)]
mod tests {
    use super::Proposal;

    #[test]
    fn dropping_the_first_draft_keeps_each_later_token_with_its_own_distribution() {
        let mut p = Proposal {
            tokens: vec![4, 7, 1],
            dists: (0..9).map(|i| i as f32).collect(),
            vocab: 3,
            ..Proposal::default()
        };
        p.drop_first();
        assert_eq!(p.tokens, [7, 1]);
        assert_eq!(p.dist(0), Some(&[3.0, 4.0, 5.0][..]));
        assert_eq!(p.dist(1), Some(&[6.0, 7.0, 8.0][..]));
        // A point-mass proposal has no distributions to drop.
        let mut p = Proposal {
            tokens: vec![4, 7],
            dists: Vec::new(),
            vocab: 3,
            ..Proposal::default()
        };
        p.drop_first();
        assert_eq!(p.tokens, [7]);
        assert_eq!(p.dist(0), None);
        p.drop_first();
        p.drop_first();
        assert!(p.tokens.is_empty());
    }

    #[test]
    fn a_tree_keeps_its_main_chain_rows_and_prunes_to_a_subtree() {
        use super::ROOT;
        // Main chain 0 → 1 → 2 (with rows), alternatives 3 (beside 0), 4 (beside 2), 5 (under 3).
        let mut p = Proposal {
            tokens: vec![10, 11, 12, 13, 14, 15],
            dists: (0..9).map(|i| i as f32).collect(),
            vocab: 3,
            parents: vec![ROOT, 0, 1, ROOT, 1, 3],
            confidence: vec![0.9, 0.8, 0.7, 0.5, 0.4, 0.3],
            confidence_kind: 0,
        };
        assert_eq!(p.chain_len(), 3);
        assert_eq!(p.input_parents(), vec![u32::MAX, 0, 1, 2, 0, 2, 4]);
        assert_eq!(p.dist(2), Some(&[6.0, 7.0, 8.0][..]));
        assert_eq!(p.dist(3), None);
        // Dropping node 1 drops 2 and 4 (its subtree); 5 stays under 3.
        let mut q = p.clone();
        q.retain_nodes(&[true, false, true, true, true, true]);
        assert_eq!(q.tokens, [10, 13, 15]);
        assert_eq!(q.parents, [ROOT, ROOT, 1]);
        assert_eq!(q.confidence, [0.9, 0.5, 0.3]);
        assert_eq!(q.dist_rows(), 1);
        // Cutting the chain after its first node drops 1, 2 and 4 but keeps 3 and 5.
        let mut c = p.clone();
        c.keep_chain_prefix(1);
        assert_eq!(c.tokens, [10, 13, 15]);
        assert_eq!(c.parents, [ROOT, ROOT, 1]);
        assert_eq!(c.dist_rows(), 1);
        p.to_chain();
        assert!(!p.is_tree());
        assert_eq!(p.tokens, [10, 11, 12]);
        assert_eq!(p.confidence, [0.9, 0.8, 0.7]);
        assert_eq!(p.dist_rows(), 3);
        assert_eq!(p.parents_or_chain(), [ROOT, 0, 1]);
        p.keep_chain_prefix(2);
        assert_eq!(p.tokens, [10, 11]);
        assert_eq!((p.dist_rows(), p.confidence.len()), (2, 2));
    }
}
