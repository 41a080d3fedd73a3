//! A batch-invariant f16-weight matrix multiply for x86 CPUs with AVX2, FMA and F16C.
//!
//! Why it exists: candle's f16 matmul converts each activation row to f16 and runs one
//! (row, column) dot product at a time, so verifying 4 drafted tokens cost 2.2x a single-token
//! step (measured) where reading the weights once should make it nearly free. Here weights are
//! repacked at load into groups of 4 tiles of 8 output columns, interleaved by input index
//! (`[group][k][4 tiles][8]`, so a group's 32 columns at one input are one 64-byte line and a
//! group is one sequential stream for the prefetchers); each 8-value load is converted to f32
//! once and multiplied into up to 8 activation rows kept in f32.
//!
//! Batch invariance by construction: every output element is one fused multiply-add chain over
//! k in ascending order, starting from zero, whatever the number of rows or how rows and tiles
//! are grouped into work units.

use std::sync::OnceLock;

use half::f16;

use crate::model::kernels::packed_gemm::{self, PackedWeight};

const TILE_N: usize = 8;
/// How far ahead in a group's weight stream the kernel prefetches. Without it streaming the
/// weights and the arithmetic do not overlap (a 4-token forward cost 23 ms against 14 ms for
/// one token at depth 64 before groups were one stream); 1, 2, 4 and 8 KB ahead were measured
/// with `tandem forward-bench --weights-dtype f16`, 2 KB the fastest by a few percent.
const PREFETCH_BYTES: usize = 2048;
/// One group's f16 bits at one input index, aligned to a cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u16; GROUP_STEP]);

/// Tiles interleaved into one stream; tiles are padded to a multiple of it.
const TILE_GROUP: usize = 4;
/// f16 values of one group at one input index: one 64-byte line.
const GROUP_STEP: usize = TILE_GROUP * TILE_N;

/// f16 weights `(n, k)` packed for [`PackedF16::matmul`].
pub struct PackedF16 {
    /// f16 bits, `[group][k][4 tiles][8 columns]`, one line a step; columns past `n` are
    /// zero.
    data: Vec<Line>,
    n: usize,
    k: usize,
    tiles: usize,
}

/// Whether this CPU runs the kernel (and `TANDEM_DISABLE_F16_GEMM` is not set).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        packed_gemm::enabled("TANDEM_DISABLE_F16_GEMM", || {
            #[cfg(target_arch = "x86_64")]
            {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        })
    })
}

impl PackedF16 {
    /// Packs little-endian f16 bytes of a row-major `(n, k)` weight; `None` if the byte count
    /// does not match.
    pub fn from_f16_bytes(bytes: &[u8], n: usize, k: usize) -> Option<Self> {
        if n == 0 || k == 0 || bytes.len() != n * k * 2 {
            return None;
        }
        let tiles = n.div_ceil(TILE_N).div_ceil(TILE_GROUP) * TILE_GROUP;
        let mut data = vec![Line([0; GROUP_STEP]); tiles / TILE_GROUP * k];
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            let (g, j) = (t / TILE_GROUP, t % TILE_GROUP);
            let row = &bytes[col * k * 2..(col + 1) * k * 2];
            for (i, v) in row.chunks_exact(2).enumerate() {
                data[g * k + i].0[j * TILE_N + c] = u16::from_le_bytes([v[0], v[1]]);
            }
        }
        Some(Self { data, n, k, tiles })
    }

    /// Packs f32 values (rounded to f16) of a row-major `(n, k)` weight.
    pub fn from_f32(values: &[f32], n: usize, k: usize) -> Option<Self> {
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        Self::from_f16_bytes(&bytes, n, k)
    }
}

impl PackedWeight for PackedF16 {
    fn out_features(&self) -> usize {
        self.n
    }

    fn in_features(&self) -> usize {
        self.k
    }

    fn kernel_name(&self) -> &'static str {
        "f16-gemm"
    }

    fn matmul(&self, x: &[f32], m: usize, dst: &mut [f32]) {
        self.matmul_on(x, m, dst, wide_available());
    }
}

