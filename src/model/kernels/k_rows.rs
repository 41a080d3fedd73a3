//! Activation rows quantized for the K-quant kernels: 8 bits per value, one f32 scale per
//! 256-value super-block (ggml's Q8_K), with the exact sums of every 16 and every 32 values.
//!
//! Why it exists: a K-quant weight scales each 16- or 32-value sub-block by a small integer and
//! its whole 256-value super-block by one f16. With one activation scale per super-block too,
//! a kernel sums a super-block's products in integers, exactly (sub-block sums times their
//! integer scales), and needs two f32 multiply-adds per 256 values, where 32-value activation
//! scales would need a float step per sub-block. The sums are what a weight's offsets
//! (`- dmin · m` per sub-block, Q6_K's `- 32`) multiply.
//!
//! One quantizer serves every instruction set, in plain code the compiler vectorizes: a row's
//! values depend only on that row, so a row is quantized the same alone or in a batch.

/// Values per super-block.
pub(crate) const QK_K: usize = 256;

/// `m` rows quantized per super-block, stored block-major (super-block `b` of every row, then
/// `b + 1`), so a kernel serving several rows finds their values, scales and sums for one
/// super-block at fixed offsets from one pointer.
pub(crate) struct KRows {
    /// `(block, row, value)`: super-block `b` of row `r` at `(b · m + r) · 256`.
    pub(crate) qs: Vec<i8>,
    /// `(block, row)`: the scale of super-block `b` of row `r`.
    pub(crate) scales: Vec<f32>,
    /// `(block, row, 16)`: the sums of each 16 values (what Q6_K's sub-blocks take).
    pub(crate) sums16: Vec<i16>,
    /// `(block, row, 8)`: the sums of each 32 values (what Q4_K's and Q5_K's take).
    pub(crate) sums32: Vec<i16>,
    /// Rows.
    pub(crate) m: usize,
}

impl KRows {
    const fn new() -> Self {
        Self {
            qs: Vec::new(),
            scales: Vec::new(),
            sums16: Vec::new(),
            sums32: Vec::new(),
            m: 0,
        }
    }

    /// Where super-block `b` of row `r` sits among the super-blocks.
    #[inline(always)]
    pub(crate) fn at(&self, r: usize, b: usize) -> usize {
        b * self.m + r
    }

    /// Sized for `m` rows of `k` values, keeping the memory (the quantizer writes every entry).
    fn reshape(&mut self, m: usize, k: usize) {
        self.m = m;
        let blocks = m * k / QK_K;
        self.qs.resize(m * k, 0);
        self.scales.resize(blocks, 0.0);
        self.sums16.resize(blocks * 16, 0);
        self.sums32.resize(blocks * 8, 0);
    }
}

/// Quantizes the `m` rows of `x` (row-major, a multiple of 256 values each).
#[cfg(test)]
pub(crate) fn quantize_k_rows(x: &[f32], m: usize) -> KRows {
    let mut out = KRows::new();
    quantize_into(x, m, &mut out);
    out
}

/// From this many rows (a prefill's) the rows are quantized on every thread.
const PARALLEL_ROWS: usize = 16;

