//! The round planner: every sequence's γ for one round, chosen to maximise the round's expected
//! decoding tokens per second from the acceptance estimates and the measured costs.

use super::costs::CostModel;

/// The expected speedup of drafting γ with acceptance rate α and a round costing `round_cost`
/// plain steps: expected tokens per round `(1 − α^(γ+1)) / (1 − α)` over the round's cost.
pub fn expected_speedup(alpha: f64, gamma: usize, round_cost: f64) -> f64 {
    expected_tokens(alpha, gamma) / round_cost
}

/// Expected tokens a round of γ drafts yields at acceptance rate α (the accepted drafts and
/// the one token the target always adds).
pub fn expected_tokens(alpha: f64, gamma: usize) -> f64 {
    if alpha >= 1.0 {
        (gamma + 1) as f64
    } else {
        (1.0 - alpha.powi(gamma as i32 + 1)) / (1.0 - alpha)
    }
}

/// How a sequence's γ is set for a round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Choice {
    /// Set by the request or a probe (0 = a plain step).
    Fixed(usize),
    /// The planner picks 0 or a γ in `min..=max`.
    Free { min: usize, max: usize },
    /// A probe of `gamma` drafts, made only if what speculation could save over the rest of
    /// the request (at best, every draft accepted, up to `max` drafts a round) outweighs the
    /// drafter catching up first.
    Probe { gamma: usize, max: usize },
}

/// One decoding sequence as the round planner sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub alpha: f64,
    pub choice: Choice,
    /// The drafter's tokens it must take in before drafting: the context it has not seen, as
    /// the drafter reads it (one of its own tokens a target token for a drafter of the same
    /// vocabulary; one or several for one of another).
    pub catch_up: usize,
    /// Tokens it may still generate (its one-off catch-up is spread over them).
    pub remaining: usize,
    /// Context tokens its draft steps attend over (0 = not known: priced as measured).
    pub depth: usize,
    /// The most of its drafts that could stand, as far as the request shows: 1, or for a
    /// drafter of another vocabulary the share of the prompt it covers (a drafted run ends at
    /// the first token it cannot propose). What a probe hopes for is bounded by it.
    pub ceiling: f64,
}

/// Chooses every sequence's γ for one round (docs/speculation.md, "The round planner") to maximise the round's expected
/// tokens per second: expected tokens over the round's cost, which is the draft steps (shared
/// by every drafting sequence), each drafter's catch-up spread over what its sequence may
/// still generate, and one target forward as wide as everyone's tokens plus `base_width`
/// (prompt chunks in the same forward). A lone sequence gets the γ with the best expected
/// speedup; in a batch, where a plain step already shares the weights, extra verification
/// width is weighed against everyone's time. Free sequences speculate only if the plan beats
/// all-plain by `min_gain`. Until costs are measured, free sequences draft `min`.
pub fn plan_round(
    candidates: &[Candidate],
    base_width: usize,
    costs: &CostModel,
    min_gain: f64,
) -> Vec<usize> {
    let mut plan: Vec<usize> = candidates
        .iter()
        .map(|c| match c.choice {
            Choice::Fixed(g) => g,
            Choice::Probe { .. } | Choice::Free { .. } => 0,
        })
        .collect();
    let fixed = plan.clone();
    for (i, c) in candidates.iter().enumerate() {
        if let Choice::Probe { gamma, max } = c.choice {
            if probe_pays(candidates, i, &fixed, max, costs) {
                plan[i] = gamma;
            }
        }
    }
    let rate = |plan: &[usize]| round_rate(candidates, plan, base_width, costs);
    if rate(&plan).is_none() {
        for (g, c) in plan.iter_mut().zip(candidates) {
            if let Choice::Free { min, .. } = c.choice {
                *g = min;
            }
        }
        return plan;
    }
    let plain_rate = rate(&plan).unwrap_or(0.0);
    // Coordinate ascent: each free sequence in turn takes its best γ given the others, until
    // nothing changes (a few passes at most; every move strictly raises the rate).
    for _ in 0..4 {
        let mut changed = false;
        for i in 0..candidates.len() {
            let Choice::Free { min, max } = candidates[i].choice else {
                continue;
            };
            // A drafter that must first catch up on a long prompt is worth it only if
            // speculation could win that time back over the rest of the request: the round's
            // share of the catch-up looks small, but it is paid in full now.
            if candidates[i].catch_up > 0 && !probe_pays(candidates, i, &plan, max, costs) {
                continue;
            }
            let before = plan[i];
            let mut best = (before, rate(&plan).unwrap_or(0.0));
            for g in std::iter::once(0).chain(min..=max) {
                plan[i] = g;
                let r = rate(&plan).unwrap_or(0.0);
                if r > best.1 * (1.0 + 1e-9) {
                    best = (g, r);
                }
            }
            changed |= best.0 != before;
            plan[i] = best.0;
        }
        if !changed {
            break;
        }
    }
    if rate(&plan).unwrap_or(0.0) < plain_rate * min_gain {
        for (g, c) in plan.iter_mut().zip(candidates) {
            if matches!(c.choice, Choice::Free { .. }) {
                *g = 0;
            }
        }
    }
    plan
}

