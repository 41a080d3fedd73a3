//! What the 8-bit and 4-bit tile kernels share: the activation rows quantized to 8 bits, the
//! instruction sets the kernels are written for, and the driver that runs one tile kernel over
//! every (column tile, chunk of rows) unit in parallel.
//!
//! Why it exists: `q8_gemm` and `q4_gemm` differ only inside a tile (how a weight block is
//! unpacked and scaled); how rows are quantized, how work is split over threads and which
//! dot-product instruction runs must be the same for both, and are written here once.

use std::sync::OnceLock;

use crate::model::kernels::packed_gemm;

/// Output columns per weight tile: one 512-bit vector of 32-bit lanes, or two 256-bit halves.
pub(crate) const TILE_N: usize = 16;
/// Values per quantized block.
pub(crate) const QK: usize = 32;
/// The most activation rows one weight load serves (the AVX-512 kernels, whose 32 registers
/// hold 12 rows' accumulators; 256-bit ones take [`ROWS_256`]): a verification of γ = 8
/// drafts (9 rows) streams the weights once.
pub(crate) const MAX_ROWS: usize = 12;
/// Activation rows a 256-bit kernel serves a weight load: its 16 registers hold no more
/// accumulators.
pub(crate) const ROWS_256: usize = 4;

/// Activation rows quantized to 8 bits per 32-value block, as ggml's Q8_0 does it (shared with
/// `q4_gemm`, whose weights multiply the same 8-bit activations), stored block-major: block `b`
/// of every row, then block `b + 1`. A tile kernel serving `R` rows a weight load then finds
/// all their values for one block, and their scales, at fixed offsets from one pointer, which
/// the instruction can take as an embedded broadcast operand rather than a register per row.
pub(crate) struct QuantRows {
    /// `(block, row, value)`: block `b` of row `r` at `(b · m + r) · 32`.
    pub(crate) qs: Vec<i8>,
    /// `(block, row)`: the scale of block `b` of row `r` at `b · m + r`.
    pub(crate) scales: Vec<f32>,
    /// `(block, row)`: the sum of block `b` of row `r`'s quantized values, `Σa` (exact), which
    /// a kernel multiplying offset weights (`w + c`) subtracts or scales.
    pub(crate) sums: Vec<i32>,
    /// Rows.
    pub(crate) m: usize,
}

impl QuantRows {
    /// Where block `b` of row `r` sits among the blocks (its scale's index; its values start
    /// at 32 times it).
    #[inline(always)]
    pub(crate) fn at(&self, r: usize, b: usize) -> usize {
        b * self.m + r
    }

    /// A pointer to the 4 values of group `g` of block `b` of row `r` (the caller keeps them
    /// inside the rows).
    #[inline(always)]
    pub(crate) unsafe fn group(&self, r: usize, b: usize, g: usize) -> *const i32 {
        self.qs.as_ptr().add(self.at(r, b) * QK + g * 4) as *const i32
    }
}

impl QuantRows {
    const fn new() -> Self {
        Self {
            qs: Vec::new(),
            scales: Vec::new(),
            sums: Vec::new(),
            m: 0,
        }
    }

    /// Sized for `m` rows of `k` values, keeping the buffers' memory: every entry is written by
    /// the quantizer, so nothing is cleared.
    fn reshape(&mut self, m: usize, k: usize) {
        self.m = m;
        let blocks = m * k / QK;
        self.qs.resize(m * k, 0);
        self.scales.resize(blocks, 0.0);
        self.sums.resize(blocks, 0);
    }
}

/// Quantizes the `m` rows of `x` (row-major, a multiple of 32 values each).
#[cfg(test)]
pub(crate) fn quantize_rows(x: &[f32], m: usize) -> QuantRows {
    let mut out = QuantRows::new();
    quantize_rows_into(x, m, &mut out);
    out
}

