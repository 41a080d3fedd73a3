//! A batch-invariant float-weight (f16 or f32) matrix multiply for x86 CPUs with AVX2, FMA
//! and F16C.
//!
//! Why it exists: candle's f16 matmul converts each activation row to f16 and runs one
//! (row, column) dot product at a time, so verifying 4 drafted tokens cost 2.2x a single-token
//! step (measured) where reading the weights once should make it nearly free. Its f32 matmul
//! does the same, through vector helpers it cannot inline in a build for any x86-64 CPU (a
//! tiny model's forward spent half its time in their calls). Here weights are repacked at
//! load into groups of 4 tiles of 8 output columns, interleaved by input index
//! (`[group][k][4 tiles][8]`, so a group's 32 columns at one input are one 64-byte line of
//! f16, two of f32, and a group is one sequential stream for the prefetchers); each 8-value
//! load is widened to f32 once (f16) and multiplied into up to 8 activation rows kept in f32.
//!
//! Batch invariance by construction: every output element is one fused multiply-add chain over
//! k in ascending order, starting from zero, whatever the number of rows or how rows and tiles
//! are grouped into work units.

use std::sync::OnceLock;

use crate::model::kernels::packed_gemm::{self, PackedWeight};

const TILE_N: usize = 8;
/// How far ahead in a group's weight stream the kernel prefetches. Without it streaming the
/// weights and the arithmetic do not overlap (a 4-token forward cost 23 ms against 14 ms for
/// one token at depth 64 before groups were one stream); 1, 2, 4 and 8 KB ahead were measured
/// with `tandem forward-bench --weights-dtype f16`, 2 KB the fastest by a few percent.
const PREFETCH_BYTES: usize = 2048;
/// One cache line of a group's stream.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; LINE_BYTES]);

const LINE_BYTES: usize = 64;
/// Tiles interleaved into one stream; tiles are padded to a multiple of it.
const TILE_GROUP: usize = 4;
/// Values of one group at one input index: one line of f16, two of f32.
const GROUP_STEP: usize = TILE_GROUP * TILE_N;

/// The type a packed weight keeps its values in (the file's: nothing is rounded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatElem {
    F16,
    F32,
}

impl FloatElem {
    const fn bytes(self) -> usize {
        match self {
            Self::F16 => 2,
            Self::F32 => 4,
        }
    }
}

/// Float weights `(n, k)` packed for [`PackedFloat::matmul`].
pub struct PackedFloat {
    /// Little-endian values, `[group][k][4 tiles][8 columns]`, one or two lines a step;
    /// columns past `n` are zero.
    data: Vec<Line>,
    elem: FloatElem,
    n: usize,
    k: usize,
    tiles: usize,
}

/// Whether this CPU runs the kernel (and `TANDEM_DISABLE_F16_GEMM` is not set: the switch
/// keeps its first name, from when the kernel ran f16 alone).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE
        .get_or_init(|| packed_gemm::enabled("TANDEM_DISABLE_F16_GEMM", packed_gemm::has_avx2_fma))
}

impl PackedFloat {
    /// Packs the little-endian `elem` values of a row-major `(n, k)` weight; `None` if the
    /// byte count does not match.
    pub fn from_le_bytes(elem: FloatElem, bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        let eb = elem.bytes();
        if n == 0 || k == 0 || bytes.len() != n * k * eb {
            return None;
        }
        let tiles = n.div_ceil(TILE_N).div_ceil(TILE_GROUP) * TILE_GROUP;
        let step_lines = GROUP_STEP * eb / LINE_BYTES;
        let mut data = vec![Line([0; LINE_BYTES]); tiles / TILE_GROUP * k * step_lines];
        let step_bytes = step_lines * LINE_BYTES;
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            let (g, j) = (t / TILE_GROUP, t % TILE_GROUP);
            let row = &bytes[col * k * eb..(col + 1) * k * eb];
            for (i, v) in row.chunks_exact(eb).enumerate() {
                let at = (g * k + i) * step_bytes + (j * TILE_N + c) * eb;
                let (line, off) = (at / LINE_BYTES, at % LINE_BYTES);
                data[line].0[off..off + eb].copy_from_slice(v);
            }
        }
        Some(Self {
            data,
            elem,
            n,
            k,
            tiles,
        })
    }

    /// Bytes from one input index to the next in a group's stream.
    fn step_bytes(&self) -> usize {
        GROUP_STEP * self.elem.bytes()
    }
}

