//! One round, as phases each a method here: settle who runs and under what settings, plan and
//! draft, build the target batch, verify it (with drafting ahead beside it), record what it
//! cost, then take the outcomes.

use std::collections::HashMap;
use std::time::Instant;

use super::foresight::NextDraft;
use super::round_clock::{log_forecast, RoundTimes};
use super::round_plan::{RoundPlan, SeqState, TargetPart};
use super::state::{Ending, Scheduler};
use crate::draft::DraftTiming;
use crate::engine::error::EngineError;
use crate::engine::governor::{round_gains, RoundForecast, RoundShare};
use crate::engine::messages::{
    DraftBatchResult, DraftItem, Failure, TargetBatch, TargetBatchResult, TargetItem,
    TargetOutcome, TargetWork,
};
use crate::engine::speculation_settings::SpeculationSettings;
use crate::telemetry;

/// The drafts a round asks for, planned.
struct Drafting {
    /// Drafted before the target forward and verified in it.
    now: Vec<DraftItem>,
    /// Drafted during the target forward, for a later round.
    ahead: Vec<DraftItem>,
    forecast: Option<RoundForecast>,
}

/// The round's target batch and what the round keeps of it to read the outcomes.
struct TargetRound {
    items: Vec<TargetItem>,
    /// Sequences whose next round is drafted during this forward, with its γ.
    guesses: Vec<(u64, usize)>,
    /// Sequences that ended before the forward (their grammar failed).
    ended: Vec<Ending>,
    mask_seconds: f64,
    /// Every item verifies drafts (no prompt chunk): the forward prices verification.
    decode_only: bool,
    /// Each item's `(tokens, context tokens before them)`: the forward's width, and the depths
    /// its rows attend over.
    rows: Vec<(usize, usize)>,
    /// What each sequence sent: its chunk length, or its drafts.
    sent: SentItems,
}

/// What each sequence of a round sent, by id: its chunk length, or its drafts.
type SentItems = HashMap<u64, (usize, Vec<u32>)>;

/// A round's outcome for each sequence, or the sequence's failure.
type Outcomes = [Result<TargetOutcome, (u64, Failure)>];

impl Scheduler {
    /// One round: prefill chunks, drafting and one batched target forward.
    pub(super) async fn step(&mut self) -> Result<(), EngineError> {
        self.retire_cancelled().await;
        self.admit().await;
        if self.active.is_empty() {
            return Ok(());
        }
        let live = self.resolve_round_settings();
        let pipelined = self.cfg.pipeline && self.drafter.is_some();
        let shape = self.shape_round(pipelined);
        let drafting = self.plan_drafts(&shape, &live);
        let round_start = Instant::now();
        let (mut draft_secs, mut draft_timing) = (0.0, DraftTiming::default());
        if !drafting.now.is_empty() {
            let drafts = self.draft(drafting.now).await?;
            draft_timing = drafts.timing;
            draft_secs = self.take_drafts(drafts, &[]).0;
        }
        let mut ahead = drafting.ahead;
        let mut batch = self.target_round(&shape, &live, &mut ahead);
        let (target, ahead, wall) = self.verify(std::mem::take(&mut batch.items), ahead).await;
        // Drafts of a next round made during this one wait for its outcome.
        let (ahead_secs, mut guessed) = self.take_drafts(ahead?, &batch.guesses);
        self.counters.rounds += 1;
        let Some(mut result) = target? else {
            for ending in batch.ended {
                self.end_sequence(ending).await;
            }
            return Ok(());
        };
        self.counters
            .overlap
            .record(wall, result.seconds, ahead_secs);
        // A plain run's steps are recorded as the rounds they stand for, each at their mean.
        let steps = result.steps.max(1);
        self.counters.rounds += steps as u64 - 1;
        self.counters.plain_run_steps += steps as u64 - 1;
        self.learned.rounds_without_drafts += steps as u64 - 1;
        let round_seconds = round_start.elapsed().as_secs_f64();
        let times = RoundTimes {
            draft: draft_timing,
            verify_seconds: result.seconds / steps as f64,
            expert_reads: std::mem::take(&mut result.expert_reads),
            mask_seconds: batch.mask_seconds,
            round_seconds: round_seconds / steps as f64,
        };
        for _ in 0..steps {
            self.record_round(
                &times,
                drafting.forecast.filter(|_| !pipelined),
                draft_secs + ahead_secs,
                (batch.decode_only, &batch.rows),
            );
        }
        if batch.decode_only {
            let drafted =
                draft_secs + ahead_secs > 0.0 || batch.sent.values().any(|s| !s.1.is_empty());
            let lag = times.draft.catch_up_seconds;
            // Each step of a plain run (one outcome each) as the round it stands for.
            let per_round = if steps > 1 { 1 } else { result.outcomes.len() };
            for round in result.outcomes.chunks(per_round.max(1)) {
                self.record_gain(
                    drafted,
                    (round, &batch.sent),
                    (&batch.rows, times.round_seconds, lag),
                );
            }
        }
        let mut ended = batch.ended;
        for outcome in result.outcomes {
            // A plain run's steps after its sequence's end are dropped with the sequence.
            let seq = outcome.as_ref().map_or_else(|(seq, _)| *seq, |o| o.seq);
            if ended.iter().any(|(id, _)| *id == seq) {
                continue;
            }
            ended.extend(self.take_outcome(outcome, &batch.sent, &mut guessed));
        }
        self.finish_round(ended).await
    }

