//! The Scheduler actor: admission, rounds, per-request state and streams, stop conditions and
//! retirement. It knows nothing of tensors: each round it asks the Drafter for drafts and the
//! Verifier for one batched target forward, then turns the outcomes into output events.
//!
//! Continuous batching: requests join (admitted from the queue) and leave (finished or
//! cancelled) between rounds; prompts are prefilled in chunks that cost at most what
//! `prefill_chunk` tokens cost at a context's start ([`prefill_price::PrefillPrice`]: a deep
//! token costs its attention too), inside the same forward as everyone else's decoding. With
//! `pipeline` on, decoding sequences are split into two groups: while the verifier checks one
//! group's drafts, the drafter drafts for the other (docs/speculation.md, "Pipelining"). While
//! only one group has decoding sequences (a lone request, say), it is verified every round, and the drafter drafts each sequence's next
//! round during the verification, assuming every draft stands and guessing the target's token
//! after them; the guess is used when both held and discarded otherwise. The round's shape is
//! decided by the pure [`round_plan::RoundPlan`]; γ by the governor, and a token tree's
//! alternatives by the governor's prices too (`trees`).

mod admission;
mod admitted;
mod constrain;
mod draft_coverage;
mod drafter_tokens;
mod drafting;
mod foresight;
mod outcome;
mod plain_run;
pub mod prefill_price;
mod remember;
mod round;
mod round_clock;
pub mod round_plan;
mod state;
mod trees;

use kameo::message::{Context, Message};

pub use draft_coverage::DraftCoverage;
pub use foresight::{DraftForesight, MatchStop};
pub use state::{Scheduler, SchedulerConfig};

use crate::engine::messages::{
    ClearPrefixCache, EngineEvent, Failure, GetSchedulerStats, SchedulerStats, Step,
};
use crate::telemetry;
use state::record_finished;

impl Message<Step> for Scheduler {
    type Reply = ();

    async fn handle(&mut self, _: Step, ctx: &mut Context<Self, Self::Reply>) {
        self.step_scheduled = false;
        if let Err(e) = self.step().await {
            // A failure of the whole forward (not of one request's sampling): every active
            // request is told, and its resources go back.
            for s in std::mem::take(&mut self.active) {
                record_finished("error", &s);
                let events = s.events.clone();
                self.retire(s, false).await;
                let _ = events.send(EngineEvent::Failed(Failure::engine(e.to_string())));
            }
        }
        telemetry::set_queue(self.active.len(), self.queue.len());
        self.liveness.round_ended(self.work());
        self.schedule_step(ctx.actor_ref());
    }
}

impl Message<ClearPrefixCache> for Scheduler {
    type Reply = ();

    async fn handle(&mut self, _: ClearPrefixCache, _: &mut Context<Self, Self::Reply>) {
        self.clear_prefix_cache().await;
    }
}

impl Message<GetSchedulerStats> for Scheduler {
    type Reply = SchedulerStats;

    async fn handle(
        &mut self,
        _: GetSchedulerStats,
        _: &mut Context<Self, Self::Reply>,
    ) -> SchedulerStats {
        SchedulerStats {
            active: self.active.len(),
            queued: self.queue.len(),
            rounds: self.counters.rounds,
            overlap_ratio: self.counters.overlap.ratio(),
            drafted_ahead: self.counters.drafted_ahead,
            ahead_used: self.counters.ahead_used,
            prefilled_tokens: self.counters.prefilled_tokens,
            queued_prompt_tokens: self
                .queue
                .iter()
                .map(|q| q.request.generation.prompt.len() as u64)
                .sum(),
            generated_tokens: self.counters.generated_tokens,
            plain_run_steps: self.counters.plain_run_steps,
        }
    }
}
