//! A batch-invariant matrix multiply for 32-value blocks of 4-bit and 5-bit weights (Q4_1 and
//! Q4_0, Q5_1 and Q5_0) on x86 CPUs with AVX2, FMA and F16C: the default model's kernel, as
//! target and as drafter, and that of the rows a `Q4_K_M` file cannot give 256-value blocks.
//!
//! Why it exists: a draft model's step is bound by streaming its weights (a Q8_0 step of
//! SmolLM2-135M reads ~143 MB at ~18 GB/s on our 2-core machines), so a drafter whose weights
//! are half the size drafts in about half the time, and speculation pays only when a draft step
//! is cheap next to a target step. The default model ships as Q4_1, so this kernel runs a
//! drafter on exactly the target's weights at half Q8_0's bytes; candle has no SIMD Q4_1 kernel
//! on x86 and its Q4_0 one computes one (row, column) dot product at a time. Weights are repacked
//! at load into tiles of 16 output columns like `q8_gemm`, in exactly the file's bytes (f16
//! scales and minimums kept as they are: a 4-bit step is bound by streaming them), and multiply
//! the same 8-bit activations.
//!
//! A 4-bit weight is `d · q + m` with `q` in 0..15 (Q4_0 is the case `m = -8 · d`); a 5-bit one
//! the same with `q` in 0..31, its fifth bits in a plane of their own (Q5_0: `m = -16 · d`;
//! llama.cpp's `Q4_K_M` stores rows whose length is no multiple of 256, such as the default
//! model's 576, as Q5_0). The values
//! stay unsigned so one `vpdpbusd` (or `maddubs` + `madd` on plain AVX2, which cannot saturate:
//! 15 · 127 · 2 < 32768) multiplies them straight into the signed activations; per 32-value
//! block the integer sum is exact, then two f32 fused multiply-adds add `d · da · Σ q·a` and
//! `m · da · Σ a`, blocks in order. Each output element is thus computed the same way whatever
//! the number of rows (batch invariance), and the AVX2, AVX-VNNI and AVX-512 VNNI paths give
//! the same bits.
//!
//! MXFP4 experts (gpt-oss) reach this kernel as Q5_0 blocks of exactly their values
//! (`load/mxfp4`): doubled E2M1 values, 15 of the 32 a 5-bit block can hold. Such a weight is
//! packed as 4-bit codes instead, each looked up (`vpshufb`) as its value plus 12, so `q` runs
//! 0..24 with `m = -12 · d`: the same weights from 20 bytes a column's block, not 24.

use std::sync::OnceLock;

use crate::model::kernels::packed_gemm::{self, PackedWeight};
use crate::model::kernels::tile_driver::{self, with_quantized, DotIsa, QuantRows, QK, TILE_N};

mod tiles;

pub use tiles::Q4Format;
use tiles::{as_e2m1, pack, Tile, Tiles, E2M1_LOOKUP};

/// How many tiles ahead the kernel prefetches (the reason is `q8_gemm`'s: streaming and
/// arithmetic overlap only with it): about 3 KB.
const PREFETCH_TILES: usize = 10;
/// 4-bit or 5-bit weights `(n, k)` packed for [`matmul`].
pub struct PackedQ4 {
    four: Option<Tiles<0>>,
    five: Option<Tiles<64>>,
    /// 5-bit blocks whose every value is a doubled E2M1 value (MXFP4 experts read as Q5_0):
    /// 4-bit codes into [`E2M1_LOOKUP`].
    e2m1: Option<Tiles<0>>,
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
    /// Packs raw GGUF Q4_0, Q4_1, Q5_0 or Q5_1 bytes of an `(n, k)` weight; `None` if the
    /// shape does not fit (k not a multiple of 32), or a Q4_0/Q5_0 scale is so large that its
    /// minimum `-8 · d` (`-16 · d`) leaves f16's range.
    pub fn from_gguf_bytes(format: Q4Format, bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let block_bytes = format.header_bytes() + QK / 2;
        if k == 0 || !k.is_multiple_of(QK) || bytes.len() != n * (k / QK) * block_bytes {
            return None;
        }
        let (mut four, mut five, mut e2m1) = (None, None, None);
        if format.five_bits() {
            let tiles = pack::<64>(format, bytes, n, k)?;
            match (format == Q4Format::Q5_0)
                .then(|| as_e2m1(&tiles))
                .flatten()
            {
                Some(codes) => e2m1 = Some(codes),
                None => five = Some(tiles),
            }
        } else {
            four = Some(pack::<0>(format, bytes, n, k)?);
        }
        Some(Self {
            four,
            five,
            e2m1,
            n,
            k,
        })
    }

