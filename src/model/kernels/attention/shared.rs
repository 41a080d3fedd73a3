//! What the attention kernels share, so that the scalar definitions and the vector kernels
//! agree bit for bit: the element type they read ([`KvElement`]), the fixed eight-lane
//! reduction ([`lane_sum`], and [`reduce_eight_keys`] for eight keys in registers); the
//! softmax exponential is `crate::model::kernels::fast_exp`'s. A leaf: it imports no kernel.

/// An element of a KV cache as attention reads it.
pub trait KvElement: Copy + Send + Sync + 'static {
    /// IEEE half precision (else f32): the vector paths widen it as they load.
    const HALF: bool;
    /// The value as f32 (exact for both types).
    fn widen(self) -> f32;
}

impl KvElement for f32 {
    const HALF: bool = false;
    #[inline]
    fn widen(self) -> f32 {
        self
    }
}

impl KvElement for half::f16 {
    const HALF: bool = true;
    #[inline]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// The fixed reduction of eight lanes: `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`.
#[inline]
pub(super) fn lane_sum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// Eight keys' eight-lane partial sums reduced to their eight scores, in key order, pairing
/// the lanes as [`lane_sum`] does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn reduce_eight_keys(
    a: [std::arch::x86_64::__m256; 8],
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // x_i = a_i + a_(i+4) for two accumulators at once: [A.x0..x3, B.x0..x3].
    let fold = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    // hadd pairs (x0 + x1), (x2 + x3) within each key, then their sums: lanes come out as
    // keys [0, 2, 4, 6, 1, 3, 5, 7], put back in order by one permute.
    let h0 = _mm256_hadd_ps(fold(a[0], a[1]), fold(a[2], a[3]));
    let h1 = _mm256_hadd_ps(fold(a[4], a[5]), fold(a[6], a[7]));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_permutevar8x32_ps(_mm256_hadd_ps(h0, h1), order)
}