fn quantize_into(x: &[f32], m: usize, out: &mut KRows) {
    assert!(m > 0 && x.len().is_multiple_of(m * QK_K));
    let k = x.len() / m;
    out.reshape(m, k);
    let at = (
        out.qs.as_mut_ptr() as usize,
        out.scales.as_mut_ptr() as usize,
        out.sums16.as_mut_ptr() as usize,
        out.sums32.as_mut_ptr() as usize,
    );
    let vector = crate::model::kernels::packed_gemm::has_avx2_fma();
    let rows = |rows: std::ops::Range<usize>| {
        for r in rows {
            for b in 0..k / QK_K {
                let i = b * m + r;
                // SAFETY: the buffers were just sized for `m` rows of `k` values; super-block
                // `b` of row `r` is written by this call alone (rows are split between calls).
                unsafe {
                    let block = (
                        &mut *((at.0 as *mut [i8; QK_K]).add(i)),
                        &mut *(at.1 as *mut f32).add(i),
                        &mut *((at.2 as *mut [i16; 16]).add(i)),
                        &mut *((at.3 as *mut [i16; 8]).add(i)),
                    );
                    let x = &x[r * k + b * QK_K..][..QK_K];
                    #[cfg(target_arch = "x86_64")]
                    if vector {
                        quantize_block_avx2(x, block);
                        continue;
                    }
                    quantize_block(x, block)
                }
            }
        }
    };
    if m >= PARALLEL_ROWS {
        crate::model::kernels::parallel::for_each_split(m, rows);
    } else {
        rows(0..m);
    }
}

/// One super-block: the scale `amax / 127`, each value its quotient rounded to the nearest
/// integer (ties to even, by adding and subtracting 1.5 · 2²³, which every SIMD width does the
/// same way), and the sums.
type Block<'a> = (
    &'a mut [i8; QK_K],
    &'a mut f32,
    &'a mut [i16; 16],
    &'a mut [i16; 8],
);

/// 1.5 · 2²³: added to and subtracted from a value of magnitude below 2²², it rounds the value
/// to the nearest integer, ties to even.
const MAGIC: f32 = 12_582_912.0;

#[inline(always)]
fn quantize_block(x: &[f32], (qs, scale, sums16, sums32): Block) {
    let mut lanes = [0f32; 16];
    for sixteen in x.chunks_exact(16) {
        for (l, v) in lanes.iter_mut().zip(sixteen) {
            *l = l.max(v.abs());
        }
    }
    let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        // |v · id| ≤ 127 (up to rounding of the quotient), so the sum is exact in f32 and the
        // clamp only guards a last-bit overshoot.
        *q = ((v * id + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i8;
    }
    for (s, sixteen) in sums16.iter_mut().zip(qs.chunks_exact(16)) {
        *s = sixteen.iter().map(|&q| q as i16).sum();
    }
    for (j, s) in sums32.iter_mut().enumerate() {
        *s = sums16[2 * j] + sums16[2 * j + 1];
    }
    *scale = d;
}

/// [`quantize_block`] eight values at a time: the same maximum, quotient and IEEE operations
/// (a multiply, then the magic add and subtract, never fused), so the same bits for finite
/// inputs. The scalar loop did not vectorize, and quantizing on the calling thread alone was
/// a third of a cache-resident 8-row matmul.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_block_avx2(x: &[f32], (qs, scale, sums16, sums32): Block) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let mut m8 = _mm256_setzero_ps();
    for i in 0..QK_K / 8 {
        m8 = _mm256_max_ps(
            m8,
            _mm256_andnot_ps(sign, _mm256_loadu_ps(x.as_ptr().add(8 * i))),
        );
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (idv, magic) = (_mm256_set1_ps(id), _mm256_set1_ps(MAGIC));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    for c in 0..QK_K / 32 {
        let src = x.as_ptr().add(32 * c);
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let y = _mm256_mul_ps(_mm256_loadu_ps(src.add(8 * i)), idv);
            _mm256_cvtps_epi32(_mm256_sub_ps(_mm256_add_ps(y, magic), magic))
        });
        let words = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(words, order);
        _mm256_storeu_si256(qs.as_mut_ptr().add(32 * c) as *mut __m256i, bytes);
        // Lane i: the sum of values 4i..4i + 4; lanes 0-3 and 4-7 are the two sixteens.
        let s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16);
        let (lo, hi) = (
            _mm256_castsi256_si128(s8),
            _mm256_extracti128_si256::<1>(s8),
        );
        let pairs = _mm_hadd_epi32(lo, hi);
        let two = _mm_hadd_epi32(pairs, pairs);
        let (a, b) = (
            _mm_cvtsi128_si32(two) as i16,
            _mm_extract_epi32::<1>(two) as i16,
        );
        sums16[2 * c] = a;
        sums16[2 * c + 1] = b;
        sums32[c] = a + b;
    }
    *scale = d;
}

