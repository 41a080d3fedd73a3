//! The AVX-512 BF16 kernels of a bf16 cache's attention (`vdpbf16ps`): the bits of
//! `bf16_pairs`' scalar definitions, two multiply-adds a lane per instruction.
//!
//! - Scores, a key in the lanes: a key's 16 pairs a register, eight keys at a time, folded by
//!   the f32 kernels' reduction (`halves_sum`, `reduce_eight_keys`).
//! - Scores of a run's units, keys along the lanes: a chunk of keys transposed once as pairs
//!   (16 × 16 tiles of 32-bit pairs), then each unit's sixteen chains are sixteen registers of
//!   sixteen keys, folded by vertical adds in the same order.
//! - Value sums: two value rows interleaved into pairs (one permute a register), weighed by
//!   the two keys' weights as one broadcast pair.

use std::arch::x86_64::*;

use super::avx512::halves_sum;
use super::bf16_pairs::WeightBits;
use super::shared::{lane_sum, prefetch_row, reduce_eight_keys, KvForm, KvRows, PREFETCH_ROWS};
use super::vertical::{transpose16, CHUNK};

/// Whether the bf16 kernels may run: AVX-512 BF16 and the AVX-512 kernels' switch
/// (`TANDEM_DISABLE_AVX512=1` turns them off with the others).
pub(super) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        super::shared::simd_available()
            && super::shared::wide_available()
            && is_x86_feature_detected!("avx512bf16")
    })
}

/// `vdpbf16ps` on integer registers holding bf16 pairs.
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
pub(super) unsafe fn dp(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
    let pairs = |x| std::mem::transmute::<__m512i, __m512bh>(x);
    _mm512_dpbf16_ps(acc, pairs(a), pairs(b))
}

/// `src` rounded to bf16 bits into `dst` (as long), `bf16_pairs::round` for each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn round_slice(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let whole = src.len() / 32 * 32;
    for i in (0..whole).step_by(32) {
        let lo = _mm512_loadu_ps(sp.add(i));
        let hi = _mm512_loadu_ps(sp.add(i + 16));
        let r = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dp.add(i).cast(), r);
    }
    for i in whole..src.len() {
        dst[i] = super::bf16_pairs::round(src[i]).to_bits();
    }
}

/// See `bf16_pairs::scaled_dots`: `q` is bf16 bits, a multiple of 32 long, and every key read
/// is inside `keys` (the caller checks both).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
pub(super) unsafe fn scaled_dots<K: KvRows>(
    q: &[u16],
    keys: K,
    (stride, offset): (usize, usize),
    scale: f32,
    scores: &mut [f32],
) {
    debug_assert!(K::FORM == KvForm::Bf16);
    let blocks = q.len() / 32;
    let (qp, kp) = (q.as_ptr(), keys.base().cast::<u16>());
    let key = |j: usize, c: usize| _mm512_loadu_si512(kp.add(offset + j * stride + 32 * c).cast());
    let n = scores.len();
    let sv = _mm256_set1_ps(scale);
    let mut j = 0;
    while j + 8 <= n {
        let mut acc = [_mm512_setzero_ps(); 8];
        for i in 0..8 {
            prefetch_row(keys, offset + (j + i + PREFETCH_ROWS) * stride, q.len());
        }
        for c in 0..blocks {
            let qz = _mm512_loadu_si512(qp.add(32 * c).cast());
            for (i, a) in acc.iter_mut().enumerate() {
                *a = dp(*a, qz, key(j + i, c));
            }
        }
        let folded: [__m256; 8] = std::array::from_fn(|i| halves_sum(acc[i]));
        let sums = reduce_eight_keys(folded);
        _mm256_storeu_ps(scores.as_mut_ptr().add(j), _mm256_mul_ps(sums, sv));
        j += 8;
    }
    while j < n {
        let mut acc = _mm512_setzero_ps();
        for c in 0..blocks {
            acc = dp(acc, _mm512_loadu_si512(qp.add(32 * c).cast()), key(j, c));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), halves_sum(acc));
        scores[j] = lane_sum(&lanes) * scale;
        j += 1;
    }
}

