//! Q4_K and Q5_K: 256-value super-blocks of eight 32-value sub-blocks, each value
//! `d · sc[j] · q - dmin · m[j]` with 6-bit `sc` and `m`, `q` of 4 bits (Q5_K: 5).
//!
//! A tile holds one super-block of 16 output columns: the nibbles as `q4_gemm`'s tiles hold
//! them (vector `p` has value group `2p` in its low nibbles and `2p + 1` in its high ones, each
//! `[column][4 values]`, so one `vpdpbusd` multiplies a group of every column), Q5_K's fifth bits
//! as bit planes (byte `[column][value]` of plane `v` holds group `8v + k`'s bit in bit `k`),
//! and the scales and minimums as bytes, two sub-blocks side by side per column, which widen
//! into 16-bit pairs for `vpdpwssd` and 32-bit lanes for `vpmulld` without a shuffle.
//!
//! Per row and super-block every sum is an integer, exactly: `Σⱼ sc[j] · Σ q·a` (at most
//! 63 · 31 · 127 · 256 < 2³¹) and `Σⱼ m[j] · Σa`. Then two f32 steps add
//! `Σ · (d · da)` and subtract `Σm · (dmin · da)`, super-blocks in order: the same operations
//! on every instruction set and whatever the number of rows.

use crate::model::kernels::k_rows::{KRows, QK_K};
use crate::model::kernels::kquant_gemm::decode::Decoded;
use crate::model::kernels::kquant_gemm::grid::Grid;
use crate::model::kernels::tile_driver::{self, DotIsa, TILE_N};

/// One super-block of 16 columns; `H` is the bytes of fifth bits (0 for Q4_K, 512 for Q5_K).
#[repr(C, align(64))]
#[derive(Clone)]
pub(crate) struct MinTile<const H: usize> {
    d: [u16; TILE_N],
    dmin: [u16; TILE_N],
    /// `[pair][column][2]`: sub-blocks `2i` and `2i + 1`.
    sc: [u8; 4 * TILE_N * 2],
    m: [u8; 4 * TILE_N * 2],
    qs: [u8; QK_K * TILE_N / 2],
    qh: [u8; H],
}

/// Q4_K's tile.
pub(crate) type Q4KTile = MinTile<0>;
/// Q5_K's tile.
pub(crate) type Q5KTile = MinTile<512>;

impl<const H: usize> MinTile<H> {
    pub(crate) fn zero() -> Self {
        Self {
            d: [0; TILE_N],
            dmin: [0; TILE_N],
            sc: [0; 4 * TILE_N * 2],
            m: [0; 4 * TILE_N * 2],
            qs: [0; QK_K * TILE_N / 2],
            qh: [0; H],
        }
    }

    /// Puts column `c`'s super-block into the tile.
    pub(crate) fn put(&mut self, c: usize, block: &Decoded) {
        self.d[c] = block.d;
        self.dmin[c] = block.dmin;
        for j in 0..8 {
            let at = (j / 2) * 2 * TILE_N + c * 2 + j % 2;
            self.sc[at] = block.sc[j] as u8;
            self.m[at] = block.m[j];
        }
        for (i, &q) in block.q.iter().enumerate() {
            let (g, v) = (i / 4, i % 4);
            self.qs[(g / 2) * 64 + c * 4 + v] |= (q & 0xf) << (4 * (g % 2));
            if H > 0 {
                self.qh[(g / 8) * 64 + c * 4 + v] |= (q >> 4) << (g % 8);
            }
        }
    }

    /// Column `c`'s value `i` as the kernel reads it: `(q, sc, m, d, dmin)`.
    #[cfg(test)]
    pub(crate) fn value(&self, c: usize, i: usize) -> (u8, u8, u8, u16, u16) {
        let (g, v, j) = (i / 4, i % 4, i / 32);
        let mut q = (self.qs[(g / 2) * 64 + c * 4 + v] >> (4 * (g % 2))) & 0xf;
        if H > 0 {
            q |= ((self.qh[(g / 8) * 64 + c * 4 + v] >> (g % 8)) & 1) << 4;
        }
        let at = (j / 2) * 2 * TILE_N + c * 2 + j % 2;
        (q, self.sc[at], self.m[at], self.d[c], self.dmin[c])
    }
}

