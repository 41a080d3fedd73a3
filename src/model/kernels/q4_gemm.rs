//! A batch-invariant matrix multiply for 4-bit weights (Q4_1 and Q4_0) on x86 CPUs with AVX2
//! and FMA: the drafter's kernel.
//!
//! Why it exists: a draft model's step is bound by streaming its weights (a Q8_0 step of
//! SmolLM2-135M reads ~143 MB at ~18 GB/s on our 2-core machines), so a drafter whose weights
//! are half the size drafts in about half the time, and speculation pays only when a draft step
//! is cheap next to a target step. The default model ships as Q4_1, so this kernel runs a
//! drafter on exactly the target's weights at half Q8_0's bytes; candle has no SIMD Q4_1 kernel
//! on x86 and its Q4_0 one computes one (row, column) dot product at a time. Weights are repacked
//! at load into tiles of 8 output columns like `q8_gemm`, and multiply the same 8-bit
//! activations.
//!
//! A 4-bit weight is `d · q + m` with `q` in 0..15 (Q4_0 is the case `m = -8 · d`). The nibbles
//! stay unsigned so one `vpdpbusd` (or `maddubs` + `madd` on plain AVX2, which cannot saturate:
//! 15 · 127 · 2 < 32768) multiplies them straight into the signed activations; per 32-value
//! block the integer sum is exact, then two f32 fused multiply-adds add `d · da · Σ q·a` and
//! `m · da · Σ a`, blocks in order. Each output element is thus computed the same way whatever
//! the number of rows (batch invariance), and the AVX2 and AVX-VNNI paths give the same bits.

use std::sync::OnceLock;

use half::f16;

use crate::model::kernels::packed_gemm::{self, PackedWeight};
use crate::model::kernels::tile_driver::{
    for_each_dot_isa, for_each_tile, quantize_rows, DotIsa, QuantRows, QK, ROWS, TILE_N,
};

/// How many tiles ahead the kernel prefetches (the reason is `q8_gemm`'s: streaming and
/// arithmetic overlap only with it).
const PREFETCH_TILES: usize = 16;
const TILE_BYTES: usize = std::mem::size_of::<Tile>();
/// One 32-value block of 8 output columns: per-column scales and minimums, then four 32-byte
/// vectors. Vector `p` holds value group `2p` (values `8p..8p + 4` of the block) in its low
/// nibbles and group `2p + 1` in its high ones, each laid out `[column (8)][4 values]`.
#[repr(C, align(32))]
#[derive(Clone)]
struct Tile {
    scales: [f32; TILE_N],
    mins: [f32; TILE_N],
    qs: [u8; QK * TILE_N / 2],
}

/// The GGUF 4-bit block types this kernel packs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q4Format {
    /// f16 scale, 16 bytes of nibbles; value `d · (q - 8)`.
    Q4_0,
    /// f16 scale, f16 minimum, 16 bytes of nibbles; value `d · q + m`.
    Q4_1,
}

impl Q4Format {
    fn header_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 2,
            Self::Q4_1 => 4,
        }
    }
}

/// 4-bit weights `(n, k)` packed for [`matmul`].
pub struct PackedQ4 {
    tiles: Vec<Tile>,
    n: usize,
    k: usize,
}

/// Whether this CPU runs the kernel (and `TANDEM_DISABLE_Q4_GEMM` is not set).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE
        .get_or_init(|| packed_gemm::enabled("TANDEM_DISABLE_Q4_GEMM", packed_gemm::has_avx2_fma))
}

impl PackedQ4 {
    /// Packs raw GGUF Q4_0 or Q4_1 bytes of an `(n, k)` weight; `None` if the shape does not
    /// fit (k not a multiple of 32).
    pub fn from_gguf_bytes(format: Q4Format, bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let header = format.header_bytes();
        let block_bytes = header + QK / 2;
        if k == 0 || !k.is_multiple_of(QK) || bytes.len() != n * (k / QK) * block_bytes {
            return None;
        }
        let kb = k / QK;
        let zero = Tile {
            scales: [0.0; TILE_N],
            mins: [0.0; TILE_N],
            qs: [0; QK * TILE_N / 2],
        };
        let mut tiles = vec![zero; n.div_ceil(TILE_N) * kb];
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            for b in 0..kb {
                let blk = &bytes[(col * kb + b) * block_bytes..(col * kb + b + 1) * block_bytes];
                let tile = &mut tiles[t * kb + b];
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                tile.scales[c] = d;
                tile.mins[c] = match format {
                    Q4Format::Q4_0 => -8.0 * d,
                    Q4Format::Q4_1 => f16::from_le_bytes([blk[2], blk[3]]).to_f32(),
                };
                // GGUF keeps value i in the low nibble of byte i and value i + 16 in the high
                // nibble of byte i.
                let nibble = |i: usize| {
                    let byte = blk[header + i % 16];
                    if i < 16 {
                        byte & 0x0f
                    } else {
                        byte >> 4
                    }
                };
                for i in 0..QK {
                    let (g, j) = (i / 4, i % 4);
                    let at = (g / 2) * 32 + c * 4 + j;
                    tile.qs[at] |= nibble(i) << (4 * (g % 2));
                }
            }
        }
        Some(Self { tiles, n, k })
    }
}

