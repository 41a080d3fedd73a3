use super::*;
use crate::engine::governor::test_support::costs;
use crate::engine::governor::*;

#[test]
fn a_rounds_first_draft_step_is_priced_apart_from_the_rest() {
    let mut c = CostModel::new(5);
    // A γ = 3 round: its first step took in two tokens (8 ms), the later ones one (5 ms).
    c.record_draft(0.018, (0.008, 2), 3, 1);
    assert!((c.draft_seconds(1, 1).unwrap() - 0.008).abs() < 1e-12);
    assert!((c.draft_seconds(4, 1).unwrap() - 0.023).abs() < 1e-12);
    // γ = 1 rounds measure only first steps; the later-step price stands.
    c.record_draft(0.009, (0.009, 2), 1, 1);
    assert!((c.draft_seconds(3, 1).unwrap() - 0.018).abs() < 1e-12);
    // Untimed first steps count as average ones.
    let mut u = CostModel::new(5);
    u.record_draft(0.012, (0.0, 0), 3, 1);
    assert!((u.draft_seconds(2, 1).unwrap() - 0.008).abs() < 1e-12);
}

#[test]
fn a_wide_forward_slower_than_as_many_steps_is_not_kept() {
    let mut c = CostModel::new(4);
    c.record_verify(1.0, 1);
    c.record_verify(1.5, 2);
    c.mark_provisional();
    c.record_verify(1.0, 1);
    // Kept, it would replace the start-up price as the width's only live one.
    c.record_verify(2.4, 2);
    assert_eq!(
        c.verify_seconds(2),
        Some(1.5),
        "2.4 > 2 steps of 1.0: noise"
    );
    c.record_verify(1.8, 2);
    assert_eq!(
        c.verify_seconds(2),
        Some(1.8),
        "a plausible live price replaces it"
    );
    // Before a live one-token price, nothing is judged.
    let mut fresh = CostModel::new(4);
    fresh.record_verify(9.0, 3);
    assert_eq!(fresh.verify_seconds(3), Some(9.0));
}

#[test]
fn verify_costs_are_interpolated_between_measured_widths() {
    let mut c = CostModel::new(9);
    c.record_draft(0.0, (0.0, 0), 1, 1);
    c.record_verify(1.0, 1);
    c.record_verify(2.0, 3);
    // Width 2 halfway between widths 1 and 3; width 6 extrapolated per token, and so is a
    // width past the model's range.
    assert!((c.round_cost(1).unwrap() - 1.5).abs() < 1e-12);
    assert!((c.round_cost(5).unwrap() - 4.0).abs() < 1e-12);
    assert!((c.verify_seconds(30).unwrap() - 20.0).abs() < 1e-12);
    assert_eq!(c.verify_seconds(0), Some(0.0));
}

#[test]
fn fresher_prices_of_other_widths_bound_a_stale_one() {
    let mut c = CostModel::new(8);
    c.record_verify(1.0, 1);
    // Width 3 last ran deep in long prompts; width 4 runs now, on short ones.
    c.record_verify(1.6, 3);
    c.record_verify(1.4, 4);
    assert_eq!(c.verify_seconds(3), Some(1.4));
    assert_eq!(c.verify_seconds(4), Some(1.4));
    assert!(c.verify_seconds(2).unwrap() <= 1.4);
    assert_eq!(c.verify_seconds(1), Some(1.0));
    // And a wide forward priced on short contexts is not cheaper than a narrow one that
    // ran since, deeper in.
    c.record_verify(1.5, 2);
    assert_eq!(c.verify_seconds(3), Some(1.5));
    assert_eq!(c.verify_seconds(4), Some(1.5));
    c.record_verify(1.4, 4);
    c.record_verify(1.3, 3);
    assert_eq!(c.verify_seconds(3), Some(1.3));
    // So one of three requests drafting a token is not mistaken for free.
    let mut g = Governor::new(GovernorConfig::default());
    for _ in 0..30 {
        g.record_round(4, 4);
    }
    c.record_draft(0.5, (0.0, 0), 1, 1);
    let three = [g.candidate(1, 1, (0, 100), None); 3];
    assert_eq!(plan_round(&three, 0, &c, 1.02), vec![0, 0, 0]);
}

