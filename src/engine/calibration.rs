//! Start-up calibration: what target forwards of each width and the drafter's steps and
//! catch-ups cost on this machine, measured before the first request so the governor's first
//! plans rest on prices rather than guesses. Live rounds replace these prices as they run.

use kameo::actor::ActorRef;

use super::drafter::Drafter;
use super::error::EngineError;
use super::governor::{CostModel, ExpertPrices};
use super::messages::MeasureDraftCosts;
use super::verifier::{TimedForward, Verifier};
use crate::draft::DraftTiming;

/// The widest target forward timed at start-up; wider ones are extrapolated until measured.
const MAX_WIDTH: usize = 64;
/// Context lengths the drafter's catch-up is timed at: a short context prices draft steps and
/// small catch-ups, a long one the catch-up of a real prompt.
const CATCH_UP_CONTEXTS: [usize; 2] = [32, 256];
/// Each width is timed this many times, the best kept.
const REPEATS: usize = 2;

/// The widths timed at start-up: every width a lone request can verify, then a few points up
/// to a whole batch of full verifications (interpolated between).
fn verify_widths(max_seqs: usize, gamma_limit: usize) -> Vec<usize> {
    let max_width = max_seqs * (gamma_limit + 1);
    let mut widths: Vec<usize> = (1..=(gamma_limit + 1).min(max_width)).collect();
    let mut w = widths.last().copied().unwrap_or(1);
    while w < max_width.min(MAX_WIDTH) {
        w = (w * 2).min(max_width.min(MAX_WIDTH));
        widths.push(w);
    }
    widths
}

/// A cost model for forwards up to a whole batch of full verifications, with the target's
/// forwards timed on its first slot (free at start-up). A mixture's forwards are priced by
/// the experts they read (`experts`): the price of one read from the widest lone verification
/// timed twice, its rows choosing alike and apart.
pub(super) async fn calibrate_target(
    verifier: &Verifier,
    max_seqs: usize,
    gamma_limit: usize,
    experts: Option<ExpertPrices>,
) -> Result<CostModel, EngineError> {
    let mut costs = CostModel::new(max_seqs * (gamma_limit + 1));
    let widths = verify_widths(max_seqs, gamma_limit);
    let timed = verifier.calibrate(0, widths, REPEATS, false).await?;
    if let Some(mut prices) = experts {
        let probe = gamma_limit + 1;
        let apart = timed.iter().find(|t| t.width == probe);
        let alike = verifier.calibrate(0, vec![probe], REPEATS, true).await?;
        if let (Some(apart), Some(alike)) = (apart, alike.first()) {
            let total = |t: &TimedForward| t.reads.iter().map(|&r| r as usize).sum::<usize>();
            prices.set_per_expert((total(apart), apart.seconds), (total(alike), alike.seconds));
            tracing::debug!(
                width = probe,
                apart_ms = apart.seconds * 1e3,
                apart_reads = total(apart),
                alike_ms = alike.seconds * 1e3,
                alike_reads = total(alike),
                per_expert_us = prices.per_expert() * 1e6,
                "expert reads calibrated"
            );
        }
        costs.price_experts(prices);
    }
    for t in &timed {
        costs.record_forward(t.seconds, t.width, &t.reads);
    }
    Ok(costs)
}

/// Times the drafter's steps and catch-ups at a short and a long context into `costs`.
pub(super) async fn calibrate_drafter(
    drafter: &ActorRef<Drafter>,
    gamma_limit: usize,
    context_len: usize,
    costs: &mut CostModel,
) -> Result<(), EngineError> {
    let contexts: Vec<usize> = CATCH_UP_CONTEXTS
        .into_iter()
        .filter(|&n| n + gamma_limit + 1 < context_len)
        .collect();
    let timings = drafter
        .ask(MeasureDraftCosts { contexts })
        .await
        .map_err(|e| EngineError::Draft(e.to_string()))?;
    if let Some(t) = timings.first() {
        costs.record_draft(t.step_seconds, t.first_step_seconds, t.steps, 1);
    }
    let per_step = |t: &DraftTiming| t.step_seconds / t.steps.max(1) as f64;
    if let (Some(a), Some(b)) = (timings.first(), timings.last()) {
        costs.record_draft_depths(
            (a.catch_up_tokens, per_step(a)),
            (b.catch_up_tokens, per_step(b)),
        );
    }
    for t in &timings {
        tracing::debug!(
            tokens = t.catch_up_tokens,
            catch_up_ms = t.catch_up_seconds * 1e3,
            step_ms = per_step(t) * 1e3,
            "drafter calibrated"
        );
        costs.record_catch_up(t.catch_up_seconds, t.catch_up_tokens);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lone_request_width_is_timed_then_a_few_up_to_the_batch() {
        assert_eq!(verify_widths(1, 4), vec![1, 2, 3, 4, 5]);
        assert_eq!(
            verify_widths(8, 8),
            vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 18, 36, 64]
        );
        assert_eq!(verify_widths(2, 3), vec![1, 2, 3, 4, 8]);
    }
}
