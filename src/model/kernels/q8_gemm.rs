//! A batch-invariant Q8_0 matrix multiply for x86 CPUs with AVX2 and FMA.
//!
//! Why it exists: candle's Q8_0 kernel computes one (row, column) dot product at a time, so a
//! multi-token forward (prefill, speculative verification) reads every weight once per row and
//! costs nearly as much per token as decoding; its faster repacked path needs AVX512-VNNI and
//! rows whose length is a multiple of 256 (SmolLM2's are 576). Here weights are repacked at load
//! into tiles of 8 output columns, so each 256-bit weight load covers 8 columns x 4 values and
//! serves up to 4 activation rows.
//!
//! Products use llama.cpp's sign trick, `maddubs(|w|, sign(a, w))`, which keeps every 16-bit
//! pair sum below saturation (|a|, |w| <= 127, or one of them -128 with the other <= 127).
//!
//! Batch invariance is kept by construction: for every output element the sequence of
//! operations is the same whatever the number of rows or how rows are grouped — exact int32 sums
//! within a 32-value block, then one f32 fused multiply-add per block, blocks in order.

use std::sync::OnceLock;

use half::f16;

use crate::model::kernels::packed_gemm::{self, PackedWeight};
use crate::model::kernels::tile_driver::{
    for_each_dot_isa, for_each_tile, quantize_rows, DotIsa, QuantRows, QK, ROWS, TILE_N,
};

/// How many tiles ahead the kernel prefetches. Without it a core waits on each tile's load and
/// then computes, so a 4-token forward cost the sum of streaming the weights and the arithmetic
/// (15.2 ms against 9.0 ms for one token at depth 64); 8 tiles (~2.3 KB) ahead overlaps the two
/// (10.0 ms). 4, 12, 16 and 32 were measured too: `tandem forward-bench`.
const PREFETCH_TILES: usize = 8;
const TILE_BYTES: usize = std::mem::size_of::<Tile>();
/// Bytes of one GGUF Q8_0 block: an f16 scale then 32 signed bytes.
const BLOCK_BYTES: usize = 2 + QK;

/// One 32-value block of 8 output columns: per-column scales, then the weights laid out
/// `[group of 4 values (8)][column (8)][4 bytes]`.
#[repr(C, align(32))]
#[derive(Clone)]
struct Tile {
    scales: [f32; TILE_N],
    qs: [i8; QK * TILE_N],
}

/// Q8_0 weights `(n, k)` packed for [`matmul`].
pub struct PackedQ8 {
    tiles: Vec<Tile>,
    n: usize,
    k: usize,
}

/// Whether this CPU runs the kernel (and `TANDEM_DISABLE_Q8_GEMM` is not set).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE
        .get_or_init(|| packed_gemm::enabled("TANDEM_DISABLE_Q8_GEMM", packed_gemm::has_avx2_fma))
}

impl PackedQ8 {
    /// Packs raw GGUF Q8_0 bytes of an `(n, k)` weight; `None` if the shape does not fit
    /// (k not a multiple of 32).
    pub fn from_q8_0_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if k == 0 || !k.is_multiple_of(QK) || bytes.len() != n * (k / QK) * BLOCK_BYTES {
            return None;
        }
        let kb = k / QK;
        let n_tiles = n.div_ceil(TILE_N);
        let zero = Tile {
            scales: [0.0; TILE_N],
            qs: [0; QK * TILE_N],
        };
        let mut tiles = vec![zero; n_tiles * kb];
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            for b in 0..kb {
                let blk = &bytes[(col * kb + b) * BLOCK_BYTES..(col * kb + b + 1) * BLOCK_BYTES];
                let tile = &mut tiles[t * kb + b];
                tile.scales[c] = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                for (i, &q) in blk[2..].iter().enumerate() {
                    let (g, j) = (i / 4, i % 4);
                    tile.qs[(g * TILE_N + c) * 4 + j] = q as i8;
                }
            }
        }
        Some(Self { tiles, n, k })
    }
}

impl PackedWeight for PackedQ8 {
    fn out_features(&self) -> usize {
        self.n
    }

    fn in_features(&self) -> usize {
        self.k
    }

    fn kernel_name(&self) -> &'static str {
        "q8-gemm"
    }

    fn matmul(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        matmul(self, x, m, dst)
    }
}

/// `dst (m, n) = x (m, k) · Wᵀ`.
pub fn matmul(w: &PackedQ8, x: &[f32], m: usize, dst: &mut [f32]) {
    matmul_on(w, x, m, dst, DotIsa::best())
}

/// [`matmul`] on the tile kernel for `isa` (which the CPU must have).
fn matmul_on(w: &PackedQ8, x: &[f32], m: usize, dst: &mut [f32], isa: DotIsa) {
    assert!(available(), "q8_gemm::matmul needs AVX2 and FMA");
    assert_eq!(x.len(), m * w.k);
    assert_eq!(dst.len(), m * w.n);
    let q = quantize_rows(x);
    // SAFETY (of each call): `available()` checked the CPU features; the driver hands each
    // tile its own (rows, 8-column) block of `dst`, inside the bounds asserted above.
    #[cfg(target_arch = "x86_64")]
    for_each_tile(m, w.n, dst, |t, r0, rows, dst| unsafe {
        match isa {
            DotIsa::Avx2 => tile_kernel_avx2(w, &q, t, r0, rows, dst),
            DotIsa::AvxVnni => tile_kernel_vnni(w, &q, t, r0, rows, dst),
            DotIsa::Avx512Vnni => tile_kernel_vnni512(w, &q, t, r0, rows, dst),
        }
    });
    // Elsewhere `available()` is false and the assertion above has stopped the call.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (q, isa);
}

