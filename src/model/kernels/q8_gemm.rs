//! A batch-invariant Q8_0 matrix multiply for x86 CPUs with AVX2, FMA and F16C.
//!
//! Why it exists: candle's Q8_0 kernel computes one (row, column) dot product at a time, so a
//! multi-token forward (prefill, speculative verification) reads every weight once per row and
//! costs nearly as much per token as decoding; its faster repacked path needs AVX512-VNNI and
//! rows whose length is a multiple of 256 (SmolLM2's are 576). Here weights are repacked at load
//! into tiles of 16 output columns (ik_llama.cpp's row-interleaved `_R8` layouts are the same
//! idea), so one 512-bit weight load covers 16 columns x 4 values and serves up to 12 activation
//! rows on AVX-512 VNNI (a 256-bit kernel takes the tile's halves, 4 rows at a time).
//!
//! Weights are stored offset by 128 as unsigned bytes, what `vpdpbusd` multiplies into signed
//! activations; `128 · Σa` per block is subtracted after. On plain AVX2 products use llama.cpp's
//! sign trick instead, `maddubs(|w|, sign(a, w))`, which keeps every 16-bit pair sum below
//! saturation (|a|, |w| <= 127, or one of them -128 with the other <= 127).
//!
//! Batch invariance is kept by construction: for every output element the sequence of
//! operations is the same whatever the number of rows or how rows are grouped — exact int32 sums
//! within a 32-value block, then one f32 fused multiply-add per block, blocks in order.

use std::sync::OnceLock;

use crate::model::kernels::packed_gemm::{self, PackedWeight};
use crate::model::kernels::tile_driver::{
    self, run_tile_kernels, with_quantized, DotIsa, QK, TILE_N,
};

/// How many tiles ahead the kernel prefetches. Without it a core waits on each tile's load and
/// then computes, so a 4-token forward cost the sum of streaming the weights and the arithmetic
/// (15.2 ms against 9.0 ms for one token at depth 64); about 2-3 KB ahead overlaps the two
/// (10.0 ms). `tandem forward-bench` measures it.
const PREFETCH_TILES: usize = 5;
const TILE_BYTES: usize = std::mem::size_of::<Tile>();
/// Bytes of one GGUF Q8_0 block: an f16 scale then 32 signed bytes.
const BLOCK_BYTES: usize = 2 + QK;

/// One 32-value block of 16 output columns: eight 64-byte vectors, vector `g` holding values
/// `4g..4g + 4` laid out `[column (16)][4 bytes]`, each weight stored offset by 128 as an
/// unsigned byte (`w ^ 0x80`), what `vpdpbusd` multiplies. A vector's two 32-byte halves are
/// the columns 0-7 and 8-15 that a 256-bit kernel takes one at a time.
#[repr(C, align(64))]
#[derive(Clone)]
struct Tile {
    qs: [u8; QK * TILE_N],
}

/// A tile's per-column scales, as the file's f16 bits.
#[repr(C, align(32))]
#[derive(Clone)]
struct TileScales([u16; TILE_N]);

/// Q8_0 weights `(n, k)` packed for [`matmul`].
pub struct PackedQ8 {
    tiles: Vec<Tile>,
    scales: Vec<TileScales>,
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
        // Padding columns hold weight 0 (byte 0x80) with scale 0.
        let mut tiles = vec![
            Tile {
                qs: [0x80; QK * TILE_N]
            };
            n_tiles * kb
        ];
        let mut scales = vec![TileScales([0; TILE_N]); n_tiles * kb];
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            for b in 0..kb {
                let blk = &bytes[(col * kb + b) * BLOCK_BYTES..(col * kb + b + 1) * BLOCK_BYTES];
                scales[t * kb + b].0[c] = u16::from_le_bytes([blk[0], blk[1]]);
                let tile = &mut tiles[t * kb + b];
                for (i, &q) in blk[2..].iter().enumerate() {
                    let (g, j) = (i / 4, i % 4);
                    tile.qs[g * 64 + c * 4 + j] = q ^ 0x80;
                }
            }
        }
        Some(Self {
            tiles,
            scales,
            n,
            k,
        })
    }
}