#[test]
fn drafting_that_runs_over_its_forecast_is_priced_higher() {
    let mut c = CostModel::new(4);
    c.record_draft(1.0, (0.0, 0), 1, 1);
    c.record_verify(1.0, 1);
    assert_eq!(c.draft_seconds(1, 1), Some(1.0));
    for _ in 0..50 {
        let f = c.draft_seconds(2, 1).unwrap();
        c.record_draft_forecast(f, 2.0 * 1.5);
    }
    assert!((c.draft_seconds(1, 1).unwrap() - 1.5).abs() < 0.01);
    // A drafter whose steps cost 0.5 of a target step when lucky and 0.75 typically, at
    // 70% acceptance: worth it by the luckiest price, not by the typical one.
    let g = Governor::with_prior(GovernorConfig::default(), 0.7);
    let mut lucky = CostModel::new(4);
    lucky.record_draft(0.5, (0.0, 0), 1, 1);
    for w in 1..=4 {
        lucky.record_verify(1.0 + 0.05 * (w - 1) as f64, w);
    }
    let one = [g.candidate(1, 3, (0, 100), None)];
    assert!(plan_round(&one, 0, &lucky, 1.05)[0] > 0);
    for _ in 0..50 {
        let f = lucky.draft_seconds(1, 1).unwrap();
        lucky.record_draft_forecast(f, 0.75);
    }
    assert_eq!(plan_round(&one, 0, &lucky, 1.05), vec![0]);
}

#[test]
fn draft_steps_are_priced_by_how_many_sequences_draft() {
    let mut c = CostModel::new(8);
    c.record_draft(3.0, (0.0, 0), 3, 1);
    c.record_draft(6.0, (0.0, 0), 2, 4);
    assert_eq!(c.draft_seconds(2, 1), Some(2.0));
    assert_eq!(c.draft_seconds(1, 4), Some(3.0));
    // Between measured sizes: interpolated. Past the largest, a first step (a forward as
    // wide as its feeds) along the line through the two widest; later steps at the largest's.
    assert!((c.draft_seconds(1, 2).unwrap() - 5.0 / 3.0).abs() < 1e-12);
    assert!((c.draft_seconds(1, 8).unwrap() - (3.0 + 4.0 * 2.0 / 3.0)).abs() < 1e-12);
    assert!((c.draft_seconds(2, 8).unwrap() - (3.0 + 4.0 * 2.0 / 3.0 + 3.0)).abs() < 1e-12);
    assert_eq!(c.draft_seconds(0, 8), Some(0.0));
    assert_eq!(CostModel::new(8).draft_seconds(1, 1), None);
}

#[test]
fn live_measurements_replace_start_up_ones() {
    let mut c = CostModel::new(2);
    c.record_verify(1.0, 1);
    c.record_verify(2.0, 2);
    c.record_draft(0.5, (0.0, 0), 1, 1);
    c.mark_provisional();
    assert_eq!(c.verify_seconds(1), Some(1.0));
    c.record_verify(1.3, 1);
    c.record_draft(0.7, (0.0, 0), 1, 1);
    assert_eq!(c.verify_seconds(1), Some(1.3));
    assert_eq!(c.draft_seconds(1, 1), Some(0.7));
    // Live ones then keep the minimum of the window; a width measured only at start-up
    // drifts as its nearest live-measured neighbour did (1.0 -> 1.3).
    c.record_verify(1.5, 1);
    assert_eq!(c.verify_seconds(1), Some(1.3));
    assert!((c.verify_seconds(2).unwrap() - 2.6).abs() < 1e-12);
    c.record_verify(2.1, 2);
    assert_eq!(c.verify_seconds(2), Some(2.1));
}

#[test]
fn catch_ups_are_priced_by_size() {
    let mut c = CostModel::new(4);
    assert_eq!(c.catch_up_seconds(100), 0.0);
    c.record_catch_up(0.5, 32);
    c.record_catch_up(2.0, 256);
    // Each size class at its own price per token; an unmeasured one at the nearest
    // measured class, the dearer one on a tie.
    assert!((c.catch_up_seconds(40) - 40.0 * 0.5 / 32.0).abs() < 1e-12);
    assert!((c.catch_up_seconds(300) - 300.0 * 2.0 / 256.0).abs() < 1e-12);
    // Past it, never below the smaller class's price per token.
    assert!((c.catch_up_seconds(1000) - 1000.0 * 0.5 / 32.0).abs() < 1e-12);
    assert!((c.catch_up_seconds(3) - 3.0 * 0.5 / 32.0).abs() < 1e-12);
    assert!((c.catch_up_seconds(100) - 100.0 * 0.5 / 32.0).abs() < 1e-12);
    assert_eq!(c.catch_up_seconds(0), 0.0);
    let mut tie = CostModel::new(4);
    tie.record_catch_up(0.5, 32);
    tie.record_catch_up(4.0, 128);
    assert!((tie.catch_up_seconds(64) - 64.0 * 4.0 / 128.0).abs() < 1e-12);
}