/// [`scaled_dots`] for `M` queries (2 or 3, bf16 bits, `q[m * dim..][..dim]`) reading the same
/// `n` keys, each key block loaded once for all of them; query `m`'s scores go to
/// `scores[m * score_stride..][..n]`, the bits [`scaled_dots`] gives each. `dim` a multiple of
/// 32; every read and write inside its slice (the caller checks).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn scaled_dots_shared<K: KvRows, const M: usize>(
    q: &[u16],
    keys: K,
    (stride, offset): (usize, usize),
    scale: f32,
    (scores, score_stride): (&mut [f32], usize),
    n: usize,
) {
    debug_assert!(K::FORM == KvForm::Bf16);
    let dim = q.len() / M;
    let (qp, kp, sp) = (q.as_ptr(), keys.base().cast::<u16>(), scores.as_mut_ptr());
    let key = |j: usize, c: usize| _mm512_loadu_si512(kp.add(offset + j * stride + 32 * c).cast());
    let sv = _mm256_set1_ps(scale);
    let mut j = 0;
    while j + 8 <= n {
        let mut acc = [[_mm512_setzero_ps(); 8]; M];
        for i in 0..8 {
            prefetch_row(keys, offset + (j + i + PREFETCH_ROWS) * stride, dim);
        }
        for c in 0..dim / 32 {
            let qz: [__m512i; M] =
                std::array::from_fn(|m| _mm512_loadu_si512(qp.add(m * dim + 32 * c).cast()));
            for i in 0..8 {
                let k = key(j + i, c);
                for m in 0..M {
                    acc[m][i] = dp(acc[m][i], qz[m], k);
                }
            }
        }
        for (m, a) in acc.iter().enumerate() {
            let folded: [__m256; 8] = std::array::from_fn(|i| halves_sum(a[i]));
            let sums = reduce_eight_keys(folded);
            _mm256_storeu_ps(sp.add(m * score_stride + j), _mm256_mul_ps(sums, sv));
        }
        j += 8;
    }
    if j < n {
        for m in 0..M {
            let out = std::slice::from_raw_parts_mut(sp.add(m * score_stride + j), n - j);
            let at = (stride, offset + j * stride);
            scaled_dots(&q[m * dim..][..dim], keys, at, scale, out);
        }
    }
}

/// Keys `0..n` (`n ≤ CHUNK`; key `j` at element `j * stride + offset`, `dim` a multiple of
/// 32) as pairs into `out[p * CHUNK + j]` (pair `p` of key `j`, 32 bits); keys `n..` of the
/// last tile of 16 are zeros. The caller checks every read is inside `keys` and `out` holds
/// `dim / 2 * CHUNK` pairs.
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn transpose_pairs<K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    dim: usize,
    n: usize,
    out: *mut u32,
) {
    let kp = keys.base().cast::<u16>();
    for tile in 0..n.div_ceil(16) {
        for r in 0..16 {
            let j = tile * 16 + r + PREFETCH_ROWS;
            prefetch_row(keys, j * stride + offset, dim);
        }
        for t in 0..dim / 32 {
            let rows: [__m512; 16] = std::array::from_fn(|r| {
                let j = tile * 16 + r;
                if j < n {
                    _mm512_loadu_ps(kp.add(j * stride + offset + 32 * t).cast())
                } else {
                    _mm512_setzero_ps()
                }
            });
            let cols = transpose16(rows);
            for (p, c) in cols.iter().enumerate() {
                _mm512_storeu_ps(out.add((16 * t + p) * CHUNK + 16 * tile).cast(), *c);
            }
        }
    }
}

/// `out[m][j] = dot(q[m], key j) · scale` for keys `j < n` of a chunk transposed as pairs
/// (`kt`), `M` queries of bf16 bits at once (`dim` a multiple of 32): lane `l`'s chain over
/// the pairs `16c + l`, `lane l + lane l+8`, then `lane_sum`'s pairing, as
/// `bf16_pairs::dot`. Every read and write is inside its buffer (the caller checks).
#[target_feature(enable = "avx512f,avx512vl,avx512bf16")]
#[allow(clippy::needless_range_loop)]
unsafe fn vertical_scores<const M: usize>(
    q: [*const u32; M],
    dim: usize,
    ktp: *const u32,
    n: usize,
    scale: f32,
    out: [*mut f32; M],
) {
    let sv = _mm512_set1_ps(scale);
    for tile in 0..n.div_ceil(16) {
        let chains = |ls: [usize; 4]| -> [[__m512; M]; 4] {
            let mut acc = [[_mm512_setzero_ps(); M]; 4];
            for c in 0..dim / 32 {
                for (a, l) in acc.iter_mut().zip(ls) {
                    let p = 16 * c + l;
                    let k = _mm512_loadu_si512(ktp.add(p * CHUNK + 16 * tile).cast());
                    for m in 0..M {
                        let q = _mm512_set1_epi32(q[m].add(p).read_unaligned() as i32);
                        a[m] = dp(a[m], q, k);
                    }
                }
            }
            acc
        };
        super::vertical::store_scores(super::vertical::fold_chains(chains), sv, (n, tile), out);
    }
}