    /// Whether the weights run as 4-bit E2M1 codes (MXFP4's values, 20 bytes a column's block
    /// in the tiles against Q5_0's 24).
    pub fn is_e2m1(&self) -> bool {
        self.e2m1.is_some()
    }
}

#[cfg(test)]
impl PackedQ4 {
    /// The weights back out of the tiles, `(n, k)` row-major: `d · q + m` per value.
    fn unpack(&self) -> Vec<f32> {
        use half::f16;
        fn value<const H: usize>(tile: &Tile<H>, c: usize, i: usize) -> f32 {
            let (g, j) = (i / 4, i % 4);
            let mut q = (tile.qs[(g / 2) * 64 + c * 4 + j] >> (4 * (g % 2))) & 0x0f;
            if H > 0 {
                q |= ((tile.qh[c * 4 + j] >> g) & 1) << 4;
            }
            let m = f16::from_bits(tile.mins[c]).to_f32();
            f16::from_bits(tile.scales[c]).to_f32() * q as f32 + m
        }
        match (&self.four, &self.five, &self.e2m1) {
            (Some(w), _, _) => {
                tile_driver::unpack_with(self.n, self.k, |b, c, i| value(&w.tiles[b], c, i))
            }
            (_, Some(w), _) => {
                tile_driver::unpack_with(self.n, self.k, |b, c, i| value(&w.tiles[b], c, i))
            }
            (_, _, Some(w)) => tile_driver::unpack_with(self.n, self.k, |b, c, i| {
                let tile = &w.tiles[b];
                let (g, j) = (i / 4, i % 4);
                let code = (tile.qs[(g / 2) * 64 + c * 4 + j] >> (4 * (g % 2))) & 0x0f;
                let m = f16::from_bits(tile.mins[c]).to_f32();
                f16::from_bits(tile.scales[c]).to_f32() * E2M1_LOOKUP[code as usize] as f32 + m
            }),
            _ => unreachable!("packed weights hold one kind of tile"),
        }
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
        if self.is_e2m1() {
            "q4-gemm-e2m1"
        } else {
            "q4-gemm"
        }
    }

