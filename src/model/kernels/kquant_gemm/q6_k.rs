//! Q6_K: 256-value super-blocks of sixteen 16-value sub-blocks, each value
//! `d · sc[j] · (q - 32)` with a signed 8-bit `sc` and a 6-bit `q`.
//!
//! A tile holds one super-block of 16 output columns: the low nibbles as `min_k`'s tiles hold
//! them, the high two bits in planes (byte `[column][value]` of plane `v` holds group
//! `4v + k`'s bits at bits `2k`), and the scales two sub-blocks side by side per column. The
//! offset is taken out through the activations' 16-value sums: per row and super-block
//! `Σⱼ sc[j] · Σ q·a` and `Σⱼ sc[j] · Σa` are exact integers (at most 128 · 63 · 127 · 256
//! < 2³¹), then `Σ · (d · da)` is added and `Σsc · (d · da · 32)` subtracted, super-blocks in
//! order: the same operations on every instruction set and whatever the number of rows.

use crate::model::kernels::k_rows::{KRows, QK_K};
use crate::model::kernels::kquant_gemm::decode::Decoded;
use crate::model::kernels::kquant_gemm::grid::Grid;
use crate::model::kernels::kquant_gemm::min_k;
use crate::model::kernels::tile_driver::{self, DotIsa, TILE_N};

/// One super-block of 16 columns.
#[repr(C, align(64))]
#[derive(Clone)]
pub(crate) struct Q6KTile {
    /// `[pair][column][2]`: sub-blocks `2i` and `2i + 1`.
    sc: [i8; 8 * TILE_N * 2],
    qs: [u8; QK_K * TILE_N / 2],
    qh: [u8; QK_K * TILE_N / 4],
    d: [u16; TILE_N],
}

impl Q6KTile {
    pub(crate) fn zero() -> Self {
        Self {
            sc: [0; 8 * TILE_N * 2],
            qs: [0; QK_K * TILE_N / 2],
            qh: [0; QK_K * TILE_N / 4],
            d: [0; TILE_N],
        }
    }

    /// Puts column `c`'s super-block into the tile.
    pub(crate) fn put(&mut self, c: usize, block: &Decoded) {
        self.d[c] = block.d;
        for j in 0..16 {
            self.sc[(j / 2) * 2 * TILE_N + c * 2 + j % 2] = block.sc[j];
        }
        for (i, &q) in block.q.iter().enumerate() {
            let (g, v) = (i / 4, i % 4);
            self.qs[(g / 2) * 64 + c * 4 + v] |= (q & 0xf) << (4 * (g % 2));
            self.qh[(g / 4) * 64 + c * 4 + v] |= (q >> 4) << (2 * (g % 4));
        }
    }

    /// Column `c`'s value `i` as the kernel reads it: `(q, sc, d)`.
    #[cfg(test)]
    pub(crate) fn value(&self, c: usize, i: usize) -> (u8, i8, u16) {
        let (g, v, j) = (i / 4, i % 4, i / 16);
        let low = (self.qs[(g / 2) * 64 + c * 4 + v] >> (4 * (g % 2))) & 0xf;
        let high = (self.qh[(g / 4) * 64 + c * 4 + v] >> (2 * (g % 4))) & 3;
        let sc = self.sc[(j / 2) * 2 * TILE_N + c * 2 + j % 2];
        (low | (high << 4), sc, self.d[c])
    }
}

const PREFETCH_BYTES: usize = 2 * std::mem::size_of::<Q6KTile>();

type Args<'a> = (&'a Grid<Q6KTile>, &'a KRows, usize, usize, *mut f32);

/// `dst (m, n) = x · Wᵀ` over the quantized rows `q`, on `isa`'s kernel (which the CPU has).
pub(crate) fn run(w: &Grid<Q6KTile>, q: &KRows, m: usize, dst: &mut [f32], isa: DotIsa) {
    #[cfg(target_arch = "x86_64")]
    tile_driver::for_each_tile(
        m,
        w.n,
        min_k::rows_per_load(isa),
        dst,
        |t, r0, rows, dst| {
            use tile_driver::with_const_rows;
            let args = (w, q, t, r0, dst);
            // SAFETY: as `min_k::run`.
            unsafe {
                match isa {
                    DotIsa::Avx2 => with_const_rows!(rows, kernel_avx2(args)),
                    DotIsa::AvxVnni => with_const_rows!(rows, kernel_vnni(args)),
                    DotIsa::Avx512Vnni => with_const_rows!(rows, kernel_vnni512(args)),
                }
            }
        },
    );
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, q, m, dst, isa);
}

