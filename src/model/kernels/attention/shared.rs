//! What the attention kernels share, so that the scalar definitions and the vector kernels
//! agree bit for bit: the element type they read ([`KvElement`]), the fixed eight-lane
//! reduction ([`lane_sum`], and [`reduce_eight_keys`] for eight keys in registers); the
//! softmax exponential is `crate::model::kernels::fast_exp`'s; and `accumulate_values`
//! written once for the AVX2 and AVX-512 widths. A leaf: it imports no kernel.

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

/// `accumulate_values` for one vector width (AVX2's 8 lanes, AVX-512's 16): each 4-register
/// block of the even and odd value sums takes the weighted value rows two at a time, the same
/// fused multiply-adds in the same order at either width (and as the scalar definition), so the
/// results are the same bits. `$load` reads one register of `T` as f32.
macro_rules! accumulate_values_at_width {
    ($(#[$doc:meta])* $features:literal, $vec:ty, $w:literal, $loadu:ident, $storeu:ident,
     $set1:ident, $fmadd:ident, $load:ident) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) unsafe fn accumulate_values<T: KvElement>(
            weights: &[f32],
            values: &[T],
            stride: usize,
            offset: usize,
            acc: &mut [f32],
        ) {
            const BLOCK: usize = 4 * $w;
            let dim = acc.len() / 2;
            let n = weights.len();
            for block in 0..dim / BLOCK {
                let vp = values.as_ptr().add(offset + block * BLOCK);
                let ep = acc.as_mut_ptr().add(block * BLOCK);
                let op = acc.as_mut_ptr().add(dim + block * BLOCK);
                let mut even: [$vec; 4] = std::array::from_fn(|r| $loadu(ep.add(r * $w)));
                let mut odd: [$vec; 4] = std::array::from_fn(|r| $loadu(op.add(r * $w)));
                let mut j = 0;
                while j + 2 <= n {
                    let (we, wo) = ($set1(weights[j]), $set1(weights[j + 1]));
                    let (ve, vo) = (vp.add(j * stride), vp.add((j + 1) * stride));
                    for r in 0..4 {
                        even[r] = $fmadd(we, $load(ve.add(r * $w)), even[r]);
                        odd[r] = $fmadd(wo, $load(vo.add(r * $w)), odd[r]);
                    }
                    j += 2;
                }
                if j < n {
                    let we = $set1(weights[j]);
                    let ve = vp.add(j * stride);
                    for (r, e) in even.iter_mut().enumerate() {
                        *e = $fmadd(we, $load(ve.add(r * $w)), *e);
                    }
                }
                for r in 0..4 {
                    $storeu(ep.add(r * $w), even[r]);
                    $storeu(op.add(r * $w), odd[r]);
                }
            }
        }
    };
}
pub(super) use accumulate_values_at_width;
