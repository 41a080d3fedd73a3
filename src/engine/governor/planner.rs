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
    /// Context tokens its drafter has not seen yet (taken in before drafting).
    pub catch_up: usize,
    /// Tokens it may still generate (its one-off catch-up is spread over them).
    pub remaining: usize,
    /// Context tokens its draft steps attend over (0 = not known: priced as measured).
    pub depth: usize,
}

/// Chooses every sequence's γ for one round (DESIGN.md §4) to maximise the round's expected
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
/// A sequence free to speculate is priced at full acceptance: pricing a first round at its
/// estimate declines catch-ups that the rounds after them repay. A probe is priced halfway
/// between its estimate and full acceptance: hopeful, since its estimate is stale and finding
/// out is what it is for, but not blind: priced at full acceptance, a poor drafter would keep
/// probing, and each probe first takes in everything decoded since the last. A drafter that
/// loses even at full acceptance is never probed.
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
    let alpha = match c.choice {
        Choice::Probe { .. } => (c.alpha + 1.0) / 2.0,
        _ => 1.0,
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

/// What a round run with a plan is expected to yield and cost, by part, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoundForecast {
    pub tokens: f64,
    pub draft: f64,
    pub catch_up: f64,
    pub verify: f64,
    /// Sequences drafting, draft steps, and the target forward's width.
    pub drafting: usize,
    pub steps: usize,
    pub width: usize,
}