impl PackedF16 {
    /// [`PackedWeight::matmul`], on the AVX-512 kernel if `wide` (same bits either way).
    fn matmul_on(&self, x: &[f32], m: usize, dst: &mut [f32], wide: bool) {
        assert!(available(), "f16_gemm needs AVX2, FMA and F16C");
        assert!(
            !wide || wide_available(),
            "the wide f16 kernel needs AVX-512F"
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
                        1 => wide_block::<1>(self, x, t0, r0, dst),
                        2 => wide_block::<2>(self, x, t0, r0, dst),
                        3 => wide_block::<3>(self, x, t0, r0, dst),
                        4 => wide_block::<4>(self, x, t0, r0, dst),
                        5 => wide_block::<5>(self, x, t0, r0, dst),
                        6 => wide_block::<6>(self, x, t0, r0, dst),
                        7 => wide_block::<7>(self, x, t0, r0, dst),
                        8 => wide_block::<8>(self, x, t0, r0, dst),
                        other => unreachable!("no wide f16 block for {other} rows"),
                    }
                    return;
                }
                match (rows, tiles_per_unit) {
                    (1, 4) => block::<1, 4>(self, x, t0, r0, dst),
                    (2, 4) => block::<2, 4>(self, x, t0, r0, dst),
                    (1, 2) => block::<1, 2>(self, x, t0, r0, dst),
                    (2, 2) => block::<2, 2>(self, x, t0, r0, dst),
                    (3, 2) => block::<3, 2>(self, x, t0, r0, dst),
                    (4, 2) => block::<4, 2>(self, x, t0, r0, dst),
                    (5, 1) => block::<5, 1>(self, x, t0, r0, dst),
                    (6, 1) => block::<6, 1>(self, x, t0, r0, dst),
                    (7, 1) => block::<7, 1>(self, x, t0, r0, dst),
                    (8, 1) => block::<8, 1>(self, x, t0, r0, dst),
                    other => unreachable!("no f16 block for {other:?}"),
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

/// One prefetch per input step (one 64-byte line of the group's stream), `PREFETCH_BYTES`
/// ahead of step `kk`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_group(wbase: *const u16, kk: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let p = wbase.wrapping_add(kk * GROUP_STEP) as *const i8;
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES));
}

/// Where tile `t0`'s values at input 0 start: later inputs are `GROUP_STEP` apart, and the
/// tiles after `t0` in its group `TILE_N` apart.
fn tile_base(w: &PackedF16, t0: usize) -> *const u16 {
    let (g, j) = (t0 / TILE_GROUP, t0 % TILE_GROUP);
    w.data[g * w.k..]
        .as_ptr()
        .cast::<u16>()
        .wrapping_add(j * TILE_N)
}

