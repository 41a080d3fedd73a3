//! Start-up calibration: what target forwards of each width and the drafter's steps and
//! catch-ups cost on this machine, measured before the first request so the governor's first
//! plans rest on prices rather than guesses. Live rounds replace these prices as they run.

use kameo::actor::ActorRef;

use std::time::Instant;

use super::drafter::Drafter;
use super::error::EngineError;
use super::governor::{
    check_widths, still_holds, ConfidenceRates, CostModel, ExpertPrices, PooledAcceptance,
    Remembered, VerifyDepth,
};
use super::messages::MeasureDraftCosts;
use super::price_memory::MemoryFile;
use super::verifier::{TimedForward, Verifier};
use crate::draft::DraftTiming;

/// The widest target forward timed at start-up; wider ones are extrapolated until measured.
const MAX_WIDTH: usize = 64;
/// Context lengths the drafter's catch-up is timed at: a short context prices draft steps and
/// small catch-ups, a long one the catch-up of a real prompt.
const CATCH_UP_CONTEXTS: [usize; 2] = [32, 256];
/// The context depth width prices are timed and kept at.
const SHALLOW_DEPTH: usize = 32;
/// The depth lone verifications are timed at again, for how their prices grow with depth: deep
/// enough that attention's share stands out of the timing noise (a SmolLM2 step grows about
/// 2 ms from depth 32 to 1024, half a step), and deep enough to stand for the long prompts
/// whose rounds it prices (Gemma-3's windowed layers stop growing at 512). The context is
/// copies of a short one's keys and values (`Verifier::time_depths`), so its depth costs
/// start-up no prefill.
const DEEP_DEPTH: usize = 1024;
/// Each width is timed this many times, the best kept.
const REPEATS: usize = 2;
/// Rounds of the depth widths ([`depth_widths`]) timed shallow and then deep, each width's
/// growth the median of its rounds' ratios. Timed instead as one burst at each depth (best of
/// 8 at 512), a SmolLM2 step's growth read -1.6 to 2.0 ms over 16 fresh starts on a busy VM,
/// where 4 rounds to 1024 read 0.6-1.7 ms (scaled to 480 tokens; back-to-back decoding on a
/// quiet one grows 0.8 ms) in about the start-up time: a line twice too steep priced a step
/// at depth 900 up to 59% above what it took, and a verification low beside it.
const DEEP_ROUNDS: usize = 4;
/// Steps run untimed before anything is timed: a fresh process's first forwards run up to
/// 1.8x a warm step (caches, the threads' first wake-ups), and a price taken then would be
/// that process's, not the machine's.
const WARM_UP_STEPS: usize = 8;

/// Where the governor's first prices came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PricesFrom {
    /// A configured price table (tests, simulations).
    Table,
    /// Timed at this start: nothing remembered.
    Measured,
    /// Remembered from an earlier run, and the forwards timed now ran at its prices.
    Remembered,
    /// Remembered, but the forwards timed now did not run at its prices (another machine, a
    /// busy one): timed anew; what drafts did is still remembered.
    Remeasured,
}

/// How the governor's start-up went: where its prices came from, and the seconds it took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StartUpPrices {
    pub from: PricesFrom,
    pub seconds: f64,
}

/// Target and drafter settings start-up timing needs.
pub(super) struct Timing<'a> {
    pub verifier: &'a Verifier,
    pub drafter: Option<&'a ActorRef<Drafter>>,
    pub max_seqs: usize,
    pub gamma_limit: usize,
    pub context_len: usize,
    pub experts: Option<ExpertPrices>,
}

/// What the governor starts from (the configured `table`, or remembered in `memory` and still
/// holding, or measured now) and the file its learning is kept in from here on: saved at once
/// when start-up had to measure, so a server stopped before its first request still starts
/// faster next time.
pub(super) async fn start_governor(
    table: Option<CostModel>,
    timing: Timing<'_>,
    mut memory: Option<MemoryFile>,
) -> Result<(Remembered, Option<MemoryFile>, StartUpPrices), EngineError> {
    let (learned, start_up) = start_up_learning(table, timing, memory.as_ref()).await?;
    if let Some(m) = memory.as_mut() {
        m.set_reference(learned.reference.clone());
        if start_up.from != PricesFrom::Remembered {
            m.save_start_up(&learned);
        }
    }
    tracing::info!(
        prices = ?start_up.from,
        seconds = start_up.seconds,
        memory = ?memory.as_ref().map(|m| m.path().display().to_string()),
        "governor ready"
    );
    Ok((learned, memory, start_up))
}

