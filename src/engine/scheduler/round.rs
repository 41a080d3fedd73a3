//! One round: the plan, drafting, one batched target forward (with drafting ahead beside it),
//! then the outcomes.

use std::collections::HashMap;
use std::time::Instant;

use super::foresight::NextDraft;
use super::round_clock::{log_forecast, RoundTimes};
use super::round_plan::{RoundPlan, SeqState, TargetPart};
use super::state::Scheduler;
use crate::draft::DraftTiming;
use crate::engine::error::EngineError;
use crate::engine::messages::{TargetBatch, TargetWork};
use crate::telemetry;

impl Scheduler {
    /// One round: prefill chunks, drafting and one batched target forward.
    pub(super) async fn step(&mut self) -> Result<(), EngineError> {
        self.retire_cancelled().await;
        self.admit().await;
        if self.active.is_empty() {
            return Ok(());
        }
        let live = self.settings.get();
        let queued = self.queue.len();
        telemetry::set_speculation(live.lenience_for_queue(queued).get(), live.gamma_gauge());
        let pipelined = self.cfg.pipeline && self.drafter.is_some();
        let states: Vec<SeqState> = self
            .active
            .iter()
            .map(|s| SeqState {
                decoding: s.decoding(),
                pending: s.pending.is_some(),
                group: s.group,
                prompt_left: s.prompt_len() - s.prefilled,
                waiting: s.waits_for.is_some(),
            })
            .collect();
        let shape = RoundPlan::build(&states, pipelined, self.cfg.prefill_chunk, self.rounds);
        let now = (
            &shape.draft_now[..],
            &self.foresee(&shape.draft_now, &live)[..],
        );
        let (plan_now, forecast) = self.plan(now, shape.prefill_width, &live);
        let to_draft_now = self.draft_items(now, &plan_now, &live);
        // Drafts made ahead come from a context not known yet.
        let ahead = (
            &shape.draft_ahead[..],
            &vec![NextDraft::Unknown; shape.draft_ahead.len()][..],
        );
        let plan_ahead = self.plan(ahead, 0, &live).0;
        let mut to_draft_ahead = self.draft_items(ahead, &plan_ahead, &live);
        if !shape.draft_now.is_empty() || !shape.draft_ahead.is_empty() {
            self.rounds_without_drafts = if to_draft_now.is_empty() && to_draft_ahead.is_empty() {
                self.rounds_without_drafts + 1
            } else {
                0
            };
        }

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
                    let item = s.verify_item(s.settings(&live, queued).lenience);
                    let gamma = item.tokens.len() - 1;
                    if shape.within && gamma > 0 {
                        guesses.push((s.id, gamma));
                    }
                    item
                }
                TargetPart::Prefill { len } => {
                    s.prefill_item(len, s.settings(&live, queued).lenience)
                }
            });
        }
        self.shape_proposals(&mut items, &live);
        let (failed, mask_seconds) = self.constrain_items(&mut items, &live);
        let mut ended: Vec<_> = failed
            .into_iter()
            .map(|(seq, failure)| (seq, Err(failure)))
            .collect();
        // A tree is verified as one walk: no next round is guessed beside it.
        guesses.retain(|&(seq, _)| items.iter().any(|i| i.seq == seq && i.parents.is_empty()));
        for &(seq, gamma) in &guesses {
            let item = items
                .iter()
                .find(|i| i.seq == seq)
                .map(|i| i.tokens[1..].to_vec())
                .and_then(|drafts| {
                    let s = self.active.iter().find(|s| s.id == seq)?;
                    s.draft_ahead_item(&drafts, gamma, self.cfg.context_len, &live, queued)
                });
            to_draft_ahead.extend(item);
        }
        let decode_only = items.iter().all(|i| i.work == TargetWork::Verify);
        self.prefilled_tokens += items
            .iter()
            .filter(|i| i.work != TargetWork::Verify)
            .map(|i| i.tokens.len() as u64)
            .sum::<u64>();
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
            for ending in ended {
                self.end_sequence(ending).await;
            }
            return Ok(());
        };
        self.overlap.record(wall, result.seconds, ahead_secs);
        draft_secs += ahead_secs;
        let times = RoundTimes {
            draft: draft_timing,
            verify_seconds: result.seconds,
            mask_seconds,
            round_seconds: round_start.elapsed().as_secs_f64(),
        };
        if let (Some(f), false) = (forecast, pipelined) {
            // Only rounds whose drafter stepped: a round drafted by prompt lookup's scan alone
            // (`head+lookup`) would teach the model's forecasts that a step costs nothing.
            if f.drafting > 0 && draft_timing.steps > 0 {
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

        for outcome in result.outcomes {
            ended.extend(self.take_outcome(outcome, &sent, &mut guessed));
        }
        if let Some(x) = self.speedup.get() {
            telemetry::set_speedup_estimate(x);
        }
        // Before anything ends: a first choice that prefilled and finished in this round still
        // holds the cache its other choices start from.
        self.start_waiting_choices().await?;
        for ending in ended {
            self.end_sequence(ending).await;
        }
        Ok(())
    }
}