impl PackedWeight for PackedQ4 {
    fn out_features(&self) -> usize {
        self.n
    }

    fn in_features(&self) -> usize {
        self.k
    }

    fn kernel_name(&self) -> &'static str {
        "q4-gemm"
    }

    fn matmul(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        matmul(self, x, m, dst)
    }
}

/// `dst (m, n) = x (m, k) · Wᵀ`.
pub fn matmul(w: &PackedQ4, x: &[f32], m: usize, dst: &mut [f32]) {
    matmul_on(w, x, m, dst, DotIsa::best())
}

/// [`matmul`] on the tile kernel for `isa` (which the CPU must have).
fn matmul_on(w: &PackedQ4, x: &[f32], m: usize, dst: &mut [f32], isa: DotIsa) {
    assert!(available(), "q4_gemm::matmul needs AVX2 and FMA");
    assert_eq!(x.len(), m * w.k);
    assert_eq!(dst.len(), m * w.n);
    let q = quantize_rows(x);
    // da · Σa per (row, block): what each column's minimum multiplies.
    let row_sums: Vec<f32> =
        q.qs.chunks_exact(QK)
            .zip(&q.scales)
            .map(|(blk, &da)| da * blk.iter().map(|&v| v as i32).sum::<i32>() as f32)
            .collect();
    // SAFETY (of each call): `available()` checked the CPU features; the driver hands each
    // tile its own (rows, 8-column) block of `dst`, inside the bounds asserted above.
    #[cfg(target_arch = "x86_64")]
    for_each_tile(m, w.n, dst, |t, r0, rows, dst| unsafe {
        match isa {
            DotIsa::Avx2 => tile_kernel_avx2(w, &q, &row_sums, t, r0, rows, dst),
            DotIsa::AvxVnni => tile_kernel_vnni(w, &q, &row_sums, t, r0, rows, dst),
            DotIsa::Avx512Vnni => tile_kernel_vnni512(w, &q, &row_sums, t, r0, rows, dst),
        }
    });
    // Elsewhere `available()` is false and the assertion above has stopped the call.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (q, isa, row_sums);
}

