//! What the scheduler keeps between rounds: its configuration, the queue, the active
//! sequences, the governor's cost model and estimates, and its counters.

use std::collections::VecDeque;
use std::sync::Arc;

use kameo::actor::ActorRef;
use kameo::Actor;

use super::admitted::{Queued, Sequence};
use super::draft_coverage::DraftCoverage;
use super::foresight::DraftForesight;
use super::round_clock::Overlap;
use crate::draft::DraftOrigins;
use crate::engine::cache_manager::CacheManager;
use crate::engine::drafter::Drafter;
use crate::engine::governor::{
    ConfidenceRates, CostModel, GovernorConfig, PooledAcceptance, Remembered, SpeedupEstimate,
};
use crate::engine::liveness::Liveness;
use crate::engine::messages::{Failure, Step};
use crate::engine::price_memory::MemoryFile;
use crate::engine::request::FinishReason;
use crate::engine::speculation_settings::LiveSpeculation;
use crate::engine::verifier::Verifier;
use crate::telemetry;

/// Weight of the past in the server-wide acceptance rate, per drafted token (≈ the last few
/// hundred drafts of any request).
pub(super) const POOLED_ACCEPTANCE_DECAY: f64 = 0.995;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_seqs: usize,
    pub prefill_chunk: usize,
    /// What a prompt token costs by its depth: a round's chunks together cost what
    /// `prefill_chunk` tokens cost at a context's start.
    pub prefill_price: super::prefill_price::PrefillPrice,
    pub pipeline: bool,
    pub context_len: usize,
    /// The largest γ any round may draft (KV headroom is reserved for it).
    pub gamma_limit: usize,
    /// Store finished sequences' texts in the prefix cache and start prompts from cached prefixes.
    pub prefix_cache: bool,
    pub governor: GovernorConfig,
    /// For a drafter that drafts prompt lookup's match first: the same lookup, run before
    /// planning, so each round is planned with the acceptance of the draft it will get.
    pub foresight: Option<DraftForesight>,
    /// For a drafter of another vocabulary: how much of a prompt it covers, which moves where
    /// a new request's acceptance of its drafts starts.
    pub coverage: Option<DraftCoverage>,
    /// What the drafter's drafts are called, for requests that ask who wrote each token.
    pub origins: DraftOrigins,
    /// Fault injection for tests: stop waking up after this many rounds.
    pub stall_after_rounds: Option<u64>,
}

/// How a sequence's round ended it: finished for a reason, or failed with a message.
pub(super) type Ending = (u64, Result<FinishReason, Failure>);

/// The governor's knowledge across requests (see [`Scheduler::learned`]).
pub(super) struct Learned {
    /// Measured prices of forwards, draft steps and catch-ups.
    pub(super) costs: CostModel,
    pub(super) speedup: SpeedupEstimate,
    /// Every request's drafts together, by kind: where a new request's governor starts.
    pub(super) acceptance: PooledAcceptance,
    /// How often chains' nodes and trees' alternatives stand when tried, by the drafter's
    /// confidence.
    pub(super) chain_rates: ConfidenceRates,
    pub(super) branch_rates: ConfidenceRates,
    /// Decoding rounds since anyone drafted (prices are re-measured after many: see
    /// `governor::recheck_prices`).
    pub(super) rounds_without_drafts: u64,
    /// Where what is learned here is kept for the next start (none: not kept).
    pub(super) memory: Option<MemoryFile>,
}

/// What rounds did, counted (see [`Scheduler::counters`]).
#[derive(Default)]
pub(super) struct RoundCounters {
    pub(super) rounds: u64,
    pub(super) overlap: Overlap,
    /// Next rounds drafted during a verification within a request, and how many were used.
    pub(super) drafted_ahead: u64,
    pub(super) ahead_used: u64,
    pub(super) prefilled_tokens: u64,
    /// Tokens emitted to requests, all together.
    pub(super) generated_tokens: u64,
    /// Rounds run as later steps of plain runs.
    pub(super) plain_run_steps: u64,
}

