//! The scheduler's side of drafting: γ for each sequence from the governor's plan, the draft
//! requests it sends, and what comes back (drafts kept with their sequences, costs recorded).

use std::collections::HashMap;

use super::state::Scheduler;
use crate::engine::error::EngineError;
use crate::engine::governor::{forecast_round, plan_round, Candidate, RoundForecast};
use crate::engine::messages::{DraftBatch, DraftBatchResult, DraftItem, DraftOutcome};
use crate::engine::settings::SpeculationSettings;

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
        self.costs.record_draft(
            t.step_seconds,
            t.first_step_seconds,
            t.steps,
            drafts.outcomes.len(),
        );
        self.costs
            .record_catch_up(t.catch_up_seconds, t.catch_up_tokens);
        for o in drafts.outcomes {
            if held.iter().any(|&(seq, _)| seq == o.seq) {
                kept.insert(o.seq, o);
                continue;
            }
            let Some(s) = self.active.iter_mut().find(|s| s.id == o.seq) else {
                continue;
            };
            s.draft_rng = o.rng;
            s.drafter_seen = s.context.len();
            // The drafter took the features the request carried.
            s.features.clear();
            // A drafter failure costs this round's speculation, not the request.
            s.pending = o.proposal.ok();
        }
        (t.step_seconds + t.catch_up_seconds, kept)
    }

    /// γ for each sequence in `which` (indices into `active`) for one round, with `base_width`
    /// other tokens in the same target forward, and what the plan is expected to cost.
    pub(super) fn plan(
        &self,
        which: &[usize],
        base_width: usize,
        live: &SpeculationSettings,
    ) -> (Vec<usize>, Option<RoundForecast>) {
        let has_drafter = self.drafter.is_some();
        let candidates: Vec<Candidate> = which
            .iter()
            .map(|&i| {
                self.active[i].candidate(has_drafter, self.cfg.context_len, live, self.queue.len())
            })
            .collect();
        let plan = plan_round(
            &candidates,
            base_width,
            &self.costs,
            self.cfg.governor.min_gain,
        );
        let forecast = forecast_round(&candidates, &plan, base_width, &self.costs);
        if has_drafter && !candidates.is_empty() {
            tracing::debug!(?candidates, ?plan, "plan");
        }
        (plan, forecast)
    }

    /// Draft requests for the sequences `which` that the plan gives a γ.
    pub(super) fn draft_items(
        &self,
        which: &[usize],
        plan: &[usize],
        live: &SpeculationSettings,
    ) -> Vec<DraftItem> {
        which
            .iter()
            .zip(plan)
            .filter(|&(_, &gamma)| gamma > 0)
            .map(|(&i, &gamma)| {
                self.active[i].draft_item(
                    gamma,
                    (self.cfg.context_len, self.cfg.max_gamma),
                    live,
                    self.queue.len(),
                )
            })
            .collect()
    }
}