/// Quantizes the `m` rows of `x` into `out`, reusing its memory.
fn quantize_rows_into(x: &[f32], m: usize, out: &mut QuantRows) {
    assert!(m > 0 && x.len().is_multiple_of(m * QK));
    out.reshape(m, x.len() / m);
    #[cfg(target_arch = "x86_64")]
    if packed_gemm::has_avx2_fma() {
        let at = (
            out.qs.as_mut_ptr() as usize,
            out.scales.as_mut_ptr() as usize,
            out.sums.as_mut_ptr() as usize,
        );
        // SAFETY: the CPU has AVX2 and FMA; the buffers hold `m` rows of `k` values (just
        // reshaped), and each call writes only its own rows' blocks.
        let rows = |r: std::ops::Range<usize>| unsafe {
            quantize_rows_avx2(
                x,
                m,
                r,
                (at.0 as *mut i8, at.1 as *mut f32, at.2 as *mut i32),
            )
        };
        if m >= PARALLEL_ROWS {
            crate::model::kernels::parallel::for_each_split(m, rows);
        } else {
            rows(0..m);
        }
        return;
    }
    quantize_rows_portable(x, out)
}

/// From this many rows (a prefill's) the rows are quantized on every thread: a long prompt's
/// quantizing on the calling thread alone was the largest serial part of its forward. A
/// verification's rows (at most 12 a weight load) stay on the calling thread, where waking
/// the pool would cost more.
const PARALLEL_ROWS: usize = 16;

/// Calls `f` with the `m` rows of `x` quantized into memory the calling thread keeps across
/// calls: a forward quantizes the activations of every matmul, and allocating (and clearing)
/// them each time was a visible share of a wide forward's serial time.
pub(crate) fn with_quantized<R>(x: &[f32], m: usize, f: impl FnOnce(&QuantRows) -> R) -> R {
    thread_local! {
        static ROWS: std::cell::RefCell<QuantRows> =
            const { std::cell::RefCell::new(QuantRows::new()) };
    }
    ROWS.with(|rows| match rows.try_borrow_mut() {
        Ok(mut q) => {
            quantize_rows_into(x, m, &mut q);
            f(&q)
        }
        // A matmul inside another's closure (none today): quantize into fresh memory.
        Err(_) => {
            let mut q = QuantRows::new();
            quantize_rows_into(x, m, &mut q);
            f(&q)
        }
    })
}

/// [`quantize_rows_portable`]'s arithmetic eight values at a time: the same maximum, the same
/// IEEE quotient and products, rounding half away from zero as `f32::round` does (truncate,
/// then step away from zero where the dropped fraction is at least a half; both exact), so the
/// same bits for finite inputs. The scalar loop compiled to one value at a time, and at 8
/// rows quantizing took a fifth of a matmul's time on the calling thread alone.
///
/// Quantizes `rows` of the `m` rows of `x` into the block-major buffers `(qs, scales, sums)`,
/// which hold all `m` rows; blocks of other rows are not touched.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_rows_avx2(
    x: &[f32],
    m: usize,
    rows: std::ops::Range<usize>,
    (qs, scales, sums): (*mut i8, *mut f32, *mut i32),
) {
    use std::arch::x86_64::*;
    let k = x.len() / m;
    let sign = _mm256_set1_ps(-0.0);
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    for r in rows {
        for b in 0..k / QK {
            let at = b * m + r;
            let src = x.as_ptr().add(r * k + b * QK);
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(8 * i)));
            let abs = |v: __m256| _mm256_andnot_ps(sign, v);
            let m8 = _mm256_max_ps(
                _mm256_max_ps(abs(v[0]), abs(v[1])),
                _mm256_max_ps(abs(v[2]), abs(v[3])),
            );
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let idv = _mm256_set1_ps(id);
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                let y = _mm256_mul_ps(v[i], idv);
                let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
                let away = _mm256_cmp_ps::<_CMP_GE_OQ>(abs(_mm256_sub_ps(y, t)), half);
                let step = _mm256_and_ps(away, _mm256_or_ps(one, _mm256_and_ps(sign, y)));
                _mm256_cvttps_epi32(_mm256_add_ps(t, step))
            });
            let words = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let bytes = _mm256_permutevar8x32_epi32(words, order);
            _mm256_storeu_si256(qs.add(at * QK) as *mut __m256i, bytes);
            *scales.add(at) = d;
            // Σa: byte pairs (1 · a, exact in 16 bits), then word pairs, then the 8 lanes.
            let s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16);
            let s4 = _mm_add_epi32(
                _mm256_castsi256_si128(s8),
                _mm256_extracti128_si256::<1>(s8),
            );
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            *sums.add(at) = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
        }
    }
}