/// The AVX-512 VNNI kernel: all 16 columns in one vector, `R` rows (at most
/// [`min_k::ROWS_512`]) a weight load; as `min_k`'s, a sub-block's four value groups are
/// unpacked once and each row takes them in turn.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn kernel_vnni512<const R: usize>((w, q, t, r0, dst): Args) {
    use std::arch::x86_64::*;
    let kb = w.k / QK_K;
    debug_assert!(r0 + R <= q.m && w.tiles.len() >= (t + 1) * kb);
    let (low, top) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    let tiles = w.tiles.as_ptr().add(t * kb);
    let mut acc = [_mm512_setzero_ps(); R];
    // (low nibbles & 0x0f) | (high bits masked to bits 4-5)
    let join = |nib: __m512i, high: __m512i| {
        _mm512_ternarylogic_epi32::<0xEC>(nib, _mm512_and_si512(high, top), low)
    };
    for b in 0..kb {
        let tile = &*tiles.add(b);
        // The tile ahead is prefetched a few lines a sub-block: all of it at once filled the
        // line-fill buffers and stalled this tile's own loads.
        let ahead = (tile as *const Q6KTile as *const i8).wrapping_add(PREFETCH_BYTES);
        let lines = std::mem::size_of::<Q6KTile>() / 64;
        let first = q.at(r0, b);
        let acts = q.qs.as_ptr().add(first * QK_K);
        let sums = q.sums16.as_ptr().add(first * 16);
        let pairs = |i: usize| {
            let at = tile.sc.as_ptr().add(i * 32) as *const __m256i;
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(at))
        };
        let mut fsum = [_mm512_setzero_ps(); R];
        for j in 0..16 {
            for line in j * lines / 16..(j + 1) * lines / 16 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
            }
            let scp = pairs(j / 2);
            let sc = _mm512_cvtepi32_ps(if j % 2 == 0 {
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(scp))
            } else {
                _mm512_srai_epi32::<16>(scp)
            });
            let vec = |k: usize| {
                _mm512_loadu_si512(tile.qs.as_ptr().add((2 * j + k) * 64) as *const __m512i)
            };
            let (v0, v1) = (vec(0), vec(1));
            let h = _mm512_loadu_si512(tile.qh.as_ptr().add(j * 64) as *const __m512i);
            let g = [
                join(v0, _mm512_slli_epi16::<4>(h)),
                join(_mm512_srli_epi16::<4>(v0), _mm512_slli_epi16::<2>(h)),
                join(v1, h),
                join(_mm512_srli_epi16::<4>(v1), _mm512_srli_epi16::<2>(h)),
            ];
            for (r, s) in fsum.iter_mut().enumerate() {
                let x = acts.add(r * QK_K + j * 16) as *const i32;
                let mut ia = _mm512_setzero_si512();
                let mut ib = _mm512_setzero_si512();
                for k in 0..2 {
                    let a = _mm512_set1_epi32(x.add(2 * k).read_unaligned());
                    ia = _mm512_dpbusd_epi32(ia, g[2 * k], a);
                    let a = _mm512_set1_epi32(x.add(2 * k + 1).read_unaligned());
                    ib = _mm512_dpbusd_epi32(ib, g[2 * k + 1], a);
                }
                *s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ia, ib)), sc, *s);
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(tile.d.as_ptr() as *const __m256i));
        let scps: [__m512i; 8] = std::array::from_fn(pairs);
        for r in 0..R {
            let mut msum = _mm512_setzero_si512();
            for (i, scp) in scps.iter().enumerate() {
                let pair = (sums.add(r * 16 + 2 * i) as *const i32).read_unaligned();
                msum = _mm512_dpwssd_epi32(msum, *scp, _mm512_set1_epi32(pair));
            }
            let dd = _mm512_mul_ps(d, _mm512_set1_ps(*q.scales.get_unchecked(first + r)));
            acc[r] = _mm512_fmadd_ps(fsum[r], dd, acc[r]);
            let offset = _mm512_mul_ps(dd, _mm512_set1_ps(32.0));
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), offset, acc[r]);
        }
    }
    let cols = (w.n - t * TILE_N).min(TILE_N);
    let mask = (((1u32 << cols) - 1) & 0xffff) as __mmask16;
    for (r, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(dst.add((r0 + r) * w.n + t * TILE_N), mask, *a);
    }
}