/// Activation rows the AVX-512 kernels serve a weight load: a sub-block's unpacked weights
/// (8 registers) and a running sum per row stay in registers.
pub(crate) const ROWS_512: usize = 8;

/// Rows a weight load serves on `isa`.
pub(crate) fn rows_per_load(isa: DotIsa) -> usize {
    match isa {
        DotIsa::Avx512Vnni => ROWS_512,
        other => other.rows_per_load(),
    }
}

/// How many tiles ahead the kernels prefetch: about 5 KB (`q8_gemm` says why).
const PREFETCH_BYTES: usize = 2 * 2368;

type Args<'a, const H: usize> = (&'a Grid<MinTile<H>>, &'a KRows, usize, usize, *mut f32);

/// `dst (m, n) = x · Wᵀ` over the quantized rows `q`, on `isa`'s kernel (which the CPU has).
pub(crate) fn run<const H: usize>(
    w: &Grid<MinTile<H>>,
    q: &KRows,
    m: usize,
    dst: &mut [f32],
    isa: DotIsa,
) {
    #[cfg(target_arch = "x86_64")]
    tile_driver::for_each_tile(m, w.n, rows_per_load(isa), dst, |t, r0, rows, dst| {
        use tile_driver::with_const_rows;
        let args = (w, q, t, r0, dst);
        // SAFETY: the caller checked the CPU features of `isa`; the driver hands each tile its
        // own (rows, 16-column) block of `dst`, with at most `rows_per_load` rows.
        unsafe {
            match isa {
                DotIsa::Avx2 => with_const_rows!(rows, kernel_avx2::<H>(args)),
                DotIsa::AvxVnni => with_const_rows!(rows, kernel_vnni::<H>(args)),
                DotIsa::Avx512Vnni => with_const_rows!(rows, kernel_vnni512::<H>(args)),
            }
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, q, m, dst, isa);
}

/// The AVX-512 VNNI kernel: all 16 columns in one vector, `R` rows (at most [`ROWS_512`]) a
/// weight load. A sub-block's eight value groups are unpacked once into registers, then each
/// row takes them in turn (its eight products, times the sub-block scale, into its running
/// sum): what lives across the rows is the unpacked weights and a sum per row, which fits the
/// 32 registers, where running sums per row for the products, the scaled sums and the
/// minimums did not.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn kernel_vnni512<const H: usize, const R: usize>((w, q, t, r0, dst): Args<H>) {
    use std::arch::x86_64::*;
    let kb = w.k / QK_K;
    debug_assert!(r0 + R <= q.m && w.tiles.len() >= (t + 1) * kb);
    let (low, bit4) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x10));
    let lo16 = _mm512_set1_epi32(0xffff);
    let tiles = w.tiles.as_ptr().add(t * kb);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..kb {
        let tile = &*tiles.add(b);
        // The tile ahead is prefetched a few lines a sub-block: all of it at once filled the
        // line-fill buffers and stalled this tile's own loads.
        let ahead = (tile as *const MinTile<H> as *const i8).wrapping_add(PREFETCH_BYTES);
        let lines = std::mem::size_of::<MinTile<H>>() / 64;
        // Row r0 + r: values at acts + 256 r, scale at scales + r, 32-value sums at sums + 8 r.
        let first = q.at(r0, b);
        let acts = q.qs.as_ptr().add(first * QK_K);
        let sums = q.sums32.as_ptr().add(first * 8);
        let widen = |v: &[u8], i: usize| {
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(v.as_ptr().add(i * 32) as *const __m256i))
        };
        let mut fsum = [_mm512_setzero_ps(); R];
        for j in 0..8 {
            for line in j * lines / 8..(j + 1) * lines / 8 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
            }
            let scp = widen(&tile.sc, j / 2);
            let sc = _mm512_cvtepi32_ps(if j % 2 == 0 {
                _mm512_and_si512(scp, lo16)
            } else {
                _mm512_srli_epi32::<16>(scp)
            });
            let h = if H > 0 {
                _mm512_loadu_si512(tile.qh.as_ptr().add(j * 64) as *const __m512i)
            } else {
                _mm512_setzero_si512()
            };
            let mut g = [_mm512_setzero_si512(); 8];
            for p in 0..4 {
                let v = _mm512_load_si512(tile.qs.as_ptr().add((4 * j + p) * 64) as *const _);
                g[2 * p] = _mm512_and_si512(v, low);
                g[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                if H > 0 {
                    for k in [2 * p, 2 * p + 1] {
                        let fifth = _mm512_and_si512(tile_driver::bit_to_4_512(h, k), bit4);
                        g[k] = _mm512_or_si512(g[k], fifth);
                    }
                }
            }
            for (r, s) in fsum.iter_mut().enumerate() {
                let x = acts.add(r * QK_K + j * 32) as *const i32;
                // Two chains of four, added: the same integer sum as one chain of eight.
                let mut ia = _mm512_setzero_si512();
                let mut ib = _mm512_setzero_si512();
                for k in 0..4 {
                    let a = _mm512_set1_epi32(x.add(2 * k).read_unaligned());
                    ia = _mm512_dpbusd_epi32(ia, g[2 * k], a);
                    let a = _mm512_set1_epi32(x.add(2 * k + 1).read_unaligned());
                    ib = _mm512_dpbusd_epi32(ib, g[2 * k + 1], a);
                }
                *s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ia, ib)), sc, *s);
            }
        }
        let d = _mm512_cvtph_ps(_mm256_load_si256(tile.d.as_ptr() as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_load_si256(tile.dmin.as_ptr() as *const __m256i));
        let mp = [0, 1, 2, 3].map(|i| widen(&tile.m, i));
        for r in 0..R {
            let mut msum = _mm512_setzero_si512();
            for (i, m) in mp.iter().enumerate() {
                let pair = (sums.add(r * 8 + 2 * i) as *const i32).read_unaligned();
                msum = _mm512_dpwssd_epi32(msum, *m, _mm512_set1_epi32(pair));
            }
            let da = _mm512_set1_ps(*q.scales.get_unchecked(first + r));
            acc[r] = _mm512_fmadd_ps(fsum[r], _mm512_mul_ps(d, da), acc[r]);
            let mins = _mm512_cvtepi32_ps(msum);
            acc[r] = _mm512_fnmadd_ps(mins, _mm512_mul_ps(dmin, da), acc[r]);
        }
    }
    let cols = (w.n - t * TILE_N).min(TILE_N);
    let mask = (((1u32 << cols) - 1) & 0xffff) as __mmask16;
    for (r, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(dst.add((r0 + r) * w.n + t * TILE_N), mask, *a);
    }
}