/// The bf16 form of `vertical::transposed_scores`: `units` queries (`query(m)`, bf16 bits
/// rounded once for the whole call) against keys `0..n` (`n ≤ CHUNK`), scores to
/// `out.0[m * out.1..][..n]`, the bits of `bf16_pairs::scaled_dots`. `dim` a multiple of 32;
/// every key read inside `keys`.
#[allow(clippy::too_many_arguments)]
pub(super) fn transposed_scores<'q, K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    n: usize,
    (units, query): (usize, &dyn Fn(usize) -> &'q [u16]),
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
    kt: &mut Vec<f32>,
) {
    let dim = query(0).len();
    assert!(available() && dim.is_multiple_of(32) && n <= CHUNK);
    assert!(n == 0 || (n - 1) * stride + offset + dim <= keys.elements());
    assert!(n == 0 || (units - 1) * out_stride + n <= out.len());
    // The transposed pairs, 32 bits each, in the caller's buffer.
    if kt.len() < dim / 2 * CHUNK {
        kt.resize(dim / 2 * CHUNK, 0.0);
    }
    let kt = kt.as_mut_ptr().cast::<u32>();
    // SAFETY: AVX-512 BF16 was checked (asserted); every key read is inside `keys`, the
    // transposed pairs inside `kt`, every query `dim` long (asserted per group) and every score
    // inside `out` (asserted above).
    unsafe {
        transpose_pairs(keys, (stride, offset), dim, n, kt);
        let op = out.as_mut_ptr();
        macro_rules! group {
            ($m:expr, $M:literal) => {{
                let q: [*const u32; $M] = std::array::from_fn(|k| {
                    let q = query($m + k);
                    assert_eq!(q.len(), dim);
                    q.as_ptr().cast::<u32>()
                });
                let o: [*mut f32; $M] = std::array::from_fn(|k| op.add(($m + k) * out_stride));
                vertical_scores::<$M>(q, dim, kt, n, scale, o)
            }};
        }
        super::shared::in_fours!(units, group);
    }
}

/// Word indices taking element `i` of row 0 and row 1 (`a` and `b` of `vpermt2w`) into pair
/// `i` for `i` in `16h..16h + 16`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn pair_index(h: usize) -> __m512i {
    let idx: [u16; 32] = std::array::from_fn(|w| {
        let i = (16 * h + w / 2) as u16;
        if w % 2 == 0 {
            i
        } else {
            32 + i
        }
    });
    _mm512_loadu_si512(idx.as_ptr().cast())
}

/// Elements 0..32 of the row at `at` and of the row `stride` after it (zeros for a `lone` row
/// with no partner, which is not read), their pairs `idx` picks ([`pair_index`]): 16 pairs.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn interleave(at: *const u16, stride: usize, lone: bool, idx: __m512i) -> __m512i {
    let r0 = _mm512_loadu_si512(at.cast());
    let r1 = if lone {
        _mm512_setzero_si512()
    } else {
        _mm512_loadu_si512(at.add(stride).cast())
    };
    _mm512_permutex2var_epi16(r0, idx, r1)
}

