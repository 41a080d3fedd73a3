//! The Scheduler actor: admission, rounds, per-request state and streams, stop conditions and
//! retirement. It knows nothing of tensors: each round it asks the Drafter for drafts and the
//! Verifier for one batched target forward, then turns the outcomes into output events.
//!
//! Continuous batching: requests join (admitted from the queue) and leave (finished or
//! cancelled) between rounds; prompts are prefilled in chunks of at most `prefill_chunk` tokens
//! per round, inside the same forward as everyone else's decoding. With `pipeline` on, decoding
//! sequences are split into two groups: while the verifier checks one group's drafts, the
//! drafter drafts for the other (DESIGN.md §4). While only one group has decoding sequences (a
//! lone request, say), it is verified every round, and the drafter drafts each sequence's next
//! round during the verification, assuming every draft stands and guessing the target's token
//! after them; the guess is used when both held and discarded otherwise. The round's shape is
//! decided by the pure [`round_plan::RoundPlan`]; γ by the governor.

mod admission;
mod drafting;
mod outcome;
mod round_clock;
pub mod round_plan;
mod sequence;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use kameo::actor::ActorRef;
use kameo::message::{Context, Message};
use kameo::Actor;

use self::outcome::record_finished;
use self::round_clock::{log_forecast, Overlap, RoundTimes};
use self::round_plan::{RoundPlan, SeqState, TargetPart};
use self::sequence::{Queued, Sequence};
use super::cache_manager::CacheManager;
use super::drafter::Drafter;
use super::error::EngineError;
use super::governor::{AcceptanceRate, CostModel, GovernorConfig, SpeedupEstimate};
use super::messages::*;
use super::request::FinishReason;
use super::settings::LiveSettings;
use super::verifier::Verifier;
use crate::draft::DraftTiming;
use crate::telemetry;

/// Weight of the past in the server-wide acceptance rate, per drafted token (≈ the last few
/// hundred drafts of any request).
const POOLED_ACCEPTANCE_DECAY: f64 = 0.995;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub max_seqs: usize,
    pub max_queue: usize,
    pub prefill_chunk: usize,
    pub pipeline: bool,
    pub context_len: usize,
    /// The largest γ any round may draft (KV headroom is reserved for it).
    pub max_gamma: usize,
    pub governor: GovernorConfig,
}

/// How a sequence's round ended it: finished for a reason, or failed with a message.
type Ending = (u64, Result<FinishReason, String>);