/// What the governor starts from: the configured `table` (frozen), a remembered table that
/// still holds on this machine, or prices timed now; and the acceptance remembered, if any
/// (else a pooled guess of one half).
async fn start_up_learning(
    table: Option<CostModel>,
    t: Timing<'_>,
    memory: Option<&MemoryFile>,
) -> Result<(Remembered, StartUpPrices), EngineError> {
    let started = Instant::now();
    let fresh = |costs| Remembered {
        costs,
        reference: Vec::new(),
        acceptance: PooledAcceptance::new(0.5),
        chain_rates: ConfidenceRates::default(),
        branch_rates: ConfidenceRates::default(),
    };
    let done = |from| StartUpPrices {
        from,
        seconds: started.elapsed().as_secs_f64(),
    };
    if let Some(table) = table {
        return Ok((fresh(table.freeze()), done(PricesFrom::Table)));
    }
    let width = t.max_seqs * (t.gamma_limit + 1);
    let remembered = memory
        .and_then(MemoryFile::load)
        .filter(|r| r.costs.max_width() == width && !r.costs.is_frozen());
    let Some(mut remembered) = remembered else {
        let (costs, reference) = measure(&t).await?;
        let mut fresh = fresh(costs);
        fresh.reference = reference;
        return Ok((fresh, done(PricesFrom::Measured)));
    };
    warm_up(t.verifier).await?;
    let now = check_forwards(&t).await?;
    let holds = still_holds(&remembered.reference, &now);
    tracing::debug!(?now, then = ?remembered.reference, holds, "remembered prices checked");
    if !holds {
        (remembered.costs, remembered.reference) = measure(&t).await?;
        return Ok((remembered, done(PricesFrom::Remeasured)));
    }
    remembered.costs.mark_provisional();
    Ok((remembered, done(PricesFrom::Remembered)))
}

/// The check's forwards ([`check_widths`]), each the best of a few.
async fn check_forwards(t: &Timing<'_>) -> Result<Vec<(usize, f64)>, EngineError> {
    let timed = t
        .verifier
        .calibrate(
            0,
            check_widths(t.gamma_limit),
            (SHALLOW_DEPTH, REPEATS + 1),
            false,
        )
        .await?;
    Ok(timed.iter().map(|f| (f.width, f.seconds)).collect())
}

/// Runs the target's first steps of this process untimed.
async fn warm_up(verifier: &Verifier) -> Result<(), EngineError> {
    verifier
        .calibrate(0, vec![1], (SHALLOW_DEPTH, WARM_UP_STEPS), false)
        .await?;
    Ok(())
}

/// Every price timed now, provisional until rounds refine them, and the check's forwards
/// timed after them (what a later start compares its own with).
async fn measure(t: &Timing<'_>) -> Result<(CostModel, Vec<(usize, f64)>), EngineError> {
    warm_up(t.verifier).await?;
    let mut costs =
        calibrate_target(t.verifier, t.max_seqs, t.gamma_limit, t.experts.clone()).await?;
    if let Some(d) = t.drafter {
        calibrate_drafter(d, t.gamma_limit, t.context_len, &mut costs).await?;
    }
    costs.mark_provisional();
    Ok((costs, check_forwards(t).await?))
}

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
async fn calibrate_target(
    verifier: &Verifier,
    max_seqs: usize,
    gamma_limit: usize,
    experts: Option<ExpertPrices>,
) -> Result<CostModel, EngineError> {
    let mut costs = CostModel::new(max_seqs * (gamma_limit + 1));
    let widths = verify_widths(max_seqs, gamma_limit);
    let timed = verifier
        .calibrate(0, widths, (SHALLOW_DEPTH, REPEATS), false)
        .await?;
    if let Some(mut prices) = experts {
        let probe = gamma_limit + 1;
        let apart = timed.iter().find(|t| t.width == probe);
        let alike = verifier
            .calibrate(0, vec![probe], (SHALLOW_DEPTH, REPEATS), true)
            .await?;
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
        costs.record_forward(t.seconds, &[(t.width, t.depth)], &t.reads);
    }
    calibrate_depth(verifier, gamma_limit, &timed, &mut costs).await?;
    Ok(costs)
}

