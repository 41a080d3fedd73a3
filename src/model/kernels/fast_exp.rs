//! `e^x` for `x ≤ 0`, as a scalar function and as an eight-lane AVX2 kernel that give the same
//! bits: attention's softmax weights, the MLP's SiLU and sampling's softmax all need one
//! exponential per element, and libm's `expf` (one call per element, not vectorized) was a
//! visible share of each (`tandem forward-bench --ops`). Every argument these callers pass is
//! at most 0 (a score minus its row's maximum, or minus a magnitude), where this is within 2 ulp
//! of `exp`. Because the vector kernel performs the scalar definition's operations one for one,
//! a value's result does not depend on where in a slice it sits, which keeps every forward
//! batch-invariant.

/// `e^x`, by a fixed sequence of fused operations (Cephes' expf: write x as n·ln2 plus r, a
/// degree-5 polynomial in r, then scale by 2ⁿ), so the vector path gives exactly these bits.
/// Within 2 ulp of `exp` on `[-87, 0]`; below -87 it clamps (≈ 1.6e-38, a negligible weight).
#[inline]
pub(crate) fn softmax_exp(x: f32) -> f32 {
    // Not `max`: a NaN score must stay NaN (and surface as NaN logits), not become a weight.
    let x = if x < EXP_MIN { EXP_MIN } else { x };
    let n = x.mul_add(LOG2E, 0.5).floor();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let e = (p * r).mul_add(r, r) + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

const EXP_MIN: f32 = -87.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// [`softmax_exp`] on eight lanes, operation for operation.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // max_ps returns its second operand when either is NaN: a NaN stays NaN, as in the scalar.
    let x = _mm256_max_ps(_mm256_set1_ps(EXP_MIN), x);
    let n = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(LOG2E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut poly = _mm256_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c));
    }
    let e = _mm256_add_ps(
        _mm256_fmadd_ps(_mm256_mul_ps(poly, r), r, r),
        _mm256_set1_ps(1.0),
    );
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(e, _mm256_castsi256_ps(pow2))
}

/// [`softmax_exp`] on sixteen lanes, operation for operation (so lane for lane the bits of
/// [`exp8`] and the scalar form).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // As in `exp8`: a NaN stays NaN (max returns its second operand when either is NaN).
    let x = _mm512_max_ps(_mm512_set1_ps(EXP_MIN), x);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_fmadd_ps(
        x,
        _mm512_set1_ps(LOG2E),
        _mm512_set1_ps(0.5),
    ));
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut poly = _mm512_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(c));
    }
    let e = _mm512_add_ps(
        _mm512_fmadd_ps(_mm512_mul_ps(poly, r), r, r),
        _mm512_set1_ps(1.0),
    );
    let pow2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(e, _mm512_castsi512_ps(pow2))
}

/// Whether [`exp8`] may run here (AVX2 and FMA, unless `TANDEM_DISABLE_AVX2` turns the vector
/// kernels off).
pub(crate) fn vector_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            crate::model::kernels::packed_gemm::enabled("TANDEM_DISABLE_AVX2", || {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
            })
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