#[derive(Actor)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    verifier: ActorRef<Verifier>,
    drafter: Option<ActorRef<Drafter>>,
    cache: ActorRef<CacheManager>,
    settings: LiveSettings,
    queue: VecDeque<Queued>,
    active: Vec<Sequence>,
    next_id: u64,
    step_scheduled: bool,
    costs: CostModel,
    speedup: SpeedupEstimate,
    /// Every request's drafts together: where a new request's governor starts.
    acceptance: AcceptanceRate,
    rounds: u64,
    overlap: Overlap,
    /// Next rounds drafted during a verification within a request, and how many were used.
    drafted_ahead: u64,
    ahead_used: u64,
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
            rounds: 0,
            overlap: Overlap::default(),
            drafted_ahead: 0,
            ahead_used: 0,
        }
    }

    fn schedule_step(&mut self, me: &ActorRef<Self>) {
        let has_work = !self.active.is_empty() || !self.queue.is_empty();
        if has_work && !self.step_scheduled {
            self.step_scheduled = true;
            // The mailbox only ever holds one Step, so this cannot fill it.
            let _ = me.tell(Step).try_send();
        }
    }

    /// One round: prefill chunks, drafting and one batched target forward.
    async fn step(&mut self) -> Result<(), EngineError> {
        self.retire_cancelled().await;
        self.admit().await;
        if self.active.is_empty() {
            return Ok(());
        }
        let live = self.settings.get();
        let lenience = live.lenience_for_queue(self.queue.len());
        telemetry::set_speculation(lenience.get(), live.gamma_gauge());
        let pipelined = self.cfg.pipeline && self.drafter.is_some();
        let states: Vec<SeqState> = self
            .active
            .iter()
            .map(|s| SeqState {
                decoding: s.decoding(),
                pending: s.pending.is_some(),
                group: s.group,
                prompt_left: s.prompt_len() - s.prefilled,
            })
            .collect();
        let shape = RoundPlan::build(&states, pipelined, self.cfg.prefill_chunk, self.rounds);
        let (plan_now, forecast) = self.plan(&shape.draft_now, shape.prefill_width, &live);
        let to_draft_now = self.draft_items(&shape.draft_now, &plan_now);
        let plan_ahead = self.plan(&shape.draft_ahead, 0, &live).0;
        let mut to_draft_ahead = self.draft_items(&shape.draft_ahead, &plan_ahead);

        let round_start = Instant::now();
        let mut draft_secs = 0.0;
        let mut draft_timing = DraftTiming::default();
        if !to_draft_now.is_empty() {
            let drafts = self.draft(to_draft_now).await?;
            draft_timing = drafts.timing;
            draft_secs = self.take_drafts(drafts, &[]).0;
        }

        // The target batch; sequences verified within their request draft their next round
        // during it (their γ: as many as this round drafted).
        let mut items = Vec::with_capacity(shape.target.len());
        let mut guesses: Vec<(u64, usize)> = Vec::new();
        for &(i, part) in &shape.target {
            let s = &mut self.active[i];
            items.push(match part {
                TargetPart::Verify => {
                    let item = s.verify_item(lenience);
                    let gamma = item.tokens.len() - 1;
                    if shape.within && gamma > 0 {
                        guesses.push((s.id, gamma));
                    }
                    item
                }
                TargetPart::Prefill { len } => s.prefill_item(len, lenience),
            });
        }
        for &(seq, gamma) in &guesses {
            let item = items
                .iter()
                .find(|i| i.seq == seq)
                .map(|i| i.tokens[1..].to_vec())
                .and_then(|drafts| {
                    let s = self.active.iter().find(|s| s.id == seq)?;
                    s.draft_ahead_item(&drafts, gamma, self.cfg.context_len)
                });
            to_draft_ahead.extend(item);
        }
        let decode_only = items.iter().all(|i| i.work == TargetWork::Verify);
        let width: usize = items.iter().map(|i| i.tokens.len()).sum();
        // What each sequence sent: its chunk length, or its drafts.
        let sent: HashMap<u64, (usize, Vec<u32>)> = items
            .iter()
            .map(|i| {
                let drafts = match i.work {
                    TargetWork::Verify => i.tokens[1..].to_vec(),
                    _ => Vec::new(),
                };
                (i.seq, (i.tokens.len(), drafts))
            })
            .collect();

        let wall = Instant::now();
        let verifier = self.verifier.clone();
        let target = async move {
            if items.is_empty() {
                return Ok(None);
            }
            verifier
                .ask(TargetBatch { items })
                .await
                .map(Some)
                .map_err(|e| EngineError::Worker(format!("verifier: {e}")))
        };
        let (target, ahead) = tokio::join!(target, self.draft(to_draft_ahead));
        let wall = wall.elapsed().as_secs_f64();
        // Drafts of a next round made during this one wait for its outcome.
        let (ahead_secs, mut guessed) = self.take_drafts(ahead?, &guesses);
        self.rounds += 1;
        let Some(result) = target? else {
            return Ok(());
        };
        self.overlap.record(wall, result.seconds, ahead_secs);
        draft_secs += ahead_secs;
        let times = RoundTimes {
            draft: draft_timing,
            verify_seconds: result.seconds,
            round_seconds: round_start.elapsed().as_secs_f64(),
        };
        if let (Some(f), false) = (forecast, pipelined) {
            if f.drafting > 0 {
                self.costs
                    .record_draft_forecast(f.draft, draft_timing.step_seconds);
            }
            log_forecast(&f, &times);
        }
        telemetry::record_step(
            times.round_seconds,
            result.seconds,
            (draft_secs > 0.0).then_some(draft_secs),
        );
        telemetry::set_overlap(self.overlap.ratio());
        // Decode-only forwards keep the verification costs current at today's context depths
        // and batch widths.
        if decode_only {
            self.costs.record_verify(result.seconds, width);
        }

        let mut ended = Vec::new();
        for outcome in result.outcomes {
            ended.extend(self.take_outcome(outcome, &sent, &mut guessed));
        }
        if let Some(x) = self.speedup.get() {
            telemetry::set_speedup_estimate(x);
        }
        for ending in ended {
            self.end_sequence(ending).await;
        }
        Ok(())
    }
}

impl Message<Step> for Scheduler {
    type Reply = ();

    async fn handle(&mut self, _: Step, ctx: &mut Context<Self, Self::Reply>) {
        self.step_scheduled = false;
        if let Err(e) = self.step().await {
            // A failure of the whole forward (not of one request's sampling): every active
            // request is told, and its resources go back.
            for s in std::mem::take(&mut self.active) {
                record_finished("error", &s);
                let _ = s.events.send(EngineEvent::Failed(e.to_string()));
                self.retire(s).await;
            }
        }
        telemetry::set_queue(self.active.len(), self.queue.len());
        self.schedule_step(ctx.actor_ref());
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
            rounds: self.rounds,
            overlap_ratio: self.overlap.ratio(),
            drafted_ahead: self.drafted_ahead,
            ahead_used: self.ahead_used,
        }
    }
}