/// Whether speculating could pay for `candidates[i]`'s drafter catching up on what it missed:
/// what its speculation could save over the request's remaining tokens (the best γ up to
/// `max`, the others as in `plan`) against the catch-up.
///
/// Speculation is priced halfway between the estimate and full acceptance (the candidate's
/// `ceiling`, or its estimate where that is higher): hopeful, since a
/// request's estimate starts from other requests' and finding out is what a probe is for, but
/// not blind: priced at full acceptance, a poor drafter would keep probing, each probe first
/// taking in everything decoded since the last, and a good one that is dear to catch up
/// (SmolLM2 taking in a 700-token prompt for Gemma 3, 0.9 ms a token) would take in long
/// prompts that the rest of a short answer cannot repay. A drafter that loses even at full
/// acceptance is never probed.
///
/// Hope is paid from what drafting saved: while exploring has lately cost more than drafting
/// gained (`CostModel::may_explore`), speculation is priced at the estimate itself, so only a
/// request whose own rate says the catch-up pays takes it in. A drafter that is dear next to
/// its target and rarely right enough (SmolLM2 for Gemma 3, sampled) would otherwise lose a
/// catch-up on every fresh request's prompt, and one that pays loses nothing by it: its
/// ledger stays ahead.
///
/// Savings are priced in the batch the request is in, not as if it were alone: beside other
/// sequences a plain step already yields several tokens per weight pass, so one request's
/// drafts save far less, and a probe priced alone would pay catch-ups that its batch never
/// repays.
fn probe_pays(
    candidates: &[Candidate],
    i: usize,
    plan: &[usize],
    max: usize,
    costs: &CostModel,
) -> bool {
    let c = &candidates[i];
    let alpha = if costs.may_explore() {
        (c.alpha + c.ceiling.max(c.alpha)) / 2.0
    } else {
        c.alpha
    };
    let Some(save) = could_save(candidates, i, plan, (alpha, max), costs) else {
        return true;
    };
    save > 0.0 && costs.catch_up_seconds(c.catch_up) < save
}

/// The most time `candidates[i]` speculating could save over its remaining tokens at
/// acceptance rate `alpha`, the others keeping `plan`, outside any prompt chunk (a chunk is one
/// round; the savings come in the rounds after): per round, what the round's tokens would cost
/// at the batch's plain price per token less what the round costs, times the rounds its
/// remaining tokens take. `None` until costs are measured.
fn could_save(
    candidates: &[Candidate],
    i: usize,
    plan: &[usize],
    (alpha, max): (f64, usize),
    costs: &CostModel,
) -> Option<f64> {
    let mut at = candidates.to_vec();
    at[i].alpha = alpha;
    at[i].catch_up = 0;
    let mut plan = plan.to_vec();
    plan[i] = 0;
    let plain = forecast_round(&at, &plan, 0, costs)?;
    let per_token = plain.seconds() / plain.tokens;
    let mut best = 0.0_f64;
    for g in 1..=max.max(1) {
        plan[i] = g;
        let f = forecast_round(&at, &plan, 0, costs)?;
        let rounds = candidates[i].remaining as f64 / expected_tokens(alpha, g);
        best = best.max(rounds * (f.tokens * per_token - f.seconds()));
    }
    Some(best)
}