    /// Resolves what every active sequence speculates under this round (its request's
    /// settings over the live ones, with the queue's depth), once, and returns the live
    /// settings the round reads.
    fn resolve_round_settings(&mut self) -> SpeculationSettings {
        let live = self.settings.get();
        let queued = self.queue.len();
        telemetry::set_speculation(live.lenience_for_queue(queued).get(), live.gamma_gauge());
        for s in &mut self.active {
            s.round = live.for_round(&s.request.speculative, queued);
        }
        live
    }

    /// Who drafts, who is verified and which prompts take a chunk this round.
    fn shape_round(&self, pipelined: bool) -> RoundPlan {
        let states: Vec<SeqState> = self
            .active
            .iter()
            .map(|s| SeqState {
                decoding: s.decoding(),
                pending: s.pending.is_some(),
                group: s.group,
                prompt_left: s.prompt_len() - s.prefilled,
                prompt_done: s.prefilled,
                waiting: s.waits_for.is_some(),
            })
            .collect();
        RoundPlan::build(
            &states,
            pipelined,
            (&self.cfg.prefill_price, self.cfg.prefill_chunk),
            self.counters.rounds,
        )
    }

    /// γ for every sequence that drafts this round, now or ahead, and the drafts asked for.
    fn plan_drafts(&mut self, shape: &RoundPlan, live: &SpeculationSettings) -> Drafting {
        self.count_drafter_tokens();
        let now = (
            &shape.draft_now[..],
            &self.foresee(&shape.draft_now, live)[..],
        );
        let (plan_now, forecast) = self.plan(now, shape.prefill_width);
        let to_draft_now = self.draft_items(now, &plan_now, live);
        // Drafts made ahead come from a context not known yet.
        let ahead = (
            &shape.draft_ahead[..],
            &vec![NextDraft::Unknown; shape.draft_ahead.len()][..],
        );
        let plan_ahead = self.plan(ahead, 0).0;
        let to_draft_ahead = self.draft_items(ahead, &plan_ahead, live);
        if !shape.draft_now.is_empty() || !shape.draft_ahead.is_empty() {
            self.learned.rounds_without_drafts =
                if to_draft_now.is_empty() && to_draft_ahead.is_empty() {
                    self.learned.rounds_without_drafts + 1
                } else {
                    0
                };
        }
        Drafting {
            now: to_draft_now,
            ahead: to_draft_ahead,
            forecast,
        }
    }

