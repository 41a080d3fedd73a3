//! Every kernel against the scalar definitions, bit for bit (the whole call: `call_tests`).

use super::scalar::dot;
use super::{accumulate_values, finish_values, scaled_dots, softmax_weights, KvRows};
use crate::model::kernels::fast_exp::softmax_exp;

pub(super) fn val(i: usize) -> f32 {
    ((i * 104_729 % 2000) as f32 - 1000.0) * 1e-3
}

/// `f()` with this thread's parallel sections run on it alone: a deep call's items are then
/// interleaved from two segments on, whatever the pool's size (see `causal`).
pub(super) fn on_one_thread<T>(f: impl FnOnce() -> T) -> T {
    use crate::model::kernels::parallel::set_inline;
    set_inline(true);
    let out = f();
    set_inline(false);
    out
}

pub(super) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A hash of `i` in `[-0.5, 0.5)`, with no period a cache could line up with (`val` repeats
/// every 2000 elements, so a deep cache of it holds the same rows in every segment).
pub(super) fn noise(i: usize) -> f32 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
}

/// `n` f16 numbers, and the same numbers in f32.
pub(super) fn half_and_wide(n: usize, k: usize) -> (Vec<half::f16>, Vec<f32>) {
    let h: Vec<half::f16> = (0..n)
        .map(|i| half::f16::from_f32(val(i * k + 3) * 1.7))
        .collect();
    let w = h.iter().map(|x| x.to_f32()).collect();
    (h, w)
}

/// q8_0 rows (`scale · q`) and the same numbers in f32.
pub(super) struct Q8 {
    pub(super) quants: Vec<i8>,
    pub(super) scales: Vec<f32>,
    pub(super) wide: Vec<f32>,
}

impl Q8 {
    /// `n` elements (a multiple of 32): bytes over the whole range, scales that are f16 numbers
    /// of several magnitudes.
    pub(super) fn of(n: usize, k: usize) -> Self {
        let quants: Vec<i8> = (0..n).map(|i| (noise(i * k + 1) * 254.0) as i8).collect();
        let scales: Vec<f32> = (0..n.div_ceil(32))
            .map(|b| half::f16::from_f32(0.002 + noise(b * k + 9).abs() * 0.03).to_f32())
            .collect();
        let wide = (0..n)
            .map(|i| f32::from(quants[i]) * scales[i / 32])
            .collect();
        Self {
            quants,
            scales,
            wide,
        }
    }

    pub(super) fn rows(&self) -> super::Q8Rows<'_> {
        super::Q8Rows::new(&self.quants, &self.scales)
    }
}

/// `out = (Σ_{j even} weights[j] · value j + Σ_{j odd} weights[j] · value j) · inv` in one go.
pub(super) fn weighted_values<K: KvRows>(
    weights: &[f32],
    inv: f32,
    values: K,
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    let mut acc = vec![0f32; 2 * out.len()];
    accumulate_values(weights, values, stride, offset, &mut acc);
    finish_values(&acc, inv, out);
}

/// The definition of `weighted_values`, written out plainly.
pub(super) fn value_sums_by_definition(
    weights: &[f32],
    inv: f32,
    values: &[f32],
    stride: usize,
    offset: usize,
    dim: usize,
) -> Vec<f32> {
    let mut sums = vec![vec![0f32; dim]; 2];
    for (j, &w) in weights.iter().enumerate() {
        for (d, o) in sums[j % 2].iter_mut().enumerate() {
            *o = w.mul_add(values[j * stride + offset + d], *o);
        }
    }
    (0..dim).map(|d| (sums[0][d] + sums[1][d]) * inv).collect()
}

type ValuePath = fn(&[f32], f32, &[f32], usize, usize, &mut [f32]);

