//! Acceptance over a token tree: multi-draft speculative sampling (SpecInfer, Miao et al. 2024;
//! docs/speculation.md, "Token trees"), as pure code.
//!
//! A drafter may propose several continuations at once, packed into a prefix tree whose nodes
//! the target verifies in one forward. The walk starts at the root (the last sampled token, not
//! a draft) with the target's row there. At each reached node its children are tried in order:
//! child x, proposed from the distribution q_k, is accepted with probability
//! `min(1, p(x)/q_k(x))` where p is the current target distribution; after a rejection
//! `p ← norm(max(p − q_k, 0))` and the next child is tried against that. An accepted child
//! becomes the node reached and the walk goes on with its own target row; when every child is
//! rejected (or there are none), the next token is drawn from what remains of p.
//!
//! Why it is exact for any proposals: trying one child is one step of speculative sampling
//! against the current p, which emits x with probability `min(p, q_k)(x)` and otherwise
//! continues with `norm(max(p − q_k, 0))`, so `min(p, q_k) + max(p − q_k, 0) = p` at every
//! step, whatever the next child is (drawn from a q of its own, or a point mass chosen in
//! advance, `q_k = δ(x)`). So the first token is distributed as p, and by the same argument each
//! later one as the target's row after it. The tests prove it by running this code down every
//! branch of its random choices (exact enumeration) for one to four drafts from different
//! proposals, mixed point masses, and trees two levels deep.
//!
//! Greedy decoding walks to the child equal to the target's argmax (the lowest index among
//! ties), so the accepted path is the longest one plain greedy decoding would emit.
//!
//! Trees are verified at lenience 1 only: lenience is a chain-only relaxation.

use super::argmax;
use super::rejection::{
    acceptance_probability, check_distribution, check_target_shape, check_vocab, residual,
    DraftDist, RoundChoices, SpecError,
};

/// The parent of a node that hangs from the root (the round's first, already sampled, token):
/// the model's own sentinel for a tree input's first token.
pub use crate::model::TREE_ROOT;

/// The parent of a chain's node `i`: the node before it, or [`TREE_ROOT`] for the first.
pub fn chain_parent(i: usize) -> u32 {
    if i == 0 {
        TREE_ROOT
    } else {
        i as u32 - 1
    }
}

/// A draft tree: node `i` proposes `tokens[i]` after its parent `parents[i]`, [`TREE_ROOT`] or an
/// earlier node (so the nodes are in a topological order, and the target's rows can be
/// computed in one forward over them in this order).
#[derive(Clone, Copy, Debug)]
pub struct DraftTree<'a> {
    pub tokens: &'a [u32],
    pub parents: &'a [u32],
}

impl DraftTree<'_> {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Checks the shape: one parent per node, each the root or an earlier node.
    pub fn check(&self) -> Result<(), SpecError> {
        if self.parents.len() != self.tokens.len() {
            return Err(SpecError::RowCount {
                what: "tree parent",
                expected: self.tokens.len(),
                got: self.parents.len(),
            });
        }
        for (i, &p) in self.parents.iter().enumerate() {
            if p != TREE_ROOT && p as usize >= i {
                return Err(SpecError::TreeOrder { node: i, parent: p });
            }
        }
        Ok(())
    }

    /// The children of `node` (`TREE_ROOT` for the root's), in order.
    pub fn children(&self, node: u32) -> impl Iterator<Item = usize> + '_ {
        self.parents
            .iter()
            .enumerate()
            .filter(move |&(_, &p)| p == node)
            .map(|(i, _)| i)
    }

    /// Depth of each node: 1 for a child of the root.
    pub fn depths(&self) -> Vec<usize> {
        let mut d: Vec<usize> = Vec::with_capacity(self.len());
        for &p in self.parents {
            d.push(if p == TREE_ROOT { 1 } else { d[p as usize] + 1 });
        }
        d
    }

    /// Node `i` and its ancestors, from the root's child down to `i`.
    pub fn path_to(&self, i: usize) -> Vec<usize> {
        let mut path = vec![i];
        let mut at = self.parents[i];
        while at != TREE_ROOT {
            path.push(at as usize);
            at = self.parents[at as usize];
        }
        path.reverse();
        path
    }
}

