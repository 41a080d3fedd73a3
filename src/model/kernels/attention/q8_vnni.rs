//! The x86 forms of `q8_scores`' definition: AVX-512 VNNI on a chunk of keys transposed so
//! each lane holds a key, and AVX2 with a key's bytes along the lanes (llama.cpp's sign trick).
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones. The transposition stores each key byte
//! plus 128 (`k ^ 0x80`), so a block's lane sum is `Σ q_i k_i + 128 Σ q_i`; its accumulator
//! starts at `−128 Σ q_i` (the query block's sum, kept beside its bytes), which leaves the
//! exact integer dot product. `vpmaddubsw` (AVX2) takes `|q|` against `k` carrying `q`'s sign:
//! each pair of products is at most 2 · 127 · 127, inside i16, so nothing saturates.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::q8_query::Q8Query;
use super::shared::{in_fours, prefetch_row, KvForm, KvRows, PREFETCH_ROWS};

/// Keys a transposed chunk holds (the row stride of its bytes and scales).
pub(super) const CHUNK: usize = 64;

/// The instruction set the q8 scores run on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Isa {
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// AVX-512 VNNI where the attention kernels' AVX-512 and the 8-bit matmul's VNNI are both
    /// on (`TANDEM_DISABLE_AVX512`, `TANDEM_DISABLE_VNNI` turn it off), else AVX2 where the
    /// attention kernels' AVX2 runs; `None`: the scalar definition.
    pub(super) fn best() -> Option<Isa> {
        static BEST: OnceLock<Option<Isa>> = OnceLock::new();
        *BEST.get_or_init(|| {
            use crate::model::kernels::tile_driver::DotIsa;
            if !super::shared::simd_available() {
                None
            } else if super::shared::wide_available() && DotIsa::best() == DotIsa::Avx512Vnni {
                Some(Isa::Avx512Vnni)
            } else {
                Some(Isa::Avx2)
            }
        })
    }
}

/// `q8_scores::run_scores` on AVX-512 VNNI (the caller checks): the `n ≤ CHUNK` keys are
/// transposed into `kt` once, then scored for the units four at a time.
#[allow(clippy::too_many_arguments)]
pub(super) fn transposed_scores<'q, K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    n: usize,
    (units, query): (usize, &dyn Fn(usize) -> Q8Query<'q>),
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
    kt: &mut Vec<f32>,
) {
    if units == 0 || n == 0 {
        return;
    }
    let dim = query(0).dim();
    assert!(K::FORM == KvForm::Q8 && dim.is_multiple_of(32) && n <= CHUNK);
    assert!(stride.is_multiple_of(32) && offset.is_multiple_of(32));
    assert!((n - 1) * stride + offset + dim <= keys.elements());
    assert!((units - 1) * out_stride + n <= out.len());
    let words = dim / 4;
    if kt.len() < (words + dim / 32) * CHUNK {
        kt.resize((words + dim / 32) * CHUNK, 0.0);
    }
    let (ints, scales) = kt.split_at_mut(words * CHUNK);
    let (ints, scales) = (ints.as_mut_ptr().cast::<i32>(), scales.as_mut_ptr());
    macro_rules! group {
        ($m:expr, $M:literal) => {{
            let p: [_; $M] = std::array::from_fn(|k| {
                let q = query($m + k);
                assert_eq!(q.dim(), dim);
                (q, out[($m + k) * out_stride..].as_mut_ptr())
            });
            vnni_scores::<$M>(p.map(|x| x.0), ints, scales, n, scale, p.map(|x| x.1))
        }};
    }
    // SAFETY: AVX-512 VNNI was checked by the caller; every key read is inside `keys` and
    // every score written inside `out` (asserted above); `kt` holds the transposed chunk.
    unsafe {
        transpose_keys(keys, (stride, offset), dim, n, ints, scales);
        in_fours!(units, group);
    }
}