/// Value rows `0..n` (`n ≤ CHUNK`; row `j` at element `j * stride + offset`, `dim` a multiple
/// of 32) interleaved into pairs, once for all of a run's units: pair `t` (rows `2t, 2t + 1`;
/// a zero row after an odd `n`) is `out[t * dim..][..dim]`, element `d` of both rows as one
/// 32-bit pair. Returns whether it ran (AVX-512 BF16 here); the caller checks every read is
/// inside `rows`.
pub(super) fn pair_rows<K: KvRows>(
    rows: K,
    (stride, offset): (usize, usize),
    n: usize,
    dim: usize,
    out: &mut Vec<f32>,
) -> bool {
    if K::FORM != KvForm::Bf16 || !available() || !dim.is_multiple_of(32) {
        return false;
    }
    assert!(n <= CHUNK);
    assert!(n == 0 || (n - 1) * stride + offset + dim <= rows.elements());
    if out.len() < dim * CHUNK.div_ceil(2) {
        out.resize(dim * CHUNK.div_ceil(2), 0.0);
    }
    // SAFETY: AVX-512 BF16 was checked; every read is inside `rows` and every write inside
    // `out` (asserted above).
    unsafe { pair_rows_wide(rows, (stride, offset), n, dim, out) };
    true
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn pair_rows_wide<K: KvRows>(
    rows: K,
    (stride, offset): (usize, usize),
    n: usize,
    dim: usize,
    out: &mut [f32],
) {
    let (vp, op) = (rows.base().cast::<u16>(), out.as_mut_ptr());
    let (lo, hi) = (pair_index(0), pair_index(1));
    for t in 0..n.div_ceil(2) {
        let j = 2 * t;
        prefetch_row(rows, offset + (j + PREFETCH_ROWS) * stride, dim);
        prefetch_row(rows, offset + (j + 1 + PREFETCH_ROWS) * stride, dim);
        for b in 0..dim / 32 {
            let at = vp.add(offset + j * stride + 32 * b);
            let o = op.add(t * dim + 32 * b);
            for (h, idx) in [lo, hi].into_iter().enumerate() {
                let p = interleave(at, stride, j + 1 == n, idx);
                _mm512_storeu_si512(o.add(16 * h).cast(), p);
            }
        }
    }
}

/// Each head's first weight (for heads that are not there, a pointer never read).
fn heads_of(weights: WeightBits) -> [*const u16; 3] {
    std::array::from_fn(|m| weights.bits.as_ptr().wrapping_add(m * weights.stride))
}

/// Pair `t` of the weights at `w` (keys `2t, 2t + 1`) as one 32-bit word.
#[inline]
unsafe fn weight_pair(w: *const u16, t: usize) -> u32 {
    w.add(2 * t).cast::<u32>().read_unaligned()
}

/// `bf16_pairs::accumulate_values` for `heads` heads (at most 3) weighing the first `n` rows
/// of paired value rows ([`pair_rows`]) by rounded weights ([`WeightBits`]): head `m`'s even
/// and odd sums `acc[m * 2 * dim..][..2 * dim]`. Every access is inside its slice (the caller
/// checks); AVX-512 BF16 runs (the caller checked `pair_rows`' answer).
pub(super) fn accumulate_paired(
    weights: WeightBits,
    n: usize,
    heads: usize,
    paired: &[f32],
    acc: &mut [f32],
) {
    let dim = acc.len() / (2 * heads);
    assert!((1..=3).contains(&heads) && n <= CHUNK && dim.is_multiple_of(32));
    assert!(paired.len() >= n.div_ceil(2) * dim);
    weights.check(heads, n);
    let w = heads_of(weights);
    // SAFETY: AVX-512 BF16 ran `pair_rows`; every access is inside its slice (asserted); a
    // lone last key's pair holds a zero partner, masked off anyway.
    unsafe { paired_wide(w, n, heads, paired, acc) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn paired_wide(w: [*const u16; 3], n: usize, heads: usize, paired: &[f32], acc: &mut [f32]) {
    let dim = acc.len() / (2 * heads);
    let pp = paired.as_ptr().cast::<u32>();
    let pair = |t: usize, e: usize, _lone: bool| _mm512_loadu_si512(pp.add(t * dim + e).cast());
    sums_for_heads(heads, w, n, &pair, acc);
}

/// The same over value rows as they lie in the cache (rows `j` at element `j * stride +
/// offset` of `values`), each pair interleaved in registers as it is used: for a step's few
/// heads, where pairing a chunk into memory first cost more than it saved.
pub(super) fn accumulate_rows<K: KvRows>(
    weights: WeightBits,
    n: usize,
    heads: usize,
    values: K,
    (stride, offset): (usize, usize),
    acc: &mut [f32],
) {
    debug_assert!(K::FORM == KvForm::Bf16);
    let dim = acc.len() / (2 * heads);
    assert!(available() && (1..=3).contains(&heads) && dim.is_multiple_of(32));
    assert!(n == 0 || (n - 1) * stride + offset + dim <= values.elements());
    weights.check(heads, n);
    let w = heads_of(weights);
    // SAFETY: AVX-512 BF16 is here (asserted); every row read is inside `values` and every
    // weight inside `weights` (asserted), a lone last key's partner row never read.
    unsafe { rows_wide(w, n, heads, values, (stride, offset), acc) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn rows_wide<K: KvRows>(
    w: [*const u16; 3],
    n: usize,
    heads: usize,
    values: K,
    (stride, offset): (usize, usize),
    acc: &mut [f32],
) {
    let vp = values.base().cast::<u16>();
    let (lo, hi) = (pair_index(0), pair_index(1));
    let pair = |t: usize, e: usize, lone: bool| {
        let at = offset + 2 * t * stride + e / 32 * 32;
        if e.is_multiple_of(32) {
            prefetch_row(values, at + PREFETCH_ROWS * stride, 32);
            prefetch_row(values, at + (PREFETCH_ROWS + 1) * stride, 32);
        }
        let idx = if e.is_multiple_of(32) { lo } else { hi };
        interleave(vp.add(at), stride, lone, idx)
    };
    sums_for_heads(heads, w, n, &pair, acc);
}

/// [`pair_sums`] for `heads` heads (1 to 3), in the widest block the head size divides (64
/// or 32 elements).
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512bf16")]
#[inline]
unsafe fn sums_for_heads<F: Fn(usize, usize, bool) -> __m512i>(
    heads: usize,
    w: [*const u16; 3],
    n: usize,
    pair: &F,
    acc: &mut [f32],
) {
    let wide = (acc.len() / (2 * heads)).is_multiple_of(64);
    match (heads, wide) {
        (1, true) => pair_sums::<1, 4, F>(w, n, pair, acc),
        (2, true) => pair_sums::<2, 4, F>(w, n, pair, acc),
        (3, true) => pair_sums::<3, 4, F>(w, n, pair, acc),
        (1, false) => pair_sums::<1, 2, F>(w, n, pair, acc),
        (2, false) => pair_sums::<2, 2, F>(w, n, pair, acc),
        _ => pair_sums::<3, 2, F>(w, n, pair, acc),
    }
}

/// `M` heads' value sums in blocks of `16 R` elements: a block's even and odd sums of every
/// head in registers (`4 M R` accumulators) while the pairs (`pair(t, e, lone)`: pair `t`'s
/// elements `e..e + 16`) stream past, two pairs a turn.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512bf16")]
#[allow(clippy::needless_range_loop)]
unsafe fn pair_sums<const M: usize, const R: usize, F: Fn(usize, usize, bool) -> __m512i>(
    w: [*const u16; 3],
    n: usize,
    pair: &F,
    acc: &mut [f32],
) {
    let dim = acc.len() / (2 * M);
    let ap = acc.as_mut_ptr();
    // The high half of a lone last key's pair: its partner, masked off.
    let keep_low = _mm512_set1_epi32(0xffff);
    for block in 0..dim / (16 * R) {
        let e0 = block * 16 * R;
        let at = |m: usize, odd: usize, r: usize| ap.add(m * 2 * dim + odd * dim + e0 + 16 * r);
        let mut even: [[__m512; R]; M] =
            std::array::from_fn(|m| std::array::from_fn(|r| _mm512_loadu_ps(at(m, 0, r))));
        let mut odd: [[__m512; R]; M] =
            std::array::from_fn(|m| std::array::from_fn(|r| _mm512_loadu_ps(at(m, 1, r))));
        let pairs = n / 2;
        let mut t = 0;
        while t + 2 <= pairs {
            for r in 0..R {
                let (pe, po) = (pair(t, e0 + 16 * r, false), pair(t + 1, e0 + 16 * r, false));
                for m in 0..M {
                    let we = _mm512_set1_epi32(weight_pair(w[m], t) as i32);
                    let wo = _mm512_set1_epi32(weight_pair(w[m], t + 1) as i32);
                    even[m][r] = dp(even[m][r], we, pe);
                    odd[m][r] = dp(odd[m][r], wo, po);
                }
            }
            t += 2;
        }
        // A last whole pair (it is even: `t` is), then a lone key (its pair's parity is `t`'s).
        if t < pairs {
            even = pair_into(even, w, t, false, |r| pair(t, e0 + 16 * r, false));
            t += 1;
        }
        if n % 2 == 1 {
            let lone = |r| _mm512_and_si512(pair(t, e0 + 16 * r, true), keep_low);
            if t % 2 == 0 {
                even = pair_into(even, w, t, true, lone);
            } else {
                odd = pair_into(odd, w, t, true, lone);
            }
        }
        for m in 0..M {
            for r in 0..R {
                _mm512_storeu_ps(at(m, 0, r), even[m][r]);
                _mm512_storeu_ps(at(m, 1, r), odd[m][r]);
            }
        }
    }
}

/// `sums` plus pair `t` (its registers from `pair(r)`) weighed by each head's pair `t` of
/// weights, the high weight masked off for a lone key. By value, so the sums stay in registers.
#[target_feature(enable = "avx512f,avx512vl,avx512bf16")]
#[inline]
unsafe fn pair_into<const M: usize, const R: usize>(
    mut sums: [[__m512; R]; M],
    w: [*const u16; 3],
    t: usize,
    lone: bool,
    pair: impl Fn(usize) -> __m512i,
) -> [[__m512; R]; M] {
    for r in 0..R {
        let p = pair(r);
        for (m, s) in sums.iter_mut().enumerate() {
            let wv = if lone {
                weight_pair(w[m], t) & 0xffff
            } else {
                weight_pair(w[m], t)
            };
            s[r] = dp(s[r], _mm512_set1_epi32(wv as i32), p);
        }
    }
    sums
}