#[derive(Actor)]
pub struct Scheduler {
    pub(super) cfg: SchedulerConfig,
    pub(super) verifier: ActorRef<Verifier>,
    pub(super) drafter: Option<ActorRef<Drafter>>,
    pub(super) cache: ActorRef<CacheManager>,
    pub(super) settings: LiveSpeculation,
    pub(super) queue: VecDeque<Queued>,
    pub(super) active: Vec<Sequence>,
    pub(super) next_id: u64,
    pub(super) step_scheduled: bool,
    /// What the governor has learned across requests: every round's plan reads it, and
    /// every round's outcome updates it.
    pub(super) learned: Learned,
    /// What rounds did, for stats and metrics only: no plan reads them.
    pub(super) counters: RoundCounters,
    /// The heartbeat the watchdog and `/health` read.
    pub(super) liveness: Arc<Liveness>,
}

impl Scheduler {
    pub fn new(
        cfg: SchedulerConfig,
        verifier: ActorRef<Verifier>,
        drafter: Option<ActorRef<Drafter>>,
        cache: ActorRef<CacheManager>,
        settings: LiveSpeculation,
        (start, memory): (Remembered, Option<MemoryFile>),
        liveness: Arc<Liveness>,
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
            learned: Learned {
                costs: start.costs,
                speedup: SpeedupEstimate::default(),
                acceptance: start.acceptance,
                chain_rates: start.chain_rates,
                branch_rates: start.branch_rates,
                rounds_without_drafts: 0,
                memory,
            },
            counters: RoundCounters::default(),
            liveness,
        }
    }

    /// Sequences queued or running.
    pub(super) fn work(&self) -> usize {
        self.active.len() + self.queue.iter().map(|q| q.events.len()).sum::<usize>()
    }

    /// Wakes the scheduler for its next round while it has work. Its mailbox is unbounded
    /// (client traffic into it is bounded by the engine's capacity permits), so the wake-up
    /// is never refused for room; it fails only when the actor is stopping, and then nothing
    /// can run again: the liveness record says so.
    pub(super) fn schedule_step(&mut self, me: &ActorRef<Self>) {
        let has_work = !self.active.is_empty() || !self.queue.is_empty();
        // With a peer actor gone no round can make progress: waking up again would only spin.
        if !has_work || self.step_scheduled || self.liveness.is_dead() {
            return;
        }
        if self
            .cfg
            .stall_after_rounds
            .is_some_and(|n| self.counters.rounds >= n)
        {
            tracing::warn!(
                rounds = self.counters.rounds,
                "test fault: the scheduler no longer wakes up"
            );
            return;
        }
        match me.tell(Step).try_send() {
            Ok(()) => self.step_scheduled = true,
            Err(e) => {
                tracing::error!(error = %e, "the scheduler cannot wake itself; no round will run");
                self.liveness.mark_dead();
            }
        }
    }
}

impl Scheduler {
    /// Reports a failed message to another engine actor. One that is gone (it panicked or
    /// stopped) leaves an engine that cannot go on: the liveness record says so, and `/health`
    /// turns 503. A handler's own error is the request's problem, logged only.
    pub(super) fn report_peer_error<M, E: std::fmt::Debug>(
        &self,
        peer: &'static str,
        e: &kameo::error::SendError<M, E>,
    ) {
        use kameo::error::SendError;
        match e {
            SendError::ActorNotRunning(_) | SendError::ActorStopped => {
                tracing::error!(peer, "an engine actor is gone; the engine cannot go on");
                self.liveness.mark_dead();
            }
            SendError::HandlerError(err) => {
                tracing::warn!(peer, error = ?err, "an engine actor refused a request's cleanup")
            }
            _ => tracing::warn!(peer, "a message to an engine actor was not handled"),
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
