//! A bf16 cache's kernels against `bf16_pairs`' scalar definitions, bit for bit, and the
//! definitions against the instructions they name (where this CPU has them).

use half::bf16;

use super::bf16_pairs::{self, dp, round};
use super::tests::{bits, noise};

/// Keys or values as a bf16 cache holds them.
fn rows(n: usize, seed: usize, scale: f32) -> Vec<bf16> {
    (0..n).map(|i| round(scale * noise(seed + i))).collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn rounding_and_pair_products_are_the_instructions_bits() {
    use std::arch::x86_64::*;
    if !super::bf16_avx512::available() {
        eprintln!(
            "no AVX-512 BF16 here: the kernels' bits are checked against the definitions only"
        );
        return;
    }
    // Ordinary values, ties, subnormals, infinities, NaN, the largest finite, near-overflow.
    let mut xs: Vec<f32> = (0..20_000)
        .map(|i| 300.0 * noise(i) * noise(i + 7))
        .collect();
    xs.extend([
        0.0,
        -0.0,
        1e-40,
        -1e-40,
        f32::MIN_POSITIVE,
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
    ]);
    xs.extend([
        f32::NEG_INFINITY,
        f32::NAN,
        1.0 + f32::EPSILON * 32768.0,
        3.390_3e38,
    ]);
    xs.extend((0..1000).map(|i| f32::from_bits(0x3f80_8000 + (i << 16))));
    xs.extend((0..1000).map(|i| noise(i) * 1e-37));
    while !xs.len().is_multiple_of(32) {
        xs.push(1.5);
    }
    let mut vector = vec![0u16; xs.len()];
    // SAFETY: AVX-512 BF16 is here (checked above).
    unsafe { super::bf16_avx512::round_slice(&xs, &mut vector) };
    for (x, v) in xs.iter().zip(&vector) {
        assert_eq!(
            round(*x).to_bits(),
            *v,
            "rounding {x:e} ({:#x})",
            x.to_bits()
        );
    }
    // One lane of `vdpbf16ps` on random pairs, tiny ones among them (subnormal products).
    for i in 0..20_000usize {
        let scale = if i % 4 == 0 { 1e-20 } else { 8.0 };
        let pick = |k: usize| round(scale * noise(i * 8 + k)).to_bits();
        let (a, b) = ([pick(0), pick(1)], [pick(2), pick(3)]);
        let acc = if i % 3 == 0 {
            noise(i) * 1e-38
        } else {
            50.0 * noise(i + 1)
        };
        let acc = if acc.abs() < f32::MIN_POSITIVE {
            0.0
        } else {
            acc
        };
        let pair = |p: [u16; 2]| (u32::from(p[0]) | u32::from(p[1]) << 16) as i32;
        // SAFETY: AVX-512 BF16 is here (checked above).
        let got = unsafe {
            let pair = |p| _mm512_set1_epi32(pair(p));
            let r = super::bf16_avx512::dp(_mm512_set1_ps(acc), pair(a), pair(b));
            let mut out = [0f32; 16];
            _mm512_storeu_ps(out.as_mut_ptr(), r);
            out[0]
        };
        assert_eq!(
            dp(acc, a, b).to_bits(),
            got.to_bits(),
            "lane {i}: {acc:e}, {a:?}, {b:?}"
        );
    }
}

/// Scores through `loops` (the in-lane kernel alone or for heads side by side, or a run's
/// transposed pairs) are the
/// definition's `dot` times the scale, for heads of 32, 64 and 96 and any number of keys.
#[test]
fn scores_are_the_definitions_bits() {
    for dim in [32, 64, 96, 256] {
        let stride = 3 * dim;
        let keys = rows(70 * stride, 11, 4.0);
        let q: Vec<f32> = (0..12 * dim).map(|i| 3.0 * noise(5000 + i)).collect();
        for n in [1, 7, 8, 9, 33, 64] {
            let want = |m: usize| -> Vec<f32> {
                let mut qb = Vec::new();
                bf16_pairs::round_into(&q[m * dim..][..dim], &mut qb);
                (0..n)
                    .map(|j| bf16_pairs::dot(&qb, keys.as_slice(), j * stride + dim) * 0.125)
                    .collect()
            };
            let mut one = vec![0f32; n];
            super::scaled_dots(&q[..dim], keys.as_slice(), stride, dim, 0.125, &mut one);
            assert_eq!(
                bits(&one),
                bits(&want(0)),
                "dim {dim}, {n} keys, in the lanes"
            );
            for heads in 2..=3 {
                let mut out = vec![0f32; heads * 64];
                let q = &q[..heads * dim];
                let at = (stride, dim);
                super::loops::scaled_dots_heads(
                    q,
                    heads,
                    keys.as_slice(),
                    at,
                    0.125,
                    &mut out,
                    64,
                    n,
                );
                for m in 0..heads {
                    let got = &out[m * 64..][..n];
                    assert_eq!(
                        bits(got),
                        bits(&want(m)),
                        "dim {dim}, {n} keys, head {m} of {heads}"
                    );
                }
            }
            let mut out = vec![0f32; 12 * 64];
            let mut qb = Vec::new();
            bf16_pairs::round_into(&q, &mut qb);
            let query = |m: usize| &qb[m * dim..][..dim];
            let mut kt = Vec::new();
            let at = (keys.as_slice(), (stride, dim));
            let ran = super::loops::vertical_scores_bf16(
                at.0,
                at.1,
                n,
                (12, &query),
                0.125,
                (&mut out, 64),
                &mut kt,
            );
            assert_eq!(
                ran,
                super::bf16_avx512::available(),
                "transposed scores ran"
            );
            if ran {
                for m in 0..12 {
                    assert_eq!(
                        bits(&out[m * 64..][..n]),
                        bits(&want(m)),
                        "dim {dim}, {n} keys, unit {m}"
                    );
                }
            }
        }
    }
}

/// Value sums of one head, of heads side by side and over paired rows are the definition's
/// (keys paired from the first, a last key alone, chunks continuing the chains).
#[test]
fn value_sums_are_the_definitions_bits() {
    for dim in [32, 64, 96, 256] {
        let stride = 2 * dim;
        let values = rows(140 * stride, 77, 2.0);
        let weights: Vec<f32> = (0..3 * 140)
            .map(|i| (noise(900 + i) + 0.5) * 0.02)
            .collect();
        // The same weights rounded, and a partner for the last head's lone last key.
        let mut weight_bits = Vec::new();
        bf16_pairs::round_into(&weights, &mut weight_bits);
        weight_bits.push(0);
        for n in [1, 2, 3, 5, 64, 65, 130] {
            let want = |m: usize| -> Vec<f32> {
                let mut acc = vec![0f32; 2 * dim];
                let (even, odd) = acc.split_at_mut(dim);
                let w = &weights[m * 140..][..n];
                for (t, pair) in w.chunks(2).enumerate() {
                    let sums = if t % 2 == 0 { &mut *even } else { &mut *odd };
                    let wp = [
                        round(pair[0]).to_bits(),
                        pair.get(1).map_or(0, |&x| round(x).to_bits()),
                    ];
                    for (d, o) in sums.iter_mut().enumerate() {
                        let v0 = values[2 * t * stride + dim + d].to_bits();
                        let v1 = if pair.len() == 2 {
                            values[(2 * t + 1) * stride + dim + d].to_bits()
                        } else {
                            0
                        };
                        *o = dp(*o, wp, [v0, v1]);
                    }
                }
                acc
            };
            for heads in 1..=3 {
                let mut acc = vec![0f32; heads * 2 * dim];
                super::loops::accumulate_values_heads(
                    &weights,
                    140,
                    n,
                    heads,
                    values.as_slice(),
                    (stride, dim),
                    &mut acc,
                );
                for m in 0..heads {
                    assert_eq!(
                        bits(&acc[m * 2 * dim..][..2 * dim]),
                        bits(&want(m)),
                        "dim {dim}, {n} keys, head {m} of {heads}"
                    );
                }
                if n <= super::vertical::CHUNK {
                    let mut paired = Vec::new();
                    let at = (values.as_slice(), (stride, dim));
                    if super::loops::pair_rows(at, n, dim, &mut paired) {
                        let mut acc = vec![0f32; heads * 2 * dim];
                        let w = bf16_pairs::WeightBits {
                            bits: &weight_bits,
                            stride: 140,
                        };
                        super::loops::accumulate_paired(w, n, heads, &paired, &mut acc);
                        for m in 0..heads {
                            assert_eq!(
                                bits(&acc[m * 2 * dim..][..2 * dim]),
                                bits(&want(m)),
                                "paired: dim {dim}, {n} keys, head {m} of {heads}"
                            );
                        }
                    }
                }
            }
        }
    }
}