fn quantize_rows_portable(x: &[f32], out: &mut QuantRows) {
    let k = x.len() / out.m;
    for (r, row) in x.chunks_exact(k).enumerate() {
        for (b, xs) in row.chunks_exact(QK).enumerate() {
            let at = out.at(r, b);
            // The largest magnitude in eight lanes, then across them: a maximum is exact, so
            // the order does not change it (for finite values), and the lanes vectorize where
            // one running maximum would be a chain of 32 dependent steps.
            let mut lanes = [0f32; 8];
            for eight in xs.chunks_exact(8) {
                for (l, v) in lanes.iter_mut().zip(eight) {
                    *l = l.max(v.abs());
                }
            }
            let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in out.qs[at * QK..(at + 1) * QK].iter_mut().zip(xs) {
                *q = (v * id).round() as i8;
                sum += *q as i32;
            }
            out.scales[at] = d;
            out.sums[at] = sum;
        }
    }
}

/// Runs `tile(t, r0, rows, dst)` for every column tile `t` of an `(m, n)` output and every
/// chunk of at most `chunk` rows starting at `r0`, in parallel, each thread a contiguous run
/// of tiles (one sequential stream of weights). Row chunks vary fastest so a worker keeps one
/// column tile's weights in cache. Each call owns the `(rows, TILE_N)` block
/// of `dst` it is given (`dst` is the whole output's start). How rows are chunked never
/// changes a result: every output element is computed by the same operations in any chunk.
pub(crate) fn for_each_tile(
    m: usize,
    n: usize,
    chunk: usize,
    dst: &mut [f32],
    tile: impl Fn(usize, usize, usize, *mut f32) + Sync,
) {
    assert_eq!(dst.len(), m * n);
    let n_tiles = n.div_ceil(TILE_N);
    let row_chunks = m.div_ceil(chunk);
    let dst_ptr = dst.as_mut_ptr() as usize;
    crate::model::kernels::parallel::for_each_unit_split(n_tiles * row_chunks, |unit| {
        let (t, rc) = (unit / row_chunks, unit % row_chunks);
        let r0 = rc * chunk;
        tile(t, r0, (m - r0).min(chunk), dst_ptr as *mut f32);
    });
}

/// A packed weight's values back out, `(n, k)` row-major: `value(tile block, column in the
/// tile, value in the block)` for every one, where tile block `t · (k / 32) + b` is column
/// tile `t`'s block `b` (the tests' check that a layout holds the file's exact weights).
#[cfg(test)]
pub(crate) fn unpack_with(
    n: usize,
    k: usize,
    value: impl Fn(usize, usize, usize) -> f32,
) -> Vec<f32> {
    let kb = k / QK;
    let mut out = vec![0f32; n * k];
    for col in 0..n {
        let (t, c) = (col / TILE_N, col % TILE_N);
        for b in 0..kb {
            for i in 0..QK {
                out[col * k + b * QK + i] = value(t * kb + b, c, i);
            }
        }
    }
    out
}

/// Stores the first `cols` lanes of `v` at `dst` (a tile's row, cut at the matrix's edge).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn store_cols_256(v: std::arch::x86_64::__m256, dst: *mut f32, cols: usize) {
    let mut out = [0f32; 8];
    std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), v);
    std::ptr::copy_nonoverlapping(out.as_ptr(), dst, cols.min(8));
}

/// Moves bit `k` of every byte of `h` to bit 4, where a 5-bit value's fifth bit goes (the
/// caller masks the other bits off: the 16-bit shifts carry bits between bytes).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn bit_to_4_512(
    h: std::arch::x86_64::__m512i,
    k: usize,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    match k {
        0 => _mm512_slli_epi16::<4>(h),
        1 => _mm512_slli_epi16::<3>(h),
        2 => _mm512_slli_epi16::<2>(h),
        3 => _mm512_slli_epi16::<1>(h),
        4 => h,
        5 => _mm512_srli_epi16::<1>(h),
        6 => _mm512_srli_epi16::<2>(h),
        _ => _mm512_srli_epi16::<3>(h),
    }
}