/// The 256-bit kernel for AVX2 and AVX-VNNI (as `min_k`'s): `R` rows (at most 4), the tile's
/// two 8-column halves one after the other; a running sum of `$dot4` is widened after every
/// two groups (6-bit values).
macro_rules! kernel_256 {
    ($name:ident, $features:literal, $dot4:expr, $widen:expr, $dot2:expr) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize>((w, q, t, r0, dst): Args) {
            use std::arch::x86_64::*;
            let kb = w.k / QK_K;
            let (low, top) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
            let join = |nib: __m256i, high: __m256i| {
                _mm256_or_si256(_mm256_and_si256(nib, low), _mm256_and_si256(high, top))
            };
            let cols = (w.n - t * TILE_N).min(TILE_N);
            let lines = std::mem::size_of::<Q6KTile>() / 64;
            for half in 0..cols.div_ceil(8) {
                let mut acc = [_mm256_setzero_ps(); R];
                for b in 0..kb {
                    let tile = &w.tiles[t * kb + b];
                    let ahead = (tile as *const Q6KTile as *const i8).wrapping_add(PREFETCH_BYTES);
                    let first = q.at(r0, b);
                    let acts = q.qs.as_ptr().add(first * QK_K);
                    let sums = q.sums16.as_ptr().add(first * 16);
                    let mut fsum = [_mm256_setzero_ps(); R];
                    let mut msum = [_mm256_setzero_si256(); R];
                    for i in 0..8 {
                        let at = tile.sc.as_ptr().add(i * 32 + half * 16) as *const __m128i;
                        let scp = _mm256_cvtepi8_epi16(_mm_loadu_si128(at));
                        let scs = [
                            _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(scp)),
                            _mm256_srai_epi32::<16>(scp),
                        ]
                        .map(|v| _mm256_cvtepi32_ps(v));
                        for (s, sc) in scs.iter().enumerate() {
                            let j = 2 * i + s;
                            if half == 0 {
                                for line in j * lines / 16..(j + 1) * lines / 16 {
                                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64));
                                }
                            }
                            let load = |p: *const u8| _mm256_loadu_si256(p as *const __m256i);
                            let v0 = load(tile.qs.as_ptr().add(2 * j * 64 + half * 32));
                            let v1 = load(tile.qs.as_ptr().add((2 * j + 1) * 64 + half * 32));
                            let h = load(tile.qh.as_ptr().add(j * 64 + half * 32));
                            let groups = [
                                join(v0, _mm256_slli_epi16::<4>(h)),
                                join(_mm256_srli_epi16::<4>(v0), _mm256_slli_epi16::<2>(h)),
                                join(v1, h),
                                join(_mm256_srli_epi16::<4>(v1), _mm256_srli_epi16::<2>(h)),
                            ];
                            let mut ia = [_mm256_setzero_si256(); R];
                            for k in [0, 2] {
                                for (r, a) in ia.iter_mut().enumerate() {
                                    let x = acts.add(r * QK_K + j * 16 + k * 4) as *const i32;
                                    let mut part = _mm256_setzero_si256();
                                    for (g, at) in groups[k..k + 2].iter().zip([0, 1]) {
                                        let xa = _mm256_set1_epi32(x.add(at).read_unaligned());
                                        part = $dot4(part, *g, xa);
                                    }
                                    *a = _mm256_add_epi32(*a, $widen(part));
                                }
                            }
                            for r in 0..R {
                                let sum = _mm256_cvtepi32_ps(ia[r]);
                                fsum[r] = _mm256_fmadd_ps(sum, *sc, fsum[r]);
                            }
                        }
                        for (r, ms) in msum.iter_mut().enumerate() {
                            let pair = (sums.add(r * 16 + 2 * i) as *const i32).read_unaligned();
                            *ms = $dot2(*ms, scp, _mm256_set1_epi32(pair));
                        }
                    }
                    let at = tile.d.as_ptr().add(8 * half) as *const __m128i;
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(at));
                    for r in 0..R {
                        let dd = _mm256_mul_ps(d, _mm256_set1_ps(q.scales[first + r]));
                        acc[r] = _mm256_fmadd_ps(fsum[r], dd, acc[r]);
                        let offset = _mm256_mul_ps(dd, _mm256_set1_ps(32.0));
                        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[r]), offset, acc[r]);
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

// A `maddubs` pair sum is at most 2 · 63 · 127 = 16,002 in magnitude, so it never saturates.
crate::model::kernels::kquant_gemm::grid::kernels_256!(kernel_256);
