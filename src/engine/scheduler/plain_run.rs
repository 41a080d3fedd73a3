//! How many plain steps a lone sequence's round runs back to back on the verifier's worker
//! (`engine/plain_run.rs`): pure, from what the scheduler knows of the sequence.
//!
//! Why it exists: a run spares the crossings between the scheduler and the worker that a
//! round of one plain token pays, but while it runs nobody drafts, a request that arrives
//! waits and a cancelled one is not noticed. So a run is long only where the sequence will
//! not draft anyway (its request decodes plainly, or drafting lost it more than its
//! allowance), grows with the rounds in a row that drafted nothing where the governor decides
//! (a lookup drafter finds a match again, or the governor tries drafting again, at most a few
//! tokens late), and never takes longer than [`RUN_SECONDS`] of forwards. A fixed γ drafts
//! wherever its drafter proposes, as the request asked: it never runs.

use super::state::Scheduler;
use crate::engine::gamma::{gamma_cap, RoundGamma};
use crate::engine::messages::{PlainRun, TargetItem, TargetWork};

/// Most steps in one run.
pub const MOST_STEPS: usize = 16;
/// A run's forwards take about this long at most: the longest a request that arrives during a
/// run waits before it is admitted, beyond the step it would wait for anyway.
pub const RUN_SECONDS: f64 = 0.04;
/// A sequence that may still draft runs one step more for every this many rounds in a row
/// that drafted nothing.
pub const ROUNDS_PER_STEP: u64 = 8;

/// What a lone sequence's next round looks like, for [`plain_run_steps`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunSituation {
    /// Tokens the round may still feed the target: what the context and `max_tokens` leave.
    pub room: usize,
    /// It will not draft in the coming rounds: no drafter, a request that decodes plainly, or
    /// one whose drafting lost it more than its allowance.
    pub done_drafting: bool,
    /// The governor decides whether it drafts (an adaptive γ): a fixed γ never runs.
    pub governed: bool,
    /// Rounds in a row that drafted nothing.
    pub rounds_without_drafts: u64,
    /// What one plain step costs now, once measured.
    pub step_seconds: Option<f64>,
}

/// Steps the round runs: 1 (a round of its own) up to [`MOST_STEPS`].
pub fn plain_run_steps(r: &RunSituation) -> usize {
    let by_drafting = if r.done_drafting {
        MOST_STEPS
    } else if r.governed {
        1 + usize::try_from(r.rounds_without_drafts / ROUNDS_PER_STEP).unwrap_or(MOST_STEPS)
    } else {
        1
    };
    let by_time = match r.step_seconds {
        Some(s) if s > 0.0 => (RUN_SECONDS / s) as usize,
        _ => 1,
    };
    by_drafting.min(by_time).min(MOST_STEPS).min(r.room).max(1)
}

impl Scheduler {
    /// Lets the round's item run plainly for several steps where it is a lone sequence's
    /// plain step (no drafts, none made ahead beside it, no grammar, nobody waiting).
    pub(super) fn plan_plain_run(&self, items: &mut [TargetItem], drafting_ahead: bool) {
        let ([item], [s]) = (items, self.active.as_slice()) else {
            return;
        };
        if drafting_ahead
            || !self.queue.is_empty()
            || item.work != TargetWork::Verify
            || item.tokens.len() != 1
            || s.constraint.is_some()
        {
            return;
        }
        let governed = matches!(s.round.gamma, RoundGamma::Adaptive { .. });
        let situation = RunSituation {
            room: gamma_cap(item.start_pos, self.cfg.context_len, s.remaining()) + 1,
            done_drafting: self.drafter.is_none()
                || s.round.gamma == RoundGamma::Plain
                || (governed && !s.governor.may_draft()),
            governed,
            rounds_without_drafts: self.learned.rounds_without_drafts,
            step_seconds: self
                .learned
                .costs
                .plain_token_seconds(&[(1, item.start_pos)]),
        };
        item.plain_run = PlainRun {
            steps: plain_run_steps(&situation),
            eos_ids: s.request.generation.eos_ids.clone(),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn situation() -> RunSituation {
        RunSituation {
            room: 1000,
            done_drafting: true,
            governed: true,
            rounds_without_drafts: 0,
            step_seconds: Some(0.003),
        }
    }

    #[test]
    fn a_sequence_done_drafting_runs_as_long_as_time_room_and_the_cap_allow() {
        assert_eq!(plain_run_steps(&situation()), 13, "0.04 s of 3 ms steps");
        let fast = RunSituation {
            step_seconds: Some(0.0005),
            ..situation()
        };
        assert_eq!(plain_run_steps(&fast), MOST_STEPS);
        let short = RunSituation { room: 3, ..fast };
        assert_eq!(plain_run_steps(&short), 3);
        let slow = RunSituation {
            step_seconds: Some(0.08),
            ..situation()
        };
        assert_eq!(plain_run_steps(&slow), 1, "a step longer than a run's time");
        let unpriced = RunSituation {
            step_seconds: None,
            ..situation()
        };
        assert_eq!(plain_run_steps(&unpriced), 1);
        let no_room = RunSituation {
            room: 0,
            ..situation()
        };
        assert_eq!(plain_run_steps(&no_room), 1);
    }

    #[test]
    fn a_sequence_that_may_draft_runs_longer_the_longer_it_drafted_nothing() {
        let steps = |rounds| {
            plain_run_steps(&RunSituation {
                done_drafting: false,
                rounds_without_drafts: rounds,
                step_seconds: Some(0.0005),
                ..situation()
            })
        };
        assert_eq!(steps(0), 1);
        assert_eq!(steps(ROUNDS_PER_STEP - 1), 1);
        assert_eq!(steps(ROUNDS_PER_STEP), 2);
        assert_eq!(steps(5 * ROUNDS_PER_STEP), 6);
        assert_eq!(steps(u64::MAX), MOST_STEPS);
        let fixed = RunSituation {
            done_drafting: false,
            governed: false,
            rounds_without_drafts: 100 * ROUNDS_PER_STEP,
            ..situation()
        };
        assert_eq!(plain_run_steps(&fixed), 1, "a fixed γ drafts where it can");
    }
}
