//! What every K-quant format's kernels share: the packed weights as they read them, and the
//! two 256-bit instruction sets' products.

/// One format's tiles: column tile `t`'s super-block `b` at `t · (k / 256) + b`, for an
/// `(n, k)` weight.
pub(crate) struct Grid<T> {
    pub(crate) tiles: Vec<T>,
    pub(crate) n: usize,
    pub(crate) k: usize,
}

/// Instantiates a format's `$kernel_256!(name, features, dot4, widen, dot2)` as `kernel_avx2`
/// and `kernel_vnni`. `dot4(acc, w, a)` adds unsigned-by-signed byte products in groups of
/// four to a running sum that `widen` turns into 32-bit lanes: AVX2 keeps it in 16-bit lanes
/// (one `maddubs` pair sum each a group, exact while a lane stays below 32,768, which the
/// kernel ensures by widening often enough for its values' bits), so a `madd` runs once every
/// few groups rather than after each; VNNI sums in 32 bits and widens nothing. `dot2(acc, w,
/// a)` adds signed 16-bit products in pairs. All exact, so both give the same sums.
macro_rules! kernels_256 {
    ($kernel_256:ident) => {
        $kernel_256!(
            kernel_avx2,
            "avx2,fma,f16c",
            |acc, w, a| _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)),
            |acc| _mm256_madd_epi16(acc, _mm256_set1_epi16(1)),
            |acc, w, a| _mm256_add_epi32(acc, _mm256_madd_epi16(w, a))
        );
        $kernel_256!(
            kernel_vnni,
            "avx2,fma,f16c,avxvnni",
            |acc, w, a| _mm256_dpbusd_avx_epi32(acc, w, a),
            |acc| acc,
            |acc, w, a| _mm256_dpwssd_avx_epi32(acc, w, a)
        );
    };
}
pub(crate) use kernels_256;
