//! Token trees in a round: before the target forward, each tree proposal is cut to the
//! alternatives the governor prices as paying (or to its chain where a tree cannot be
//! verified), and after it, what the walks tried teaches the governor how often alternatives
//! stand.

use super::state::Scheduler;
use crate::engine::gamma::GammaPolicy;
use crate::engine::governor::{expected_tokens, keep_alternatives, RoundPrice, TreeOffer};
use crate::engine::messages::{TargetItem, TargetWork, TreeWalk};

impl Scheduler {
    /// Shapes the round's tree proposals: a request with a fixed γ keeps its tree as drafted;
    /// under the governor, alternatives are kept only while forecast to pay against the round
    /// (its chains' expected tokens over the forward's price and `draft_seconds` of drafting);
    /// a tree that keeps none, or whose lenience is not 1, is verified as its chain.
    pub(super) fn shape_trees(&self, items: &mut [TargetItem], draft_seconds: f64) {
        if !items.iter().any(|it| it.proposal.is_tree()) {
            return;
        }
        let alpha_of = |seq: u64| {
            self.active
                .iter()
                .find(|s| s.id == seq)
                .map_or(0.0, |s| s.governor.alpha())
        };
        let chain_width = |it: &TargetItem| 1 + it.proposal.chain_len().min(it.tokens.len() - 1);
        let width: usize = items
            .iter()
            .map(|it| {
                if it.proposal.is_tree() {
                    chain_width(it)
                } else {
                    it.tokens.len()
                }
            })
            .sum();
        let tokens: f64 = items
            .iter()
            .filter(|it| it.work == TargetWork::Verify)
            .map(|it| expected_tokens(alpha_of(it.seq), it.proposal.chain_len()))
            .sum();
        let mut round = self.costs.verify_seconds(width).map(|v| RoundPrice {
            tokens,
            seconds: v + draft_seconds,
            width,
        });
        for it in items.iter_mut().filter(|it| it.proposal.is_tree()) {
            let fixed = self
                .active
                .iter()
                .find(|s| s.id == it.seq)
                .is_some_and(|s| matches!(s.request.gamma, GammaPolicy::Fixed(_)));
            if !it.lenience.is_exact() {
                it.proposal.to_chain();
            } else if !fixed {
                let p = &it.proposal;
                let keep = round.as_mut().and_then(|r| {
                    let offer = TreeOffer {
                        parents: &p.parents,
                        chain_len: p.chain_len(),
                        confidence: &p.confidence,
                        alpha: alpha_of(it.seq),
                    };
                    keep_alternatives(&offer, &self.branch_rates, r, &self.costs)
                });
                match keep {
                    Some(keep) => it.proposal.retain_nodes(&keep),
                    None => it.proposal.to_chain(),
                }
                if it.proposal.tokens.len() == it.proposal.chain_len() {
                    it.proposal.to_chain();
                }
            }
            it.tokens.truncate(1);
            it.tokens.extend_from_slice(&it.proposal.tokens);
            it.parents = it.proposal.input_parents();
        }
    }

    /// What a tree round's walk tried goes into the alternatives' acceptance estimates.
    pub(super) fn learn_from_walk(&mut self, walk: &TreeWalk) {
        for &(confidence, accepted) in &walk.tried_branches {
            self.branch_rates.record(confidence, accepted);
        }
    }
}