impl PackedWeight for PackedFloat {
    fn out_features(&self) -> usize {
        self.n
    }

    fn in_features(&self) -> usize {
        self.k
    }

    fn kernel_name(&self) -> &'static str {
        match self.elem {
            FloatElem::F16 => "f16-gemm",
            FloatElem::F32 => "f32-gemm",
        }
    }

    fn matmul(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        self.matmul_on(x, m, dst, wide_available());
    }
}

impl PackedFloat {
    /// [`PackedWeight::matmul`], on the AVX-512 kernel if `wide` (same bits either way).
    fn matmul_on(&self, x: &[f32], m: usize, dst: &mut [f32], wide: bool) {
        assert!(available(), "float_gemm needs AVX2, FMA and F16C");
        assert!(
            !wide || wide_available(),
            "the wide float kernel needs AVX-512F"
        );
        assert_eq!(x.len(), m * self.k);
        assert_eq!(dst.len(), m * self.n);
        let dst_ptr = dst.as_mut_ptr() as usize;
        // Up to 8 rows (a verification pass) read each weight once: 1-2 rows x 4 tiles, 3-4 rows
        // x 2 tiles, 5-8 rows x 1 tile, so a unit has 4-8 independent FMA chains in registers.
        // More rows (prefill): 4 rows x 2 tiles, row chunks varying fastest so a unit's weights
        // stay in cache across chunks. The wide kernel holds 2 tiles a register and has 32 of
        // them: up to 8 rows x 4 tiles.
        let (rows_per_unit, tiles_per_unit) = match (wide, m) {
            (true, _) => (m.min(8), 4),
            (false, 0..=2) => (m, 4),
            (false, 3..=4) => (m, 2),
            (false, 5..=8) => (m, 1),
            (false, _) => (4, 2),
        };
        let row_chunks = m.div_ceil(rows_per_unit.max(1));
        let units = (self.tiles / tiles_per_unit) * row_chunks;
        crate::model::kernels::parallel::for_each_unit_split(units, |unit| {
            let (g, rc) = (unit / row_chunks, unit % row_chunks);
            let r0 = rc * rows_per_unit;
            let rows = (m - r0).min(rows_per_unit);
            let t0 = g * tiles_per_unit;
            // SAFETY: `available()` (and for the wide kernel `wide_available()`) checked the
            // CPU features; each unit writes only its own (rows, tiles) block of `dst`, inside
            // the bounds asserted above.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                let dst = dst_ptr as *mut f32;
                if wide {
                    match rows {
                        1 => self.wide_block::<1>(x, t0, r0, dst),
                        2 => self.wide_block::<2>(x, t0, r0, dst),
                        3 => self.wide_block::<3>(x, t0, r0, dst),
                        4 => self.wide_block::<4>(x, t0, r0, dst),
                        5 => self.wide_block::<5>(x, t0, r0, dst),
                        6 => self.wide_block::<6>(x, t0, r0, dst),
                        7 => self.wide_block::<7>(x, t0, r0, dst),
                        8 => self.wide_block::<8>(x, t0, r0, dst),
                        other => unreachable!("no wide float block for {other} rows"),
                    }
                    return;
                }
                match (rows, tiles_per_unit) {
                    (1, 4) => self.block::<1, 4>(x, t0, r0, dst),
                    (2, 4) => self.block::<2, 4>(x, t0, r0, dst),
                    (1, 2) => self.block::<1, 2>(x, t0, r0, dst),
                    (2, 2) => self.block::<2, 2>(x, t0, r0, dst),
                    (3, 2) => self.block::<3, 2>(x, t0, r0, dst),
                    (4, 2) => self.block::<4, 2>(x, t0, r0, dst),
                    (5, 1) => self.block::<5, 1>(x, t0, r0, dst),
                    (6, 1) => self.block::<6, 1>(x, t0, r0, dst),
                    (7, 1) => self.block::<7, 1>(x, t0, r0, dst),
                    (8, 1) => self.block::<8, 1>(x, t0, r0, dst),
                    other => unreachable!("no float block for {other:?}"),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (t0, r0, rows, dst_ptr);
        });
    }
}

/// Whether the AVX-512 kernel can run (and `TANDEM_DISABLE_AVX512` is not set). It computes
/// every output with the same fused multiply-add chain as the AVX2 kernel, 16 columns a
/// register instead of 8: a 4-8-token verification is bound by arithmetic, not by streaming
/// the weights (an 8-token f16 forward ran at ~60% of AVX2's peak).
pub fn wide_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        available()
            && packed_gemm::enabled("TANDEM_DISABLE_AVX512", || {
                #[cfg(target_arch = "x86_64")]
                {
                    // VL too: the kernels' 256-bit temporaries then have 32 registers.
                    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl")
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    false
                }
            })
    })
}

