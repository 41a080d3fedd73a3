//! The acceptance rules against their definitions: exact enumeration of the emitted distribution
//! (lossless at lenience 1, valid and bounded below it), fixed rounds, and the greedy rule.

use super::*;
use crate::sampling::{probabilities, SamplingParams};

const LENIENCES: [f32; 3] = [0.9, 0.5, 0.1];

/// Normalises non-negative weights (computed in f64) into an f32 distribution.
fn normalise(w: &[f64]) -> Vec<f32> {
    let s: f64 = w.iter().sum();
    w.iter().map(|&x| (x / s) as f32).collect()
}

fn dense(rng: &mut SeededRng, n: usize) -> Vec<f32> {
    let w: Vec<f64> = (0..n).map(|_| rng.next_f64() + 1e-3).collect();
    normalise(&w)
}

/// Many exact zeros; at least one token keeps mass.
fn sparse(rng: &mut SeededRng, n: usize) -> Vec<f32> {
    let mut w: Vec<f64> = (0..n)
        .map(|_| {
            if rng.next_f64() < 0.7 {
                0.0
            } else {
                rng.next_f64()
            }
        })
        .collect();
    let keep = (rng.next_u64() % n as u64) as usize;
    w[keep] += 0.1;
    normalise(&w)
}

/// One token above 0.99.
fn peaked(rng: &mut SeededRng, n: usize) -> Vec<f32> {
    let top = (rng.next_u64() % n as u64) as usize;
    let mut w: Vec<f64> = (0..n).map(|_| rng.next_f64() * 0.005 / n as f64).collect();
    w[top] = 0.995;
    normalise(&w)
}

/// p and q on disjoint halves of the vocabulary.
fn disjoint(rng: &mut SeededRng, n: usize) -> (Vec<f32>, Vec<f32>) {
    let split = 1 + (rng.next_u64() % (n as u64 - 1)) as usize;
    let mut wp = vec![0f64; n];
    let mut wq = vec![0f64; n];
    for (x, (wp, wq)) in wp.iter_mut().zip(&mut wq).enumerate() {
        let w = rng.next_f64() + 1e-3;
        if x < split {
            *wp = w;
        } else {
            *wq = w;
        }
    }
    (normalise(&wp), normalise(&wq))
}

fn random_params(rng: &mut SeededRng, n: usize) -> SamplingParams {
    let pick = |rng: &mut SeededRng, xs: &[f32]| xs[(rng.next_u64() % xs.len() as u64) as usize];
    SamplingParams {
        temperature: pick(rng, &[0.5, 0.8, 1.0, 1.5]),
        top_k: (rng.next_u64() % (n as u64 + 1)) as usize,
        top_p: pick(rng, &[1.0, 0.95, 0.8, 0.5]),
        min_p: pick(rng, &[0.0, 0.0, 0.05, 0.2]),
        ..SamplingParams::default()
    }
}

/// Target and drafter look at related logits, each through its own processors, so the masks
/// (top-k/top-p/min-p) differ between p and q.
fn processed(rng: &mut SeededRng, n: usize) -> (Vec<f32>, Vec<f32>) {
    let logits_p: Vec<f32> = (0..n)
        .map(|_| (rng.next_f64() * 8.0 - 4.0) as f32)
        .collect();
    let logits_q: Vec<f32> = logits_p
        .iter()
        .map(|&l| l + (rng.next_f64() * 3.0 - 1.5) as f32)
        .collect();
    let (mut p, mut q) = (Vec::new(), Vec::new());
    probabilities(&logits_p, &random_params(rng, n), &mut p).unwrap();
    probabilities(&logits_q, &random_params(rng, n), &mut q).unwrap();
    (p, q)
}

/// (p, q) pairs over vocabularies of 2..=64 from every family the tests care about.
fn random_pairs() -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut rng = SeededRng::new(0x5eed);
    let mut pairs = Vec::new();
    for n in 2..=64usize {
        for _ in 0..4 {
            pairs.push((dense(&mut rng, n), dense(&mut rng, n)));
            pairs.push((sparse(&mut rng, n), sparse(&mut rng, n)));
            pairs.push((sparse(&mut rng, n), dense(&mut rng, n)));
            pairs.push((peaked(&mut rng, n), dense(&mut rng, n)));
            pairs.push((dense(&mut rng, n), peaked(&mut rng, n)));
            pairs.push((peaked(&mut rng, n), peaked(&mut rng, n)));
            pairs.push(disjoint(&mut rng, n));
            pairs.push(processed(&mut rng, n));
            let p = dense(&mut rng, n);
            pairs.push((p.clone(), p));
        }
    }
    pairs
}