/// Every `weighted_values` path this machine can run but AVX-512 (tested on its own), by
/// name: accumulated in one go or in chunks of 6 keys, then finished.
fn value_paths() -> Vec<(&'static str, ValuePath)> {
    let mut paths: Vec<(&'static str, ValuePath)> = vec![
        ("dispatch", |w, i, v, s, o, out| {
            weighted_values(w, i, v, s, o, out)
        }),
        ("dispatch, chunked", |w, i, v, s, o, out| {
            let mut acc = vec![0f32; 2 * out.len()];
            for (c, ws) in w.chunks(6).enumerate() {
                accumulate_values(ws, &v[c * 6 * s..], s, o, &mut acc);
            }
            finish_values(&acc, i, out);
        }),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        if super::simd_available() {
            paths.push(("avx2", |w, i, v, s, o, out| {
                let mut acc = vec![0f32; 2 * out.len()];
                unsafe { super::avx2::accumulate_values(w, v, s, o, &mut acc) };
                finish_values(&acc, i, out);
            }));
        }
    }
    paths
}

/// (outputs, keys) for the value sums: 128 and 64 outputs run on every path, 96 on AVX2
/// only, 40 on the scalar loop; odd and even key counts end the two chains differently.
const VALUE_SUM_SHAPES: [(usize, usize); 6] =
    [(128, 37), (64, 1), (64, 8), (96, 5), (40, 6), (64, 19)];

/// Checks one value-sum path on every shape whose output count it takes (`multiple_of`).
fn check_value_sums(name: &str, path: ValuePath, multiple_of: usize) {
    for (dim, n) in VALUE_SUM_SHAPES {
        if !dim.is_multiple_of(multiple_of) {
            continue;
        }
        let (stride, offset) = (3 * dim, dim);
        let values: Vec<f32> = (0..n * stride).map(val).collect();
        let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
        let want = value_sums_by_definition(&weights, 0.37, values.as_slice(), stride, offset, dim);
        let mut ours = vec![0f32; dim];
        path(&weights, 0.37, values.as_slice(), stride, offset, &mut ours);
        assert_eq!(bits(&ours), bits(&want), "{name}: {dim} outputs, {n} keys");
    }
}

#[test]
fn vector_value_sums_equal_the_scalar_loop_bit_for_bit() {
    for (name, path) in value_paths() {
        let multiple_of = if name.starts_with("avx") { 32 } else { 1 };
        check_value_sums(name, path, multiple_of);
    }
}

// The AVX-512 kernels' tests run where the CPU has AVX-512F and AVX-512VL (every build has the
// kernels; they are chosen at run time). On a CPU without them the kernels never run, and
// these tests say so on stderr and have nothing to check.