/// Keys `0..n` (key `j` at element `j * stride + offset`, `dim` bytes; `stride` and `offset`
/// whole blocks) into `kt[w * CHUNK + j]` (the key's 4-byte word `w`, each byte plus 128) and
/// their block scales into `ks[b * CHUNK + j]`; the last tile's missing keys get scale 0.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn transpose_keys<K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    dim: usize,
    n: usize,
    kt: *mut i32,
    ks: *mut f32,
) {
    let words = dim / 4;
    let flip = _mm512_set1_epi32(0x8080_8080_u32 as i32);
    // Key `r` of a tile's scales, `stride / 32` blocks apart.
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let scale_step = _mm512_mullo_epi32(lanes, _mm512_set1_epi32((stride / 32) as i32));
    let pair_steps = [
        _mm512_castsi512_si256(scale_step),
        _mm512_extracti64x4_epi64::<1>(scale_step),
    ];
    for tile in 0..n.div_ceil(16) {
        let first = tile * 16 * stride + offset;
        for r in 0..16 {
            prefetch_row(keys, first + (r + PREFETCH_ROWS) * stride, dim);
        }
        // The scales the tile as many rows ahead gathers, which the prefetchers do not follow
        // through a gather: every row's, `stride / 32` a row.
        let ahead = keys
            .scale_base()
            .wrapping_add((first + PREFETCH_ROWS * stride) / 32);
        for line in (0..16 * stride / 32 * 4).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast::<i8>().wrapping_add(line));
        }
        let left = (n - 16 * tile).min(16);
        let present: __mmask16 = if left == 16 { !0 } else { (1 << left) - 1 };
        let base = keys.base().cast::<i8>().add(first);
        for t in 0..words.div_ceil(16) {
            let width = (words - 16 * t).min(16);
            let mask: __mmask16 = if width == 16 { !0 } else { (1 << width) - 1 };
            let flipped = |w: __m512i| _mm512_castsi512_ps(_mm512_xor_si512(w, flip));
            // A whole tile loads its rows unmasked, without a mask worked out per row.
            let rows: [__m512; 16] = if left == 16 && width == 16 {
                std::array::from_fn(|r| {
                    flipped(_mm512_loadu_si512(base.add(r * stride + 64 * t).cast()))
                })
            } else {
                std::array::from_fn(|r| {
                    let m = if r < left { mask } else { 0 };
                    flipped(_mm512_maskz_loadu_epi32(
                        m,
                        base.add(r * stride + 64 * t).cast(),
                    ))
                })
            };
            let cols = super::vertical::transpose16(rows);
            for (e, c) in cols.iter().enumerate().take(width) {
                let at = kt.add((16 * t + e) * CHUNK + 16 * tile);
                _mm512_storeu_si512(at.cast(), _mm512_castps_si512(*c));
            }
        }
        let scales = keys.scale_base().add(first / 32);
        let blocks = dim / 32;
        for b in (0..blocks - blocks % 2).step_by(2) {
            let [even, odd] = gather_scale_pairs(scales, (pair_steps, b), present);
            _mm512_storeu_ps(ks.add(b * CHUNK + 16 * tile), even);
            _mm512_storeu_ps(ks.add((b + 1) * CHUNK + 16 * tile), odd);
        }
        if blocks % 2 == 1 {
            let b = blocks - 1;
            let index = _mm512_add_epi32(scale_step, _mm512_set1_epi32(b as i32));
            let s =
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), present, index, scales.cast());
            _mm512_storeu_ps(ks.add(b * CHUNK + 16 * tile), s);
        }
    }
}

/// The scales of blocks `b` and `b + 1` of a tile's 16 keys (`steps`: where keys `0..8` and
/// `8..16` start, in blocks from `scales`), the keys not `present` zero: each key's two side
/// by side gathered as one 8-byte element, eight keys a gather, then split into the two
/// blocks' lanes; half the elements two 4-byte gathers take.
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
unsafe fn gather_scale_pairs(
    scales: *const f32,
    (steps, b): ([__m256i; 2], usize),
    present: __mmask16,
) -> [__m512; 2] {
    let at = _mm256_set1_epi32(b as i32);
    let (first, second) = (
        _mm256_add_epi32(steps[0], at),
        _mm256_add_epi32(steps[1], at),
    );
    let pairs = |index: __m256i, mask: __mmask8| {
        _mm512_castsi512_ps(_mm512_mask_i32gather_epi64::<4>(
            _mm512_setzero_si512(),
            mask,
            index,
            scales.cast(),
        ))
    };
    let (low, high) = (
        pairs(first, present as __mmask8),
        pairs(second, (present >> 8) as __mmask8),
    );
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
    [
        _mm512_permutex2var_ps(low, evens, high),
        _mm512_permutex2var_ps(low, odds, high),
    ]
}