/// Times a lone request's verify widths in rounds at `SHALLOW_DEPTH` and `DEEP_DEPTH` context
/// tokens (`Verifier::time_depths`), for how a forward's price grows with its rows' depth:
/// each width's growth is read as a ratio within rounds and applied to its price timed at
/// start-up (`VerifyDepth::from_pairs`), so a change in the machine's speed between the two
/// timings is not read as growth. A mixture's forwards are compared without their expert
/// reads, which do not depend on depth.
async fn calibrate_depth(
    verifier: &Verifier,
    gamma_limit: usize,
    shallow: &[TimedForward],
    costs: &mut CostModel,
) -> Result<(), EngineError> {
    let lone = depth_widths(gamma_limit);
    let rounds = verifier
        .time_depths(0, lone.clone(), (SHALLOW_DEPTH, DEEP_DEPTH), DEEP_ROUNDS)
        .await?;
    let own = |t: &TimedForward| {
        let reads = costs
            .expert_prices()
            .map_or(0.0, |e| e.seconds_of(&t.reads));
        t.seconds - reads
    };
    let d0 = shallow.first().map_or(SHALLOW_DEPTH, |t| t.depth);
    let prices: Vec<(usize, f64)> = shallow
        .iter()
        .filter(|t| lone.contains(&t.width))
        .map(|t| (t.width, own(t)))
        .collect();
    let d1 = rounds
        .first()
        .and_then(|r| r.deep.first())
        .map_or(DEEP_DEPTH, |t| t.depth);
    let pairs: Vec<(usize, f64, f64)> = rounds
        .iter()
        .flat_map(|r| r.shallow.iter().zip(&r.deep))
        .filter(|(a, _)| a.depth == d0)
        .map(|(a, b)| (a.width, own(a), own(b)))
        .collect();
    let line = VerifyDepth::from_pairs((d0, &prices), d1, &pairs);
    if let Some(line) = &line {
        for &(w, price) in &prices {
            tracing::debug!(
                width = w,
                d0,
                d1,
                shallow_ms = price * 1e3,
                growth_ms = line.slope(w) * (d1 - d0) as f64 * 1e3,
                "verify depth calibrated"
            );
        }
    }
    costs.set_verify_depth(line);
    Ok(())
}

/// The lone verify widths timed again deep: enough points for the line over the width
/// (`VerifyDepth`, which one width cannot pull), few enough that [`DEEP_ROUNDS`] rounds of
/// them cost start-up little: 1, 2, 3, 5 and the widest.
fn depth_widths(gamma_limit: usize) -> Vec<usize> {
    let widest = gamma_limit + 1;
    let mut widths: Vec<usize> = [1, 2, 3, 5, widest]
        .into_iter()
        .filter(|&w| w <= widest)
        .collect();
    widths.dedup();
    widths
}

/// Times the drafter's steps and catch-ups at a short and a long context into `costs`.
async fn calibrate_drafter(
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
        costs.record_draft(
            t.step_seconds,
            (t.first_step_seconds, t.first_step_tokens),
            t.steps,
            1,
        );
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

    #[test]
    fn a_few_lone_widths_up_to_the_widest_are_timed_deep() {
        assert_eq!(depth_widths(8), vec![1, 2, 3, 5, 9]);
        assert_eq!(depth_widths(4), vec![1, 2, 3, 5]);
        assert_eq!(depth_widths(3), vec![1, 2, 3, 4]);
        assert_eq!(depth_widths(2), vec![1, 2, 3]);
        assert_eq!(depth_widths(0), vec![1]);
    }
}