/// The speculative step written out from the paper's formula, independently of
/// `first_token_distribution`: Σ_t q(t)·α(t)·[x = t] + (1 − Σ_t q(t)·α(t))·residual(x).
fn enumerate_full(p: &[f32], q: &[f32], l: f32) -> (Vec<f64>, f64) {
    let mut res = Vec::new();
    residual(p, DraftDist::Full(q), 0, l, &mut res);
    let alpha = |t: usize| {
        let (p, q) = (p[t] as f64, q[t] as f64 * l as f64);
        if q == 0.0 {
            if p > 0.0 {
                1.0
            } else {
                0.0
            }
        } else {
            (p / q).min(1.0)
        }
    };
    let accept: f64 = (0..p.len()).map(|t| q[t] as f64 * alpha(t)).sum();
    // Clamped because an f32 q may sum to a hair over 1.
    let rejected = (1.0 - accept).max(0.0);
    let out = (0..p.len())
        .map(|x| q[x] as f64 * alpha(x) + rejected * res[x] as f64)
        .collect();
    (out, accept)
}

/// Point-mass draft of `t`: accept with min(1, p(t)/l), else the residual.
fn enumerate_point(p: &[f32], t: u32, l: f32) -> Vec<f64> {
    let mut res = Vec::new();
    residual(p, DraftDist::PointMass, t, l, &mut res);
    let alpha = (p[t as usize] as f64 / l as f64).min(1.0);
    (0..p.len())
        .map(|x| alpha * (x == t as usize) as u8 as f64 + (1.0 - alpha) * res[x] as f64)
        .collect()
}

fn assert_close(got: &[f64], want: &[f32], tol: f64, what: &str) {
    for (x, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w as f64).abs() <= tol,
            "{what}: token {x}: got {g}, want {w}"
        );
    }
}

#[test]
fn exact_lossless_full_drafts_random_pairs() {
    let pairs = random_pairs();
    assert!(pairs.len() > 2000);
    for (p, q) in &pairs {
        let (exact, _) = enumerate_full(p, q, 1.0);
        assert_close(&exact, p, 1e-6, &format!("formula p={p:?} q={q:?}"));
        let public =
            first_token_distribution(p, DraftDist::Full(q), None, Lenience::EXACT).unwrap();
        assert_close(&public, p, 1e-6, &format!("public p={p:?} q={q:?}"));
        // Conditioning on each drafted token and averaging over q is the same thing.
        let mut avg = vec![0f64; p.len()];
        for (t, &q_t) in q.iter().enumerate() {
            let cond =
                first_token_distribution(p, DraftDist::Full(q), Some(t as u32), Lenience::EXACT);
            for (a, c) in avg.iter_mut().zip(cond.unwrap()) {
                *a += q_t as f64 * c;
            }
        }
        assert_close(&avg, p, 1e-6, &format!("conditional p={p:?} q={q:?}"));
    }
}

#[test]
fn exact_lossless_point_mass_every_drafted_token() {
    for (p, _) in random_pairs().iter().step_by(3) {
        for t in 0..p.len() as u32 {
            assert_close(&enumerate_point(p, t, 1.0), p, 1e-6, "formula");
            let public =
                first_token_distribution(p, DraftDist::PointMass, Some(t), Lenience::EXACT);
            assert_close(&public.unwrap(), p, 1e-6, &format!("p={p:?} t={t}"));
        }
    }
}

fn assert_lenient_valid(dist: &[f64], p: &[f32], l: f32, what: &str) {
    let total: f64 = dist.iter().sum();
    assert!((total - 1.0).abs() <= 1e-6, "{what}: sums to {total}");
    for (x, (&d, &px)) in dist.iter().zip(p).enumerate() {
        assert!(d >= 0.0, "{what}: token {x} negative {d}");
        let bound = px as f64 / l as f64 + 1e-9;
        assert!(d <= bound, "{what}: token {x}: {d} > p/l = {bound}");
    }
}

#[test]
fn lenience_gives_valid_bounded_distribution_and_never_lowers_acceptance() {
    for (p, q) in &random_pairs() {
        let (_, exact_rate) = enumerate_full(p, q, 1.0);
        for l in LENIENCES {
            let (dist, rate) = enumerate_full(p, q, l);
            assert_lenient_valid(&dist, p, l, &format!("full l={l} p={p:?} q={q:?}"));
            assert!(rate >= exact_rate - 1e-12, "l={l}: {rate} < {exact_rate}");
            let public = first_token_distribution(
                p,
                DraftDist::Full(q),
                None,
                Lenience::try_from(l).unwrap(),
            )
            .unwrap();
            for (a, b) in public.iter().zip(&dist) {
                assert!((a - b).abs() < 1e-12);
            }
        }
    }
    for (p, _) in random_pairs().iter().step_by(5) {
        for t in 0..p.len() as u32 {
            let exact_rate = p[t as usize] as f64;
            for l in LENIENCES {
                let public = first_token_distribution(
                    p,
                    DraftDist::PointMass,
                    Some(t),
                    Lenience::try_from(l).unwrap(),
                );
                let dist = public.unwrap();
                assert_lenient_valid(&dist, p, l, &format!("point l={l} t={t} p={p:?}"));
                let rate = (p[t as usize] as f64 / l as f64).min(1.0);
                assert!(rate >= exact_rate);
                assert!(dist[t as usize] >= rate - 1e-12);
            }
        }
    }
}