/// The 256-bit kernel, written once for AVX2 and AVX-VNNI: `R` rows (at most 4), the tile's
/// two 8-column halves one after the other, the same operations per output element as the
/// AVX-512 one (`grid::kernels_256` says what `$dot4`, `$widen` and `$dot2` do). A running
/// sum of `$dot4` is widened after 8 groups of 4-bit values, 4 of 5-bit ones.
macro_rules! kernel_256 {
    ($name:ident, $features:literal, $dot4:expr, $widen:expr, $dot2:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const H: usize, const R: usize>((w, q, t, r0, dst): Args<H>) {
            use std::arch::x86_64::*;
            let kb = w.k / QK_K;
            let (low, bit4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
            let lo16 = _mm256_set1_epi32(0xffff);
            let cols = (w.n - t * TILE_N).min(TILE_N);
            let lines = std::mem::size_of::<MinTile<H>>() / 64;
            // p-steps (two groups each) between widenings.
            let flush = if H > 0 { 2 } else { 4 };
            for half in 0..cols.div_ceil(8) {
                let mut acc = [_mm256_setzero_ps(); R];
                for b in 0..kb {
                    let tile = &w.tiles[t * kb + b];
                    let ahead =
                        (tile as *const MinTile<H> as *const i8).wrapping_add(PREFETCH_BYTES);
                    let first = q.at(r0, b);
                    let acts = q.qs.as_ptr().add(first * QK_K);
                    let sums = q.sums32.as_ptr().add(first * 8);
                    let mut fsum = [_mm256_setzero_ps(); R];
                    let mut msum = [_mm256_setzero_si256(); R];
                    for i in 0..4 {
                        let widen = |v: &[u8]| {
                            let at = v.as_ptr().add(i * 32 + half * 16) as *const __m128i;
                            _mm256_cvtepu8_epi16(_mm_loadu_si128(at))
                        };
                        let (scp, mp) = (widen(&tile.sc), widen(&tile.m));
                        let scs = [_mm256_and_si256(scp, lo16), _mm256_srli_epi32::<16>(scp)]
                            .map(|v| _mm256_cvtepi32_ps(v));
                        for (s, sc) in scs.iter().enumerate() {
                            let j = 2 * i + s;
                            if half == 0 {
                                for line in j * lines / 8..(j + 1) * lines / 8 {
                                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
                                }
                            }
                            let h = if H > 0 {
                                let at = tile.qh.as_ptr().add(j * 64 + half * 32);
                                _mm256_loadu_si256(at as *const __m256i)
                            } else {
                                _mm256_setzero_si256()
                            };
                            let mut ia = [_mm256_setzero_si256(); R];
                            let mut part = [_mm256_setzero_si256(); R];
                            for p in 0..4 {
                                let at = tile.qs.as_ptr().add((4 * j + p) * 64 + half * 32);
                                let v = _mm256_loadu_si256(at as *const __m256i);
                                let mut lo = _mm256_and_si256(v, low);
                                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                                if H > 0 {
                                    let b0 =
                                        _mm256_and_si256(tile_driver::bit_to_4_256(h, 2 * p), bit4);
                                    let b1 = _mm256_and_si256(
                                        tile_driver::bit_to_4_256(h, 2 * p + 1),
                                        bit4,
                                    );
                                    lo = _mm256_or_si256(lo, b0);
                                    hi = _mm256_or_si256(hi, b1);
                                }
                                for (r, a) in part.iter_mut().enumerate() {
                                    let x = acts.add(r * QK_K + j * 32 + p * 8) as *const i32;
                                    let x0 = _mm256_set1_epi32(x.read_unaligned());
                                    let x1 = _mm256_set1_epi32(x.add(1).read_unaligned());
                                    *a = $dot4(*a, lo, x0);
                                    *a = $dot4(*a, hi, x1);
                                }
                                if (p + 1) % flush == 0 {
                                    for r in 0..R {
                                        ia[r] = _mm256_add_epi32(ia[r], $widen(part[r]));
                                        part[r] = _mm256_setzero_si256();
                                    }
                                }
                            }
                            for r in 0..R {
                                let sum = _mm256_cvtepi32_ps(ia[r]);
                                fsum[r] = _mm256_fmadd_ps(sum, *sc, fsum[r]);
                            }
                        }
                        for (r, ms) in msum.iter_mut().enumerate() {
                            let pair = (sums.add(r * 8 + 2 * i) as *const i32).read_unaligned();
                            *ms = $dot2(*ms, mp, _mm256_set1_epi32(pair));
                        }
                    }
                    let f16s = |v: &[u16; TILE_N]| {
                        _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(8 * half) as *const _))
                    };
                    let (d, dmin) = (f16s(&tile.d), f16s(&tile.dmin));
                    for r in 0..R {
                        let da = _mm256_set1_ps(q.scales[first + r]);
                        let sum = fsum[r];
                        acc[r] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, da), acc[r]);
                        let mins = _mm256_cvtepi32_ps(msum[r]);
                        acc[r] = _mm256_fnmadd_ps(mins, _mm256_mul_ps(dmin, da), acc[r]);
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    let row = dst.add((r0 + r) * w.n + t * TILE_N + 8 * half);
                    tile_driver::store_cols_256(*a, row, cols - 8 * half);
                }
            }
        }
    };
}

// A `maddubs` pair sum is at most 2 · 31 · 127 = 7874 in magnitude, so it never saturates.
crate::model::kernels::kquant_gemm::grid::kernels_256!(kernel_256);