/// `out[m][j] = q8_dot(q[m], key j) * scale` for the `n` keys of a transposed chunk, `M`
/// queries at once. Per block, two integer accumulators a query (words alternating), added
/// before the block's conversion: exact, so the definition's bits.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512vnni")]
#[allow(clippy::needless_range_loop)]
unsafe fn vnni_scores<const M: usize>(
    q: [Q8Query; M],
    kt: *const i32,
    ks: *const f32,
    n: usize,
    scale: f32,
    out: [*mut f32; M],
) {
    let blocks = q[0].dim() / 32;
    let words: [*const i32; M] = q.map(|x| x.quants.as_ptr().cast::<i32>());
    let sv = _mm512_set1_ps(scale);
    for tile in 0..n.div_ceil(16) {
        let mut acc = [_mm512_setzero_ps(); M];
        for b in 0..blocks {
            let mut even: [__m512i; M] =
                std::array::from_fn(|m| _mm512_set1_epi32(-128 * q[m].sums[b]));
            let mut odd = [_mm512_setzero_si512(); M];
            for c in (0..8).step_by(2) {
                let w = 8 * b + c;
                let k0 = _mm512_loadu_si512(kt.add(w * CHUNK + 16 * tile).cast());
                let k1 = _mm512_loadu_si512(kt.add((w + 1) * CHUNK + 16 * tile).cast());
                for m in 0..M {
                    let q0 = _mm512_set1_epi32(words[m].add(w).read_unaligned());
                    let q1 = _mm512_set1_epi32(words[m].add(w + 1).read_unaligned());
                    even[m] = _mm512_dpbusd_epi32(even[m], k0, q0);
                    odd[m] = _mm512_dpbusd_epi32(odd[m], k1, q1);
                }
            }
            let kscale = _mm512_loadu_ps(ks.add(b * CHUNK + 16 * tile));
            for m in 0..M {
                let isum = _mm512_cvtepi32_ps(_mm512_add_epi32(even[m], odd[m]));
                let d = _mm512_mul_ps(_mm512_set1_ps(q[m].scales[b]), kscale);
                acc[m] = _mm512_fmadd_ps(isum, d, acc[m]);
            }
        }
        let left = (n - 16 * tile).min(16);
        let mask: __mmask16 = if left == 16 { !0 } else { (1 << left) - 1 };
        for m in 0..M {
            _mm512_mask_storeu_ps(out[m].add(16 * tile), mask, _mm512_mul_ps(acc[m], sv));
        }
    }
}

/// `q8_scores::scaled_q8_dots` on AVX2, a key at a time: per block, `|q|` against the key's
/// bytes given `q`'s signs (`vpmaddubsw`), pairs summed to i32 (`vpmaddwd`), the eight lanes
/// added. Every key read is inside `keys` (the caller checks).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scaled_dots<K: KvRows>(
    query: Q8Query,
    keys: K,
    (stride, offset): (usize, usize),
    scale: f32,
    scores: &mut [f32],
) {
    debug_assert!(K::FORM == KvForm::Q8);
    let dim = query.dim();
    let base = keys.base().cast::<i8>();
    let ones = _mm256_set1_epi16(1);
    for (j, s) in scores.iter_mut().enumerate() {
        let at = j * stride + offset;
        prefetch_row(keys, at + PREFETCH_ROWS * stride, dim);
        let mut acc = 0f32;
        for b in 0..dim / 32 {
            let qv = _mm256_loadu_si256(query.quants.as_ptr().add(32 * b).cast());
            let kv = _mm256_loadu_si256(base.add(at + 32 * b).cast());
            let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(qv), _mm256_sign_epi8(kv, qv));
            let isum = lane_total(_mm256_madd_epi16(pairs, ones));
            let d = query.scales[b] * keys.scale(at + 32 * b);
            acc = (isum as f32).mul_add(d, acc);
        }
        *s = acc * scale;
    }
}

/// The sum of eight i32 lanes (exact in any order).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lane_total(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}