#[test]
fn gamma3_all_accepted_gives_bonus_from_last_row() {
    // p_i(t_i) >= q_i(t_i) makes every acceptance certain; the last row is a point mass.
    let drafts = [1u32, 2, 0];
    let q1 = [0.2f32, 0.5, 0.3, 0.0];
    let q2 = [0.1f32, 0.1, 0.4, 0.4];
    let p1 = [0.1f32, 0.6, 0.2, 0.1];
    let p2 = [0.2f32, 0.2, 0.5, 0.1];
    let p3 = [1.0f32, 0.0, 0.0, 0.0];
    let p4 = [0.0f32, 0.0, 0.0, 1.0];
    let mut scratch = Vec::new();
    for seed in 0..50 {
        let mut rng = SeededRng::new(seed);
        let out = accept_sampled(
            &drafts,
            &[
                DraftDist::Full(&q1),
                DraftDist::Full(&q2),
                DraftDist::PointMass,
            ],
            &[&p1, &p2, &p3, &p4],
            Lenience::EXACT,
            &mut rng,
            &mut scratch,
        )
        .unwrap();
        assert_eq!(
            out,
            RoundOutcome {
                accepted: 3,
                next_token: 3,
                bonus: true
            }
        );
    }
}

#[test]
fn gamma3_rejects_at_the_right_position_with_a_residual_token() {
    // Position 0 is certain to pass, position 1 certain to fail (p_2(t_2) = 0); the residual
    // of position 1 is p_2 minus q_2, which only leaves token 3.
    let drafts = [1u32, 2, 0];
    let q1 = [0.25f32; 4];
    let q2 = [0.3f32, 0.3, 0.4, 0.0];
    let q3 = [0.25f32; 4];
    let p1 = [0.0f32, 1.0, 0.0, 0.0];
    let p2 = [0.3f32, 0.3, 0.0, 0.4];
    let p3 = [1.0f32, 0.0, 0.0, 0.0];
    let p4 = [1.0f32, 0.0, 0.0, 0.0];
    let mut scratch = Vec::new();
    for seed in 0..50 {
        let mut rng = SeededRng::new(seed);
        let out = accept_sampled(
            &drafts,
            &[
                DraftDist::Full(&q1),
                DraftDist::Full(&q2),
                DraftDist::Full(&q3),
            ],
            &[&p1, &p2, &p3, &p4],
            Lenience::EXACT,
            &mut rng,
            &mut scratch,
        )
        .unwrap();
        assert_eq!(
            out,
            RoundOutcome {
                accepted: 1,
                next_token: 3,
                bonus: false
            }
        );
    }
}

#[test]
fn gamma0_is_a_plain_sampling_step() {
    let p = [0.0f32, 0.0, 1.0];
    let mut rng = SeededRng::new(1);
    let out = accept_sampled(&[], &[], &[&p], Lenience::EXACT, &mut rng, &mut Vec::new()).unwrap();
    assert_eq!((out.accepted, out.next_token, out.bonus), (0, 2, true));
    assert_eq!(
        accept_greedy(&[], &[&p], Lenience::EXACT)
            .unwrap()
            .next_token,
        2
    );
}

#[test]
fn greedy_accepts_while_argmax_matches_then_corrects() {
    let p1 = [0.1f32, 0.7, 0.2];
    let p2 = [0.5f32, 0.2, 0.3];
    let p3 = [0.2f32, 0.3, 0.5];
    let p4 = [0.6f32, 0.3, 0.1];
    let rows: [&[f32]; 4] = [&p1, &p2, &p3, &p4];
    let out = accept_greedy(&[1, 0, 1], &rows, Lenience::EXACT).unwrap();
    assert_eq!(
        out,
        RoundOutcome {
            accepted: 2,
            next_token: 2,
            bonus: false
        }
    );
    let out = accept_greedy(&[1, 0, 2], &rows, Lenience::EXACT).unwrap();
    assert_eq!(
        out,
        RoundOutcome {
            accepted: 3,
            next_token: 0,
            bonus: true
        }
    );
    let out = accept_greedy(&[0, 0, 2], &rows, Lenience::EXACT).unwrap();
    assert_eq!((out.accepted, out.next_token), (0, 1));
}