/// `R` rows times 4 tiles starting at tile `t0`, row `r0`, two tiles a 512-bit register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn wide_block<const R: usize>(
    w: &PackedF16,
    x: &[f32],
    t0: usize,
    r0: usize,
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    const T: usize = 4;
    let k = w.k;
    let mut acc = [[_mm512_setzero_ps(); T / 2]; R];
    let wbase = tile_base(w, t0);
    let xbase = x.as_ptr().add(r0 * k);
    for kk in 0..k {
        prefetch_group(wbase, kk);
        let mut wv = [_mm512_setzero_ps(); T / 2];
        for (pair, v) in wv.iter_mut().enumerate() {
            let both = wbase.add(kk * GROUP_STEP + 2 * pair * TILE_N) as *const __m256i;
            *v = _mm512_cvtph_ps(_mm256_load_si256(both)); // 32-byte aligned in its line
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

/// `R` rows times `T` tiles starting at tile `t0`, row `r0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<const R: usize, const T: usize>(
    w: &PackedF16,
    x: &[f32],
    t0: usize,
    r0: usize,
    dst: *mut f32,
) {
    use std::arch::x86_64::*;
    let k = w.k;
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let wbase = tile_base(w, t0);
    let xbase = x.as_ptr().add(r0 * k);
    for kk in 0..k {
        // A unit of fewer than 4 tiles shares its lines with the group's other units; the
        // one that owns the group's first tile prefetches them.
        if t0.is_multiple_of(TILE_GROUP) {
            prefetch_group(wbase, kk);
        }
        let mut wv = [_mm256_setzero_ps(); T];
        for (j, v) in wv.iter_mut().enumerate() {
            let p = wbase.add(kk * GROUP_STEP + j * TILE_N) as *const __m128i;
            *v = _mm256_cvtph_ps(_mm_loadu_si128(p));
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
mod tests {
    use super::*;
    use crate::model::kernels::packed_gemm::test_support::random;

    #[test]
    fn matches_exact_products_and_is_row_invariant() {
        assert!(
            available(),
            "these tests need an x86-64 CPU with AVX2, FMA and F16C (every CI machine has them)"
        );
        // n = 44 leaves a partial tile and padded tile groups.
        let (n, k) = (44usize, 96usize);
        let w = random(1, n * k);
        let packed = PackedF16::from_f32(&w, n, k).unwrap();
        let wr: Vec<f64> = w.iter().map(|&v| f16::from_f32(v).to_f64()).collect();
        let m = 11;
        let x = random(2, m * k);
        let mut all = vec![0f32; m * n];
        packed.matmul(&x, m, &mut all);
        for r in 0..m {
            for c in 0..n {
                let exact: f64 = (0..k).map(|i| x[r * k + i] as f64 * wr[c * k + i]).sum();
                let got = all[r * n + c] as f64;
                assert!((got - exact).abs() < 1e-4, "({r},{c}): {got} vs {exact}");
            }
        }
        // Every prefix of rows (so every grouping of rows into units) gives the same bits.
        for rows in 1..=m {
            let mut part = vec![0f32; rows * n];
            packed.matmul(&x[..rows * k], rows, &mut part);
            assert!(part[..] == all[..rows * n], "{rows} rows differ");
        }
        for r in 0..m {
            let mut one = vec![0f32; n];
            packed.matmul(&x[r * k..(r + 1) * k], 1, &mut one);
            assert!(one[..] == all[r * n..(r + 1) * n], "row {r} differs alone");
        }
    }

    // Runs where the CPU has AVX-512F and VL (the kernels are chosen at run time); elsewhere
    // the wide kernel is never used and the test says so on stderr.
    #[test]
    fn wide_kernel_gives_the_avx2_kernels_bits() {
        if !wide_available() {
            eprintln!(
                "this CPU lacks AVX-512F/VL (or TANDEM_DISABLE_AVX512 is set): nothing to check"
            );
            return;
        }
        // n = 44: a partial tile and padding; k = 1536 like the MLP's down projection.
        let (n, k) = (44usize, 1536usize);
        let w = random(3, n * k);
        let packed = PackedF16::from_f32(&w, n, k).unwrap();
        for m in [1, 3, 4, 5, 8, 9, 19] {
            let x = random(4 + m as u64, m * k);
            let mut narrow = vec![0f32; m * n];
            let mut wide = vec![0f32; m * n];
            packed.matmul_on(&x, m, &mut narrow, false);
            packed.matmul_on(&x, m, &mut wide, true);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&narrow), bits(&wide), "{m} rows");
        }
    }

    #[test]
    fn the_groups_unpack_to_the_files_exact_weights() {
        let (n, k) = (44usize, 96usize);
        let bytes: Vec<u8> = random(7, n * k)
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        let packed = PackedF16::from_f16_bytes(&bytes, n, k).unwrap();
        for col in 0..n {
            let (t, c) = (col / TILE_N, col % TILE_N);
            for i in 0..k {
                let at = tile_base(&packed, t).wrapping_add(i * GROUP_STEP + c);
                // SAFETY: inside the packed data (the tile exists, i < k, c < 8).
                let got = unsafe { *at };
                let want =
                    u16::from_le_bytes([bytes[(col * k + i) * 2], bytes[(col * k + i) * 2 + 1]]);
                assert_eq!(got, want, "column {col}, input {i}");
            }
        }
    }

    #[test]
    fn refuses_mismatched_bytes() {
        assert!(PackedF16::from_f16_bytes(&[0; 6], 1, 4).is_none());
        assert!(PackedF16::from_f16_bytes(&[], 0, 4).is_none());
    }
}