#[test]
fn catch_ups_past_the_deepest_measured_size_are_extrapolated() {
    let mut c = CostModel::new(4);
    c.record_catch_up(31.0 * 0.9e-3, 31);
    c.record_catch_up(255.0 * 1.0e-3, 255);
    // 0.1 ms a token dearer over 224 more tokens: a 767-token prompt at 1.0 ms a token
    // plus 512/224 of that.
    let want = 767.0 * (1.0e-3 + 0.1e-3 * 512.0 / 224.0);
    assert!((c.catch_up_seconds(767) - want).abs() < 1e-9);
    // Sizes measured, or below the deepest, keep their class's price.
    assert!((c.catch_up_seconds(200) - 0.2).abs() < 1e-9);
    assert!((c.catch_up_seconds(40) - 40.0 * 0.9e-3).abs() < 1e-9);
}

#[test]
fn a_deep_small_catch_up_keeps_larger_unmeasured_ones_from_looking_cheap() {
    let mut c = CostModel::new(4);
    // Start-up's two sizes from the context's start, then a live 82-token catch-up after a
    // plain stretch deep in a context: dearer per token than its size alone says.
    c.record_catch_up(31.0 * 0.26e-3, 31);
    c.record_catch_up(255.0 * 0.29e-3, 255);
    c.record_catch_up(82.0 * 0.43e-3, 82);
    // The line through 82 and 255 falls; a 770-token prompt is priced at no less than
    // 0.43 ms a token, not flat at 0.29.
    assert!((c.catch_up_seconds(770) - 770.0 * 0.43e-3).abs() < 1e-9);
    // A measured class keeps its own price (128-255 tokens, and 16-31).
    assert!((c.catch_up_seconds(150) - 150.0 * 0.29e-3).abs() < 1e-9);
    assert!((c.catch_up_seconds(20) - 20.0 * 0.26e-3).abs() < 1e-9);
    // Between measured classes (32-63, between 16-31 and 64-127), the dearer neighbour's.
    assert!((c.catch_up_seconds(40) - 40.0 * 0.43e-3).abs() < 1e-9);
}

#[test]
fn draft_steps_at_depth_cost_at_least_the_start_up_line() {
    let verify = [
        0.012, 0.0125, 0.013, 0.0135, 0.014, 0.0145, 0.015, 0.0155, 0.016,
    ];
    let mut c = costs(0.003, &verify);
    c.record_catch_up(0.6, 600);
    // Start-up: 3 ms a step at 30 tokens of context, 4 ms at 250.
    c.record_draft_depths((30, 0.003), (250, 0.004));
    assert_eq!(c.draft_step_floor(10), 0.0);
    let deep = 0.003 + 0.001 * 1970.0 / 220.0;
    assert!((c.draft_step_floor(2000) - deep).abs() < 1e-12);
    let free = |depth| Candidate {
        alpha: 0.9,
        choice: Choice::Free { min: 1, max: 8 },
        catch_up: 600,
        remaining: 200,
        depth,
        ceiling: 1.0,
    };
    // Shallow, a draft step is a quarter of a plain step and the catch-up repays itself;
    // at a depth of 2000 a step costs as much as the plain step it should save.
    assert!(plan_round(&[free(40)], 0, &c, 1.05)[0] > 0);
    assert_eq!(plan_round(&[free(2000)], 0, &c, 1.05), vec![0]);
    let f = forecast_round(&[free(2000)], &[4], 0, &c).unwrap();
    assert!((f.draft - 4.0 * deep).abs() < 1e-12, "{f:?}");
}

#[test]
fn a_frozen_table_ignores_every_measurement() {
    let table = costs(1e-4, &[1e-3, 1.1e-3, 1.2e-3]).freeze();
    let before = (
        table.verify_seconds(2),
        table.draft_seconds(3, 1),
        table.catch_up_seconds(64),
    );
    let mut live = table.clone();
    live.mark_provisional();
    live.record_verify(5e-3, 2);
    live.record_draft(1.0, (0.5, 1), 2, 1);
    live.record_draft_forecast(1e-4, 1.0);
    live.record_catch_up(1.0, 64);
    live.record_draft_depths((32, 1.0), (256, 2.0));
    live.record_round_forecast(true, 1e-3, 1.0);
    assert!(live.is_frozen());
    assert_eq!(live.drafting_bias(), 1.0);
    assert_eq!(
        (
            live.verify_seconds(2),
            live.draft_seconds(3, 1),
            live.catch_up_seconds(64)
        ),
        before
    );
    assert_eq!(live.draft_step_floor(1000), 0.0);
    // The same measurements do move an unfrozen table.
    let mut unfrozen = costs(1e-4, &[1e-3, 1.1e-3, 1.2e-3]);
    unfrozen.record_draft(1.0, (0.5, 1), 2, 1);
    unfrozen.record_draft_forecast(1e-4, 1.0);
    unfrozen.record_round_forecast(true, 1e-3, 1.0);
    assert_ne!(unfrozen.draft_seconds(3, 1), before.1);
    assert!(unfrozen.drafting_bias() > 1.0);
}

