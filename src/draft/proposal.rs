//! What a drafter proposes for one round: a chain of drafted tokens, or a token tree, with the
//! drafter's distributions and confidence where it has them, and the edits the governor makes
//! to it before verification.

use crate::sampling::tree::{chain_parent, TREE_ROOT};

/// Drafted tokens and, for drafters that sample, their distributions (`vocab` values per token).
///
/// A chain (`parents` empty): each token follows the one before it. A tree: `parents[i]` is
/// node `i`'s parent ([`TREE_ROOT`] or an earlier node). A tree's first nodes are its main chain
/// (node `i` the child of node `i − 1`), the chain a drafter would have proposed alone; the
/// nodes after it are alternatives branching off it (or off each other). Distributions, when
/// there are any, belong to the main chain's nodes; an alternative is a point mass (a token
/// chosen deterministically, such as a runner-up of the drafter or another earlier match).
#[derive(Clone, Debug, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Flat `rows * vocab` probabilities for the first `rows` nodes; empty for point masses.
    pub dists: Vec<f32>,
    /// The drafts are the drafter's likeliest tokens under sampling, verified as point masses
    /// (`SampledDrafts::Likeliest`); `dists` then holds the distributions they were the
    /// likeliest of, read only to measure what drawing from them would have kept.
    pub point_masses: bool,
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
        self.point_masses = false;
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
                    p == TREE_ROOT
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
        let mut new_index = vec![TREE_ROOT; self.tokens.len()];
        let (mut tokens, mut parents, mut confidence) = (Vec::new(), Vec::new(), Vec::new());
        let rows = self.dist_rows();
        let mut kept_rows = 0;
        for i in 0..self.tokens.len() {
            let parent = self.parents[i];
            let parent_kept = parent == TREE_ROOT || new_index[parent as usize] != TREE_ROOT;
            if !(keep[i] && parent_kept) {
                continue;
            }
            new_index[i] = tokens.len() as u32;
            tokens.push(self.tokens[i]);
            parents.push(if parent == TREE_ROOT {
                TREE_ROOT
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

    /// Draft distribution of token `i` as the acceptance rule reads it, or `None` for a point
    /// mass.
    pub fn dist(&self, i: usize) -> Option<&[f32]> {
        if self.point_masses {
            return None;
        }
        self.drawn_from(i)
    }

    /// The distribution token `i` was drawn from or was the likeliest of, if the drafter had
    /// one.
    pub fn drawn_from(&self, i: usize) -> Option<&[f32]> {
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
                    .map(|&p| if p == TREE_ROOT { 0 } else { p + 1 }),
            )
            .collect()
    }
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
        use super::TREE_ROOT;
        // Main chain 0 → 1 → 2 (with rows), alternatives 3 (beside 0), 4 (beside 2), 5 (under 3).
        let mut p = Proposal {
            tokens: vec![10, 11, 12, 13, 14, 15],
            dists: (0..9).map(|i| i as f32).collect(),
            vocab: 3,
            parents: vec![TREE_ROOT, 0, 1, TREE_ROOT, 1, 3],
            confidence: vec![0.9, 0.8, 0.7, 0.5, 0.4, 0.3],
            confidence_kind: 0,
            point_masses: false,
        };
        assert_eq!(p.chain_len(), 3);
        assert_eq!(p.input_parents(), vec![u32::MAX, 0, 1, 2, 0, 2, 4]);
        assert_eq!(p.dist(2), Some(&[6.0, 7.0, 8.0][..]));
        assert_eq!(p.dist(3), None);
        // Likeliest tokens keep their rows for measuring, but the rule reads point masses.
        let likeliest = Proposal {
            point_masses: true,
            ..p.clone()
        };
        assert_eq!(likeliest.dist(0), None);
        assert_eq!(likeliest.drawn_from(2), Some(&[6.0, 7.0, 8.0][..]));
        // Dropping node 1 drops 2 and 4 (its subtree); 5 stays under 3.
        let mut q = p.clone();
        q.retain_nodes(&[true, false, true, true, true, true]);
        assert_eq!(q.tokens, [10, 13, 15]);
        assert_eq!(q.parents, [TREE_ROOT, TREE_ROOT, 1]);
        assert_eq!(q.confidence, [0.9, 0.5, 0.3]);
        assert_eq!(q.dist_rows(), 1);
        // Cutting the chain after its first node drops 1, 2 and 4 but keeps 3 and 5.
        let mut c = p.clone();
        c.keep_chain_prefix(1);
        assert_eq!(c.tokens, [10, 13, 15]);
        assert_eq!(c.parents, [TREE_ROOT, TREE_ROOT, 1]);
        assert_eq!(c.dist_rows(), 1);
        p.to_chain();
        assert!(!p.is_tree());
        assert_eq!(p.tokens, [10, 11, 12]);
        assert_eq!(p.confidence, [0.9, 0.8, 0.7]);
        assert_eq!(p.dist_rows(), 3);
        assert_eq!(p.parents_or_chain(), [TREE_ROOT, 0, 1]);
        p.keep_chain_prefix(2);
        assert_eq!(p.tokens, [10, 11]);
        assert_eq!((p.dist_rows(), p.confidence.len()), (2, 2));
    }
}