/// Whether the AVX-512 kernels run on this CPU; says so on stderr when they do not.
#[cfg(target_arch = "x86_64")]
pub(super) fn avx512_kernels_run_here() -> bool {
    let here = super::simd_available() && super::wide_available();
    if !here {
        eprintln!("this CPU lacks AVX-512F/VL (or TANDEM_DISABLE_AVX512 is set): nothing to check");
    }
    here
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_value_sums_equal_the_scalar_loop_bit_for_bit() {
    if !avx512_kernels_run_here() {
        return;
    }
    check_value_sums(
        "avx512",
        |w, i, v, s, o, out| {
            let mut acc = vec![0f32; 2 * out.len()];
            unsafe { super::avx512::accumulate_values(w, v, s, o, &mut acc) };
            finish_values(&acc, i, out);
        },
        64,
    );
}

type Dots = fn(&[f32], &[f32], usize, usize, f32, &mut [f32]);

/// Checks one score path against the scalar dot on every head size it takes
/// (`multiple_of`): 8-key blocks and a tail; 23 keys also leave a tail after two blocks.
/// Head sizes of 64 and 48 run the vector paths, 40 the scalar one.
fn check_scores(name: &str, path: Dots, multiple_of: usize) {
    for dim in [64usize, 48, 40] {
        if !dim.is_multiple_of(multiple_of) {
            continue;
        }
        for n in [1, 7, 8, 23, 64] {
            let (stride, offset) = (3 * dim, dim);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let keys: Vec<f32> = (0..n * stride).map(|i| val(i * 7 + 3)).collect();
            let mut scores = vec![0f32; n];
            path(&q, keys.as_slice(), stride, offset, 0.125, &mut scores);
            for (j, &s) in scores.iter().enumerate() {
                assert_eq!(
                    s.to_bits(),
                    (dot(&q, keys.as_slice(), j * stride + offset) * 0.125).to_bits(),
                    "{name}: key {j} of {n}, head size {dim}"
                );
            }
        }
    }
}

#[test]
fn vector_scores_equal_the_scalar_dot_bit_for_bit() {
    check_scores(
        "dispatch",
        |q, k, s, o, sc, out| scaled_dots(q, k, s, o, sc, out),
        1,
    );
    #[cfg(target_arch = "x86_64")]
    if super::simd_available() {
        check_scores(
            "avx2",
            |q, k, s, o, sc, out| unsafe { super::avx2::scaled_dots(q, k, s, o, sc, out) },
            16,
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_scores_equal_the_scalar_dot_bit_for_bit() {
    if !avx512_kernels_run_here() {
        return;
    }
    check_scores(
        "avx512",
        |q, k, s, o, sc, out| unsafe { super::avx512::scaled_dots(q, k, s, o, sc, out) },
        16,
    );
}

#[test]
fn dot_is_close_to_the_exact_product() {
    for dim in [16, 64, 70] {
        let a: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
        let b: Vec<f32> = (0..dim).map(|i| val(i * 7 + 3)).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let scale: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64 * *y as f64).abs())
            .sum();
        assert!(
            ((dot(&a, b.as_slice(), 0) as f64) - exact).abs() <= 1e-6 * scale,
            "{dim}"
        );
    }
}

#[test]
fn vector_softmax_weights_equal_the_scalar_ones_bit_for_bit() {
    for n in [1, 5, 8, 13, 16, 24, 40, 100, 1001] {
        let scores: Vec<f32> = (0..n).map(|j| val(j * 17 + 1) * 9.0).collect();
        let mut ours = scores.clone();
        let (their_max, sum) = softmax_weights(&mut ours);
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        assert_eq!(their_max, max);
        let want: Vec<f32> = scores.iter().map(|&s| softmax_exp(s - max)).collect();
        let mut lanes = [0f32; 8];
        let full = n / 8 * 8;
        for (j, w) in want[..full].iter().enumerate() {
            lanes[j % 8] += w;
        }
        let mut want_sum = super::shared::lane_sum(&lanes);
        for w in &want[full..] {
            want_sum += w;
        }
        assert_eq!(bits(&ours), bits(&want), "{n} keys");
        assert_eq!(sum.to_bits(), want_sum.to_bits(), "{n} keys");
        // And they are softmax: the largest weight is 1, the sum is close to exact.
        let exact: f64 = scores.iter().map(|&s| ((s - max) as f64).exp()).sum();
        assert!(
            (sum as f64 - exact).abs() < 1e-6 * exact,
            "{sum} vs {exact}"
        );
    }
}

#[test]
fn softmax_exp_is_within_two_ulp_of_exp() {
    let mut x = -87.0f32;
    while x <= 0.0 {
        let want = (x as f64).exp();
        let got = softmax_exp(x) as f64;
        let rel = (got - want).abs() / want;
        assert!(rel < 2.5e-7, "exp({x}) = {got}, want {want} ({rel:e})");
        x += 0.0137;
    }
    assert_eq!(softmax_exp(0.0), 1.0);
    assert!(softmax_exp(-1e9) < 2e-38 && softmax_exp(-1e9) > 0.0);
    assert!(softmax_exp(f32::NAN).is_nan());
    // A NaN score (a broken model) stays visible in the sum, vector lanes and tail alike.
    for at in [3, 9] {
        let mut s = vec![0.5f32; 10];
        s[at] = f32::NAN;
        assert!(softmax_weights(&mut s).1.is_nan(), "NaN at {at}");
    }
}

/// Heads side by side (`scaled_dots_heads`, `accumulate_values_heads`) give each head the bits
/// it gets alone, for f32 and f16 keys and values, 1 to 3 heads, head sizes on the AVX-512
/// paths (64, 128) and off them (48 for values, 40 for both), key counts with and without a
/// tail, and value sums that continue running sums (odd and even keys already in them).
#[test]
fn heads_side_by_side_give_each_head_its_own_bits() {
    use super::{accumulate_values_heads, scaled_dots_heads};
    fn check<K: KvRows>(keys: K, values: K, dim: usize, n: usize, heads: usize) {
        let (stride, offset) = (3 * dim, dim);
        let q: Vec<f32> = (0..heads * dim).map(|i| val(i * 13 + 5)).collect();
        let score_stride = n + 5;
        let mut scores = vec![0f32; heads * score_stride];
        scaled_dots_heads(
            &q,
            heads,
            keys,
            (stride, offset),
            0.125,
            &mut scores,
            score_stride,
            n,
        );
        let start: Vec<f32> = (0..heads * 2 * dim).map(|i| val(i * 3 + 1)).collect();
        let mut acc = start.clone();
        accumulate_values_heads(
            &scores,
            score_stride,
            n,
            heads,
            values,
            (stride, offset),
            &mut acc,
        );
        for m in 0..heads {
            let mut want = vec![0f32; n];
            scaled_dots(&q[m * dim..][..dim], keys, stride, offset, 0.125, &mut want);
            let got = &scores[m * score_stride..][..n];
            assert_eq!(
                bits(got),
                bits(&want),
                "scores of head {m}/{heads}, {dim}, {n} keys"
            );
            let mut alone = start[m * 2 * dim..][..2 * dim].to_vec();
            accumulate_values(got, values, stride, offset, &mut alone);
            let got = &acc[m * 2 * dim..][..2 * dim];
            assert_eq!(
                bits(got),
                bits(&alone),
                "sums of head {m}/{heads}, {dim}, {n} keys"
            );
        }
    }
    for dim in [128, 64, 48, 40] {
        for n in [1, 2, 7, 8, 23, 64] {
            let (k16, k32) = half_and_wide(n * 3 * dim, 7);
            let (v16, v32) = half_and_wide(n * 3 * dim, 5);
            let (kq, vq) = (Q8::of(n * 3 * dim, 7), Q8::of(n * 3 * dim, 5));
            for heads in 1..=3 {
                check(k32.as_slice(), v32.as_slice(), dim, n, heads);
                check(k16.as_slice(), v16.as_slice(), dim, n, heads);
                check(kq.rows(), vq.rows(), dim, n, heads);
            }
        }
    }
}

/// Scores from keys transposed along the lanes (a verification's runs) are the bits of
/// `scaled_dots`, for every key type, head sizes 48 to 128, chunks of 1 to 64 keys (whole and
/// partial tiles of 16) and 8 to 11 units (groups of 4 and what is left).
#[cfg(target_arch = "x86_64")]
#[test]
fn scores_from_transposed_keys_equal_the_scalar_dot_bit_for_bit() {
    if !avx512_kernels_run_here() {
        return;
    }
    fn check<K: KvRows>(keys: K, dim: usize, n: usize, units: usize, name: &str) {
        let (stride, offset) = (3 * dim, dim);
        let q: Vec<f32> = (0..units * dim).map(|i| noise(i * 13 + 5)).collect();
        let query = |m: usize| -> &[f32] { &q[m * dim..][..dim] };
        let out_stride = n + 3;
        let mut got = vec![f32::NAN; units * out_stride];
        let mut kt = Vec::new();
        let done = super::loops::vertical_scores(
            keys,
            (stride, offset),
            n,
            (units, &query),
            0.125,
            (&mut got, out_stride),
            &mut kt,
        );
        assert!(done, "{name}: the vertical kernel ran");
        for m in 0..units {
            let mut want = vec![0f32; n];
            scaled_dots(query(m), keys, stride, offset, 0.125, &mut want);
            let row = &got[m * out_stride..][..out_stride];
            assert_eq!(
                bits(&row[..n]),
                bits(&want),
                "{name}: unit {m}, {dim}, {n} keys"
            );
            assert!(
                row[n..].iter().all(|x| x.is_nan()),
                "{name}: wrote past {n}"
            );
        }
    }
    for dim in [128, 64, 48] {
        for n in [1, 15, 16, 37, 64] {
            let (k16, k32) = half_and_wide(n * 3 * dim, 7);
            let kq = Q8::of(n * 3 * dim, 3);
            for units in [8, 11] {
                check(k32.as_slice(), dim, n, units, "f32");
                check(k16.as_slice(), dim, n, units, "f16");
                check(kq.rows(), dim, n, units, "q8_0");
            }
        }
    }
}