/// The best tokens per plain step's time a lone sequence `depth` context tokens deep (0: not
/// known) could expect from drafts that stand at rate `alpha`, over γ in `1..=gamma_max`: the
/// drafts' own steps priced, and the seconds of catch-up the drafter first needs, when
/// `drafted` is `Some(catch-up)` (a model's or a head's drafts), free when `None` (prompt
/// lookup's scan). `None` until the costs are measured. It compares kinds of draft a round
/// could make: a model's or a head's guesses against a short match's copy, which costs no
/// draft step and leaves the model behind.
pub fn solo_rate(
    alpha: f64,
    gamma_max: usize,
    (drafted, depth): (Option<f64>, usize),
    costs: &CostModel,
) -> Option<f64> {
    let at_depth = |w: usize| {
        let rows = (depth > 0).then_some((w, depth));
        costs.verify_seconds_with(w, rows)
    };
    let plain = at_depth(1)?;
    let mut best = None::<f64>;
    for g in 1..=gamma_max.max(1) {
        let (draft, catch_up) = match drafted {
            Some(catch_up) => (costs.draft_seconds(g, 1)?, catch_up),
            None => (0.0, 0.0),
        };
        let round = (at_depth(g + 1)? + draft) * costs.drafting_bias() + catch_up;
        let rate = expected_tokens(alpha, g) * plain / round;
        best = Some(best.map_or(rate, |b| b.max(rate)));
    }
    best
}

/// Decoding rounds in which nobody drafted after which one sequence drafts whatever the prices
/// say (see [`recheck_prices`]).
pub const RECHECK_AFTER_ROUNDS: u64 = 256;

/// Rounds without drafts a recheck needs per drafter token it must first catch up on.
///
/// A recheck pays its drafter's catch-up on everything it missed, and a token of the
/// target's text can cost a drafter up to an eighth of a target step (SmolLM2 takes in
/// Gemma 3's text as one to two of its tokens each, at a fifteenth of Gemma's step): 64 rounds
/// per drafter token keeps rechecks under a quarter of a percent of the time, where one every 256
/// rounds whatever it had to catch up on cost a server whose drafter does not pay 2-3% (each
/// caught up on a whole prompt and the tokens after it), and one every 16 rounds a token
/// still about 1%.
pub const RECHECK_ROUNDS_PER_CATCH_UP: u64 = 64;

/// Makes one sequence draft when nobody has for [`RECHECK_AFTER_ROUNDS`] decoding rounds,
/// whatever the prices say: the sequence free to speculate (or due a probe) with the least to
/// catch up on, at its smallest γ, if the rounds without drafts are at least
/// [`RECHECK_ROUNDS_PER_CATCH_UP`] per token of that catch-up. Returns whether it did.
///
/// Why: prices change only when they are measured, and a verification of several tokens or a
/// draft step is measured only when someone drafts. A start-up calibration spoiled by a burst
/// of other work on the machine (or a move to a busier one) can price drafting so high that
/// it never pays even at full acceptance: nobody drafts, nothing is measured again, and the
/// server never speculates for the rest of its life. One round now and then re-measures them
/// (the minimum of a price's recent measurements replaces a spoiled one at once), for about a
/// two-hundredth of the rounds of a server whose drafter really does not pay.
pub fn recheck_prices(
    candidates: &[Candidate],
    plan: &mut [usize],
    rounds_without_drafts: u64,
) -> bool {
    if rounds_without_drafts < RECHECK_AFTER_ROUNDS || plan.iter().any(|&g| g > 0) {
        return false;
    }
    let pick = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c.choice {
            Choice::Free { min, .. } => Some((i, min, c.catch_up)),
            Choice::Probe { gamma, .. } => Some((i, gamma, c.catch_up)),
            Choice::Fixed(_) => None,
        })
        .filter(|&(_, _, catch_up)| {
            catch_up as u64 * RECHECK_ROUNDS_PER_CATCH_UP <= rounds_without_drafts
        })
        .min_by_key(|&(_, _, catch_up)| catch_up);
    match pick {
        Some((i, gamma, _)) => {
            plan[i] = gamma.max(1);
            true
        }
        None => false,
    }
}