/// The tile kernel, written once for three instruction sets. `$dot4(acc, w, a)` adds each
/// group of 4 products of unsigned weight bytes and signed activation bytes into acc's 32-bit
/// lanes: `maddubs` + `madd` on AVX2, one `vpdpbusd` with AVX-VNNI or AVX-512 VNNI; all exact.
macro_rules! tile_kernel {
    ($name:ident, $features:literal, $dot4:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            w: &PackedQ4,
            q: &QuantRows,
            row_sums: &[f32],
            t: usize,
            r0: usize,
            rows: usize,
            dst: *mut f32,
        ) {
            use std::arch::x86_64::*;
            let kb = w.k / QK;
            let low = _mm256_set1_epi8(0x0f);
            let mut acc = [_mm256_setzero_ps(); ROWS];
            for b in 0..kb {
                let tile = &w.tiles[t * kb + b];
                let ahead =
                    (tile as *const Tile as *const i8).wrapping_add(PREFETCH_TILES * TILE_BYTES);
                for line in 0..TILE_BYTES.div_ceil(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
                }
                let mut iacc = [_mm256_setzero_si256(); ROWS];
                for p in 0..QK / 8 {
                    let v = _mm256_load_si256(tile.qs.as_ptr().add(p * 32) as *const __m256i);
                    let lo = _mm256_and_si256(v, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    for (r, ia) in iacc.iter_mut().enumerate().take(rows) {
                        let a = q.qs.as_ptr().add((r0 + r) * w.k + b * QK + p * 8) as *const i32;
                        *ia = $dot4(*ia, lo, _mm256_set1_epi32(a.read_unaligned()));
                        *ia = $dot4(*ia, hi, _mm256_set1_epi32(a.add(1).read_unaligned()));
                    }
                }
                let sc = _mm256_load_ps(tile.scales.as_ptr());
                let mins = _mm256_load_ps(tile.mins.as_ptr());
                for (r, (a, ia)) in acc.iter_mut().zip(&iacc).enumerate().take(rows) {
                    let row_block = (r0 + r) * kb + b;
                    let scale = _mm256_mul_ps(sc, _mm256_set1_ps(q.scales[row_block]));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(*ia), scale, *a);
                    *a = _mm256_fmadd_ps(mins, _mm256_set1_ps(row_sums[row_block]), *a);
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
    fn matches_candle_and_is_row_invariant() {
        if !available() {
            panic!("these tests need an x86-64 CPU with AVX2 and FMA (every CI machine has them)");
        }
        for (format, dtype) in [
            (Q4Format::Q4_0, GgmlDType::Q4_0),
            (Q4Format::Q4_1, GgmlDType::Q4_1),
        ] {
            // n not a multiple of 8 exercises the padded last tile; 9 rows span three chunks;
            // k is a multiple of 64 because candle's Q4_1 kernel takes blocks in pairs.
            let (n, k, m) = (44usize, 128usize, 9usize);
            let w = Tensor::from_vec(random(3, n * k), (n, k), &Device::Cpu).unwrap();
            let qt = QTensor::quantize(&w, dtype).unwrap();
            let packed = PackedQ4::from_gguf_bytes(format, &qt.data().unwrap(), n, k).unwrap();
            let x = random(4, m * k);
            let mut ours = vec![0f32; m * n];
            matmul(&packed, &x, m, &mut ours);
            // We must be at least as close to the exact product as candle (which rounds
            // activation block scales to f16 where we keep f32).
            let (err_ours, err_theirs) = errors_against_candle(&w, dtype, &x, m, &ours);
            assert!(err_ours < 0.1, "{format:?}: max error {err_ours}");
            assert!(
                err_ours <= err_theirs * 1.05,
                "{format:?}: ours {err_ours} vs candle {err_theirs}"
            );
            for isa in DotIsa::available() {
                let mut other = vec![0f32; m * n];
                matmul_on(&packed, &x, m, &mut other, isa);
                assert!(other == ours, "{format:?}: {isa:?} differs");
            }
            for r in 0..m {
                let mut one = vec![0f32; n];
                matmul(&packed, &x[r * k..(r + 1) * k], 1, &mut one);
                assert!(
                    one[..] == ours[r * n..(r + 1) * n],
                    "{format:?}: row {r} differs alone"
                );
            }
        }
    }

    #[test]
    fn extreme_nibbles_and_activations_do_not_saturate() {
        // Every nibble 15 against activations at -127 and 127: the largest products the AVX2
        // path's 16-bit pair sums must hold. Q4_1 blocks with d = 1, m = 0.5: each weight 15.5.
        let (n, k) = (8usize, 64usize);
        let mut bytes = Vec::new();
        for _ in 0..n * (k / QK) {
            bytes.extend_from_slice(&f16::from_f32(1.0).to_le_bytes());
            bytes.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
            bytes.extend_from_slice(&[0xffu8; QK / 2]);
        }
        let packed = PackedQ4::from_gguf_bytes(Q4Format::Q4_1, &bytes, n, k).unwrap();
        let x: Vec<f32> = (0..k)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let want: f32 = x.iter().map(|v| 15.5 * v).sum();
        for isa in DotIsa::available() {
            let mut out = vec![0f32; n];
            matmul_on(&packed, &x, 1, &mut out, isa);
            for &o in &out {
                assert!((o - want).abs() < 1e-3, "{isa:?}: {o} vs {want}");
            }
        }
    }

    #[test]
    fn refuses_shapes_it_cannot_pack() {
        assert!(PackedQ4::from_gguf_bytes(Q4Format::Q4_0, &[0; 18], 1, 33).is_none());
        assert!(PackedQ4::from_gguf_bytes(Q4Format::Q4_0, &[0; 17], 1, 32).is_none());
        assert!(PackedQ4::from_gguf_bytes(Q4Format::Q4_1, &[0; 18], 1, 32).is_none());
    }
}