    /// The target batch: each verified sequence's drafts, each prompt's chunk, shaped into
    /// trees and constrained. Sequences verified within their request draft their next round
    /// during it (their γ: as many as this round drafted), added to `ahead`.
    fn target_round(
        &mut self,
        shape: &RoundPlan,
        live: &SpeculationSettings,
        ahead: &mut Vec<DraftItem>,
    ) -> TargetRound {
        let mut items = Vec::with_capacity(shape.target.len());
        let mut guesses: Vec<(u64, usize)> = Vec::new();
        for &(i, part) in &shape.target {
            let s = &mut self.active[i];
            items.push(match part {
                TargetPart::Verify => {
                    let item = s.verify_item(s.round.lenience);
                    let gamma = item.tokens.len() - 1;
                    if shape.within && gamma > 0 {
                        guesses.push((s.id, gamma));
                    }
                    item
                }
                TargetPart::Prefill { len } => s.prefill_item(len, s.round.lenience),
            });
        }
        self.shape_proposals(&mut items, live);
        let (failed, mask_seconds) = self.constrain_items(&mut items);
        // A tree is verified as one walk: no next round is guessed beside it.
        guesses.retain(|&(seq, _)| items.iter().any(|i| i.seq == seq && i.parents.is_empty()));
        for &(seq, gamma) in &guesses {
            ahead.extend(self.guess_item(&items, seq, gamma, live));
        }
        self.plan_plain_run(&mut items, !ahead.is_empty());
        self.counters.prefilled_tokens += items
            .iter()
            .filter(|i| i.work != TargetWork::Verify)
            .map(|i| i.tokens.len() as u64)
            .sum::<u64>();
        TargetRound {
            guesses,
            ended: failed
                .into_iter()
                .map(|(seq, failure)| (seq, Err(failure)))
                .collect(),
            mask_seconds,
            decode_only: items.iter().all(|i| i.work == TargetWork::Verify),
            rows: items
                .iter()
                .map(|i| (i.tokens.len(), i.start_pos))
                .collect(),
            sent: items
                .iter()
                .map(|i| {
                    let drafts = match i.work {
                        TargetWork::Verify => i.tokens[1..].to_vec(),
                        _ => Vec::new(),
                    };
                    (i.seq, (i.tokens.len(), drafts))
                })
                .collect(),
            items,
        }
    }

    /// The draft of `seq`'s next round made while its drafts in `items` are verified.
    fn guess_item(
        &self,
        items: &[TargetItem],
        seq: u64,
        gamma: usize,
        live: &SpeculationSettings,
    ) -> Option<DraftItem> {
        let drafts = items
            .iter()
            .find(|i| i.seq == seq)
            .map(|i| i.tokens[1..].to_vec())?;
        let s = self.active.iter().find(|s| s.id == seq)?;
        s.draft_ahead_item(&drafts, gamma, self.cfg.context_len, live)
    }

    /// The target forward (`None` when the batch is empty) and the drafts made ahead beside
    /// it, with the seconds both took.
    async fn verify(
        &self,
        items: Vec<TargetItem>,
        ahead: Vec<DraftItem>,
    ) -> (
        Result<Option<TargetBatchResult>, EngineError>,
        Result<DraftBatchResult, EngineError>,
        f64,
    ) {
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
        let (target, ahead) = tokio::join!(target, self.draft(ahead));
        (target, ahead, wall.elapsed().as_secs_f64())
    }

