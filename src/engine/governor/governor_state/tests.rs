//! The per-request governor's acceptance rates, starting points and probes.

use super::*;
use crate::engine::governor::plan_round;
use crate::engine::governor::test_support::{costs, solo};

fn class(rates: KindRates) -> PooledClass {
    PooledClass {
        rates,
        proposals: ProposalRates::default(),
        coverage: PooledCoverage::default(),
    }
}

#[test]
fn a_new_request_starts_from_what_the_drafter_achieved_lately() {
    let c = costs(0.45, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5]);
    let cfg = GovernorConfig::default();
    // Knowing nothing, a request decodes plainly first (it will probe).
    assert_eq!(solo(&Governor::new(cfg), &c), 0);
    // After other requests' drafts mostly stood, a new one speculates from its first round.
    let mut pooled = AcceptanceRate::new(0.5);
    for _ in 0..40 {
        pooled.record(4, 4, 0.99);
    }
    pooled.record(4, 1, 0.99);
    assert!(pooled.get() > 0.9, "{}", pooled.get());
    let g = Governor::with_prior(cfg, pooled.get());
    assert!(solo(&g, &c) >= 3, "γ = {}", solo(&g, &c));
    // The prior weighs two drafts: a request whose own drafts fail leaves it quickly.
    let mut g = g;
    for _ in 0..3 {
        g.record_round(2, 0);
    }
    assert_eq!(solo(&g, &c), 0, "α ≈ {}", g.alpha());
}

#[test]
fn a_prompt_rehearsal_moves_each_kind_from_the_pooled_rate_but_own_drafts_soon_lead() {
    let pooled = KindRates::new(0.5);
    let rehearsal = Rehearsal {
        tried: [0, 30, 1, 40],
        stood: [0, 0, 1, 36],
    };
    let g = Governor::starting_from(
        GovernorConfig::default(),
        &class(pooled),
        Some(&rehearsal),
        None,
    );
    // 0 of 30 and 36 of 40, each weighed as one draft against the prior's two.
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(
        close(g.alpha_of(Some(1)), 1.0 / 3.0),
        "{}",
        g.alpha_of(Some(1))
    );
    assert!(
        close(g.alpha_of(Some(3)), 1.9 / 3.0),
        "{}",
        g.alpha_of(Some(3))
    );
    assert!(
        close(g.alpha_of(Some(2)), 2.0 / 3.0),
        "{}",
        g.alpha_of(Some(2))
    );
    // A kind never rehearsed keeps the pooled rate.
    assert_eq!(g.alpha_of(Some(0)), 0.5);
    // What the request's own drafts do outweighs the rehearsal within two rounds.
    let mut g = g;
    g.record_round_of(1, 3, 3);
    g.record_round_of(1, 3, 3);
    assert!(g.alpha_of(Some(1)) > 0.75, "{}", g.alpha_of(Some(1)));
    // Without a rehearsal, or an empty one, the pooled rates as they were.
    for r in [None, Some(&Rehearsal::default())] {
        let g = Governor::starting_from(GovernorConfig::default(), &class(pooled), r, None);
        assert_eq!(g.alpha_of(Some(3)), 0.5);
        assert_eq!(g.alpha(), 0.5);
    }
}

