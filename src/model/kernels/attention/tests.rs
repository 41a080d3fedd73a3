//! Every kernel against the scalar definitions, bit for bit, and the whole attention call.

use super::scalar::dot;
use super::{accumulate_values, finish_values, scaled_dots, softmax_weights, KvRows};
use crate::model::kernels::fast_exp::softmax_exp;

fn val(i: usize) -> f32 {
    ((i * 104_729 % 2000) as f32 - 1000.0) * 1e-3
}

pub(super) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `out = (Σ_{j even} weights[j] · value j + Σ_{j odd} weights[j] · value j) · inv` in one go.
fn weighted_values<K: KvRows>(
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
fn value_sums_by_definition(
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
fn avx512_kernels_run_here() -> bool {
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

/// `n` f16 numbers, and the same numbers in f32.
fn half_and_wide(n: usize, k: usize) -> (Vec<half::f16>, Vec<f32>) {
    let h: Vec<half::f16> = (0..n)
        .map(|i| half::f16::from_f32(val(i * k + 3) * 1.7))
        .collect();
    let w = h.iter().map(|x| x.to_f32()).collect();
    (h, w)
}

/// q8_0 rows (`scale · q`) and the same numbers in f32.
struct Q8 {
    quants: Vec<i8>,
    scales: Vec<f32>,
    wide: Vec<f32>,
}

impl Q8 {
    /// `n` elements (a multiple of 32): bytes over the whole range, scales that are f16 numbers
    /// of several magnitudes.
    fn of(n: usize, k: usize) -> Self {
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

    fn rows(&self) -> super::Q8Rows<'_> {
        super::Q8Rows::new(&self.quants, &self.scales)
    }
}

/// q8_0 values, and q8_0 keys in the float score kernels, give the bits of f32 ones holding
/// their numbers on every path this CPU runs: the scalar loops (head size 40), AVX2 and
/// AVX-512. (The attention call scores q8_0 keys on the integer units instead: see
/// `q8_score_tests`.)
#[test]
fn q8_elements_give_the_bits_of_their_f32_values_in_the_float_kernels() {
    for dim in [128, 64, 48, 40] {
        for n in [1, 8, 23, 64] {
            let (stride, offset) = (3 * dim, dim);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let (kq, vq) = (Q8::of(n * stride, 7), Q8::of(n * stride, 5));
            let mut want = vec![0f32; n];
            scaled_dots(&q, kq.wide.as_slice(), stride, offset, 0.125, &mut want);
            let mut got = vec![0f32; n];
            scaled_dots(&q, kq.rows(), stride, offset, 0.125, &mut got);
            assert_eq!(bits(&got), bits(&want), "scores: head size {dim}, {n} keys");
            let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
            let want_values =
                value_sums_by_definition(&weights, 0.37, &vq.wide, stride, offset, dim);
            let mut got_values = vec![0f32; dim];
            weighted_values(&weights, 0.37, vq.rows(), stride, offset, &mut got_values);
            assert_eq!(bits(&got_values), bits(&want_values), "values: {dim}, {n}");
            #[cfg(target_arch = "x86_64")]
            {
                let mut acc = vec![0f32; 2 * dim];
                if super::simd_available() && dim % 16 == 0 {
                    unsafe {
                        super::avx2::scaled_dots(&q, kq.rows(), stride, offset, 0.125, &mut got)
                    };
                    assert_eq!(bits(&got), bits(&want), "avx2 scores: {dim}, {n}");
                }
                if super::simd_available() && dim % 32 == 0 {
                    unsafe {
                        super::avx2::accumulate_values(
                            &weights,
                            vq.rows(),
                            stride,
                            offset,
                            &mut acc,
                        )
                    };
                    finish_values(&acc, 0.37, &mut got_values);
                    assert_eq!(
                        bits(&got_values),
                        bits(&want_values),
                        "avx2 values: {dim}, {n}"
                    );
                }
                if super::simd_available() && super::wide_available() && dim % 16 == 0 {
                    unsafe {
                        super::avx512::scaled_dots(&q, kq.rows(), stride, offset, 0.125, &mut got)
                    };
                    assert_eq!(bits(&got), bits(&want), "avx512 scores: {dim}, {n}");
                    if dim % 64 == 0 {
                        acc.fill(0.0);
                        unsafe {
                            super::avx512::accumulate_values(
                                &weights,
                                vq.rows(),
                                stride,
                                offset,
                                &mut acc,
                            )
                        };
                        finish_values(&acc, 0.37, &mut got_values);
                        assert_eq!(
                            bits(&got_values),
                            bits(&want_values),
                            "avx512 values: {dim}, {n}"
                        );
                    }
                }
            }
        }
    }
}

/// f16 keys and values give, on every path, the bits f32 ones holding the same numbers
/// give: the scalar loops (head sizes 40 and 48 for values, 40 for scores) and AVX2 (AVX-512
/// in the test after this one).
#[test]
fn f16_keys_and_values_give_the_bits_of_their_f32_values_on_every_path() {
    for dim in [128, 64, 48, 40] {
        for n in [1, 8, 23, 64] {
            let (stride, offset) = (3 * dim, dim);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let (k16, k32) = half_and_wide(n * stride, 7);
            let (v16, v32) = half_and_wide(n * stride, 5);
            let mut want = vec![0f32; n];
            scaled_dots(&q, k32.as_slice(), stride, offset, 0.125, &mut want);
            let mut got = vec![0f32; n];
            scaled_dots(&q, k16.as_slice(), stride, offset, 0.125, &mut got);
            assert_eq!(bits(&got), bits(&want), "scores: head size {dim}, {n} keys");
            #[cfg(target_arch = "x86_64")]
            if super::simd_available() && dim % 16 == 0 {
                unsafe {
                    super::avx2::scaled_dots(&q, k16.as_slice(), stride, offset, 0.125, &mut got)
                };
                assert_eq!(bits(&got), bits(&want), "avx2 scores: {dim}, {n}");
            }
            let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
            let want =
                value_sums_by_definition(&weights, 0.37, v32.as_slice(), stride, offset, dim);
            let mut got = vec![0f32; dim];
            weighted_values(&weights, 0.37, v16.as_slice(), stride, offset, &mut got);
            assert_eq!(bits(&got), bits(&want), "values: head size {dim}, {n} keys");
            #[cfg(target_arch = "x86_64")]
            if super::simd_available() && dim % 32 == 0 {
                let mut acc = vec![0f32; 2 * dim];
                unsafe {
                    super::avx2::accumulate_values(
                        &weights,
                        v16.as_slice(),
                        stride,
                        offset,
                        &mut acc,
                    )
                };
                finish_values(&acc, 0.37, &mut got);
                assert_eq!(bits(&got), bits(&want), "avx2 values: {dim}, {n}");
            }
        }
    }
}

/// The AVX-512 kernels on f16 keys and values give the bits of the f32 ones.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_f16_keys_and_values_give_the_bits_of_their_f32_values() {
    if !avx512_kernels_run_here() {
        return;
    }
    // Scores take head sizes that are multiples of 16, value sums multiples of 64.
    for dim in [128, 64, 48] {
        for n in [1, 8, 23, 64] {
            let (stride, offset) = (3 * dim, dim);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let (k16, k32) = half_and_wide(n * stride, 7);
            let (v16, v32) = half_and_wide(n * stride, 5);
            let mut want = vec![0f32; n];
            scaled_dots(&q, k32.as_slice(), stride, offset, 0.125, &mut want);
            let mut got = vec![0f32; n];
            unsafe {
                super::avx512::scaled_dots(&q, k16.as_slice(), stride, offset, 0.125, &mut got)
            };
            assert_eq!(bits(&got), bits(&want), "avx512 scores: {dim}, {n}");
            if dim % 64 != 0 {
                continue;
            }
            let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
            let want =
                value_sums_by_definition(&weights, 0.37, v32.as_slice(), stride, offset, dim);
            let mut acc = vec![0f32; 2 * dim];
            unsafe {
                super::avx512::accumulate_values(&weights, v16.as_slice(), stride, offset, &mut acc)
            };
            let mut got = vec![0f32; dim];
            finish_values(&acc, 0.37, &mut got);
            assert_eq!(bits(&got), bits(&want), "avx512 values: {dim}, {n}");
        }
    }
}

/// The same through the whole attention call (grouped heads, key chunks, threads).
#[test]
fn an_f16_cache_gives_the_bits_of_its_values_in_f32() {
    use super::{causal_attention, AttnShape};
    use half::f16;
    let shape = AttnShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
    };
    // One token, a verification that fills a run, and a prefill spanning two key chunks.
    for (start, n_new) in [(150, 1), (150, 8), (0, 70)] {
        let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
        let q: Vec<f32> = (0..n_new * q_dim).map(|i| val(i * 11 + 2)).collect();
        let half_of = |k: usize| -> Vec<f16> {
            (0..(start + n_new) * kv_dim)
                .map(|i| f16::from_f32(val(i * k + 3) * 1.7))
                .collect()
        };
        let (keys16, values16) = (half_of(7), half_of(5));
        let widen = |v: &[f16]| -> Vec<f32> { v.iter().map(|x| x.to_f32()).collect() };
        let (keys32, values32) = (widen(keys16.as_slice()), widen(values16.as_slice()));
        let mut from16 = vec![0f32; n_new * q_dim];
        causal_attention(
            shape,
            &q,
            keys16.as_slice(),
            values16.as_slice(),
            (start, None),
            &mut from16,
        );
        let mut from32 = vec![0f32; n_new * q_dim];
        causal_attention(
            shape,
            &q,
            keys32.as_slice(),
            values32.as_slice(),
            (start, None),
            &mut from32,
        );
        assert_eq!(bits(&from16), bits(&from32), "start {start}, {n_new} new");
    }
}

#[test]
fn heads_computed_together_give_each_heads_own_result() {
    use super::{causal_attention, AttnShape};
    // 9 heads on 3 key-value heads (SmolLM2's shape), and 8 on 2 (groups of 4, as Llama 3's,
    // which the kernels take 3 heads and 1 at a time). 150 cached tokens span three key
    // chunks, the last one odd; 3 new tokens fit one run per key-value head, 8 (24 units)
    // fill one exactly and 11 spill into a second, and a 70-token prefill from an empty
    // cache runs queries that see different numbers of chunks together. Large enough
    // shapes are split over threads.
    for (num_heads, num_kv_heads) in [(9, 3), (8, 2)] {
        let shape = AttnShape {
            num_heads,
            num_kv_heads,
            head_dim: 64,
        };
        let group = num_heads / num_kv_heads;
        for (start, n_new) in [(150, 3), (150, 8), (150, 11), (0, 70)] {
            let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
            let q: Vec<f32> = (0..n_new * q_dim).map(|i| val(i * 11 + 2)).collect();
            let keys: Vec<f32> = (0..(start + n_new) * kv_dim)
                .map(|i| val(i * 7 + 3))
                .collect();
            let values: Vec<f32> = (0..(start + n_new) * kv_dim)
                .map(|i| val(i * 5 + 1))
                .collect();
            let mut ours = vec![0f32; n_new * q_dim];
            causal_attention(
                shape,
                &q,
                keys.as_slice(),
                values.as_slice(),
                (start, None),
                &mut ours,
            );
            let mut want = vec![0f32; n_new * q_dim];
            for i in 0..n_new {
                for h in 0..num_heads {
                    let seen = start + i + 1;
                    let mut scores = vec![0f32; seen];
                    let qv = &q[i * q_dim + h * 64..][..64];
                    scaled_dots(
                        qv,
                        keys.as_slice(),
                        kv_dim,
                        h / group * 64,
                        0.125,
                        &mut scores,
                    );
                    let inv = 1.0 / softmax_weights(&mut scores).1;
                    let o = &mut want[i * q_dim + h * 64..][..64];
                    weighted_values(&scores, inv, values.as_slice(), kv_dim, h / group * 64, o);
                }
            }
            assert_eq!(
                bits(&ours),
                bits(&want),
                "{num_heads} heads: {n_new} new tokens after {start}"
            );
        }
    }
}

/// Attention sinks (gpt-oss): each head's output is the softmax over its scores and its sink
/// logit, of which only the scores carry values, computed here in f64 by that definition; a
/// sink of -inf is no sink at all (the same bits), and a tree's chain gives the causal bits.
#[test]
fn sinks_join_each_heads_softmax_without_a_value() {
    use super::{causal_attention, tree_attention, AttnShape};
    let shape = AttnShape {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let (start, n_new) = (40, 5);
    let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
    let q: Vec<f32> = (0..n_new * q_dim).map(|i| 3.0 * val(i * 11 + 2)).collect();
    let keys: Vec<f32> = (0..(start + n_new) * kv_dim)
        .map(|i| val(i * 7 + 3))
        .collect();
    let values: Vec<f32> = (0..(start + n_new) * kv_dim)
        .map(|i| val(i * 5 + 1))
        .collect();
    let run = |sinks: Option<&[f32]>| {
        let mut out = vec![0f32; n_new * q_dim];
        causal_attention(
            shape,
            &q,
            keys.as_slice(),
            values.as_slice(),
            (start, sinks),
            &mut out,
        );
        out
    };
    let sinks = [0.5f32, -2.0, 3.0, 40.0];
    let ours = run(Some(&sinks));
    for i in 0..n_new {
        for (h, &sink) in sinks.iter().enumerate() {
            let kv = h / 2 * 64;
            let qv = &q[i * q_dim + h * 64..][..64];
            let scores: Vec<f64> = (0..start + i + 1)
                .map(|j| {
                    let k = &keys[j * kv_dim + kv..][..64];
                    qv.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / 8.0
                })
                .collect();
            let max = scores.iter().copied().fold(sink as f64, f64::max);
            let total: f64 =
                scores.iter().map(|s| (s - max).exp()).sum::<f64>() + (sink as f64 - max).exp();
            for d in 0..64 {
                let want: f64 = scores
                    .iter()
                    .enumerate()
                    .map(|(j, s)| (s - max).exp() / total * values[j * kv_dim + kv + d] as f64)
                    .sum();
                let got = ours[i * q_dim + h * 64 + d] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "query {i}, head {h}, value {d}: {got} against {want}"
                );
            }
        }
    }
    // A sink far above every score leaves the head almost nothing to attend to.
    let last_head = &ours[(n_new - 1) * q_dim + 3 * 64..][..64];
    assert!(last_head.iter().all(|v| v.abs() < 1e-6), "{last_head:?}");
    assert_eq!(bits(&run(Some(&[f32::NEG_INFINITY; 4]))), bits(&run(None)));
    let paths: Vec<Vec<usize>> = (0..n_new).map(|i| (0..=i).collect()).collect();
    let mut tree = vec![0f32; n_new * q_dim];
    tree_attention(
        shape,
        &q,
        keys.as_slice(),
        values.as_slice(),
        (start, Some(&sinks)),
        &paths,
        &mut tree,
    );
    assert_eq!(bits(&tree), bits(&ours));
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

/// A hash of `i` in `[-0.5, 0.5)`, with no period a cache could line up with (`val` repeats
/// every 2000 elements, so a deep cache of it holds the same rows in every segment).
pub(super) fn noise(i: usize) -> f32 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
}

/// Past one segment of keys, each query's output is its segments' softmaxes merged
/// (`merge_segments`, checked here against the plain softmax in f64); a row's bits are the
/// same computed alone, beside others, or as a tree's chain, with and without sinks; and a
/// query within the first segment keeps the plain softmax's bits in a deep call.
#[test]
fn deep_contexts_merge_segments_the_same_whichever_call_computes_a_row() {
    use super::{causal_attention, tree_attention, AttnShape, SEGMENT};
    let shape = AttnShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
    };
    let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
    let total = 2 * SEGMENT + 300;
    let keys: Vec<half::f16> = (0..total * kv_dim)
        .map(|i| half::f16::from_f32(noise(2 * i)))
        .collect();
    let values: Vec<half::f16> = (0..total * kv_dim)
        .map(|i| half::f16::from_f32(noise(2 * i + 1)))
        .collect();
    let q_at = |pos: usize| -> Vec<f32> {
        (0..q_dim)
            .map(|i| 6.0 * noise(1 << 40 | (pos * q_dim + i)))
            .collect()
    };
    let sinks = [0.5f32, -2.0, 3.0, 1.0, 0.0, -1.0, 2.0, 0.25, -0.5];
    // Queries at `start..start + n`, one call.
    let call = |start: usize, n: usize, sinks: Option<&[f32]>| {
        let q: Vec<f32> = (start..start + n).flat_map(q_at).collect();
        let mut out = vec![0f32; n * q_dim];
        let kv = (start + n) * kv_dim;
        causal_attention(
            shape,
            &q,
            &keys[..kv],
            &values[..kv],
            (start, sinks),
            &mut out,
        );
        out
    };
    for sinks in [None, Some(&sinks[..])] {
        // 8 queries across the first segment's end, then the second's, then deep in the third.
        for start in [SEGMENT - 4, 2 * SEGMENT - 3, total - 8] {
            let together = call(start, 8, sinks);
            for i in 0..8 {
                let alone = call(start + i, 1, sinks);
                assert_eq!(
                    bits(&together[i * q_dim..][..q_dim]),
                    bits(&alone),
                    "query {} alone and beside 7 others",
                    start + i
                );
            }
            let q: Vec<f32> = (start..start + 8).flat_map(q_at).collect();
            let paths: Vec<Vec<usize>> = (0..8).map(|i| (0..=i).collect()).collect();
            let mut tree = vec![0f32; 8 * q_dim];
            let kv = (start + 8) * kv_dim;
            tree_attention(
                shape,
                &q,
                &keys[..kv],
                &values[..kv],
                (start, sinks),
                &paths,
                &mut tree,
            );
            assert_eq!(bits(&tree), bits(&together), "a tree's chain at {start}");
        }
        // A 700-token prefill from nothing: its first queries (one segment) keep the plain
        // softmax's bits, as a shallow call computes them.
        let prefill = call(0, SEGMENT + 188, sinks);
        let shallow = call(0, 40, sinks);
        assert_eq!(bits(&prefill[..40 * q_dim]), bits(&shallow));
    }
    // Against the softmax over all keys in f64.
    let pos = total - 1;
    let out = call(pos, 1, Some(&sinks));
    let q = q_at(pos);
    for (h, &sink) in sinks.iter().enumerate() {
        let kv = h / 3 * 64;
        let scores: Vec<f64> = (0..=pos)
            .map(|j| {
                (0..64)
                    .map(|d| q[h * 64 + d] as f64 * keys[j * kv_dim + kv + d].to_f64())
                    .sum::<f64>()
                    / 8.0
            })
            .collect();
        let max = scores.iter().copied().fold(sink as f64, f64::max);
        let total_weight: f64 =
            scores.iter().map(|s| (s - max).exp()).sum::<f64>() + (sink as f64 - max).exp();
        for d in 0..64 {
            let want: f64 = scores
                .iter()
                .enumerate()
                .map(|(j, s)| (s - max).exp() / total_weight * values[j * kv_dim + kv + d].to_f64())
                .sum();
            let got = out[h * 64 + d] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "head {h}, value {d}: {got} against {want}"
            );
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
        let done = super::causal::vertical_scores(
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
