//! How many plain steps a lone sequence's round runs back to back on the verifier's worker
//! (`engine/plain_run.rs`): pure, from what the scheduler knows of the sequence.
//!
//! Why it exists: a run spares the crossings between the scheduler and the worker that a
//! round of one plain token pays, but while it runs nobody drafts, a request that arrives
//! waits and a cancelled one is not noticed. So a run is long only where the sequence will
//! not draft anyway (its request decodes plainly, or drafting lost it more than its
//! allowance) or where what would make it draft is checked on the worker after every step
//! (prompt lookup alone, its text matching nothing the governor might draft now: the run stops
//! before the first step whose context has such a match, a round the scheduler would offer
//! the governor). Elsewhere it grows with the rounds in a row that drafted nothing where the
//! governor decides (the governor tries drafting again at most a few tokens late), and it
//! never takes longer than [`RUN_SECONDS`] of forwards. A fixed γ drafts wherever its drafter
//! proposes, as the request asked: it never runs.
//!
//! Stopping at a match keeps a governed lookup request's runs long between its drafts: where
//! its drafts came every 10-30 tokens, runs growing by a step per 8 draftless rounds left most
//! of its plain steps in rounds of their own, each 0.1-0.2 ms (3-6%) over the reference loop's.

use super::admitted::Sequence;
use super::foresight::MatchStop;
use super::state::Scheduler;
use crate::engine::gamma::{gamma_cap, RoundGamma};
use crate::engine::governor::solo_rate;
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
    /// Its drafter is prompt lookup alone, whose text has no match the governor might draft
    /// now: the run stops before the first step whose context has one
    /// (`PlainRun::until_match`).
    pub stops_at_match: bool,
    /// The governor decides whether it drafts (an adaptive γ): a fixed γ never runs.
    pub governed: bool,
    /// Rounds in a row that drafted nothing.
    pub rounds_without_drafts: u64,
    /// What one plain step costs now, once measured.
    pub step_seconds: Option<f64>,
}

/// Steps the round runs: 1 (a round of its own) up to [`MOST_STEPS`].
pub fn plain_run_steps(r: &RunSituation) -> usize {
    let by_drafting = if r.done_drafting || (r.governed && r.stops_at_match) {
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
        let done_drafting = self.drafter.is_none()
            || s.round.gamma == RoundGamma::Plain
            || (governed && !s.governor.may_draft());
        let until_match = (governed && !done_drafting)
            .then(|| self.match_stop(s))
            .flatten()
            .filter(|m| !m.stops_at(&s.context));
        let situation = RunSituation {
            room: gamma_cap(item.start_pos, self.cfg.context_len, s.remaining()) + 1,
            done_drafting,
            stops_at_match: until_match.is_some(),
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
            until_match,
        };
    }

    /// Where a run of `s`, drafting with prompt lookup alone, stops: at a match of any kind
    /// the governor might draft now, each kind judged by its best expected speed-up alone
    /// (below 1, not even breaking even, where the planner wants its minimum gain; unpriced,
    /// a stop).
    fn match_stop(&self, s: &Sequence) -> Option<MatchStop> {
        let foresight = self.cfg.foresight.as_ref()?;
        let gamma_max = self
            .settings
            .get()
            .gamma_max
            .get()
            .min(self.cfg.gamma_limit);
        let depth = s.context.len() - 1;
        let mut kinds = [true; 4];
        for (k, stop) in (0u8..).zip(kinds.iter_mut()) {
            let alpha = s.governor.alpha_of(Some(k));
            *stop = solo_rate(alpha, gamma_max, (None, depth), &self.learned.costs)
                .is_none_or(|rate| rate >= 1.0);
        }
        MatchStop::new(foresight, kinds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn situation() -> RunSituation {
        RunSituation {
            room: 1000,
            done_drafting: true,
            stops_at_match: false,
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

    #[test]
    fn a_lookup_sequence_with_no_match_runs_until_one_appears() {
        let r = RunSituation {
            done_drafting: false,
            stops_at_match: true,
            rounds_without_drafts: 0,
            step_seconds: Some(0.0005),
            ..situation()
        };
        assert_eq!(
            plain_run_steps(&r),
            MOST_STEPS,
            "the worker stops it at a match"
        );
        let timed = RunSituation {
            step_seconds: Some(0.003),
            ..r
        };
        assert_eq!(
            plain_run_steps(&timed),
            13,
            "still no longer than a run's time"
        );
        let fixed = RunSituation {
            governed: false,
            ..r
        };
        assert_eq!(plain_run_steps(&fixed), 1, "a fixed γ never runs");
    }
}