#[test]
fn greedy_exact_works_on_raw_logits_and_ties_pick_lowest_index() {
    let l1 = [-3.0f32, f32::NEG_INFINITY, 2.0, 2.0];
    let l2 = [-1.0f32, -0.5, -2.0, f32::NEG_INFINITY];
    // Token 3 ties token 2 for the max, but greedy decoding picks 2.
    let out = accept_greedy(&[3], &[&l1, &l2], Lenience::EXACT).unwrap();
    assert_eq!((out.accepted, out.next_token, out.bonus), (0, 2, false));
    let out = accept_greedy(&[2], &[&l1, &l2], Lenience::EXACT).unwrap();
    assert_eq!((out.accepted, out.next_token, out.bonus), (1, 1, true));
}

#[test]
fn lenient_greedy_accepts_near_max_tokens_exact_greedy_rejects() {
    let p1 = [0.45f32, 0.4, 0.15];
    let p2 = [0.1f32, 0.1, 0.8];
    let rows: [&[f32]; 2] = [&p1, &p2];
    assert_eq!(
        accept_greedy(&[1], &rows, Lenience::EXACT)
            .unwrap()
            .accepted,
        0
    );
    // 0.4 >= 0.8 * 0.45
    let out = accept_greedy(&[1], &rows, Lenience::try_from(0.8).unwrap()).unwrap();
    assert_eq!((out.accepted, out.next_token, out.bonus), (1, 2, true));
    // 0.15 >= 0.3 * 0.45 but not 0.5 * 0.45.
    assert_eq!(
        accept_greedy(&[2], &rows, Lenience::try_from(0.3).unwrap())
            .unwrap()
            .accepted,
        1
    );
    assert_eq!(
        accept_greedy(&[2], &rows, Lenience::try_from(0.5).unwrap())
            .unwrap()
            .accepted,
        0
    );
    // Lenient greedy compares probabilities, so logits are refused.
    let logits = [-1.0f32, 0.5, 0.2];
    let err =
        accept_greedy(&[1], &[&logits, &logits], Lenience::try_from(0.8).unwrap()).unwrap_err();
    assert!(matches!(
        err,
        SpecError::InvalidValue {
            row: 0,
            token: 0,
            ..
        }
    ));
}

#[test]
fn zero_draft_probability_with_target_mass_is_accepted() {
    let q = [0.5f32, 0.5, 0.0];
    let p = [0.1f32, 0.1, 0.8];
    let p_zero = [0.5f32, 0.5, 0.0];
    let bonus = [1.0f32, 0.0, 0.0];
    let mut scratch = Vec::new();
    for seed in 0..50 {
        let mut rng = SeededRng::new(seed);
        let out = accept_sampled(
            &[2],
            &[DraftDist::Full(&q)],
            &[&p, &bonus],
            Lenience::EXACT,
            &mut rng,
            &mut scratch,
        );
        assert_eq!(out.unwrap().accepted, 1);
        // Both zero: nothing justifies the token, so it is always rejected.
        let out = accept_sampled(
            &[2],
            &[DraftDist::Full(&q)],
            &[&p_zero, &bonus],
            Lenience::EXACT,
            &mut rng,
            &mut scratch,
        );
        let out = out.unwrap();
        assert_eq!(out.accepted, 0);
        assert_ne!(out.next_token, 2);
    }
}

#[test]
fn residual_falls_back_to_p_when_nothing_is_left() {
    let p = [0.25f32, 0.75, 0.0];
    let mut out = Vec::new();
    // p − q ≤ 0 everywhere.
    residual(&p, DraftDist::Full(&p), 1, 1.0, &mut out);
    assert_eq!(out, p);
    let q = [0.5f32, 0.5, 0.0];
    residual(&[0.5, 0.5, 0.0], DraftDist::Full(&q), 0, 1.0, &mut out);
    assert_eq!(out, [0.5, 0.5, 0.0]);
    // A point mass on a token p is certain of.
    residual(&[0.0, 1.0, 0.0], DraftDist::PointMass, 1, 1.0, &mut out);
    assert_eq!(out, [0.0, 1.0, 0.0]);
    // Ordinary cases, for contrast: exact and lenient residuals.
    residual(&p, DraftDist::Full(&q), 0, 1.0, &mut out);
    assert_eq!(out, [0.0, 1.0, 0.0]);
    residual(&p, DraftDist::PointMass, 1, 0.5, &mut out);
    assert_eq!(out, [0.5, 0.5, 0.0]);
}