#[cfg(test)]
impl PackedQ8 {
    /// The weights back out of the tiles, `(n, k)` row-major: `d · q` per value.
    fn unpack(&self) -> Vec<f32> {
        tile_driver::unpack_with(self.n, self.k, |block, c, i| {
            let (g, j) = (i / 4, i % 4);
            let q = (self.tiles[block].qs[g * 64 + c * 4 + j] ^ 0x80) as i8;
            half::f16::from_bits(self.scales[block].0[c]).to_f32() * q as f32
        })
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
    assert!(available(), "q8_gemm::matmul needs AVX2, FMA and F16C");
    assert_eq!(x.len(), m * w.k);
    assert_eq!(dst.len(), m * w.n);
    with_quantized(x, m, |q| {
        // 128 · Σa per (row, block): what `vpdpbusd` over the offset weights adds.
        let offsets: Vec<i32> = match isa {
            DotIsa::Avx2 => Vec::new(),
            DotIsa::AvxVnni | DotIsa::Avx512Vnni => q.sums.iter().map(|s| 128 * s).collect(),
        };
        run_tile_kernels!(isa, m, w, q, &offsets[..], dst);
        // Elsewhere `available()` is false and the assertion above has stopped the call.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (q, isa, offsets);
    })
}

/// What every tile kernel is given: the weights, the quantized rows, `128 · Σa` per (row,
/// block) (empty on AVX2, which multiplies signed weights), the column tile, the first row and
/// the output's start.
type TileArgs<'a> = tile_driver::TileArgs<'a, PackedQ8, i32>;

/// Prefetches the tile `PREFETCH_TILES` ahead of `b` and its scales (tiles are read in
/// address order, across units too; an address past the end is harmless).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_ahead(w: &PackedQ8, b: usize) {
    use std::arch::x86_64::*;
    let ahead = (w.tiles.as_ptr().wrapping_add(b + PREFETCH_TILES)) as *const i8;
    for line in 0..TILE_BYTES / 64 {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
    }
    _mm_prefetch::<_MM_HINT_T0>(w.scales.as_ptr().wrapping_add(b + PREFETCH_TILES) as *const i8);
}

/// The 256-bit tile kernel, written once for AVX2 and AVX-VNNI: `R` rows (at most 4), the
/// tile's two 8-column halves one after the other. `$dot4(acc, u, a)` adds the 4-byte dot
/// products of the stored bytes `u` and activations `a` into acc's 32-bit lanes. AVX2 undoes
/// the offset (`u ^ 0x80`) and multiplies with llama.cpp's sign trick, `maddubs(|w|, sign(a,
/// w))`, whose 16-bit pair sums cannot saturate; AVX-VNNI multiplies the offset bytes and
/// subtracts `128 · Σa` per block. Both sums are exact, so per output element the operations
/// are the same on every path: exact integer sums per block, then `acc += Σ · (d · da)` as one
/// fused multiply-add, blocks in order. `$offset` says whether the kernel multiplies the
/// offset bytes (and so subtracts `128 · Σa`).
macro_rules! tile_kernel_256 {
    ($name:ident, $features:literal, $offset:literal, $dot4:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize>((w, q, offsets, t, r0, dst): TileArgs) {
            use std::arch::x86_64::*;
            let kb = w.k / QK;
            let cols = (w.n - t * TILE_N).min(TILE_N);
            for h in 0..cols.div_ceil(8) {
                let mut acc = [_mm256_setzero_ps(); R];
                for b in 0..kb {
                    if h == 0 {
                        prefetch_ahead(w, t * kb + b);
                    }
                    let tile = &w.tiles[t * kb + b];
                    let mut iacc = [_mm256_setzero_si256(); R];
                    for g in 0..QK / 4 {
                        let at = tile.qs.as_ptr().add(g * 64 + h * 32);
                        let u = _mm256_load_si256(at as *const __m256i);
                        for (r, ia) in iacc.iter_mut().enumerate() {
                            let a = _mm256_set1_epi32(q.group(r0 + r, b, g).read_unaligned());
                            *ia = $dot4(*ia, u, a);
                        }
                    }
                    let scales = w.scales[t * kb + b].0.as_ptr().add(8 * h);
                    let sc = _mm256_cvtph_ps(_mm_load_si128(scales as *const __m128i));
                    for (r, (a, ia)) in acc.iter_mut().zip(&iacc).enumerate() {
                        let row_block = q.at(r0 + r, b);
                        let sum = if $offset {
                            _mm256_sub_epi32(*ia, _mm256_set1_epi32(offsets[row_block]))
                        } else {
                            *ia
                        };
                        let scale = _mm256_mul_ps(sc, _mm256_set1_ps(q.scales[row_block]));
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *a);
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    let row = dst.add((r0 + r) * w.n + t * TILE_N + 8 * h);
                    crate::model::kernels::tile_driver::store_cols_256(*a, row, cols - 8 * h);
                }
            }
        }
    };
}

