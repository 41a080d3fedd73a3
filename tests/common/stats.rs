//! Statistics for the distribution tests: Pearson's chi-square goodness of fit against exact
//! probabilities, with its p-value from the chi-square distribution (the regularised upper
//! incomplete gamma function, as in Numerical Recipes §6.2), so a test states its false-alarm
//! rate instead of copying a quantile from a table.

use std::collections::BTreeMap;

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms: ~1e-15 relative).
pub fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Q(a, x) = Γ(a, x) / Γ(a): a series below a + 1, a continued fraction above.
fn upper_regularised_gamma(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let ln_front = a * x.ln() - x - ln_gamma(a);
    if x < a + 1.0 {
        let (mut term, mut sum, mut n) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            n += 1.0;
            term *= x / n;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        (1.0 - sum * ln_front.exp()).max(0.0)
    } else {
        // Lentz's method for the continued fraction.
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-16 {
                break;
            }
        }
        ln_front.exp() * h
    }
}

/// P(χ²_df ≥ x).
pub fn chi_square_sf(x: f64, df: usize) -> f64 {
    upper_regularised_gamma(df as f64 / 2.0, x / 2.0)
}

/// The result of one goodness-of-fit comparison.
#[derive(Clone, Debug)]
pub struct Fit {
    pub statistic: f64,
    pub df: usize,
    pub p_value: f64,
    /// Outcomes seen that have probability 0: each one alone refutes the distribution.
    pub impossible: Vec<String>,
}

/// Pearson's chi-square of `counts` (n draws in all) against the exact `probs`. Outcomes whose
/// expected count is under 5 are pooled, least likely first, into one cell until it reaches 5
/// (the usual condition for the chi-square approximation), so rare outcomes still count.
pub fn goodness_of_fit<K: Ord + std::fmt::Debug>(
    counts: &BTreeMap<K, u64>,
    probs: &BTreeMap<K, f64>,
) -> Fit {
    let n: u64 = counts.values().sum();
    let impossible: Vec<String> = counts
        .keys()
        .filter(|k| probs.get(*k).copied().unwrap_or(0.0) <= 0.0)
        .map(|k| format!("{k:?}"))
        .collect();
    let mut cells: Vec<(f64, u64)> = probs
        .iter()
        .filter(|(_, &p)| p > 0.0)
        .map(|(k, &p)| (n as f64 * p, counts.get(k).copied().unwrap_or(0)))
        .collect();
    cells.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut kept: Vec<(f64, u64)> = Vec::new();
    let mut pool = (0.0, 0u64);
    for (e, o) in cells {
        if e >= 5.0 && pool.0 == 0.0 {
            kept.push((e, o));
        } else {
            pool = (pool.0 + e, pool.1 + o);
            if pool.0 >= 5.0 {
                kept.push(pool);
                pool = (0.0, 0);
            }
        }
    }
    if pool.0 > 0.0 {
        match kept.first_mut() {
            Some(first) => *first = (first.0 + pool.0, first.1 + pool.1),
            None => kept.push(pool),
        }
    }
    let statistic: f64 = kept.iter().map(|&(e, o)| (o as f64 - e).powi(2) / e).sum();
    let df = kept.len().saturating_sub(1).max(1);
    Fit {
        statistic,
        df,
        p_value: chi_square_sf(statistic, df),
        impossible,
    }
}
