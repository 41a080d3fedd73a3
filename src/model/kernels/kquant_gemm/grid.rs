//! What every K-quant format's kernels share: the packed weights as they read them, and the
//! two 256-bit instruction sets' products.

/// One format's tiles: column tile `t`'s super-block `b` at `t · (k / 256) + b`, for an
/// `(n, k)` weight.
pub(crate) struct Grid<T> {
    pub(crate) tiles: Vec<T>,
    pub(crate) n: usize,
    pub(crate) k: usize,
}

/// Instantiates a format's `$kernel_256!(name, features, dot4, dot2)` as `kernel_avx2` and
/// `kernel_vnni`: `dot4(acc, w, a)` adds unsigned-by-signed byte products in groups of four
/// into 32-bit lanes, `dot2(acc, w, a)` signed 16-bit products in pairs, both exactly (AVX2's
/// `maddubs` never saturates: the values have at most 6 bits).
macro_rules! kernels_256 {
    ($kernel_256:ident) => {
        $kernel_256!(
            kernel_avx2,
            "avx2,fma,f16c",
            |acc, w, a| _mm256_add_epi32(
                acc,
                _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
            ),
            |acc, w, a| _mm256_add_epi32(acc, _mm256_madd_epi16(w, a))
        );
        $kernel_256!(
            kernel_vnni,
            "avx2,fma,f16c,avxvnni",
            |acc, w, a| _mm256_dpbusd_avx_epi32(acc, w, a),
            |acc, w, a| _mm256_dpwssd_avx_epi32(acc, w, a)
        );
    };
}
pub(crate) use kernels_256;
