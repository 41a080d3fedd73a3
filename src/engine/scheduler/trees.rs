//! Shaping a round's proposals by price, after drafting and before the target forward: a
//! chain is cut where its next tokens, by the drafter's confidence in each, are not worth their
//! rows (`confidence_pricing`); a token tree keeps only the alternatives the governor prices as
//! paying (or only its chain where a tree cannot be verified). After the forward, what the
//! round tried teaches the governor how often nodes stand, by confidence.

use super::state::Scheduler;
use crate::engine::gamma::GammaPolicy;
use crate::engine::governor::{
    expected_tokens, keep_alternatives, keep_chain, RoundPrice, TreeOffer,
};
use crate::engine::messages::{TargetItem, TargetOutcome, TargetWork};
use crate::engine::speculation_settings::SpeculationSettings;

impl Scheduler {
    /// Shapes the round's proposals (see the module doc). A request with a fixed γ keeps what
    /// it drafted. The round's price starts from every other token of the forward (chains the
    /// governor does not reshape at their expected tokens from α) and the drafting's price
    /// (the cost model's, not the clock's, so a decision depends on prices alone); each shaped
    /// sequence then adds the nodes that beat the round's rate so far.
    pub(super) fn shape_proposals(&self, items: &mut [TargetItem], live: &SpeculationSettings) {
        if !items.iter().any(|it| self.is_shaped(it)) {
            return;
        }
        let drafting: Vec<usize> = items
            .iter()
            .filter(|it| it.work == TargetWork::Verify && it.tokens.len() > 1)
            .map(|it| it.proposal.chain_len())
            .collect();
        let steps = drafting.iter().copied().max().unwrap_or(0);
        let draft_seconds = self
            .learned
            .costs
            .draft_seconds(steps, drafting.len())
            .unwrap_or(0.0);
        let mut round = self.round_price(items, draft_seconds);
        for it in items.iter_mut().filter(|it| self.is_shaped(it)) {
            self.shape_one(it, &mut round, draft_seconds, live);
        }
    }

    /// Whether a request reshapes its proposals (not with a fixed γ) and prices its chain by
    /// its drafter's confidences; `None` for a sequence no longer running.
    fn prices(&self, it: &TargetItem) -> Option<(bool, bool)> {
        let s = self.active.iter().find(|s| s.id == it.seq)?;
        let adaptive = !matches!(s.request.speculative.gamma, GammaPolicy::Fixed(_));
        let pricing = adaptive
            && it.lenience.is_exact()
            && s.round.confidence_pricing
            && it.proposal.confidence.len() >= it.proposal.chain_len();
        Some((adaptive, pricing))
    }

    fn is_shaped(&self, it: &TargetItem) -> bool {
        it.work == TargetWork::Verify
            && (it.proposal.is_tree() || self.prices(it).is_some_and(|(_, p)| p))
    }

    fn alpha_of(&self, seq: u64) -> f64 {
        self.active
            .iter()
            .find(|s| s.id == seq)
            .map_or(0.0, |s| s.governor.alpha())
    }

    /// The round's price before any shaped sequence adds its nodes: a row for each shaped
    /// sequence's fed token, every other item's rows, and the drafting.
    fn round_price(&self, items: &[TargetItem], draft_seconds: f64) -> Option<RoundPrice> {
        let (mut width, mut tokens) = (0, 0.0);
        for it in items {
            if self.is_shaped(it) {
                width += 1;
                tokens += 1.0;
            } else {
                width += it.tokens.len();
                if it.work == TargetWork::Verify {
                    tokens += expected_tokens(self.alpha_of(it.seq), it.tokens.len() - 1);
                }
            }
        }
        self.learned
            .costs
            .verify_seconds(width)
            .map(|v| RoundPrice {
                tokens,
                seconds: v + draft_seconds,
                width,
            })
    }

    /// One shaped sequence's proposal: its chain cut by price (or kept whole and priced at its
    /// rates), then a tree's alternatives kept where they pay; `round` grows by what it keeps.
    fn shape_one(
        &self,
        it: &mut TargetItem,
        round: &mut Option<RoundPrice>,
        draft_seconds: f64,
        live: &SpeculationSettings,
    ) {
        let (adaptive, pricing) = self.prices(it).unwrap_or((false, false));
        if !it.lenience.is_exact() {
            it.proposal.to_chain();
        }
        let p = &it.proposal;
        let chain = p.chain_len();
        let kind = p.confidence_kind;
        let chain_accept: Vec<f64> = if pricing {
            p.confidence[..chain]
                .iter()
                .map(|&c| self.learned.chain_rates.rate(kind, c))
                .collect()
        } else {
            vec![self.alpha_of(it.seq); chain]
        };
        let kept = match round.as_mut() {
            Some(r) if pricing => {
                let floor = live.gamma_min.get().min(chain);
                keep_chain(&chain_accept, floor, r, &self.learned.costs)
            }
            Some(r) => {
                r.tokens += expected_tokens(self.alpha_of(it.seq), chain) - 1.0;
                r.width += chain;
                r.seconds = self
                    .learned
                    .costs
                    .verify_seconds(r.width)
                    .map_or(r.seconds, |v| v + draft_seconds);
                Some(chain)
            }
            None => None,
        };
        match kept {
            // Nothing of the chain pays: a plain step (alternatives without their chain are
            // not offered on their own).
            Some(0) => it.proposal.clear(),
            Some(k) => it.proposal.keep_chain_prefix(k),
            None => {}
        }
        if it.proposal.is_tree() && adaptive {
            let p = &it.proposal;
            let keep = round.as_mut().and_then(|r| {
                let offer = TreeOffer {
                    parents: &p.parents,
                    chain_len: p.chain_len(),
                    confidence: &p.confidence,
                    kind: p.confidence_kind,
                    chain_accept: &chain_accept,
                };
                keep_alternatives(&offer, &self.learned.branch_rates, r, &self.learned.costs)
            });
            match keep {
                Some(keep) => it.proposal.retain_nodes(&keep),
                None => it.proposal.to_chain(),
            }
        }
        it.tokens.truncate(1);
        it.tokens.extend_from_slice(&it.proposal.tokens);
        it.parents = it.proposal.input_parents();
    }

    /// What a round tried goes into the acceptance estimates by confidence: the chain's nodes
    /// and a tree's alternatives.
    pub(super) fn learn_from_round(&mut self, o: &TargetOutcome) {
        for &(confidence, accepted) in &o.tried_chain {
            self.learned
                .chain_rates
                .record(o.confidence_kind, confidence, accepted);
        }
        if let Some(walk) = &o.tree {
            for &(confidence, accepted) in &walk.tried_branches {
                self.learned
                    .branch_rates
                    .record(walk.kind, confidence, accepted);
            }
        }
    }
}
