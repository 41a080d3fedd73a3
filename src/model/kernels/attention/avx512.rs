//! AVX-512 forms of the attention kernels (`scaled_dots`, `softmax_weights`,
//! `accumulate_values`): sixteen lanes a register where the AVX2 forms have eight, so a key row or a value row is two or four loads
//! and fused multiply-adds instead of four or eight. A verification of several tokens at a deep
//! context spends its extra time here (each extra query token re-reads the sequence's keys and
//! values, ~0.8 ms per token at a depth of 1000 on AVX2).
//!
//! Each output is computed with exactly the scalar definitions' arithmetic in `scalar.rs`
//! (the same fused chains in the same order, the same fixed reductions), so results are
//! bitwise those of the scalar and AVX2 paths: batch invariance and greedy parity do not
//! depend on which instruction set runs.

use std::arch::x86_64::*;

use super::shared::{
    accumulate_values_at_width, lane_sum, prefetch_row, reduce_eight_keys, softmax_tail, KvForm,
    KvRows, PREFETCH_ROWS,
};
use crate::model::kernels::fast_exp::{exp16, exp8};

/// Elements `i..i + 16` of `rows` as f32 (for q8, `i` a multiple of 16, so one scale).
#[target_feature(enable = "avx512f,avx512vl,f16c")]
#[inline]
pub(super) unsafe fn load16<K: KvRows>(rows: K, i: usize) -> __m512 {
    let p = rows.base();
    match K::FORM {
        KvForm::F32 => _mm512_loadu_ps(p.cast::<f32>().add(i)),
        KvForm::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<u16>().add(i).cast())),
        // bf16 is f32's upper half: widened exactly by a shift.
        KvForm::Bf16 => {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast::<u16>().add(i).cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
        }
        KvForm::Q8 => {
            let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(i).cast()));
            _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(rows.scale(i)))
        }
    }
}

/// The sixteen lanes of one key's products folded to eight (`lane i + lane i+8`).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
pub(super) unsafe fn halves_sum(z: __m512) -> __m256 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(z)));
    _mm256_add_ps(_mm512_castps512_ps256(z), high)
}

/// See `super::scaled_dots`; `q.len()` is a multiple of 16 and every key read is inside
/// `keys` (the caller checks both).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn scaled_dots<K: KvRows>(
    q: &[f32],
    keys: K,
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let blocks = q.len() / 16;
    let qp = q.as_ptr();
    let kp = offset;
    let n = scores.len();
    let sv = _mm256_set1_ps(scale);
    let mut j = 0;
    while j + 8 <= n {
        let mut acc = [_mm512_setzero_ps(); 8];
        for i in 0..8 {
            prefetch_row(keys, kp + (j + i + PREFETCH_ROWS) * stride, q.len());
        }
        for c in 0..blocks {
            let qz = _mm512_loadu_ps(qp.add(c * 16));
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qz, load16(keys, kp + (j + i) * stride + c * 16), *a);
            }
        }
        let folded: [__m256; 8] = std::array::from_fn(|i| halves_sum(acc[i]));
        let sums = reduce_eight_keys(folded);
        _mm256_storeu_ps(scores.as_mut_ptr().add(j), _mm256_mul_ps(sums, sv));
        j += 8;
    }
    while j < n {
        let k = kp + j * stride;
        let mut acc = _mm512_setzero_ps();
        for c in 0..blocks {
            acc = _mm512_fmadd_ps(
                _mm512_loadu_ps(qp.add(c * 16)),
                load16(keys, k + c * 16),
                acc,
            );
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), halves_sum(acc));
        scores[j] = lane_sum(&lanes) * scale;
        j += 1;
    }
}

/// See `super::softmax_weights`: the exponentials sixteen lanes at a time (`exp16`, lane for
/// lane the bits of `exp8`), each register's two halves added to the eight-lane sum one after
/// the other, so key `j` still joins lane `j mod 8` in key order, as the AVX2 form adds them.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
pub(super) unsafe fn softmax_weights(scores: &mut [f32]) -> (f32, f32) {
    let n = scores.len();
    let p = scores.as_mut_ptr();
    let (full, wide) = (n / 8 * 8, n / 16 * 16);
    let mut mv = _mm512_set1_ps(f32::NEG_INFINITY);
    for j in (0..wide).step_by(16) {
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(p.add(j)));
    }
    let mut m = [0f32; 16];
    _mm512_storeu_ps(m.as_mut_ptr(), mv);
    let max = scores[wide..]
        .iter()
        .chain(&m)
        .fold(f32::NEG_INFINITY, |a, &s| a.max(s));
    let maxv = _mm512_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    for j in (0..wide).step_by(16) {
        let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(j)), maxv));
        _mm512_storeu_ps(p.add(j), e);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        acc = _mm256_add_ps(
            acc,
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))),
        );
    }
    if full > wide {
        let e = exp8(_mm256_sub_ps(
            _mm256_loadu_ps(p.add(wide)),
            _mm512_castps512_ps256(maxv),
        ));
        _mm256_storeu_ps(p.add(wide), e);
        acc = _mm256_add_ps(acc, e);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    (max, softmax_tail(&lanes, &mut scores[full..], max))
}

accumulate_values_at_width! {
    /// See `super::accumulate_values`; the sums' length is a multiple of 128 (two halves of a
    /// multiple of 64) and every value read is inside `values` (the caller checks both).
    "avx512f,avx512vl,avx2,fma,f16c", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
    _mm512_set1_ps, _mm512_fmadd_ps, load16
}