/// What a round run with a plan is expected to yield and cost, by part, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundForecast {
    pub tokens: f64,
    pub draft: f64,
    pub catch_up: f64,
    pub verify: f64,
    /// Sequences drafting, draft steps, and the target forward's width.
    pub drafting: usize,
    pub steps: usize,
    pub width: usize,
    /// How many times `draft + verify` the round is expected to take: the measured
    /// correction for rounds that draft (`CostModel::drafting_bias`), 1 for a plain one.
    pub bias: f64,
}

impl Default for RoundForecast {
    fn default() -> Self {
        Self {
            tokens: 0.0,
            draft: 0.0,
            catch_up: 0.0,
            verify: 0.0,
            drafting: 0,
            steps: 0,
            width: 0,
            bias: 1.0,
        }
    }
}

impl RoundForecast {
    /// The round's expected seconds, correction included.
    pub fn seconds(&self) -> f64 {
        (self.draft + self.verify) * self.bias + self.catch_up
    }
}

/// The forecast of a round run with `plan`, once costs are measured. A catch-up is charged
/// only the share of it this round's expected tokens carry of what the request may still
/// generate.
pub fn forecast_round(
    candidates: &[Candidate],
    plan: &[usize],
    base_width: usize,
    costs: &CostModel,
) -> Option<RoundForecast> {
    let mut f = RoundForecast {
        width: base_width,
        ..RoundForecast::default()
    };
    for (c, &g) in candidates.iter().zip(plan) {
        let t = expected_tokens(c.alpha, g);
        f.tokens += t;
        f.width += g + 1;
        f.steps = f.steps.max(g);
        f.drafting += usize::from(g > 0);
        if g > 0 && c.catch_up > 0 {
            f.catch_up +=
                costs.catch_up_seconds(c.catch_up) * (t / c.remaining.max(1) as f64).min(1.0);
        }
    }
    f.draft = costs.draft_seconds(f.steps, f.drafting)?;
    // Prices measured on shallower contexts (start-up's, other requests') would make drafting
    // beside a deep context look cheap: a step costs at least the start-up line at the depth
    // of the deepest drafting sequence.
    let deepest = candidates
        .iter()
        .zip(plan)
        .filter(|&(_, &g)| g > 0)
        .map(|(c, _)| c.depth)
        .max()
        .unwrap_or(0);
    f.draft = f
        .draft
        .max(f.steps as f64 * costs.draft_step_floor(deepest));
    // Each sequence's rows at its own depth (0: not known, priced as measured).
    let rows = candidates
        .iter()
        .zip(plan)
        .filter(|(c, _)| c.depth > 0)
        .map(|(c, &g)| (g + 1, c.depth));
    f.verify = costs.verify_seconds_with(f.width, rows)?;
    if f.drafting > 0 {
        f.bias = costs.drafting_bias();
    }
    Some(f)
}

/// Expected decoding tokens per second of a round run with `plan`, once costs are measured.
/// A prompt chunk in the same forward is charged to its prompt, not to decoding: its part of
/// the forward (what the forward costs with it over what it costs without) is taken off the
/// round, so plans are compared at the prices they have between prefills. Charged to decoding,
/// the chunk would make any round look slow, so drafting and catch-ups beside it would look
/// nearly free, and the new request would wait for them before its first token.
fn round_rate(
    candidates: &[Candidate],
    plan: &[usize],
    base_width: usize,
    costs: &CostModel,
) -> Option<f64> {
    let f = forecast_round(candidates, plan, base_width, costs)?;
    let n = candidates.len();
    let chunk = costs.verify_seconds(base_width + n)? - costs.verify_seconds(n)?;
    let seconds = f.seconds() - chunk * f.bias;
    (seconds > 0.0).then(|| f.tokens / seconds)
}

#[cfg(test)]
mod tests;