#[test]
fn a_prompt_the_drafter_covers_less_than_the_pooled_text_starts_its_drafts_lower() {
    let c = costs(0.45, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5]);
    let cfg = GovernorConfig::default();
    let mut pooled = KindRates::new(0.5);
    for _ in 0..40 {
        pooled.record(0, 4, 4, 0.99);
    }
    pooled.record(0, 4, 1, 0.99);
    let at = |prompt: f64| {
        Some(PromptCoverage {
            prompt,
            pooled: 0.96,
        })
    };
    let g = |cov, rehearsed| Governor::starting_from(cfg, &class(pooled), rehearsed, cov);
    let (usual, foreign) = (g(at(0.96), None), g(at(0.55), None));
    // Covered as the pooled text was: the pooled rate, and the request drafts at once.
    assert!((usual.alpha_of(Some(0)) - pooled.get(Some(0))).abs() < 1e-12);
    assert!(solo(&usual, &c) >= 3, "γ = {}", solo(&usual, &c));
    // Covered little: the model's drafts start at the pooled rate times 0.55 / 0.96, and
    // the request decodes plainly until a probe says otherwise.
    let want = pooled.get(Some(0)) * 0.55 / 0.96;
    assert!((foreign.alpha_of(Some(0)) - want).abs() < 1e-9, "{want}");
    assert!((foreign.alpha() - pooled.get(None) * 0.55 / 0.96).abs() < 1e-9);
    assert_eq!(solo(&foreign, &c), 0, "α = {}", foreign.alpha());
    assert_eq!(foreign.prompt_coverage(), Some(0.55));
    assert_eq!(g(None, None).prompt_coverage(), None);
    // Prompt lookup's copies do not depend on the drafter's vocabulary: with a rehearsal
    // (lookup drafts first) only the model's kind moves, not lookup's nor every draft's.
    let rehearsed = g(at(0.55), Some(&Rehearsal::default()));
    assert!((rehearsed.alpha_of(Some(0)) - want).abs() < 1e-9);
    for kind in [Some(1), Some(3), None] {
        assert_eq!(rehearsed.alpha_of(kind), pooled.get(kind), "{kind:?}");
    }
    // Its own drafts lead within a few rounds, whatever the prompt said.
    let mut foreign = foreign;
    for _ in 0..3 {
        foreign.record_round(3, 3);
    }
    assert!(foreign.alpha() > 0.8, "{}", foreign.alpha());
}

#[test]
fn each_kind_of_draft_is_planned_with_its_own_rate() {
    let c = costs(0.02, &[1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6]);
    let plan = |g: &Governor, kind: Option<u8>| {
        plan_round(&[g.candidate(1, 8, (0, 1000), kind)], 0, &c, 1.02)[0]
    };
    let mut g = Governor::new(GovernorConfig::default());
    // Lookup after 3-token matches nearly always stands, after 1-token ones rarely.
    for _ in 0..30 {
        g.record_round_of(3, 4, 4);
        g.record_round_of(1, 2, 0);
    }
    assert!(g.alpha_of(Some(3)) > 0.9, "{}", g.alpha_of(Some(3)));
    assert!(g.alpha_of(Some(1)) < 0.1, "{}", g.alpha_of(Some(1)));
    assert!(plan(&g, Some(3)) >= 4, "γ = {}", plan(&g, Some(3)));
    assert_eq!(plan(&g, Some(1)), 0);
    // Not knowing the kind, the round is planned with every draft's rate, in between.
    let all = g.alpha();
    assert!(
        all > g.alpha_of(Some(1)) && all < g.alpha_of(Some(3)),
        "{all}"
    );
    // A kind never drafted keeps the prior; the pooled rates hand each kind on apart.
    assert_eq!(g.alpha_of(Some(2)), 0.5);
    let mut pooled = KindRates::new(0.5);
    for _ in 0..100 {
        pooled.record(0, 3, 3, 0.995);
        pooled.record(2, 3, 0, 0.995);
    }
    let fresh = Governor::starting_from(GovernorConfig::default(), &class(pooled), None, None);
    assert!(fresh.alpha_of(Some(0)) > 0.9, "{}", fresh.alpha_of(Some(0)));
    assert!(fresh.alpha_of(Some(2)) < 0.1, "{}", fresh.alpha_of(Some(2)));
    assert_eq!(fresh.alpha_of(Some(3)), 0.5);
    // A kind past the known ones counts in every draft's rate only.
    g.record_round_of(9, 4, 4);
    assert_eq!(g.alpha_of(Some(9)), g.alpha());
}