/// A mixture target (2 routed layers, 8 of 128 experts a row): a width's forward costs its
/// dense part plus 0.1 ms an expert read. Start-up's made-up text reads as uniform routing
/// would; live rounds of text whose rows share experts make every width cheaper, those not
/// run live too, by the reads they are expected to save.
#[test]
fn a_mixtures_widths_are_priced_by_the_experts_they_are_expected_to_read() {
    let per_expert = 1e-4;
    let dense = |w: usize| 1e-3 + 1e-4 * (w - 1) as f64;
    let uniform = |w: usize| (128.0 * (1.0 - (1.0 - 8.0 / 128.0_f64).powi(w as i32))).round();
    let mut c = CostModel::new(9);
    let mut prices = ExpertPrices::new(128, 8, 2);
    prices.set_per_expert(
        (2 * uniform(9) as usize, 0.02),
        (16, 0.02 - per_expert * (2.0 * uniform(9) - 16.0)),
    );
    c.price_experts(prices);
    for w in 1..=9 {
        let reads = [uniform(w) as u16; 2];
        c.record_forward(dense(w) + per_expert * 2.0 * uniform(w), &[(w, 0)], &reads);
    }
    c.mark_provisional();
    let start_up: Vec<f64> = (1..=9).map(|w| c.verify_seconds(w).unwrap()).collect();
    for w in 1..=9 {
        // Within an expert a layer: the union's share is learned from rounded counts.
        let want = dense(w) + per_expert * 2.0 * uniform(w);
        assert!((start_up[w - 1] - want).abs() < 2.0 * per_expert, "w={w}");
    }
    // Live: 3 rows read 10 experts a layer, not ~22.
    for _ in 0..3 {
        c.record_forward(dense(3) + per_expert * 20.0, &[(3, 0)], &[10, 10]);
    }
    assert!((c.verify_seconds(3).unwrap() - (dense(3) + per_expert * 20.0)).abs() < 1e-9);
    let nine = c.verify_seconds(9).unwrap();
    let expected_reads = c.expert_prices().unwrap().expected_reads(9);
    assert!(expected_reads < 2.0 * uniform(9) * 0.6, "{expected_reads}");
    assert!(nine < start_up[8] * 0.7, "{nine} against {}", start_up[8]);
    assert!(nine > c.verify_seconds(3).unwrap());
    // A step's price keeps its row's experts whatever the text.
    assert!((c.verify_seconds(1).unwrap() - (dense(1) + per_expert * 16.0)).abs() < 1e-9);
}

/// A dense target is priced as before: no expert prices, reads ignored.
#[test]
fn a_dense_targets_forwards_are_priced_by_width_alone() {
    let mut c = CostModel::new(4);
    c.record_forward(1e-3, &[(1, 0)], &[]);
    c.record_forward(1.5e-3, &[(2, 0)], &[]);
    assert_eq!(c.verify_seconds(2), Some(1.5e-3));
    assert!(c.expert_prices().is_none());
}

#[test]
fn a_remembered_table_keeps_the_widths_start_up_prices_not_a_deep_requests() {
    let mut c = CostModel::new(4);
    for (w, s) in [(1, 0.010), (2, 0.012), (3, 0.013), (4, 0.014)] {
        c.record_verify(s, w);
    }
    c.mark_provisional();
    // A long prompt's rounds: every width dearer, the 2-token verification most.
    c.record_verify(0.0135, 1);
    c.record_verify(0.0234, 2);
    c.record_round_forecast(true, 0.02, 0.03);
    assert_eq!(c.verify_seconds(2), Some(0.0234));
    let kept = c.to_remember();
    for (w, s) in [(1, 0.010), (2, 0.012), (3, 0.013), (4, 0.014)] {
        assert_eq!(kept.verify_seconds(w), Some(s), "width {w}");
    }
    assert_eq!(
        kept.drafting_bias(),
        1.0,
        "measured against live prices: afresh"
    );
    assert!(c.drafting_bias() > 1.0, "the live table keeps its own");
}

