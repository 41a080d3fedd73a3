//! AVX-512 forms of two attention kernels (`scaled_dots`, `accumulate_values`): sixteen lanes a
//! register where the AVX2 forms have eight, so a key row or a value row is two or four loads
//! and fused multiply-adds instead of four or eight. A verification of several tokens at a deep
//! context spends its extra time here (each extra query token re-reads the sequence's keys and
//! values, ~0.8 ms per token at a depth of 1000 on AVX2).
//!
//! Each output is computed with exactly the scalar definitions' arithmetic in `scalar.rs`
//! (the same fused chains in the same order, the same fixed reductions), so results are
//! bitwise those of the scalar and AVX2 paths: batch invariance and greedy parity do not
//! depend on which instruction set runs.

use std::arch::x86_64::*;

use super::shared::{accumulate_values_at_width, lane_sum, reduce_eight_keys, KvElement};

/// Sixteen elements from `p` as f32.
#[target_feature(enable = "avx512f,avx512vl,f16c")]
#[inline]
unsafe fn load16<T: KvElement>(p: *const T) -> __m512 {
    if T::HALF {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    } else {
        _mm512_loadu_ps(p.cast())
    }
}

/// The sixteen lanes of one key's products folded to eight (`lane i + lane i+8`).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[inline]
unsafe fn halves_sum(z: __m512) -> __m256 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(z)));
    _mm256_add_ps(_mm512_castps512_ps256(z), high)
}

/// See `super::scaled_dots`; `q.len()` is a multiple of 16 and every key read is inside
/// `keys` (the caller checks both).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn scaled_dots<T: KvElement>(
    q: &[f32],
    keys: &[T],
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let blocks = q.len() / 16;
    let qp = q.as_ptr();
    let kp = keys.as_ptr().add(offset);
    let n = scores.len();
    let sv = _mm256_set1_ps(scale);
    let mut j = 0;
    while j + 8 <= n {
        let mut acc = [_mm512_setzero_ps(); 8];
        for c in 0..blocks {
            let qz = _mm512_loadu_ps(qp.add(c * 16));
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qz, load16(kp.add((j + i) * stride + c * 16)), *a);
            }
        }
        let folded: [__m256; 8] = std::array::from_fn(|i| halves_sum(acc[i]));
        let sums = reduce_eight_keys(folded);
        _mm256_storeu_ps(scores.as_mut_ptr().add(j), _mm256_mul_ps(sums, sv));
        j += 8;
    }
    while j < n {
        let k = kp.add(j * stride);
        let mut acc = _mm512_setzero_ps();
        for c in 0..blocks {
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(c * 16)), load16(k.add(c * 16)), acc);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), halves_sum(acc));
        scores[j] = lane_sum(&lanes) * scale;
        j += 1;
    }
}

accumulate_values_at_width! {
    /// See `super::accumulate_values`; the sums' length is a multiple of 128 (two halves of a
    /// multiple of 64) and every value read is inside `values` (the caller checks both).
    "avx512f,avx512vl,avx2,fma,f16c", __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps,
    _mm512_set1_ps, _mm512_fmadd_ps, load16
}