tile_kernel_256!(tile_kernel_avx2, "avx2,fma,f16c", false, |acc, u, a| {
    let wv = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(a, wv));
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
});
tile_kernel_256!(
    tile_kernel_vnni,
    "avx2,fma,f16c,avxvnni",
    true,
    |acc, u, a| { _mm256_dpbusd_avx_epi32(acc, u, a) }
);

/// The AVX-512 VNNI tile kernel: all 16 columns in one 512-bit vector, `R` rows (at most 12) a
/// weight load, the same operations per output element as [`tile_kernel_256`]. With one or
/// two rows each row's block sum runs as two dependency chains (even and odd value groups,
/// added at the end: integer sums, so the same bits), since one chain of 8 `vpdpbusd` waits
/// on its own latency rather than on memory.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn tile_kernel_vnni512<const R: usize>((w, q, offsets, t, r0, dst): TileArgs) {
    use std::arch::x86_64::*;
    let split = R <= 2;
    let kb = w.k / QK;
    debug_assert!(r0 + R <= q.m && w.tiles.len() >= (t + 1) * kb);
    let (tiles, tile_scales) = (w.tiles.as_ptr().add(t * kb), w.scales.as_ptr().add(t * kb));
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..kb {
        prefetch_ahead(w, t * kb + b);
        let tile = &*tiles.add(b);
        // Row r0 + r of block b: values at acts + 32 r, scale at scales + r, offset at
        // sums + r (see `q4_gemm`'s kernel: no per-row index arithmetic).
        let first = q.at(r0, b);
        let acts = q.qs.as_ptr().add(first * QK);
        let (scales, sums) = (q.scales.as_ptr().add(first), offsets.as_ptr().add(first));
        let mut ia = [_mm512_setzero_si512(); R];
        let mut ib = [_mm512_setzero_si512(); R];
        for g in 0..QK / 4 {
            let u = _mm512_load_si512(tile.qs.as_ptr().add(g * 64) as *const __m512i);
            for r in 0..R {
                let at = acts.add(r * QK + g * 4) as *const i32;
                let a = _mm512_set1_epi32(at.read_unaligned());
                if split && g % 2 == 1 {
                    ib[r] = _mm512_dpbusd_epi32(ib[r], u, a);
                } else {
                    ia[r] = _mm512_dpbusd_epi32(ia[r], u, a);
                }
            }
        }
        let sc = _mm512_cvtph_ps(_mm256_load_si256(
            (*tile_scales.add(b)).0.as_ptr() as *const __m256i
        ));
        for r in 0..R {
            let sum = if split {
                _mm512_add_epi32(ia[r], ib[r])
            } else {
                ia[r]
            };
            let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(*sums.add(r)));
            let scale = _mm512_mul_ps(sc, _mm512_set1_ps(*scales.add(r)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
        }
    }
    let cols = (w.n - t * TILE_N).min(TILE_N);
    let mask = (((1u32 << cols) - 1) & 0xffff) as __mmask16;
    for (r, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(dst.add((r0 + r) * w.n + t * TILE_N), mask, *a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::packed_gemm::test_support::{
        assert_rows_and_isas_agree, errors_against_candle, quantized, random,
    };
    use candle_core::quantized::GgmlDType;
    use candle_core::{Device, Tensor};

    #[test]
    fn matches_candle_q8_0_and_is_row_invariant() {
        if !available() {
            panic!("these tests need an x86-64 CPU with AVX2, FMA and F16C (every CI machine)");
        }
        // n = 44 ends in a 12-column tile (a 256-bit kernel's second half holds 4), 37 in a
        // 5-column one.
        for (n, k) in [(44usize, 96usize), (37, 64)] {
            let w = Tensor::from_vec(random(1, n * k), (n, k), &Device::Cpu).unwrap();
            let (bytes, _) = quantized(&w, GgmlDType::Q8_0);
            let packed = PackedQ8::from_q8_0_bytes(&bytes, n, k).unwrap();
            let m = 7;
            let x = random(2, m * k);
            let mut ours = vec![0f32; m * n];
            matmul(&packed, &x, m, &mut ours);
            // candle rounds activation block scales to f16 while we keep them in f32, so we
            // must be at least as close to the exact product as candle is.
            let (err_ours, err_theirs) = errors_against_candle(&w, GgmlDType::Q8_0, &x, m, &ours);
            // 8-bit activations: about (1/127)/2 error per value, over 96 random-sign terms.
            assert!(err_ours < 0.1, "max error {err_ours}");
            assert!(
                err_ours <= err_theirs * 1.05,
                "ours {err_ours} vs candle {err_theirs}"
            );
            assert_rows_and_isas_agree(n, k, |x, m, dst, isa| matmul_on(&packed, x, m, dst, isa));
        }
    }

    #[test]
    fn extreme_weights_and_activations_are_exact_on_every_path() {
        // Weights at -128 and 127 against activations at ±127: the sign trick's edge on AVX2
        // and the largest offset sums on VNNI. Scale 1, so each output is an exact integer.
        let (n, k) = (16usize, 64usize);
        let mut bytes = Vec::new();
        let mut want = vec![0f32; n];
        let x: Vec<f32> = (0..k)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        for (col, want) in want.iter_mut().enumerate() {
            for b in 0..k / QK {
                bytes.extend_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
                for i in 0..QK {
                    let q: i8 = if (i + col) % 2 == 0 { -128 } else { 127 };
                    bytes.push(q as u8);
                    *want += q as f32 * 127.0 * x[b * QK + i];
                }
            }
        }
        let packed = PackedQ8::from_q8_0_bytes(&bytes, n, k).unwrap();
        for isa in DotIsa::available() {
            let mut out = vec![0f32; n];
            matmul_on(&packed, &x, 1, &mut out, isa);
            for (o, w) in out.iter().zip(&want) {
                // Activations quantize to ±127 with scale 1/127.
                assert!(
                    (o - w / 127.0).abs() < 1e-2,
                    "{isa:?}: {o} vs {}",
                    w / 127.0
                );
            }
        }
    }

    #[test]
    fn the_tiles_unpack_to_the_files_exact_weights() {
        let (n, k) = (37usize, 96usize);
        let w = Tensor::from_vec(random(6, n * k), (n, k), &Device::Cpu).unwrap();
        let (bytes, values) = quantized(&w, GgmlDType::Q8_0);
        let unpacked = PackedQ8::from_q8_0_bytes(&bytes, n, k).unwrap().unpack();
        for (i, (a, b)) in unpacked.iter().zip(&values).enumerate() {
            assert!(a == b, "value {i}: {a} unpacked, {b} in the file");
        }
    }

    #[test]
    fn refuses_shapes_it_cannot_pack() {
        assert!(PackedQ8::from_q8_0_bytes(&[0; 34], 1, 33).is_none());
        assert!(PackedQ8::from_q8_0_bytes(&[0; 30], 1, 32).is_none());
    }
}