    /// What the round cost, into the cost model and the metrics. `forecast`: the plan's, for
    /// a round that was not pipelined.
    fn record_round(
        &mut self,
        times: &RoundTimes,
        forecast: Option<RoundForecast>,
        draft_secs: f64,
        (decode_only, rows): (bool, &[(usize, usize)]),
    ) {
        if let Some(f) = forecast {
            // Only rounds whose drafter stepped: a round drafted by prompt lookup's scan alone
            // (`head+lookup`) would teach the model's forecasts that a step costs nothing.
            if f.drafting > 0 && times.draft.steps > 0 {
                self.learned
                    .costs
                    .record_draft_forecast(f.draft, times.draft.step_seconds);
            }
            if decode_only {
                // What the plan weighs apart (a catch-up on what the drafter missed) is kept
                // out of the comparison; everything else the round took is in it.
                let lag = times.draft.catch_up_seconds;
                self.learned.costs.record_round_forecast(
                    f.drafting > 0,
                    f.draft + f.verify,
                    times.round_seconds - lag,
                );
            }
            log_forecast(&f, times, self.learned.costs.drafting_net());
        }
        telemetry::record_step(
            times.round_seconds,
            times.verify_seconds,
            (draft_secs > 0.0).then_some(draft_secs),
        );
        telemetry::set_overlap(self.counters.overlap.ratio());
        // Decode-only forwards keep the verification costs current at today's context depths
        // and batch widths.
        if decode_only {
            self.learned
                .costs
                .record_forward(times.verify_seconds, rows, &times.expert_reads);
        }
    }

    /// What a decoding round gave, into the ledger of what drafting saved: its tokens (drafts
    /// that stood and the target's own) against its seconds; `rows` as in `TargetRound`. And
    /// into each request's own ledger (`record_request_gains`).
    fn record_gain(
        &mut self,
        drafted: bool,
        (outcomes, sent): (&Outcomes, &SentItems),
        (rows, seconds, lag): (&[(usize, usize)], f64, f64),
    ) {
        let done: Vec<&TargetOutcome> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        let tokens = done.iter().map(|o| tokens_of(o)).sum();
        self.learned
            .costs
            .record_decode_round(drafted, (tokens, rows), seconds);
        let per_token = self.learned.costs.plain_token_seconds(rows);
        self.record_request_gains(
            &done,
            sent,
            per_token.filter(|_| drafted),
            seconds - lag.max(0.0),
        );
    }

    /// Each request's share of a decoding round of `seconds` (the drafter's catch-up on text it
    /// missed left out: see `RequestLedger`) into its own ledger: nothing gained or lost in a
    /// plain round, or one priced at no plain `per_token` price.
    fn record_request_gains(
        &mut self,
        done: &[&TargetOutcome],
        sent: &SentItems,
        per_token: Option<f64>,
        seconds: f64,
    ) {
        let gains = match per_token {
            Some(per_token) => {
                let shares: Vec<RoundShare> = done
                    .iter()
                    .map(|o| RoundShare {
                        tokens: tokens_of(o),
                        drafted: sent.get(&o.seq).map_or(0, |s| s.1.len()),
                    })
                    .collect();
                round_gains(per_token, seconds, &shares)
            }
            None => vec![0.0; done.len()],
        };
        for (o, gain) in done.iter().zip(gains) {
            let Some(s) = self.active.iter_mut().find(|s| s.id == o.seq) else {
                continue;
            };
            let could = s.governor.may_draft();
            s.governor.record_gain(seconds, gain);
            if could && !s.governor.may_draft() {
                tracing::debug!(
                    seq = s.id,
                    drafting_net_ms = s.governor.drafting_net() * 1e3,
                    "drafting lost this request more than its cap: decoding plainly"
                );
            }
        }
    }

    /// After the outcomes: the speed-up estimate, waiting choices started, sequences ended.
    async fn finish_round(&mut self, ended: Vec<Ending>) -> Result<(), EngineError> {
        if let Some(x) = self.learned.speedup.get() {
            telemetry::set_speedup_estimate(x);
        }
        telemetry::set_drafting_net(self.learned.costs.drafting_net());
        // Before anything ends: a first choice that prefilled and finished in this round still
        // holds the cache its other choices start from.
        self.start_waiting_choices().await?;
        for ending in ended {
            self.end_sequence(ending).await;
        }
        Ok(())
    }
}

/// Tokens a round gave a sequence: the drafts that stood and the target's own.
fn tokens_of(o: &TargetOutcome) -> usize {
    o.accepted + usize::from(o.next_token.is_some())
}