#[test]
fn plain_decoding_probes_again_and_recovers() {
    let c = costs(0.1, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
    let cfg = GovernorConfig::default();
    let mut g = Governor::new(cfg);
    for _ in 0..40 {
        g.record_round(2, 0);
    }
    assert_eq!(solo(&g, &c), 0);
    let mut probed = false;
    for _ in 0..cfg.probe_every {
        let gamma = solo(&g, &c);
        if gamma > 0 {
            probed = true;
            g.record_round(gamma, gamma);
        } else {
            g.record_round(0, 0);
        }
    }
    assert!(probed, "a probe within probe_every plain steps");
    for _ in 0..30 {
        g.record_round(4, 4);
    }
    assert!(solo(&g, &c) > 0, "speculation comes back once drafts agree");
}

#[test]
fn probes_that_fail_wait_longer_each_time() {
    let c = costs(0.1, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
    let cfg = GovernorConfig::default();
    let mut g = Governor::new(cfg);
    for _ in 0..40 {
        g.record_round(2, 0);
    }
    // Every probe is rejected: the gaps between probes grow 16, 32, 64.
    let mut probes = Vec::new();
    for step in 0..200 {
        let gamma = solo(&g, &c);
        if gamma > 0 {
            probes.push(step);
        }
        g.record_round(gamma, 0);
    }
    let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 2, "{probes:?}");
    assert!(gaps.windows(2).all(|w| w[1] >= 2 * w[0] - 1), "{gaps:?}");
}

#[test]
fn a_request_whose_drafting_loses_decodes_plainly_whatever_its_estimate() {
    let c = costs(0.01, &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]);
    let cfg = GovernorConfig::default();
    // An estimate that says drafting pays (others' drafts mostly stood).
    let mut g = Governor::with_prior(cfg, 0.9);
    assert!(solo(&g, &c) > 0);
    // Its own rounds say otherwise: a round of 1.3 steps that gives one token loses 0.3.
    let mut rounds = 0;
    while solo(&g, &c) > 0 {
        g.record_gain(1.3, -0.3);
        rounds += 1;
        assert!(rounds < 10, "still drafting after {rounds} losing rounds");
    }
    assert!(rounds >= 2, "an unlucky first round is allowed: {rounds}");
    assert!(!g.may_draft() && g.drafting_net() < 0.0);
    // No probe either while the loss stands: the choice is a plain step.
    let cand = g.candidate(1, 8, (0, 1000), None);
    assert_eq!(cand.choice, Choice::Fixed(0));
    // Plain steps wear the loss down to its share of the decoding time; then it may draft.
    let mut steps = 0;
    while !g.may_draft() {
        g.record_gain(1.0, 0.0);
        steps += 1;
    }
    assert!(steps > 10, "{steps}");
    assert!(solo(&g, &c) > 0);
}

/// Sampled prompt-lookup drafts stand with a chance that varies from draft to draft (here
/// uniform in [0, 0.5], a quarter on average), two drafts a round. After six rounds from the
/// generic start (0.5), the estimate learned from the tested drafts' chances aims where the
/// one learned from which drafts stood aims, and misses the truth by much less.
#[test]
fn chances_teach_a_sampled_requests_rate_with_less_spread_than_what_stood() {
    let mut rng = crate::sampling::SeededRng::new(11);
    let (trials, truth) = (4000, 0.25);
    let (mut sq, mut mean) = ([0f64; 2], [0f64; 2]);
    for _ in 0..trials {
        let mut counted = AcceptanceRate::new(0.5);
        let mut chanced = AcceptanceRate::new(0.5);
        for _ in 0..6 {
            let drafted = 2;
            let (mut accepted, mut chances) = (
                0,
                DraftChances {
                    tested: 0,
                    sum: 0.0,
                },
            );
            for _ in 0..drafted {
                let p = rng.next_f64() * 0.5;
                chances.tested += 1;
                chances.sum += p;
                if rng.next_f64() >= p {
                    break;
                }
                accepted += 1;
            }
            counted.record(drafted, accepted, 0.995);
            chanced.record_chances(drafted, chances, 0.995);
        }
        for (i, r) in [counted, chanced].iter().enumerate() {
            sq[i] += (r.get() - truth).powi(2);
            mean[i] += r.get() / f64::from(trials);
        }
    }
    let rms = sq.map(|s| (s / f64::from(trials)).sqrt());
    assert!(rms[1] < 0.7 * rms[0], "root mean square errors {rms:?}");
    assert!((mean[1] - mean[0]).abs() < 0.03, "means {mean:?}");
}

#[test]
fn chances_outside_what_was_tested_are_held_to_it() {
    let mut r = AcceptanceRate::new(0.5);
    let before = r.get();
    // Not a number, or more chances than drafts tested: nothing beyond the tested drafts.
    r.record_chances(
        2,
        DraftChances {
            tested: 1,
            sum: f64::NAN,
        },
        0.995,
    );
    assert_eq!(r.get(), before);
    r.record_chances(
        2,
        DraftChances {
            tested: 1,
            sum: 5.0,
        },
        1.0,
    );
    assert!(
        (r.get() - (1.0 + 1.0) / (1.0 + 2.0)).abs() < 1e-12,
        "{}",
        r.get()
    );
}