/// Calls `f` with the `m` rows of `x` quantized into memory the calling thread keeps across
/// calls (a forward quantizes the input of every matmul).
pub(crate) fn with_k_quantized<R>(x: &[f32], m: usize, f: impl FnOnce(&KRows) -> R) -> R {
    thread_local! {
        static ROWS: std::cell::RefCell<KRows> = const { std::cell::RefCell::new(KRows::new()) };
    }
    ROWS.with(|rows| match rows.try_borrow_mut() {
        Ok(mut q) => {
            quantize_into(x, m, &mut q);
            f(&q)
        }
        Err(_) => {
            let mut q = KRows::new();
            quantize_into(x, m, &mut q);
            f(&q)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_quantize_alone_as_in_a_batch_and_round_within_half_a_step() {
        let (m, k) = (PARALLEL_ROWS + 3, 512usize);
        let mut x = crate::model::kernels::packed_gemm::test_support::random(11, m * k);
        // A zero super-block, and ties at the block's own scale (largest magnitude 127).
        x[QK_K..2 * QK_K].fill(0.0);
        x[k] = 127.0;
        x[k + 1] = 2.5;
        x[k + 2] = -3.5;
        let all = quantize_k_rows(&x, m);
        for r in 0..m {
            let one = quantize_k_rows(&x[r * k..(r + 1) * k], 1);
            for b in 0..k / QK_K {
                let i = all.at(r, b);
                assert_eq!(one.qs[b * QK_K..][..QK_K], all.qs[i * QK_K..][..QK_K]);
                assert_eq!(one.scales[b].to_bits(), all.scales[i].to_bits());
                assert_eq!(one.sums16[b * 16..][..16], all.sums16[i * 16..][..16]);
                let d = all.scales[i];
                let qs = &all.qs[i * QK_K..][..QK_K];
                for (j, s) in all.sums32[i * 8..][..8].iter().enumerate() {
                    let want: i16 = qs[j * 32..][..32].iter().map(|&q| q as i16).sum();
                    assert_eq!(*s, want);
                }
                for (v, &q) in x[r * k + b * QK_K..][..QK_K].iter().zip(qs) {
                    assert!(
                        (v - d * q as f32).abs() <= d * 0.5 + 1e-6,
                        "{v} vs {q} · {d}"
                    );
                }
            }
        }
        // The vector quantizer gives the scalar loop's bits.
        if crate::model::kernels::packed_gemm::has_avx2_fma() {
            for b in 0..m * k / QK_K {
                let (mut qs, mut d, mut s16, mut s32) = ([0i8; QK_K], 0f32, [0i16; 16], [0i16; 8]);
                quantize_block(
                    &x[b * QK_K..][..QK_K],
                    (&mut qs, &mut d, &mut s16, &mut s32),
                );
                let (mut vq, mut vd, mut v16, mut v32) = ([0i8; QK_K], 0f32, [0i16; 16], [0i16; 8]);
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe {
                    quantize_block_avx2(
                        &x[b * QK_K..][..QK_K],
                        (&mut vq, &mut vd, &mut v16, &mut v32),
                    )
                };
                assert_eq!(
                    (qs, d.to_bits(), s16, s32),
                    (vq, vd.to_bits(), v16, v32),
                    "block {b}"
                );
            }
        }
        let tied = all.at(1, 0) * QK_K;
        assert_eq!(&all.qs[tied..tied + 3], &[127, 2, -4], "ties round to even");
        let zero = all.at(0, 1);
        assert_eq!(all.scales[zero], 0.0);
        assert!(all.qs[zero * QK_K..][..QK_K].iter().all(|&q| q == 0));
    }
}