/// [`bit_to_4_512`] on 256 bits.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn bit_to_4_256(
    h: std::arch::x86_64::__m256i,
    k: usize,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    match k {
        0 => _mm256_slli_epi16::<4>(h),
        1 => _mm256_slli_epi16::<3>(h),
        2 => _mm256_slli_epi16::<2>(h),
        3 => _mm256_slli_epi16::<1>(h),
        4 => h,
        5 => _mm256_srli_epi16::<1>(h),
        6 => _mm256_srli_epi16::<2>(h),
        _ => _mm256_srli_epi16::<3>(h),
    }
}

/// What every tile kernel is given: the weights `W`, the quantized rows, a per-(row, block)
/// figure of the kernel's own (`S`), the column tile, the first row and the output's start.
pub(crate) type TileArgs<'a, W, S> = (&'a W, &'a QuantRows, &'a [S], usize, usize, *mut f32);

/// Runs the calling module's `tile_kernel_avx2`, `tile_kernel_vnni` and `tile_kernel_vnni512`
/// (each `fn<const R: usize>(TileArgs)`) for `$isa` over every (column tile, row chunk) of the
/// `($m, $w.n)` output `$dst`, in parallel, each given `($w, $q, $per_block, t, r0, dst)`.
/// The caller has checked the CPU features of `$isa` and the shapes of `$q` and `$dst`.
macro_rules! run_tile_kernels {
    ($isa:expr, $m:expr, $w:expr, $q:expr, $per_block:expr, $dst:expr) => {
        // SAFETY (of each call): the caller checked the CPU features of `$isa`; the driver
        // hands each tile its own (rows, 16-column) block of `dst`, inside the output, with at
        // most `rows_per_load` rows.
        #[cfg(target_arch = "x86_64")]
        $crate::model::kernels::tile_driver::for_each_tile(
            $m,
            $w.n,
            $isa.rows_per_load(),
            $dst,
            |t, r0, rows, dst| unsafe {
                use $crate::model::kernels::tile_driver::{with_const_rows, DotIsa};
                let args = ($w, $q, $per_block, t, r0, dst);
                match $isa {
                    DotIsa::Avx2 => with_const_rows!(rows, tile_kernel_avx2(args)),
                    DotIsa::AvxVnni => with_const_rows!(rows, tile_kernel_vnni(args)),
                    DotIsa::Avx512Vnni => with_const_rows!(rows, tile_kernel_vnni512(args)),
                }
            },
        );
    };
}
pub(crate) use run_tile_kernels;

/// Calls `$kernel::<R>($args)` with the const `R` equal to the runtime `$rows` (1 to
/// [`MAX_ROWS`]), so each row count gets a kernel whose loops over rows are fully unrolled and
/// whose accumulators stay in registers.
/// A kernel with generic parameters of its own names them first: `$kernel::<H>(args)` calls
/// `$kernel::<H, R>`.
macro_rules! with_const_rows {
    ($rows:expr, $kernel:ident($($arg:expr),*)) => {
        $crate::model::kernels::tile_driver::with_const_rows!($rows, $kernel::<>($($arg),*))
    };
    ($rows:expr, $kernel:ident::<$($g:ident),*>($($arg:expr),*)) => {
        match $rows {
            1 => $kernel::<$($g,)* 1>($($arg),*),
            2 => $kernel::<$($g,)* 2>($($arg),*),
            3 => $kernel::<$($g,)* 3>($($arg),*),
            4 => $kernel::<$($g,)* 4>($($arg),*),
            5 => $kernel::<$($g,)* 5>($($arg),*),
            6 => $kernel::<$($g,)* 6>($($arg),*),
            7 => $kernel::<$($g,)* 7>($($arg),*),
            8 => $kernel::<$($g,)* 8>($($arg),*),
            9 => $kernel::<$($g,)* 9>($($arg),*),
            10 => $kernel::<$($g,)* 10>($($arg),*),
            11 => $kernel::<$($g,)* 11>($($arg),*),
            12 => $kernel::<$($g,)* 12>($($arg),*),
            r => unreachable!("a row chunk of {r} rows"),
        }
    };
}
pub(crate) use with_const_rows;

/// The instruction set of the 8-bit and 4-bit tile kernels; every one gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DotIsa {
    Avx2,
    AvxVnni,
    Avx512Vnni,
}

impl DotIsa {
    /// The fastest this CPU has: AVX-512 VNNI (unless `TANDEM_DISABLE_AVX512` or
    /// `TANDEM_DISABLE_VNNI` is set), then AVX-VNNI (unless `TANDEM_DISABLE_VNNI`), then AVX2.
    pub(crate) fn best() -> DotIsa {
        static BEST: OnceLock<DotIsa> = OnceLock::new();
        *BEST.get_or_init(|| *Self::available().last().expect("AVX2 is always listed"))
    }