/// The tile kernel, written once for three instruction sets. `$dot4(acc, wabs, signed)` adds
/// each group of 4 byte products into acc's 32-bit lanes: `maddubs` + `madd` on AVX2, one
/// `vpdpbusd` with AVX-VNNI or AVX-512 VNNI. Every sum is exact (the sign trick keeps
/// `maddubs` from saturating), so all give the same bits. The AVX-512 variant runs the same
/// 256-bit code with AVX-512VL's 32 vector registers, where 16 make the unrolled loop spill.
macro_rules! tile_kernel {
    ($name:ident, $features:literal, $dot4:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            w: &PackedQ8,
            q: &QuantRows,
            t: usize,
            r0: usize,
            rows: usize,
            dst: *mut f32,
        ) {
            use std::arch::x86_64::*;
            let kb = w.k / QK;
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for b in 0..kb {
                let tile = &w.tiles[t * kb + b];
                // Tiles are read in address order (across units too), so a fixed distance
                // ahead is what comes next; a prefetch address past the end is harmless.
                let ahead =
                    (tile as *const Tile as *const i8).wrapping_add(PREFETCH_TILES * TILE_BYTES);
                for line in 0..TILE_BYTES.div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
                }
                let mut iacc = [_mm256_setzero_si256(); ROWS];
                for g in 0..QK / 4 {
                    let wv = _mm256_load_si256(tile.qs.as_ptr().add(g * 32) as *const __m256i);
                    let wabs = _mm256_abs_epi8(wv);
                    for (r, ia) in iacc.iter_mut().enumerate().take(rows) {
                        let a = (q.qs.as_ptr().add((r0 + r) * w.k + b * QK + g * 4) as *const i32)
                            .read_unaligned();
                        let signed = _mm256_sign_epi8(_mm256_set1_epi32(a), wv);
                        *ia = $dot4(*ia, wabs, signed);
                    }
                }
                let sc = _mm256_load_ps(tile.scales.as_ptr());
                for (r, (a, ia)) in acc.iter_mut().zip(&iacc).enumerate().take(rows) {
                    let scale = _mm256_mul_ps(sc, _mm256_set1_ps(q.scales[(r0 + r) * kb + b]));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*ia), scale, *a);
                }
            }
            let cols = (w.n - t * TILE_N).min(TILE_N);
            for (r, a) in acc.iter().enumerate().take(rows) {
                let mut out = [0f32; TILE_N];
                _mm256_storeu_ps(out.as_mut_ptr(), *a);
                let row = dst.add((r0 + r) * w.n + t * TILE_N);
                std::ptr::copy_nonoverlapping(out.as_ptr(), row, cols);
            }
        }
    };
}

for_each_dot_isa!(tile_kernel);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::packed_gemm::test_support::{errors_against_candle, random};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    #[test]
    fn matches_candle_q8_0_and_is_row_invariant() {
        if !available() {
            panic!("these tests need an x86-64 CPU with AVX2 and FMA (every CI machine has them)");
        }
        // n not a multiple of 8 exercises the padded last tile.
        let (n, k, m) = (44usize, 96usize, 7usize);
        let w = Tensor::from_vec(random(1, n * k), (n, k), &Device::Cpu).unwrap();
        let qt = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let packed = PackedQ8::from_q8_0_bytes(&qt.data().unwrap(), n, k).unwrap();
        let x = random(2, m * k);
        let mut ours = vec![0f32; m * n];
        matmul(&packed, &x, m, &mut ours);
        // candle rounds activation block scales to f16 while we keep them in f32, so we must
        // be at least as close to the exact product as candle is.
        let (err_ours, err_theirs) = errors_against_candle(&w, GgmlDType::Q8_0, &x, m, &ours);
        // 8-bit activations: about (1/127)/2 error per value, over 96 random-sign terms.
        assert!(err_ours < 0.1, "max error {err_ours}");
        assert!(
            err_ours <= err_theirs * 1.05,
            "ours {err_ours} vs candle {err_theirs}"
        );
        // The AVX2 and AVX-VNNI kernels give the same bits (where this CPU has both).
        for isa in DotIsa::available() {
            let mut other = vec![0f32; m * n];
            matmul_on(&packed, &x, m, &mut other, isa);
            assert!(other == ours, "{isa:?} differs");
        }
        // Each row alone gives the same bits as inside the batch.
        for r in 0..m {
            let mut one = vec![0f32; n];
            matmul(&packed, &x[r * k..(r + 1) * k], 1, &mut one);
            assert!(one[..] == ours[r * n..(r + 1) * n], "row {r} differs alone");
        }
    }

    #[test]
    fn refuses_shapes_it_cannot_pack() {
        assert!(PackedQ8::from_q8_0_bytes(&[0; 34], 1, 33).is_none());
        assert!(PackedQ8::from_q8_0_bytes(&[0; 30], 1, 32).is_none());
    }
}