impl PackedFloat {
    /// `R` rows times 4 tiles from tile `t0`, row `r0`, on the AVX-512 kernel.
    ///
    /// # Safety
    /// `wide_available()`; the block lies inside `x` and `dst` (`matmul_on` checks).
    #[cfg(target_arch = "x86_64")]
    unsafe fn wide_block<const R: usize>(&self, x: &[f32], t0: usize, r0: usize, dst: *mut f32) {
        match self.elem {
            FloatElem::F16 => wide_block::<R, false>(self, x, t0, r0, dst),
            FloatElem::F32 => wide_block::<R, true>(self, x, t0, r0, dst),
        }
    }

    /// `R` rows times `T` tiles from tile `t0`, row `r0`, on the AVX2 kernel.
    ///
    /// # Safety
    /// `available()`; the block lies inside `x` and `dst` (`matmul_on` checks).
    #[cfg(target_arch = "x86_64")]
    unsafe fn block<const R: usize, const T: usize>(
        &self,
        x: &[f32],
        t0: usize,
        r0: usize,
        dst: *mut f32,
    ) {
        match self.elem {
            FloatElem::F16 => block::<R, T, false>(self, x, t0, r0, dst),
            FloatElem::F32 => block::<R, T, true>(self, x, t0, r0, dst),
        }
    }
}

/// One step's prefetches (each line of the group's stream at one input: one of f16, two of
/// f32), `PREFETCH_BYTES` ahead of step `kk`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_group<const F32: bool>(wbase: *const u8, kk: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let step = GROUP_STEP * if F32 { 4 } else { 2 };
    let p = wbase.wrapping_add(kk * step + PREFETCH_BYTES) as *const i8;
    _mm_prefetch::<_MM_HINT_T0>(p);
    if F32 {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(LINE_BYTES));
    }
}

/// Where tile `t0`'s values at input 0 start: later inputs are a step apart, and the tiles
/// after `t0` in its group `TILE_N` values apart.
fn tile_base(w: &PackedFloat, t0: usize) -> *const u8 {
    let (g, j) = (t0 / TILE_GROUP, t0 % TILE_GROUP);
    w.data
        .as_ptr()
        .cast::<u8>()
        .wrapping_add(g * w.k * w.step_bytes() + j * TILE_N * w.elem.bytes())
}