    /// Every instruction set this CPU runs the kernels on, slowest first (for tests).
    pub(crate) fn available() -> Vec<DotIsa> {
        let mut out = vec![DotIsa::Avx2];
        #[cfg(target_arch = "x86_64")]
        {
            if packed_gemm::enabled("TANDEM_DISABLE_VNNI", || {
                is_x86_feature_detected!("avxvnni")
            }) {
                out.push(DotIsa::AvxVnni);
            }
            let avx512_vnni = || {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
            };
            if packed_gemm::enabled("TANDEM_DISABLE_VNNI", || true)
                && packed_gemm::enabled("TANDEM_DISABLE_AVX512", avx512_vnni)
            {
                out.push(DotIsa::Avx512Vnni);
            }
        }
        out
    }

    /// Activation rows one weight load serves on this instruction set.
    pub(crate) fn rows_per_load(self) -> usize {
        match self {
            DotIsa::Avx512Vnni => MAX_ROWS,
            DotIsa::Avx2 | DotIsa::AvxVnni => ROWS_256,
        }
    }

    /// For the start-up log.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DotIsa::Avx2 => "AVX2",
            DotIsa::AvxVnni => "AVX-VNNI",
            DotIsa::Avx512Vnni => "AVX-512 VNNI",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_quantizer_gives_the_scalar_bits_block_major() {
        if !packed_gemm::has_avx2_fma() {
            panic!("this test needs an x86-64 CPU with AVX2, FMA and F16C (every CI machine)");
        }
        let (m, k) = (3usize, 96usize);
        let mut x = crate::model::kernels::packed_gemm::test_support::random(7, m * k);
        // Ties, where rounding half away from zero and half to even differ: a block whose
        // largest magnitude is 127 (so each value is its own quotient) holding ±0.5, ±1.5,
        // ±2.5 and -0.0; and an all-zero block.
        x[0] = 127.0;
        for (i, v) in [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, -0.0, 126.5]
            .iter()
            .enumerate()
        {
            x[1 + i] = *v;
        }
        x[k + QK..k + 2 * QK].fill(0.0);
        // The vector quantizer against the scalar loop: the same values, sums and scale bits.
        let scalar_equals_vector = |x: &[f32], m: usize, k: usize| -> QuantRows {
            let fast = quantize_rows(x, m);
            let mut slow = QuantRows::new();
            slow.reshape(m, k);
            quantize_rows_portable(x, &mut slow);
            assert_eq!(fast.qs, slow.qs, "{m} rows");
            assert_eq!(fast.sums, slow.sums, "{m} rows");
            let bits = |q: &QuantRows| q.scales.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "{m} rows");
            slow
        };
        let slow = scalar_equals_vector(&x, m, k);
        assert_eq!(&slow.qs[1..9], &[1, -1, 2, -2, 3, -3, 0, 127]);
        // Enough rows to be quantized on every thread.
        let (m2, k2) = (PARALLEL_ROWS + 25, 64usize);
        let x2 = crate::model::kernels::packed_gemm::test_support::random(9, m2 * k2);
        scalar_equals_vector(&x2, m2, k2);
        // Block-major: row 1's second block sits after every row's first block.
        let at = slow.at(1, 1);
        assert_eq!(at, m + 1);
        assert!(slow.qs[at * QK..(at + 1) * QK].iter().all(|&q| q == 0));
        assert_eq!(slow.scales[at], 0.0);
        for r in 0..m {
            for b in 0..k / QK {
                let (blk, d) = (&x[r * k + b * QK..][..QK], slow.scales[slow.at(r, b)]);
                let q = &slow.qs[slow.at(r, b) * QK..][..QK];
                let sum: i32 = q.iter().map(|&v| v as i32).sum();
                assert_eq!(slow.sums[slow.at(r, b)], sum);
                for (v, &qv) in blk.iter().zip(q) {
                    assert!(
                        (v - d * qv as f32).abs() <= d * 0.5 + 1e-6,
                        "{v} vs {qv} · {d}"
                    );
                }
            }
        }
    }
}
