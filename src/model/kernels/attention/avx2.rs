//! AVX2 forms of the attention kernels (`scaled_dots`, `softmax_weights`, `accumulate_values`):
//! eight lanes a register, with f16 keys and values widened by F16C as they load (q8 ones by
//! a sign extension, a conversion and one multiply by their scale). Each output
//! is computed with exactly the scalar definitions' arithmetic in `scalar.rs` (the same fused
//! chains in the same order, the same fixed reductions), so results are bitwise those of the
//! scalar path.

use std::arch::x86_64::*;

use super::shared::{
    accumulate_values_at_width, lane_sum, prefetch_row, reduce_eight_keys, softmax_tail, KvForm,
    KvRows, PREFETCH_ROWS,
};
use crate::model::kernels::fast_exp::exp8 as exp;

/// Elements `i..i + 8` of `rows` as f32 (for q8, `i` a multiple of 8, so one scale).
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn load8<K: KvRows>(rows: K, i: usize) -> __m256 {
    let p = rows.base();
    match K::FORM {
        KvForm::F32 => _mm256_loadu_ps(p.cast::<f32>().add(i)),
        KvForm::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<u16>().add(i).cast())),
        // bf16 is f32's upper half: widened exactly by a shift.
        KvForm::Bf16 => {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<u16>().add(i).cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
        KvForm::Q8 => {
            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(i).cast()));
            _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(rows.scale(i)))
        }
    }
}

/// See `super::scaled_dots`; `q.len()` is a multiple of 16 and every key read is inside `keys`
/// (the caller checks both).
#[target_feature(enable = "avx2,fma,f16c")]
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
    // One key's sixteen lanes as two registers (`lo`: elements 0-7 of each block, `hi`:
    // 8-15), folded into one.
    let key_lanes = |k: usize| {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for c in 0..blocks {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(c * 16)), load8(keys, k + c * 16), lo);
            hi = _mm256_fmadd_ps(
                _mm256_loadu_ps(qp.add(c * 16 + 8)),
                load8(keys, k + c * 16 + 8),
                hi,
            );
        }
        _mm256_add_ps(lo, hi)
    };
    let mut j = 0;
    while j + 8 <= n {
        let mut folded = [_mm256_setzero_ps(); 8];
        for i in 0..8 {
            prefetch_row(keys, kp + (j + i + PREFETCH_ROWS) * stride, q.len());
        }
        // Four keys at a time keep their 8 accumulators and the query in registers.
        for half in 0..2 {
            let mut lo = [_mm256_setzero_ps(); 4];
            let mut hi = [_mm256_setzero_ps(); 4];
            for c in 0..blocks {
                let q0 = _mm256_loadu_ps(qp.add(c * 16));
                let q1 = _mm256_loadu_ps(qp.add(c * 16 + 8));
                for i in 0..4 {
                    let k = kp + (j + half * 4 + i) * stride + c * 16;
                    lo[i] = _mm256_fmadd_ps(q0, load8(keys, k), lo[i]);
                    hi[i] = _mm256_fmadd_ps(q1, load8(keys, k + 8), hi[i]);
                }
            }
            for i in 0..4 {
                folded[half * 4 + i] = _mm256_add_ps(lo[i], hi[i]);
            }
        }
        let sums = reduce_eight_keys(folded);
        _mm256_storeu_ps(scores.as_mut_ptr().add(j), _mm256_mul_ps(sums, sv));
        j += 8;
    }
    while j < n {
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), key_lanes(kp + j * stride));
        scores[j] = lane_sum(&lanes) * scale;
        j += 1;
    }
}

/// See `super::softmax_weights`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn softmax_weights(scores: &mut [f32]) -> (f32, f32) {
    let n = scores.len();
    let p = scores.as_mut_ptr();
    let full = n / 8 * 8;
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    for j in (0..full).step_by(8) {
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(p.add(j)));
    }
    let mut m = [0f32; 8];
    _mm256_storeu_ps(m.as_mut_ptr(), mv);
    let max = scores[full..]
        .iter()
        .chain(&m)
        .fold(f32::NEG_INFINITY, |a, &s| a.max(s));
    let maxv = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    for j in (0..full).step_by(8) {
        let e = exp(_mm256_sub_ps(_mm256_loadu_ps(p.add(j)), maxv));
        _mm256_storeu_ps(p.add(j), e);
        acc = _mm256_add_ps(acc, e);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    (max, softmax_tail(&lanes, &mut scores[full..], max))
}

accumulate_values_at_width! {
    /// See `super::accumulate_values`; the sums' length is a multiple of 64 (two halves of a
    /// multiple of 32) and every value read is inside `values` (the caller checks both).
    "avx2,fma,f16c", __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
    _mm256_fmadd_ps, load8
}
