use super::*;

fn params() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    }
}

fn probs_of(logits: &[f32], p: &SamplingParams) -> Vec<f32> {
    let mut out = Vec::new();
    probabilities(logits, p, &mut out).unwrap();
    out
}

#[test]
fn softmax_matches_closed_form() {
    let logits = [1.0f32, 2.0, 3.0];
    let probs = probs_of(&logits, &params());
    let z: f32 = logits.iter().map(|l| l.exp()).sum();
    for (p, l) in probs.iter().zip(logits) {
        assert!((p - l.exp() / z).abs() < 1e-6);
    }
}

#[test]
fn temperature_sharpens_and_flattens() {
    let logits = [1.0f32, 2.0];
    let cold = probs_of(
        &logits,
        &SamplingParams {
            temperature: 0.5,
            ..params()
        },
    );
    let hot = probs_of(
        &logits,
        &SamplingParams {
            temperature: 2.0,
            ..params()
        },
    );
    let base = probs_of(&logits, &params());
    assert!(cold[1] > base[1] && base[1] > hot[1]);
}

#[test]
fn top_k_keeps_exactly_k_and_renormalises() {
    let logits = [0.1f32, 3.0, 2.0, -1.0, 2.5];
    let p = probs_of(
        &logits,
        &SamplingParams {
            top_k: 2,
            ..params()
        },
    );
    let kept: Vec<usize> = (0..5).filter(|&i| p[i] > 0.0).collect();
    assert_eq!(kept, vec![1, 4]);
    assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    // probabilities 0.5, 0.3, 0.2 (as logits of their logs)
    let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
    let p = probs_of(
        &logits,
        &SamplingParams {
            top_p: 0.75,
            ..params()
        },
    );
    assert!(p[0] > 0.0 && p[1] > 0.0 && p[2] == 0.0, "{p:?}");
    let p = probs_of(
        &logits,
        &SamplingParams {
            top_p: 0.4,
            ..params()
        },
    );
    assert_eq!(p, vec![1.0, 0.0, 0.0]);
}

/// Top-p's nucleus found among the tokens above a floor is the one a sort of the whole row
/// finds: flat rows, peaked ones, ties, masked tokens, a large vocabulary, shares near 0 and 1.
#[test]
fn top_p_keeps_what_a_full_sort_keeps() {
    /// The kept tokens, or `None` where the cut falls within rounding of the share (the row
    /// is normalized here, not where `probabilities` cuts it).
    fn by_full_sort(probs: &[f32], top_p: f32) -> Option<Vec<bool>> {
        let mut order: Vec<u32> = (0..probs.len() as u32).collect();
        order.sort_unstable_by(|a, b| {
            probs[*b as usize]
                .total_cmp(&probs[*a as usize])
                .then(a.cmp(b))
        });
        let total: f64 = order.iter().map(|&i| f64::from(probs[i as usize])).sum();
        let (mut cum, mut keep) = (0f64, order.len());
        let want = f64::from(top_p) * total;
        for (n, &i) in order.iter().enumerate() {
            let before = cum;
            cum += f64::from(probs[i as usize]);
            if (cum - want).abs() < 1e-6 * total || (before - want).abs() < 1e-6 * total {
                return None;
            }
            if cum >= want {
                keep = n + 1;
                break;
            }
        }
        let mut kept = vec![false; probs.len()];
        for &i in &order[..keep] {
            kept[i as usize] = true;
        }
        Some(kept)
    }
    let mut rng = SeededRng::new(41);
    let mut checked = 0;
    for case in 0..60 {
        let vocab = [5usize, 300, 50_000][case % 3];
        let spread = [0.1f32, 2.0, 8.0][(case / 3) % 3];
        let logits: Vec<f32> = (0..vocab)
            .map(|i| match (case % 4, i % 7) {
                (0, 0) => f32::NEG_INFINITY,
                // Ties: a few values only.
                (1, _) => (rng.next_f64() * 4.0).floor() as f32,
                _ => (rng.next_f64() as f32 - 0.5) * spread * 10.0,
            })
            .collect();
        for top_p in [0.05f32, 0.5, 0.9, 0.999] {
            let sampling = SamplingParams { top_p, ..params() };
            let kept: Vec<bool> = probs_of(&logits, &sampling)
                .iter()
                .map(|&p| p > 0.0)
                .collect();
            let softmax = probs_of(&logits, &params());
            if let Some(want) = by_full_sort(&softmax, top_p) {
                assert_eq!(kept, want, "case {case}, top_p {top_p}");
                checked += 1;
            }
        }
    }
    assert!(checked > 200, "{checked} cuts checked");
}

