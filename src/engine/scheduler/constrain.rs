//! A constrained sequence's part of a round, after its proposal is shaped and before the
//! target forward: drafts checked against the grammar, the grammar's forced tokens proposed as
//! drafts, and the mask of every row the target computes for it.
//!
//! Exactness: the target's distribution at each row is masked by the grammar state after the
//! tokens before it, exactly as plain constrained decoding masks it, and the acceptance rule
//! runs on the masked rows. A draft model drafts from its masked distribution
//! (`DraftItem::grammar`), so its drafts are allowed. A chain is cut at its first forbidden
//! token only where the cut is a function of deterministic drafts (greedy requests, prompt
//! lookup's point masses); a chain sampled without the mask (a guess drafted ahead past
//! forbidden drafts) keeps its forbidden tokens, which the rule rejects with certainty
//! (cutting on the draws would change what the acceptance rule was proven for). Forced tokens
//! are point-mass drafts, deterministic given the grammar state; under sampling they always
//! replace the drafter's chain (keeping a drafted chain only when it agreed with them would
//! select on the draws), under greedy decoding a chain that starts with them is kept.

use super::state::Scheduler;
use crate::engine::acceptance::RowGrammar;
use crate::engine::error::EngineError;
use crate::engine::gamma::{gamma_cap, RoundGamma};
use crate::engine::messages::{Failure, TargetItem, TargetWork};
use crate::telemetry;

impl Scheduler {
    /// Constrains the round's items of constrained sequences (see the module doc). Returns the
    /// sequences whose grammar failed, with why (their items are taken out of the round), and
    /// the seconds the grammars took.
    pub(super) fn constrain_items(
        &mut self,
        items: &mut Vec<TargetItem>,
    ) -> (Vec<(u64, Failure)>, f64) {
        let mut failed = Vec::new();
        let mut seconds = 0.0;
        let (context_len, gamma_limit) = (self.cfg.context_len, self.cfg.gamma_limit);
        for it in items.iter_mut() {
            let Some(s) = self.active.iter_mut().find(|s| s.id == it.seq) else {
                continue;
            };
            s.round_forced = 0;
            if s.constraint.is_none() || it.work == TargetWork::PrefillChunk {
                continue;
            }
            let forcing = match it.work {
                TargetWork::Verify => {
                    let cap = gamma_cap(s.context.len() - 1, context_len, s.remaining());
                    match s.round.gamma.capped(cap) {
                        RoundGamma::Plain => 0,
                        _ => cap.min(gamma_limit),
                    }
                }
                _ => 0,
            };
            let c = s.constraint.as_mut().expect("checked above");
            let started = std::time::Instant::now();
            let result = (|| -> Result<usize, EngineError> {
                if it.work == TargetWork::PrefillLast {
                    it.grammar = RowGrammar::Masks(vec![c.mask()?]);
                    return Ok(0);
                }
                let p = &mut it.proposal;
                p.to_chain();
                let sampled_chain = !it.params.is_greedy() && p.dist(0).is_some();
                if !sampled_chain {
                    let valid = c.valid_prefix(&p.tokens);
                    p.keep_chain_prefix(valid);
                }
                let mut forced = if forcing > 0 { c.forced() } else { Vec::new() };
                forced.truncate(forcing);
                let keep_drafts = it.params.is_greedy() && p.tokens.starts_with(&forced);
                if !forced.is_empty() && !keep_drafts {
                    p.clear();
                    p.tokens = forced.clone();
                }
                it.tokens.truncate(1);
                it.tokens.extend_from_slice(&p.tokens);
                it.parents.clear();
                // Exact greedy rows need a row's mask only where the grammar refuses its
                // argmax: the verifier checks that on a fork, after the forward.
                let checked =
                    it.params.is_greedy() && it.lenience.is_exact() && it.logprobs.is_none();
                it.grammar = if checked {
                    RowGrammar::Checked(Box::new(c.fork()))
                } else {
                    let mut masks = Vec::with_capacity(p.tokens.len() + 1);
                    c.masks_along(&p.tokens, &mut masks)?;
                    RowGrammar::Masks(masks)
                };
                Ok(forced.len())
            })();
            let took = started.elapsed().as_secs_f64();
            seconds += took;
            telemetry::record_constraint_work(took);
            match result {
                Ok(forced) => s.round_forced = forced,
                Err(e) => failed.push((it.seq, Failure::of_grammar(&e))),
            }
        }
        items.retain(|it| !failed.iter().any(|(seq, _)| *seq == it.seq));
        (failed, seconds)
    }
}