    fn packed_bytes(&self) -> Option<usize> {
        let t = self.e2m1.as_ref()?;
        Some(t.tiles.len() * std::mem::size_of::<Tile<0>>())
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
    assert!(available(), "q4_gemm::matmul needs AVX2, FMA and F16C");
    assert_eq!(x.len(), m * w.k);
    assert_eq!(dst.len(), m * w.n);
    with_quantized(x, m, |q| {
        // da · Σa per (row, block): what each column's minimum multiplies.
        let row_sums: Vec<f32> = q
            .sums
            .iter()
            .zip(&q.scales)
            .map(|(&sum, &da)| da * sum as f32)
            .collect();
        match (&w.four, &w.five, &w.e2m1) {
            (Some(t), _, _) => run::<0, false>(t, q, &row_sums, m, dst, isa),
            (_, Some(t), _) => run::<64, false>(t, q, &row_sums, m, dst, isa),
            (_, _, Some(t)) => run::<0, true>(t, q, &row_sums, m, dst, isa),
            _ => unreachable!("packed weights hold one kind of tile"),
        }
    })
}

/// Runs `isa`'s tile kernel over every (column tile, row chunk) of the output, in parallel.
/// `L`: the nibbles are E2M1 codes, looked up in [`E2M1_LOOKUP`].
fn run<const H: usize, const L: bool>(
    w: &Tiles<H>,
    q: &QuantRows,
    row_sums: &[f32],
    m: usize,
    dst: &mut [f32],
    isa: DotIsa,
) {
    #[cfg(target_arch = "x86_64")]
    tile_driver::for_each_tile(m, w.n, isa.rows_per_load(), dst, |t, r0, rows, dst| {
        use tile_driver::with_const_rows;
        let args = (w, q, row_sums, t, r0, dst);
        // SAFETY: `available()` checked the CPU features of every `isa` it lists; the driver
        // hands each tile its own (rows, 16-column) block of `dst`, with at most
        // `rows_per_load` rows.
        unsafe {
            match isa {
                DotIsa::Avx2 => with_const_rows!(rows, tile_kernel_avx2::<H, L>(args)),
                DotIsa::AvxVnni => with_const_rows!(rows, tile_kernel_vnni::<H, L>(args)),
                DotIsa::Avx512Vnni => with_const_rows!(rows, tile_kernel_vnni512::<H, L>(args)),
            }
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, q, row_sums, m, dst, isa);
}

/// What every tile kernel is given: the weights, the quantized rows, `da · Σa` per (row,
/// block), the column tile, the first row and the output's start.
type TileArgs<'a, const H: usize> = tile_driver::TileArgs<'a, Tiles<H>, f32>;

/// The 256-bit tile kernel, written once for AVX2 and AVX-VNNI: `R` rows (at most 4), the
/// tile's two 8-column halves one after the other. `$dot4(acc, w, a)` adds the products of
/// unsigned weight bytes and signed activation bytes into a block's running sum `acc`, and
/// `$widen(acc)` makes that sum one 32-bit lane a column; both exact. Per output element:
/// exact integer sums per block, then `acc += Σ · (d · da)` and `acc += m · (da · Σa)` as two
/// fused multiply-adds, blocks in order; the AVX-512 kernel does the same operations, so every
/// path gives the same bits.
macro_rules! tile_kernel_256 {
    ($name:ident, $features:literal, $dot4:expr, $widen:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const H: usize, const L: bool, const R: usize>(
            (w, q, row_sums, t, r0, dst): TileArgs<H>,
        ) {
            use std::arch::x86_64::*;
            use $crate::model::kernels::tile_driver::bit_to_4_256;
            let kb = w.k / QK;
            let (low, bit4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
            let table = E2M1_LOOKUP.as_ptr() as *const __m128i;
            let lookup = _mm256_broadcastsi128_si256(_mm_loadu_si128(table));
            // Values past 15 (5-bit, or looked up) need a block's sum in two halves.
            let halves = H > 0 || L;
            let cols = (w.n - t * TILE_N).min(TILE_N);
            for h in 0..cols.div_ceil(8) {
                let mut acc = [_mm256_setzero_ps(); R];
                for b in 0..kb {
                    let tile = &w.tiles[t * kb + b];
                    if h == 0 {
                        let bytes = std::mem::size_of::<Tile<H>>();
                        let ahead = (tile as *const Tile<H> as *const i8)
                            .wrapping_add(PREFETCH_TILES * bytes);
                        for line in 0..bytes / 64 {
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
                        }
                    }
                    // Two running sums a block where the values have 5 bits (see the AVX2 note).
                    let mut iacc = [[_mm256_setzero_si256(); R]; 2];
                    let high = if H > 0 {
                        _mm256_loadu_si256(tile.qh.as_ptr().add(h * 32) as *const __m256i)
                    } else {
                        _mm256_setzero_si256()
                    };
                    for p in 0..QK / 8 {
                        let at = tile.qs.as_ptr().add(p * 64 + h * 32);
                        let v = _mm256_load_si256(at as *const __m256i);
                        let mut lo = _mm256_and_si256(v, low);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                        if H > 0 {
                            let fifth = |g| _mm256_and_si256(bit_to_4_256(high, g), bit4);
                            lo = _mm256_or_si256(lo, fifth(2 * p));
                            hi = _mm256_or_si256(hi, fifth(2 * p + 1));
                        }
                        if L {
                            lo = _mm256_shuffle_epi8(lookup, lo);
                            hi = _mm256_shuffle_epi8(lookup, hi);
                        }
                        let sums = &mut iacc[if halves { p / 2 } else { 0 }];
                        for (r, ia) in sums.iter_mut().enumerate() {
                            let a = q.group(r0 + r, b, 2 * p);
                            *ia = $dot4(*ia, lo, _mm256_set1_epi32(a.read_unaligned()));
                            *ia = $dot4(*ia, hi, _mm256_set1_epi32(a.add(1).read_unaligned()));
                        }
                    }
                    let half = |v: &[u16; TILE_N]| {
                        _mm256_cvtph_ps(_mm_load_si128(v.as_ptr().add(8 * h) as *const __m128i))
                    };
                    let (sc, mins) = (half(&tile.scales), half(&tile.mins));
                    for (r, a) in acc.iter_mut().enumerate() {
                        let row_block = q.at(r0 + r, b);
                        let scale = _mm256_mul_ps(sc, _mm256_set1_ps(q.scales[row_block]));
                        let mut sum = $widen(iacc[0][r]);
                        if halves {
                            sum = _mm256_add_epi32(sum, $widen(iacc[1][r]));
                        }
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *a);
                        *a = _mm256_fmadd_ps(mins, _mm256_set1_ps(row_sums[row_block]), *a);
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

// AVX2 keeps a block's sum in 16-bit lanes, each pair of them a column's 4-value group, and
// widens it once a block: a `maddubs` pair sum is at most 2 · 15 · 127 = 3810 in magnitude
// (activations round to -127..127), and a lane takes 8 of them a block (4 vectors, low and
// high nibbles), at most 30,480 < 32,768, so the 16-bit adds are exact and one `madd` a block
// replaces a `madd` and an add per product. With 5-bit values a pair sum reaches
// 2 · 31 · 127 = 7874, so a block's sum is two halves of at most 31,496, widened apart; with
// looked-up E2M1 values (at most 24) two halves of at most 24,384.
tile_kernel_256!(
    tile_kernel_avx2,
    "avx2,fma,f16c",
    |acc, w, a| _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)),
    |acc| _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
);
tile_kernel_256!(
    tile_kernel_vnni,
    "avx2,fma,f16c,avxvnni",
    |acc, w, a| _mm256_dpbusd_avx_epi32(acc, w, a),
    |acc| acc
);

/// The AVX-512 VNNI tile kernel: all 16 columns in one 512-bit vector, `R` rows (at most 12) a
/// weight load, the same operations per output element as [`tile_kernel_256`]. With one or
/// two rows each row's block sum runs as two dependency chains (low and high nibbles, added
/// at the end: integer sums, so the same bits), since a single chain of 8 `vpdpbusd` waits on
/// its own latency rather than on memory.
///
/// With several rows the kernel is bound by its vector instructions (a `vpdpbusd` and a fused
/// multiply-add share the same units), so everything else is kept off them: every row's
/// activations, scales and sums for a block are read at constant offsets from one pointer (the
/// block-major [`QuantRows`]), as broadcast memory operands, with no index arithmetic or
/// bounds check per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn tile_kernel_vnni512<const H: usize, const L: bool, const R: usize>(
    (w, q, row_sums, t, r0, dst): TileArgs<H>,
) {
    use std::arch::x86_64::*;
    let split = R <= 2;
    let kb = w.k / QK;
    debug_assert!(r0 + R <= q.m && w.tiles.len() >= (t + 1) * kb);
    let (low, bit4) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x10));
    let lookup = _mm512_broadcast_i32x4(_mm_loadu_si128(E2M1_LOOKUP.as_ptr() as *const __m128i));
    let bytes = std::mem::size_of::<Tile<H>>();
    let tiles = w.tiles.as_ptr().add(t * kb);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..kb {
        let tile = &*tiles.add(b);
        let ahead = (tile as *const Tile<H> as *const i8).wrapping_add(PREFETCH_TILES * bytes);
        for line in 0..bytes / 64 {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
        }
        // Row r0 + r of block b: values at acts + 32 r, scale at scales + r, sum at sums + r.
        let first = q.at(r0, b);
        let acts = q.qs.as_ptr().add(first * QK);
        let (scales, sums) = (q.scales.as_ptr().add(first), row_sums.as_ptr().add(first));
        let mut ia = [_mm512_setzero_si512(); R];
        let mut ib = [_mm512_setzero_si512(); R];
        let high = if H > 0 {
            _mm512_loadu_si512(tile.qh.as_ptr() as *const __m512i)
        } else {
            _mm512_setzero_si512()
        };
        for p in 0..QK / 8 {
            let v = _mm512_load_si512(tile.qs.as_ptr().add(p * 64) as *const __m512i);
            let mut lo = _mm512_and_si512(v, low);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            if H > 0 {
                let fifth = |g| _mm512_and_si512(tile_driver::bit_to_4_512(high, g), bit4);
                lo = _mm512_or_si512(lo, fifth(2 * p));
                hi = _mm512_or_si512(hi, fifth(2 * p + 1));
            }
            if L {
                lo = _mm512_shuffle_epi8(lookup, lo);
                hi = _mm512_shuffle_epi8(lookup, hi);
            }
            for r in 0..R {
                let a = acts.add(r * QK + p * 8) as *const i32;
                ia[r] = _mm512_dpbusd_epi32(ia[r], lo, _mm512_set1_epi32(a.read_unaligned()));
                let a1 = _mm512_set1_epi32(a.add(1).read_unaligned());
                if split {
                    ib[r] = _mm512_dpbusd_epi32(ib[r], hi, a1);
                } else {
                    ia[r] = _mm512_dpbusd_epi32(ia[r], hi, a1);
                }
            }
        }
        let sc = _mm512_cvtph_ps(_mm256_load_si256(tile.scales.as_ptr() as *const __m256i));
        let mins = _mm512_cvtph_ps(_mm256_load_si256(tile.mins.as_ptr() as *const __m256i));
        for r in 0..R {
            let sum = if split {
                _mm512_add_epi32(ia[r], ib[r])
            } else {
                ia[r]
            };
            let scale = _mm512_mul_ps(sc, _mm512_set1_ps(*scales.add(r)));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[r]);
            acc[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(*sums.add(r)), acc[r]);
        }
    }
    let cols = (w.n - t * TILE_N).min(TILE_N);
    let mask = (((1u32 << cols) - 1) & 0xffff) as __mmask16;
    for (r, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(dst.add((r0 + r) * w.n + t * TILE_N), mask, *a);
    }
}

#[cfg(test)]
mod tests;