/// [`scaled_dots`] for `M` queries (2 or 3) reading the same keys: the heads of one query
/// that share a key-value head. Each key block is loaded (and widened from f16) once for all
/// of them instead of once each; every query's scores are the same operations in the same
/// order as [`scaled_dots`] (the same fused chains from zero, the same reduction), so the same
/// bits. Query `m` is `q[m * dim..][..dim]` and its scores go to `scores[m * score_stride..]
/// [..n]`; `dim` is a multiple of 16 and every read and write is inside its slice (the caller
/// checks).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) unsafe fn scaled_dots_shared<K: KvRows, const M: usize>(
    q: &[f32],
    keys: K,
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
    score_stride: usize,
    n: usize,
) {
    let dim = q.len() / M;
    let blocks = dim / 16;
    let qp = q.as_ptr();
    let kp = offset;
    let sp = scores.as_mut_ptr();
    let sv = _mm256_set1_ps(scale);
    let mut j = 0;
    while j + 8 <= n {
        // 8 M accumulators, M query registers and one key register: 28 of 32 at M = 3.
        let mut acc = [[_mm512_setzero_ps(); 8]; M];
        for i in 0..8 {
            prefetch_row(keys, kp + (j + i + PREFETCH_ROWS) * stride, dim);
        }
        for c in 0..blocks {
            let qz: [__m512; M] =
                std::array::from_fn(|m| _mm512_loadu_ps(qp.add(m * dim + c * 16)));
            for i in 0..8 {
                let k = load16(keys, kp + (j + i) * stride + c * 16);
                for m in 0..M {
                    acc[m][i] = _mm512_fmadd_ps(qz[m], k, acc[m][i]);
                }
            }
        }
        for (m, a) in acc.iter().enumerate() {
            let folded: [__m256; 8] = std::array::from_fn(|i| halves_sum(a[i]));
            let sums = reduce_eight_keys(folded);
            _mm256_storeu_ps(sp.add(m * score_stride + j), _mm256_mul_ps(sums, sv));
        }
        j += 8;
    }
    if j < n {
        for m in 0..M {
            let out = std::slice::from_raw_parts_mut(sp.add(m * score_stride + j), n - j);
            scaled_dots(
                &q[m * dim..][..dim],
                keys,
                stride,
                offset + j * stride,
                scale,
                out,
            );
        }
    }
}

/// `super::accumulate_values` for `M` heads (2 or 3) weighing the same values: each value
/// block is loaded (and widened) once for all of them. Head `m`'s weights are
/// `weights[m * weight_stride..][..n]` and its even and odd sums `acc[m * 2 * dim..][..2 *
/// dim]`; per head the same fused multiply-adds in the same order as the one-head kernels, so
/// the same bits. `dim` is a multiple of 64 and every access is inside its slice (the caller
/// checks).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn accumulate_values_shared<K: KvRows, const M: usize>(
    weights: &[f32],
    weight_stride: usize,
    n: usize,
    values: K,
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    const BLOCK: usize = 64;
    let dim = acc.len() / (2 * M);
    let (wp, ap) = (weights.as_ptr(), acc.as_mut_ptr());
    for block in 0..dim / BLOCK {
        let vp = offset + block * BLOCK;
        let sums = |m: usize, odd: usize| ap.add(m * 2 * dim + odd * dim + block * BLOCK);
        // 8 M accumulators (24 at M = 3); the weights are broadcast from memory.
        let mut even: [[__m512; 4]; M] = std::array::from_fn(|m| {
            std::array::from_fn(|r| _mm512_loadu_ps(sums(m, 0).add(16 * r)))
        });
        let mut odd: [[__m512; 4]; M] = std::array::from_fn(|m| {
            std::array::from_fn(|r| _mm512_loadu_ps(sums(m, 1).add(16 * r)))
        });
        let mut j = 0;
        while j + 2 <= n {
            let (ve, vo) = (vp + j * stride, vp + (j + 1) * stride);
            prefetch_row(values, ve + PREFETCH_ROWS * stride, BLOCK);
            prefetch_row(values, vo + PREFETCH_ROWS * stride, BLOCK);
            for r in 0..4 {
                let (e, o) = (load16(values, ve + 16 * r), load16(values, vo + 16 * r));
                for m in 0..M {
                    let w = wp.add(m * weight_stride + j);
                    even[m][r] = _mm512_fmadd_ps(_mm512_set1_ps(*w), e, even[m][r]);
                    odd[m][r] = _mm512_fmadd_ps(_mm512_set1_ps(*w.add(1)), o, odd[m][r]);
                }
            }
            j += 2;
        }
        if j < n {
            let ve = vp + j * stride;
            for r in 0..4 {
                let e = load16(values, ve + 16 * r);
                for m in 0..M {
                    let w = _mm512_set1_ps(*wp.add(m * weight_stride + j));
                    even[m][r] = _mm512_fmadd_ps(w, e, even[m][r]);
                }
            }
        }
        for m in 0..M {
            for r in 0..4 {
                _mm512_storeu_ps(sums(m, 0).add(16 * r), even[m][r]);
                _mm512_storeu_ps(sums(m, 1).add(16 * r), odd[m][r]);
            }
        }
    }
}