impl RoundForecast {
    pub fn seconds(&self) -> f64 {
        self.draft + self.catch_up + self.verify
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
    f.verify = costs.verify_seconds(f.width)?;
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
    let seconds = f.seconds() - chunk;
    (seconds > 0.0).then(|| f.tokens / seconds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::governor::test_support::{costs, solo};
    use crate::engine::governor::*;

    #[test]
    fn expected_speedup_matches_the_paper() {
        // α = 0: every round yields one token at the round's cost.
        assert!((expected_speedup(0.0, 4, 2.0) - 0.5).abs() < 1e-12);
        // α = 1: γ + 1 tokens.
        assert!((expected_speedup(1.0, 3, 2.0) - 2.0).abs() < 1e-12);
        // α = 0.5, γ = 2: 1 + 0.5 + 0.25 tokens.
        assert!((expected_speedup(0.5, 2, 1.0) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn bad_drafter_means_plain_good_drafter_means_speculation() {
        // Draft step 20% of a target step; verifying 2-9 tokens costs 1.2x-3x a step.
        let c = costs(0.2, &[1.0, 1.2, 1.4, 1.6, 1.9, 2.2, 2.5, 2.8, 3.0]);
        let mut bad = Governor::new(GovernorConfig::default());
        let mut good = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            bad.record_round(4, 0);
            good.record_round(4, 4);
        }
        assert_eq!(solo(&bad, &c), 0, "α ≈ {}", bad.alpha());
        assert!(solo(&good, &c) >= 4, "α ≈ {}", good.alpha());
    }

    #[test]
    fn a_short_gamma_that_always_agrees_does_not_hold_speculation_back() {
        // An f16 target with a quantized self-drafter (in target steps): a draft step 0.65, a
        // 2-5 token verification 1.27-1.75. At γ = 1 every draft stood for 50 rounds: γ = 1
        // barely beats plain (2 tokens for 1.92 steps), γ = 3 or 4 wins ~1.1x. Decayed per
        // round, α stayed at 11/12 and the plan never left γ = 1.
        let c = costs(0.65, &[1.0, 1.27, 1.45, 1.59, 1.75]);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..50 {
            g.record_round(1, 1);
        }
        assert!(g.alpha() > 0.96, "α ≈ {}", g.alpha());
        assert!(solo(&g, &c) >= 3, "γ = {}, α ≈ {}", solo(&g, &c), g.alpha());
    }

    #[test]
    fn costly_drafter_is_refused_even_when_it_agrees() {
        // A drafter as slow as the target cannot win at any α on this cost curve.
        let c = costs(1.0, &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(3, 3);
        }
        assert_eq!(solo(&g, &c), 0);
    }

    #[test]
    fn no_probe_when_catching_up_costs_more_than_it_could_save() {
        let mut c = costs(0.5, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        c.record_catch_up(10.0, 100);
        let probe = |catch_up, remaining| Candidate {
            alpha: 0.5,
            choice: Choice::Probe { gamma: 1, max: 8 },
            catch_up,
            remaining,
            depth: 0,
        };
        // At best (all accepted, γ = 8) rounds cost 5.8 steps for 9 tokens: 1.55x, saving a
        // third of a step per token; catching up on 100 tokens costs 10 steps.
        assert_eq!(plan_round(&[probe(100, 20)], 0, &c, 1.02), vec![0]);
        assert_eq!(plan_round(&[probe(100, 200)], 0, &c, 1.02), vec![1]);
        // A drafter that loses even when always right is never probed.
        let slow = costs(2.0, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        assert_eq!(plan_round(&[probe(0, 10_000)], 0, &slow, 1.02), vec![0]);
    }

    #[test]
    fn a_probe_beside_other_requests_is_priced_in_their_batch() {
        // A forward costs 0.9 steps plus 0.1 a token; a draft step 0.3; catching up on the
        // 100-token prompt 20 steps.
        let verify: Vec<f64> = (1..=16).map(|w| 0.9 + 0.1 * w as f64).collect();
        let mut c = costs(0.3, &verify);
        c.record_catch_up(20.0, 100);
        // A probe is priced at 95% acceptance (halfway from its 90% estimate to all).
        let probe = Candidate {
            alpha: 0.9,
            choice: Choice::Probe { gamma: 1, max: 8 },
            catch_up: 100,
            remaining: 60,
            depth: 0,
        };
        // Alone, a round of 8 drafts yields 7.4 tokens for 4.2 steps: it could save 26 steps
        // over 60 tokens, so the catch-up is worth trying.
        assert_eq!(plan_round(&[probe], 0, &c, 1.02), vec![1]);
        // Beside a request decoding plainly, a plain step already yields 2 tokens for 1.1
        // steps; drafting 8 saves 0.3 steps a round, 2.5 over the request: not worth 20.
        let plain = Candidate {
            choice: Choice::Fixed(0),
            catch_up: 0,
            ..probe
        };
        assert_eq!(plan_round(&[probe, plain], 0, &c, 1.02), vec![0, 0]);
        // With no catch-up to pay, the probe goes ahead in the batch too.
        let caught_up = Candidate {
            catch_up: 0,
            ..probe
        };
        assert_eq!(plan_round(&[caught_up, plain], 0, &c, 1.02), vec![1, 0]);
    }

    #[test]
    fn a_drafter_that_keeps_failing_is_not_probed_at_the_price_of_a_catch_up() {
        let verify: Vec<f64> = (1..=16).map(|w| 0.9 + 0.1 * w as f64).collect();
        let mut c = costs(0.3, &verify);
        // Catching up on the 100 tokens decoded since the last probe: 10 steps.
        c.record_catch_up(10.0, 100);
        let probe = |alpha| Candidate {
            alpha,
            choice: Choice::Probe { gamma: 1, max: 8 },
            catch_up: 100,
            remaining: 60,
            depth: 0,
        };
        // Every draft accepted would save 32 steps; at 60% (halfway from its 20%) under 8.
        assert_eq!(plan_round(&[probe(0.2)], 0, &c, 1.05), vec![0]);
        assert_eq!(plan_round(&[probe(0.9)], 0, &c, 1.05), vec![1]);
        // With nothing to catch up on (prompt lookup), probing costs a draft and is made.
        let free = Candidate {
            catch_up: 0,
            ..probe(0.2)
        };
        assert_eq!(plan_round(&[free], 0, &c, 1.05), vec![1]);
    }

    #[test]
    fn unmeasured_costs_start_with_the_smallest_gamma() {
        let g = Governor::new(GovernorConfig::default());
        let plan = plan_round(&[g.candidate(2, 8, 0, 100)], 0, &CostModel::new(9), 1.02);
        assert_eq!(plan, vec![2]);
    }

    #[test]
    fn a_batch_speculates_less_when_verification_width_is_not_free() {
        // Forwards of up to 4 tokens cost about one step (weights streamed once), wider ones
        // pay per token; prompt lookup drafts for free.
        let verify: Vec<f64> = (1..=72)
            .map(|w: usize| 1.0 + 0.02 * w.min(4) as f64 + 0.3 * w.saturating_sub(4) as f64)
            .collect();
        let c = costs(0.0, &verify);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(4, 2);
            g.record_round(4, 4);
        }
        let one = g.candidate(1, 8, 0, 1000);
        let alone = plan_round(&[one], 0, &c, 1.02);
        assert!(alone[0] >= 2, "alone it speculates: {alone:?}");
        let batch = plan_round(&[one; 8], 0, &c, 1.02);
        assert!(
            batch.iter().sum::<usize>() < 8 * alone[0],
            "eight at once draft less each: {batch:?} vs {alone:?}"
        );
        let rate = |plan: &[usize]| round_rate(&[one; 8], plan, 0, &c).unwrap();
        assert!(rate(&batch) >= rate(&[0; 8]) && rate(&batch) >= rate(&[alone[0]; 8]));
        // Beside a prompt chunk the forward is wide anyway: a few more tokens cost little next
        // to the whole round, so drafting still pays.
        let with_prefill = plan_round(&[one], 64, &c, 1.02);
        assert!(with_prefill[0] > 0, "{with_prefill:?}");
    }

    #[test]
    fn a_drafter_far_behind_speculates_only_if_enough_output_is_left() {
        let mut c = costs(0.2, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        // Taking in a context token costs a tenth of a step.
        c.record_catch_up(50.0, 500);
        let mut g = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            g.record_round(4, 4);
        }
        let near_end = plan_round(&[g.candidate(1, 8, 500, 3)], 0, &c, 1.02);
        assert_eq!(
            near_end,
            vec![0],
            "500 tokens to catch up for 3 tokens of output"
        );
        let lots_left = plan_round(&[g.candidate(1, 8, 500, 2000)], 0, &c, 1.02);
        assert!(lots_left[0] > 0, "{lots_left:?}");
    }

    #[test]
    fn a_long_catch_up_is_not_hidden_beside_a_prompt_chunk() {
        let mut c = costs(0.5, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
        // Taking in a context token costs 0.15 steps: a 900-token prompt costs 135 steps,
        // more than speculation could save over 64 tokens even if every draft stood.
        c.record_catch_up(15.0, 100);
        let mut good = Governor::new(GovernorConfig::default());
        for _ in 0..30 {
            good.record_round(4, 4);
        }
        // Beside a 200-token prompt chunk the round is long anyway, so this round's share of
        // the catch-up looks cheap; it is paid in full all the same.
        let far_behind = plan_round(&[good.candidate(1, 8, 900, 64)], 200, &c, 1.02);
        assert_eq!(far_behind, vec![0]);
        let close = plan_round(&[good.candidate(1, 8, 20, 64)], 200, &c, 1.02);
        assert!(close[0] > 0, "{close:?}");
    }

    #[test]
    fn drafting_beside_a_prompt_chunk_is_priced_as_between_prefills() {
        // A forward costs 0.9 steps plus 0.1 a token; a draft step half a step.
        let verify: Vec<f64> = (1..=256).map(|w| 0.9 + 0.1 * w as f64).collect();
        let c = costs(0.5, &verify);
        // At 60% acceptance a round of one draft yields 1.6 tokens for 1.6 steps: no gain.
        let so_so = Governor::with_prior(GovernorConfig::default(), 0.6).candidate(1, 8, 0, 100);
        assert_eq!(plan_round(&[so_so], 0, &c, 1.02), vec![0]);
        // Beside a 164-token chunk the forward costs 17.4 steps whatever this request does;
        // charged to decoding, drafting looked 1.5x faster, yet it only makes the chunk's
        // prompt wait longer for its first token.
        assert_eq!(plan_round(&[so_so], 164, &c, 1.02), vec![0]);
        // A drafter that pays between prefills still drafts beside one.
        let good = Governor::with_prior(GovernorConfig::default(), 0.95).candidate(1, 8, 0, 100);
        assert!(plan_round(&[good], 0, &c, 1.02)[0] > 0);
        assert!(plan_round(&[good], 164, &c, 1.02)[0] > 0);
    }

    #[test]
    fn fixed_choices_are_kept() {
        let c = costs(1.0, &[1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]);
        let fixed = Candidate {
            alpha: 0.0,
            choice: Choice::Fixed(3),
            catch_up: 0,
            remaining: 100,
            depth: 0,
        };
        assert_eq!(plan_round(&[fixed], 0, &c, 1.02), vec![3]);
    }
}
