//! What the scheduler keeps between rounds: its configuration, the queue, the active
//! sequences, the governor's cost model and estimates, and its counters.

use std::collections::VecDeque;

use kameo::actor::ActorRef;
use kameo::Actor;

use super::round_clock::Overlap;
use super::sequence::{Queued, Sequence};
use crate::engine::cache_manager::CacheManager;
use crate::engine::drafter::Drafter;
use crate::engine::governor::{
    AcceptanceRate, ConfidenceRates, CostModel, GovernorConfig, SpeedupEstimate,
};
use crate::engine::messages::Step;
use crate::engine::request::FinishReason;
use crate::engine::settings::LiveSettings;
use crate::engine::verifier::Verifier;
use crate::telemetry;

/// Weight of the past in the server-wide acceptance rate, per drafted token (≈ the last few
/// hundred drafts of any request).
pub(super) const POOLED_ACCEPTANCE_DECAY: f64 = 0.995;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_seqs: usize,
    pub max_queue: usize,
    pub prefill_chunk: usize,
    pub pipeline: bool,
    pub context_len: usize,
    /// The largest γ any round may draft (KV headroom is reserved for it).
    pub max_gamma: usize,
    /// Retain finished sequences' slots and start prompts from cached prefixes.
    pub prefix_cache: bool,
    pub governor: GovernorConfig,
}

/// How a sequence's round ended it: finished for a reason, or failed with a message.
pub(super) type Ending = (u64, Result<FinishReason, String>);

#[derive(Actor)]
pub struct Scheduler {
    pub(super) cfg: SchedulerConfig,
    pub(super) verifier: ActorRef<Verifier>,
    pub(super) drafter: Option<ActorRef<Drafter>>,
    pub(super) cache: ActorRef<CacheManager>,
    pub(super) settings: LiveSettings,
    pub(super) queue: VecDeque<Queued>,
    pub(super) active: Vec<Sequence>,
    pub(super) next_id: u64,
    pub(super) step_scheduled: bool,
    pub(super) costs: CostModel,
    pub(super) speedup: SpeedupEstimate,
    /// Every request's drafts together: where a new request's governor starts.
    pub(super) acceptance: AcceptanceRate,
    /// How often chains' nodes and trees' alternatives stand when tried, by the drafter's
    /// confidence.
    pub(super) chain_rates: ConfidenceRates,
    pub(super) branch_rates: ConfidenceRates,
    pub(super) rounds: u64,
    pub(super) overlap: Overlap,
    /// Next rounds drafted during a verification within a request, and how many were used.
    pub(super) drafted_ahead: u64,
    pub(super) ahead_used: u64,
    pub(super) prefilled_tokens: u64,
}

impl Scheduler {
    pub fn new(
        cfg: SchedulerConfig,
        verifier: ActorRef<Verifier>,
        drafter: Option<ActorRef<Drafter>>,
        cache: ActorRef<CacheManager>,
        settings: LiveSettings,
        costs: CostModel,
    ) -> Self {
        Self {
            cfg,
            verifier,
            drafter,
            cache,
            settings,
            queue: VecDeque::new(),
            active: Vec::new(),
            next_id: 0,
            step_scheduled: false,
            costs,
            speedup: SpeedupEstimate::default(),
            acceptance: AcceptanceRate::new(0.5),
            chain_rates: ConfidenceRates::default(),
            branch_rates: ConfidenceRates::default(),
            rounds: 0,
            overlap: Overlap::default(),
            drafted_ahead: 0,
            ahead_used: 0,
            prefilled_tokens: 0,
        }
    }

    pub(super) fn schedule_step(&mut self, me: &ActorRef<Self>) {
        let has_work = !self.active.is_empty() || !self.queue.is_empty();
        if has_work && !self.step_scheduled {
            self.step_scheduled = true;
            // The mailbox only ever holds one Step, so this cannot fill it.
            let _ = me.tell(Step).try_send();
        }
    }
}

pub(super) fn record_finished(reason: &'static str, s: &Sequence) {
    telemetry::record_finished(
        reason,
        s.spec.draft_tokens,
        s.spec.accepted_tokens,
        s.arrived.elapsed().as_secs_f64(),
    );
}
