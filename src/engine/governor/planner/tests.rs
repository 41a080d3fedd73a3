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
fn drafting_that_runs_over_its_forecast_is_priced_as_it_ran() {
    // SmolLM2 drafting for Gemma 3, sampled: a draft step 0.65 of a target step, verifying 2
    // tokens 1.05x (its price from a quiet spell), three drafts in four standing. Forecast:
    // 1.75 tokens for 1.70 steps at γ = 1, a win of a few percent over plain.
    let mut c = costs(0.65, &[1.0, 1.05, 1.6, 2.1]);
    let mut g = Governor::new(GovernorConfig::default());
    for _ in 0..30 {
        g.record_round(4, 3);
    }
    let plan = |g: &Governor, c: &CostModel| {
        plan_round(&[g.candidate(1, 3, (0, 1000), None)], 0, c, 1.0)[0]
    };
    assert_eq!(plan(&g, &c), 1, "α ≈ {}", g.alpha());
    let forecast = forecast_round(&[g.candidate(1, 1, (0, 1000), None)], &[1], 0, &c).unwrap();
    assert_eq!(forecast.bias, 1.0);
    // Its rounds took 1.25x their forecast where plain steps took their price.
    for _ in 0..50 {
        c.record_round_forecast(false, 1.0, 1.0);
        c.record_round_forecast(true, 1.7, 1.7 * 1.25);
    }
    assert!(
        (c.drafting_bias() - 1.25).abs() < 0.02,
        "{}",
        c.drafting_bias()
    );
    assert_eq!(plan(&g, &c), 0, "priced as it ran, drafting loses");
    let forecast = forecast_round(&[g.candidate(1, 1, (0, 1000), None)], &[1], 0, &c).unwrap();
    assert!((forecast.seconds() - 1.7 * c.drafting_bias()).abs() < 1e-9);
    // A plain round's forecast is never scaled.
    let plain = forecast_round(&[g.candidate(1, 1, (0, 1000), None)], &[0], 0, &c).unwrap();
    assert_eq!(plain.seconds(), 1.0);
    // Once drafting rounds (a recheck's, a probe's) come in on their forecast again, the
    // correction fades and the plan drafts again.
    for _ in 0..200 {
        c.record_round_forecast(true, 1.7, 1.7);
    }
    assert!(c.drafting_bias() < 1.01, "{}", c.drafting_bias());
    assert_eq!(plan(&g, &c), 1);
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
        ceiling: 1.0,
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
        ceiling: 1.0,
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

/// A step costs 1 s, a forward 0.9 s plus 0.1 s a token, a draft step 0.3 s, and catching up
/// on 100 tokens `catch_up_100` s.
fn linear_costs(catch_up_100: f64) -> CostModel {
    let verify: Vec<f64> = (1..=16).map(|w| 0.9 + 0.1 * w as f64).collect();
    let mut c = costs(0.3, &verify);
    c.record_catch_up(catch_up_100, 100);
    c
}

/// A probe at γ 1 (up to 8) whose drafter must first take in `catch_up` tokens.
fn probe_after(alpha: f64, catch_up: usize, remaining: usize) -> Candidate {
    Candidate {
        alpha,
        choice: Choice::Probe { gamma: 1, max: 8 },
        catch_up,
        remaining,
        depth: 0,
        ceiling: 1.0,
    }
}

#[test]
fn a_drafter_that_keeps_failing_is_not_probed_at_the_price_of_a_catch_up() {
    // Catching up on the 100 tokens decoded since the last probe: 10 steps.
    let c = linear_costs(10.0);
    let probe = |alpha| probe_after(alpha, 100, 60);
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
fn hope_stops_at_the_share_of_the_text_a_drafter_of_another_vocabulary_covers() {
    // Catching up on 100 tokens costs 50 steps; at 30% no γ pays, halfway to all (65%) it
    // does (see the test below).
    let c = linear_costs(50.0);
    let covering = |ceiling| Candidate {
        ceiling,
        ..probe_after(0.3, 100, 1000)
    };
    assert_eq!(plan_round(&[covering(1.0)], 0, &c, 1.05), vec![1]);
    // A drafter covering 40% of the prompt: halfway to that (35%) saves nothing.
    assert_eq!(plan_round(&[covering(0.4)], 0, &c, 1.05), vec![0]);
    // A request whose own drafts stood more often than its prompt's coverage hopes from
    // its own rate up: at 90% it probes whatever the ceiling.
    let proven = Candidate {
        alpha: 0.9,
        ..covering(0.4)
    };
    assert_eq!(plan_round(&[proven], 0, &c, 1.05), vec![1]);
}

#[test]
fn hope_waits_while_drafting_has_lost_more_than_it_saved() {
    // Catching up on 100 tokens costs 50 steps.
    let mut c = linear_costs(50.0);
    let probe = |alpha| probe_after(alpha, 100, 1000);
    // At 30% no γ pays; halfway to all (65%) a γ of 1 saves a quarter of a step a round,
    // 150 s over the request: worth the catch-up.
    assert_eq!(plan_round(&[probe(0.3)], 0, &c, 1.05), vec![1]);
    // A round that drafted gave 3 tokens in 2 s: it saved a second against plain steps.
    c.record_decode_round(true, (3, &[(3, 0)]), 2.0);
    assert!(
        (c.drafting_net() - 1.0).abs() < 1e-9,
        "{}",
        c.drafting_net()
    );
    // Then drafting lost 2 s: one round of 3 s gave a single token.
    c.record_decode_round(true, (1, &[(3, 0)]), 3.0);
    assert!(!c.may_explore(), "{}", c.drafting_net());
    // Now the probe is priced at its own 30%, where nothing pays.
    assert_eq!(plan_round(&[probe(0.3)], 0, &c, 1.05), vec![0]);
    let fresh = Candidate {
        choice: Choice::Free { min: 1, max: 8 },
        ..probe(0.3)
    };
    assert_eq!(plan_round(&[fresh], 0, &c, 1.05), vec![0]);
    // A request whose own rate says drafting repays the catch-up still takes it in.
    assert_eq!(plan_round(&[probe(0.9)], 0, &c, 1.05), vec![1]);
    let good = Candidate {
        alpha: 0.9,
        ..fresh
    };
    assert!(plan_round(&[good], 0, &c, 1.05)[0] > 0);
    // Enough plain decoding wears the loss down, and hope comes back.
    for _ in 0..80 {
        c.record_decode_round(false, (1, &[(1, 0)]), 1.0);
    }
    assert!(c.may_explore(), "{}", c.drafting_net());
    assert_eq!(plan_round(&[probe(0.3)], 0, &c, 1.05), vec![1]);
    // A frozen table keeps no ledger.
    let mut frozen = linear_costs(50.0).freeze();
    frozen.record_decode_round(true, (1, &[(1, 0)]), 30.0);
    assert!(frozen.may_explore() && frozen.drafting_net() == 0.0);
}

#[test]
fn unmeasured_costs_start_with_the_smallest_gamma() {
    let g = Governor::new(GovernorConfig::default());
    let plan = plan_round(
        &[g.candidate(2, 8, (0, 100), None)],
        0,
        &CostModel::new(9),
        1.02,
    );
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
    let one = g.candidate(1, 8, (0, 1000), None);
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
    let near_end = plan_round(&[g.candidate(1, 8, (500, 3), None)], 0, &c, 1.02);
    assert_eq!(
        near_end,
        vec![0],
        "500 tokens to catch up for 3 tokens of output"
    );
    let lots_left = plan_round(&[g.candidate(1, 8, (500, 2000), None)], 0, &c, 1.02);
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
    let far_behind = plan_round(&[good.candidate(1, 8, (900, 64), None)], 200, &c, 1.02);
    assert_eq!(far_behind, vec![0]);
    let close = plan_round(&[good.candidate(1, 8, (20, 64), None)], 200, &c, 1.02);
    assert!(close[0] > 0, "{close:?}");
}

#[test]
fn drafting_beside_a_prompt_chunk_is_priced_as_between_prefills() {
    // A forward costs 0.9 steps plus 0.1 a token; a draft step half a step.
    let verify: Vec<f64> = (1..=256).map(|w| 0.9 + 0.1 * w as f64).collect();
    let c = costs(0.5, &verify);
    // At 60% acceptance a round of one draft yields 1.6 tokens for 1.6 steps: no gain.
    let so_so =
        Governor::with_prior(GovernorConfig::default(), 0.6).candidate(1, 8, (0, 100), None);
    assert_eq!(plan_round(&[so_so], 0, &c, 1.02), vec![0]);
    // Beside a 164-token chunk the forward costs 17.4 steps whatever this request does;
    // charged to decoding, drafting looked 1.5x faster, yet it only makes the chunk's
    // prompt wait longer for its first token.
    assert_eq!(plan_round(&[so_so], 164, &c, 1.02), vec![0]);
    // A drafter that pays between prefills still drafts beside one.
    let good =
        Governor::with_prior(GovernorConfig::default(), 0.95).candidate(1, 8, (0, 100), None);
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
        ceiling: 1.0,
    };
    assert_eq!(plan_round(&[fixed], 0, &c, 1.02), vec![3]);
}

#[test]
fn prices_that_forbid_drafting_are_measured_again_after_a_while() {
    // Drafting loses even when every draft stands: nobody drafts, so nothing is re-measured.
    let slow = costs(2.0, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
    let free = |catch_up| Candidate {
        alpha: 0.9,
        choice: Choice::Free { min: 2, max: 8 },
        catch_up,
        remaining: 1000,
        depth: 0,
        ceiling: 1.0,
    };
    let probe = Candidate {
        choice: Choice::Probe { gamma: 1, max: 8 },
        ..free(10)
    };
    let off = Candidate {
        choice: Choice::Fixed(0),
        ..free(0)
    };
    let all = [off, free(40), probe, free(2_000)];
    let mut plan = plan_round(&all, 0, &slow, 1.02);
    assert_eq!(plan, vec![0, 0, 0, 0]);
    assert!(!recheck_prices(&all, &mut plan, RECHECK_AFTER_ROUNDS - 1));
    assert_eq!(plan, vec![0, 0, 0, 0]);
    // After long enough, the one with the least to catch up drafts (never one whose γ is
    // fixed, nor one whose catch-up would cost more than the rounds it makes up for).
    assert!(!recheck_prices(&all, &mut plan, RECHECK_AFTER_ROUNDS));
    assert!(recheck_prices(
        &all,
        &mut plan,
        10 * RECHECK_ROUNDS_PER_CATCH_UP
    ));
    assert_eq!(plan, vec![0, 0, 1, 0]);
    // A catch-up of 40 tokens waits for 64 rounds a token: rechecking at 256 rounds would
    // spend on it a fifth of what those rounds took, with a drafter this dear to catch up.
    let mut plan = vec![0, 0];
    let forty = 40 * RECHECK_ROUNDS_PER_CATCH_UP;
    assert!(!recheck_prices(&[off, free(40)], &mut plan, forty - 1));
    assert_eq!(plan, vec![0, 0]);
    assert!(recheck_prices(&[off, free(40)], &mut plan, forty));
    assert_eq!(plan, vec![0, 2]);
    let mut plan = vec![0, 0];
    assert!(!recheck_prices(&[off, free(2_000)], &mut plan, 10_000));
    // A round where someone drafts measures the prices already.
    let mut plan = vec![0, 3];
    assert!(!recheck_prices(&[off, free(40)], &mut plan, 10_000));
    assert_eq!(plan, vec![0, 3]);
}

#[test]
fn a_kind_of_draft_is_worth_its_tokens_over_its_costs() {
    // A draft step costs a fifth of a step; verifying 2-9 tokens 1.05x-1.8x.
    let c = costs(0.2, &[1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7]);
    let free = |alpha| solo_rate(alpha, 8, (None, 0), &c).unwrap();
    let stepped = |alpha| solo_rate(alpha, 8, (Some(0.0), 0), &c).unwrap();
    // The best γ's tokens per step: at 50% and no draft cost, γ = 2 gives 1.75 for 1.1.
    assert!((free(0.5) - 1.75 / 1.1).abs() < 1e-9, "{}", free(0.5));
    // The same acceptance with draft steps to pay is worth less; a little more acceptance
    // does not make up for them, much more does.
    assert!(stepped(0.5) < free(0.5));
    assert!(stepped(0.55) < free(0.5));
    assert!(stepped(0.8) > free(0.5));
    // Never below a plain step's worth at γ = 1 for free drafts: a draft costs nothing.
    assert!(free(0.0) > 0.9);
    assert!(solo_rate(0.5, 8, (Some(0.0), 0), &CostModel::new(9)).is_none());
    // A drafter that must first catch up on the text a match's copies wrote (a draft model
    // after prompt lookup's rounds) is worth less by that catch-up: at three steps' worth of
    // it, a match accepted half the time is worth more than drafts that nearly always stand.
    let behind = |alpha| solo_rate(alpha, 8, (Some(3.0), 0), &c).unwrap();
    assert!(behind(0.8) < stepped(0.8));
    assert!(behind(0.95) < free(0.5));
}

#[test]
fn drafting_that_pays_near_the_start_of_a_context_is_declined_deep_in_one() {
    // Prompt lookup's free drafts (no draft step) at 40% acceptance; widths 1-4 timed at depth
    // 32 (1.0-1.3) and at 544, where attention made each wider row dearer per token of depth.
    let shallow = [(1, 1.0), (2, 1.1), (3, 1.2), (4, 1.3)];
    let deep: Vec<(usize, f64)> = shallow
        .iter()
        .map(|&(w, s)| (w, s + 0.2 * w as f64))
        .collect();
    let mut c = costs(0.0, &shallow.map(|(_, s)| s));
    c.set_verify_depth(VerifyDepth::from_timings((32, &shallow), (544, &deep)));
    let at = |depth| Candidate {
        alpha: 0.4,
        choice: Choice::Free { min: 1, max: 3 },
        catch_up: 0,
        remaining: 1000,
        depth,
        ceiling: 1.0,
    };
    assert!(plan_round(&[at(40)], 0, &c, 1.02)[0] > 0);
    // 2000 tokens deep a step costs 1.78, a 2-token verification 2.66: 1.4 tokens for 1.49
    // steps, and wider is worse.
    assert_eq!(plan_round(&[at(2032)], 0, &c, 1.02), vec![0]);
    // Priced by width alone (no depth line), the same request would draft.
    let flat = costs(0.0, &shallow.map(|(_, s)| s));
    assert!(plan_round(&[at(2032)], 0, &flat, 1.02)[0] > 0);
    // A kind's solo rate says the same.
    assert!(solo_rate(0.4, 3, (None, 2032), &c).unwrap() < 1.0);
    assert!(solo_rate(0.4, 3, (None, 40), &c).unwrap() > 1.02);
}
