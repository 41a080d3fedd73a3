//! The scheduler's side of drafting: γ for each sequence from the governor's plan, the draft
//! requests it sends, and what comes back (drafts kept with their sequences, costs recorded).

use std::collections::HashMap;

use super::foresight::{DraftForesight, NextDraft};
use super::state::Scheduler;
use crate::engine::error::EngineError;
use crate::engine::governor::{
    forecast_round, plan_round, recheck_prices, solo_rate, Candidate, RoundForecast,
};
use crate::engine::messages::{DraftBatch, DraftBatchResult, DraftItem, DraftOutcome};
use crate::engine::speculation_settings::SpeculationSettings;

impl Scheduler {
    pub(super) async fn draft(
        &self,
        items: Vec<DraftItem>,
    ) -> Result<DraftBatchResult, EngineError> {
        match (&self.drafter, items.is_empty()) {
            (Some(d), false) => d
                .ask(DraftBatch { items })
                .await
                .map_err(|e| EngineError::Worker(format!("drafter: {e}"))),
            _ => Ok(DraftBatchResult::default()),
        }
    }

    /// Stores drafts with their sequences and the drafting cost in the cost model; returns the
    /// seconds drafting took, and the drafts of the sequences in `held` (drafted ahead within
    /// a request: they wait for the verification of the round before).
    pub(super) fn take_drafts(
        &mut self,
        drafts: DraftBatchResult,
        held: &[(u64, usize)],
    ) -> (f64, HashMap<u64, DraftOutcome>) {
        let t = drafts.timing;
        let mut kept = HashMap::new();
        // A round's own few tokens went into the first step, and are priced with it by how
        // many there were, where every plan sees them; a lag was caught up apart, priced per token the drafter took
        // in, as plans count a catch-up: in the drafter's tokens (`Sequence::catch_up`).
        self.learned.costs.record_draft(
            t.step_seconds,
            (t.first_step_seconds, t.first_step_tokens),
            t.steps,
            drafts.outcomes.len(),
        );
        self.learned
            .costs
            .record_catch_up(t.catch_up_seconds, t.catch_up_tokens);
        for o in drafts.outcomes {
            if held.iter().any(|&(seq, _)| seq == o.seq) {
                kept.insert(o.seq, o);
                continue;
            }
            let took_in = self.took_in(&o);
            let Some(s) = self.active.iter_mut().find(|s| s.id == o.seq) else {
                continue;
            };
            s.draft_rng = o.rng;
            if took_in {
                s.drafter_seen = s.context.len();
            }
            // The drafter took the features the request carried.
            s.features.clear();
            // A drafter failure costs this round's speculation, not the request.
            s.pending = o.proposal.ok();
        }
        (t.step_seconds + t.catch_up_seconds, kept)
    }

    /// Whether the drafter took in its sequence's context for `o`. A model (a head) behind
    /// prompt lookup takes nothing in while lookup's match is drafted: what it has seen stays
    /// where it last stepped, so its catch-up on lookup's copies is priced when it next drafts.
    fn took_in(&self, o: &DraftOutcome) -> bool {
        let copied = o.proposal.as_ref().is_ok_and(|p| p.confidence_kind > 0);
        !(copied
            && self
                .cfg
                .foresight
                .as_ref()
                .is_some_and(DraftForesight::has_model))
    }

    /// What each sequence in `which` (indices into `active`) would draft now, where the
    /// scheduler can tell (a drafter drafting prompt lookup's match first).
    pub(super) fn foresee(&self, which: &[usize], live: &SpeculationSettings) -> Vec<NextDraft> {
        let gamma_max = live.gamma_max.get().min(self.cfg.gamma_limit);
        which
            .iter()
            .map(|&i| match &self.cfg.foresight {
                Some(f) => {
                    let s = &self.active[i];
                    // A kind's worth: its solo rate (kind 0 pays its draft steps, and the
                    // catch-up on text its drafter has not seen, such as a long prompt; a
                    // match's copy pays neither), or its acceptance until the costs are
                    // measured.
                    let catch_up = self.learned.costs.catch_up_seconds(s.catch_up());
                    let depth = s.context.len() - 1;
                    f.next(&s.context, |k| {
                        let alpha = s.governor.alpha_of(Some(k));
                        let drafted = (k == 0).then_some(catch_up);
                        solo_rate(alpha, gamma_max, (drafted, depth), &self.learned.costs)
                            .unwrap_or(alpha)
                    })
                }
                None => NextDraft::Unknown,
            })
            .collect()
    }

    /// Counts the sequences' new context tokens in the drafter's tokens, where it reads another
    /// vocabulary, so that their catch-ups are priced by what it will take in.
    pub(super) fn count_drafter_tokens(&mut self) {
        let Some(coverage) = &self.cfg.coverage else {
            return;
        };
        for s in &mut self.active {
            s.drafter_tokens
                .extend(&s.context, |id| coverage.piece_count(id));
        }
    }

    /// γ for each sequence in `which` (indices into `active`) for one round, with `base_width`
    /// other tokens in the same target forward, and what the plan is expected to cost.
    /// `next`: what each would draft (`Unknown` for drafts made ahead of a verification, from
    /// a context not known yet).
    pub(super) fn plan(
        &self,
        (which, next): (&[usize], &[NextDraft]),
        base_width: usize,
    ) -> (Vec<usize>, Option<RoundForecast>) {
        let has_drafter = self.drafter.is_some();
        let candidates: Vec<Candidate> = which
            .iter()
            .zip(next)
            .map(|(&i, &next)| self.active[i].candidate(has_drafter, self.cfg.context_len, next))
            .collect();
        let mut plan = plan_round(
            &candidates,
            base_width,
            &self.learned.costs,
            self.cfg.governor.min_gain,
        );
        if has_drafter && recheck_prices(&candidates, &mut plan, self.learned.rounds_without_drafts)
        {
            tracing::debug!(
                rounds = self.learned.rounds_without_drafts,
                "nobody drafted for a while: one round drafts to measure the prices again"
            );
        }
        let forecast = forecast_round(&candidates, &plan, base_width, &self.learned.costs);
        if has_drafter && !candidates.is_empty() {
            tracing::debug!(?candidates, ?plan, "plan");
        }
        (plan, forecast)
    }

    /// Draft requests for the sequences `which` that the plan gives a γ (`next`: what each
    /// was planned to draft).
    pub(super) fn draft_items(
        &self,
        (which, next): (&[usize], &[NextDraft]),
        plan: &[usize],
        live: &SpeculationSettings,
    ) -> Vec<DraftItem> {
        which
            .iter()
            .zip(next)
            .zip(plan)
            .filter(|&(_, &gamma)| gamma > 0)
            .map(|((&i, &next), &gamma)| {
                let mut item = self.active[i].draft_item(
                    gamma,
                    (self.cfg.context_len, self.cfg.gamma_limit),
                    live,
                );
                // Planned as the model's draft: the drafter does not look for a match first.
                item.lookup = next != NextDraft::Kind(0);
                item
            })
            .collect()
    }
}