#[test]
fn min_p_drops_tokens_below_fraction_of_top() {
    let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
    let p = probs_of(
        &logits,
        &SamplingParams {
            min_p: 0.2,
            ..params()
        },
    );
    assert!(p[1] > 0.0 && p[2] == 0.0);
}

#[test]
fn penalties_follow_their_definitions() {
    let mut l = vec![2.0f32, -2.0, 1.0, 0.0];
    let p = SamplingParams {
        repetition_penalty: 2.0,
        ..params()
    };
    apply_penalties(&mut l, &p, &[0, 1, 1], &[]);
    assert_eq!(l, vec![1.0, -4.0, 1.0, 0.0]);
    let mut l = vec![0.0f32; 3];
    let p = SamplingParams {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        logit_bias: vec![(2, 3.0)],
        ..params()
    };
    apply_penalties(&mut l, &p, &[], &[0, 0, 1]);
    assert_eq!(l, vec![-1.0, -0.75, 3.0]);
}

#[test]
fn nan_and_inf_logits_are_errors() {
    let mut out = Vec::new();
    assert_eq!(
        probabilities(&[0.0, f32::NAN], &params(), &mut out),
        Err(SamplingError::InvalidLogits(1))
    );
    assert_eq!(
        argmax(&[f32::INFINITY]),
        Err(SamplingError::InvalidLogits(0))
    );
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), Err(SamplingError::Empty));
}

#[test]
fn greedy_ties_pick_lowest_index() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]).unwrap(), 1);
}

#[test]
fn invalid_params_are_named() {
    let e = SamplingParams {
        top_p: 0.0,
        ..params()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("top_p"));
    let e = SamplingParams {
        temperature: -1.0,
        ..params()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("temperature"));
    // Each penalty is named by itself, outside OpenAI's [-2, 2] (1e308 is +inf as an f32), and
    // the repetition penalty outside the range where dividing a logit cannot overflow.
    for (presence, frequency, repetition, name) in [
        (1e308f64, 0.0, 1.0, "presence_penalty"),
        (0.0, 1e308, 1.0, "frequency_penalty"),
        (2.01, 0.0, 1.0, "presence_penalty"),
        (0.0, -3e38, 1.0, "frequency_penalty"),
        (0.0, 0.0, 1e-38, "repetition_penalty"),
        (0.0, 0.0, 101.0, "repetition_penalty"),
    ] {
        let e = SamplingParams {
            presence_penalty: presence as f32,
            frequency_penalty: frequency as f32,
            repetition_penalty: repetition,
            ..params()
        }
        .validate()
        .unwrap_err();
        assert!(
            matches!(&e, SamplingError::InvalidParam { name: n, reason } if *n == name && reason.starts_with("must be in [")),
            "{e}"
        );
    }
    for (presence, frequency, repetition) in [(2.0, -2.0, 0.01), (-2.0, 2.0, 100.0)] {
        SamplingParams {
            presence_penalty: presence,
            frequency_penalty: frequency,
            repetition_penalty: repetition,
            ..params()
        }
        .validate()
        .unwrap();
    }
}

#[test]
fn sampling_frequencies_match_probabilities() {
    let probs = vec![0.1f32, 0.0, 0.6, 0.3];
    let mut rng = SeededRng::new(42);
    let n = 60_000;
    let mut counts = [0usize; 4];
    for _ in 0..n {
        counts[sample_from(&probs, rng.next_f64()) as usize] += 1;
    }
    assert_eq!(counts[1], 0, "a zero-probability token was drawn");
    // chi-square with 2 degrees of freedom; 13.8 is the 0.999 quantile
    let chi2: f64 = [0usize, 2, 3]
        .iter()
        .map(|&i| {
            let e = probs[i] as f64 * n as f64;
            (counts[i] as f64 - e).powi(2) / e
        })
        .sum();
    assert!(chi2 < 13.8, "chi2 {chi2} counts {counts:?}");
}

#[test]
fn sampler_is_reproducible_per_seed() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let p = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        ..params()
    };
    let run = |seed| {
        let mut s = Sampler::default();
        let mut rng = SeededRng::new(seed);
        (0..20)
            .map(|_| s.pick(&logits, &p, &[], &[], &mut rng).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}