/// `R` rows times 4 tiles starting at tile `t0`, row `r0`, two tiles a 512-bit register;
/// values f32 (`F32`) or f16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn wide_block<const R: usize, const F32: bool>(
    w: &PackedFloat,
    x: &[f32],
    t0: usize,
    r0: usize,
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    const T: usize = 4;
    let k = w.k;
    let eb = if F32 { 4 } else { 2 };
    let step = GROUP_STEP * eb;
    let mut acc = [[_mm512_setzero_ps(); T / 2]; R];
    let wbase = tile_base(w, t0);
    let xbase = x.as_ptr().add(r0 * k);
    for kk in 0..k {
        prefetch_group::<F32>(wbase, kk);
        let mut wv = [_mm512_setzero_ps(); T / 2];
        for (pair, v) in wv.iter_mut().enumerate() {
            let both = wbase.add(kk * step + 2 * pair * TILE_N * eb);
            // Aligned in its line: 32 bytes of f16, 64 of f32.
            *v = if F32 {
                _mm512_load_ps(both as *const f32)
            } else {
                _mm512_cvtph_ps(_mm256_load_si256(both as *const __m256i))
            };
        }
        for (r, row_acc) in acc.iter_mut().enumerate() {
            let xb = _mm512_set1_ps(*xbase.add(r * k + kk));
            for (a, v) in row_acc.iter_mut().zip(&wv) {
                *a = _mm512_fmadd_ps(*v, xb, *a);
            }
        }
    }
    for (r, row_acc) in acc.iter().enumerate() {
        for (pair, a) in row_acc.iter().enumerate() {
            let mut out = [0f32; 2 * TILE_N];
            _mm512_storeu_ps(out.as_mut_ptr(), *a);
            for half in 0..2 {
                let col0 = (t0 + 2 * pair + half) * TILE_N;
                if col0 >= w.n {
                    break;
                }
                let cols = (w.n - col0).min(TILE_N);
                let row = dst.add((r0 + r) * w.n + col0);
                std::ptr::copy_nonoverlapping(out.as_ptr().add(half * TILE_N), row, cols);
            }
        }
    }
}

/// `R` rows times `T` tiles starting at tile `t0`, row `r0`; values f32 (`F32`) or f16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const R: usize, const T: usize, const F32: bool>(
    w: &PackedFloat,
    x: &[f32],
    t0: usize,
    r0: usize,
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    let k = w.k;
    let eb = if F32 { 4 } else { 2 };
    let step = GROUP_STEP * eb;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let wbase = tile_base(w, t0);
    let xbase = x.as_ptr().add(r0 * k);
    for kk in 0..k {
        // A unit of fewer than 4 tiles shares its lines with the group's other units; the
        // one that owns the group's first tile prefetches them.
        if t0.is_multiple_of(TILE_GROUP) {
            prefetch_group::<F32>(wbase, kk);
        }
        let mut wv = [_mm256_setzero_ps(); T];
        for (j, v) in wv.iter_mut().enumerate() {
            let p = wbase.add(kk * step + j * TILE_N * eb);
            *v = if F32 {
                _mm256_loadu_ps(p as *const f32)
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
            };
        }
        for (r, row_acc) in acc.iter_mut().enumerate() {
            let xb = _mm256_broadcast_ss(&*xbase.add(r * k + kk));
            for (a, v) in row_acc.iter_mut().zip(&wv) {
                *a = _mm256_fmadd_ps(*v, xb, *a);
            }
        }
    }
    for (r, row_acc) in acc.iter().enumerate() {
        for (j, a) in row_acc.iter().enumerate() {
            let col0 = (t0 + j) * TILE_N;
            if col0 >= w.n {
                break;
            }
            let cols = (w.n - col0).min(TILE_N);
            let mut out = [0f32; TILE_N];
            _mm256_storeu_ps(out.as_mut_ptr(), *a);
            let row = dst.add((r0 + r) * w.n + col0);
            std::ptr::copy_nonoverlapping(out.as_ptr(), row, cols);
        }
    }
}

#[cfg(test)]
mod tests;