/// A forward of `rows` (each sequence's `(new tokens, depth)`) as `c` prices it.
fn forward(c: &CostModel, rows: &[(usize, usize)]) -> Option<f64> {
    c.verify_seconds_with(rows.iter().map(|r| r.0).sum(), rows.iter().copied())
}

/// A table whose lone widths were timed at depth 32 and again at 544: a step grows by 1 ms a
/// 1000 tokens, a 5-token verification by 4 ms.
fn priced_at_depth() -> CostModel {
    let shallow = [(1, 0.010), (2, 0.011), (3, 0.012), (4, 0.013), (5, 0.014)];
    let mut c = CostModel::new(5);
    for (w, s) in shallow {
        c.record_forward(s, &[(w, 32)], &[]);
    }
    let deep: Vec<(usize, f64)> = shallow
        .iter()
        .map(|&(w, s)| (w, s + 0.000512 * (1.0 + 0.75 * (w - 1) as f64)))
        .collect();
    c.set_verify_depth(VerifyDepth::from_timings((32, &shallow), (544, &deep)));
    c
}

#[test]
fn a_verifications_price_follows_its_rows_depth() {
    let c = priced_at_depth();
    // At the reference depth, the width's own price.
    assert_eq!(forward(&c, &[(5, 32)]), Some(0.014));
    // 1000 tokens deeper: a step 1 ms dearer, a 5-token verification 4 ms.
    let step = forward(&c, &[(1, 1032)]).unwrap();
    let five = forward(&c, &[(5, 1032)]).unwrap();
    assert!((step - 0.011).abs() < 1e-9, "{step}");
    assert!((five - 0.018).abs() < 1e-9, "{five}");
    // Two sequences in one forward each pay their own depth.
    let pair = forward(&c, &[(1, 1032), (1, 32)]).unwrap();
    assert!((pair - (c.verify_seconds(2).unwrap() + 0.001)).abs() < 1e-9);
    // So the same drafts are worth less deep in a context: relative to its own step, the
    // 5-token round costs 1.4x near the start and 1.64x at depth 1032.
    let near = forward(&c, &[(5, 32)]).unwrap() / forward(&c, &[(1, 32)]).unwrap();
    assert!(five / step > near + 0.2);
}

#[test]
fn a_deep_forward_is_recorded_at_the_reference_depth() {
    let mut c = priced_at_depth();
    c.mark_provisional();
    // A live 5-token verification at depth 2032 took what the line says plus 10%: kept at
    // depth 32 as the width's price, it is the shallow price plus 10% of the deep one's.
    let deep_price = 0.014 + 0.004 * 2.0;
    c.record_forward(deep_price * 1.1, &[(5, 2032)], &[]);
    let kept = c.verify_seconds(5).unwrap();
    assert!((kept - (0.014 + 0.1 * deep_price)).abs() < 1e-9, "{kept}");
    // A short request priced afterwards is not charged the deep request's attention.
    assert!(forward(&c, &[(5, 64)]).unwrap() < 0.0175);
}

#[test]
fn a_step_whose_attention_is_most_of_it_is_priced_at_its_depth() {
    let mut c = priced_at_depth();
    c.mark_provisional();
    // 20000 tokens deeper a step costs 1 ms + 20 ms of attention, as the line says: kept at
    // depth 32 at its start-up price, and priced at its own depth at what it took.
    c.record_forward(0.030, &[(1, 20032)], &[]);
    assert!((c.verify_seconds(1).unwrap() - 0.010).abs() < 1e-9);
    assert!((forward(&c, &[(1, 20032)]).unwrap() - 0.030).abs() < 1e-9);
    // A step far cheaper than the line says (a line measured too steep) is kept at half its
    // start-up price, not at nothing.
    c.record_forward(0.012, &[(1, 20032)], &[]);
    assert!((c.verify_seconds(1).unwrap() - 0.005).abs() < 1e-9);
}

#[test]
fn the_plain_round_a_drafted_round_is_weighed_against_runs_at_its_depth() {
    let mut c = priced_at_depth();
    // A drafted round at depth 2032 gave 2 tokens in 27 ms; plain steps there cost 12 ms
    // each: it lost 3 ms (priced at depth 32 it would have lost 7).
    c.record_decode_round(true, (2, &[(5, 2032)]), 0.027);
    assert!(
        (c.drafting_net() + 0.003).abs() < 1e-9,
        "{}",
        c.drafting_net()
    );
}