/// What a tree walk decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeOutcome {
    /// The accepted nodes, from the root's child down: their tokens are emitted in this order.
    pub path: Vec<usize>,
    /// The token drawn where the walk stopped (a correction, or a bonus at a leaf).
    pub next_token: u32,
    /// True when the walk stopped at a node with no children (nothing was rejected there).
    pub bonus: bool,
    /// Every node the walk tried, accepted or not: a child of a reached node, tried before the
    /// walk moved on or stopped (for the governor's estimate of how often a branch pays).
    pub tried: Vec<usize>,
}

/// The target's row for a node: row 0 is the root's, row `i + 1` node `i`'s.
fn row_of(node: u32) -> usize {
    if node == TREE_ROOT {
        0
    } else {
        node as usize + 1
    }
}

fn check_rows(tree: &DraftTree, p: &[&[f32]]) -> Result<usize, SpecError> {
    tree.check()?;
    check_target_shape(tree.tokens, p)
}

/// Greedy walk (temperature 0): from the root, follow the child whose token is the target's
/// argmax at the node reached; the next token is the argmax where no child matches. `p` holds
/// one row per node plus the root's first (raw or processed logits: only their order counts).
pub fn accept_tree_greedy(tree: &DraftTree, p: &[&[f32]]) -> Result<TreeOutcome, SpecError> {
    check_rows(tree, p)?;
    let mut out = TreeOutcome {
        path: Vec::new(),
        next_token: 0,
        bonus: false,
        tried: Vec::new(),
    };
    let mut at = TREE_ROOT;
    'walk: loop {
        let row = p[row_of(at)];
        if let Some(token) = row.iter().position(|v| v.is_nan() || *v == f32::INFINITY) {
            return Err(SpecError::InvalidValue {
                what: "target distribution p",
                row: row_of(at),
                token,
                value: row[token],
                expected: "values must not be NaN or +inf",
            });
        }
        let best = argmax(row)?;
        let mut any = false;
        for c in tree.children(at) {
            any = true;
            out.tried.push(c);
            if tree.tokens[c] == best {
                out.path.push(c);
                at = c as u32;
                continue 'walk;
            }
        }
        out.next_token = best;
        out.bonus = !any;
        return Ok(out);
    }
}

/// Sampled walk (lenience 1): `q[i]` is what node `i` was proposed from (a full distribution,
/// or a point mass for a token chosen deterministically), `p` the target's processed rows (the
/// root's first). Random choices come from `choices` (the request's RNG when serving).
/// `scratch` and `next` hold the current residual, so a walk allocates only its outcome.
pub fn accept_tree_sampled(
    tree: &DraftTree,
    q: &[DraftDist],
    p: &[&[f32]],
    choices: &mut impl RoundChoices,
    scratch: &mut Vec<f32>,
    next: &mut Vec<f32>,
) -> Result<TreeOutcome, SpecError> {
    let vocab = check_rows(tree, p)?;
    if q.len() != tree.len() {
        return Err(SpecError::RowCount {
            what: "draft distribution q",
            expected: tree.len(),
            got: q.len(),
        });
    }
    for (row, dist) in p.iter().enumerate() {
        check_distribution("target distribution p", row, dist, true)?;
    }
    for (row, d) in q.iter().enumerate() {
        if let DraftDist::Full(dist) = *d {
            check_vocab("draft distribution q", row, dist, vocab)?;
            check_distribution("draft distribution q", row, dist, false)?;
        }
    }
    let mut out = TreeOutcome {
        path: Vec::new(),
        next_token: 0,
        bonus: false,
        tried: Vec::new(),
    };
    let mut at = TREE_ROOT;
    'walk: loop {
        // The current distribution: the node's row until a child is rejected, then the
        // residual in `scratch`.
        let mut residual_held = false;
        let mut any = false;
        for c in tree.children(at) {
            any = true;
            out.tried.push(c);
            let x = tree.tokens[c];
            let cur: &[f32] = if residual_held {
                scratch
            } else {
                p[row_of(at)]
            };
            let q_x = match q[c] {
                DraftDist::Full(d) => d[x as usize],
                DraftDist::PointMass => 1.0,
            };
            if choices.accept(acceptance_probability(cur[x as usize], q_x, 1.0)) {
                out.path.push(c);
                at = c as u32;
                continue 'walk;
            }
            residual(cur, q[c], x, 1.0, next);
            std::mem::swap(scratch, next);
            residual_held = true;
        }
        let cur: &[f32] = if residual_held {
            scratch
        } else {
            p[row_of(at)]
        };
        out.next_token = choices.draw(cur);
        out.bonus = !any;
        return Ok(out);
    }
}

#[cfg(test)]
mod tests;
