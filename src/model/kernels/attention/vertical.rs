//! Scores of many queries against one chunk of keys with the keys along the vector lanes: the
//! AVX-512 form of `dot` for a verification's runs, where (query, head) units share each key.
//!
//! Why it exists: with a key's values in the lanes (`scaled_dots`), every score ends in a
//! horizontal sum (shuffles on the same port as the multiply-adds), which profiled at about as
//! many instructions as the multiply-adds themselves at depth 8000. Here a chunk of keys is
//! transposed once (16 × 16 tiles) into `kt[element][key]`, and each query's sixteen lane
//! chains become sixteen vectors of sixteen keys, folded by vertical adds in `dot`'s order
//! (`lane l + lane l+8`, then `lane_sum`'s pairing): the same operations on the same numbers,
//! so the same bits, without a shuffle per score. The transposition costs about one
//! instruction per key and unit once a run has 8 or more units; fewer units keep the kernel in
//! `avx512`.

use std::arch::x86_64::*;

use super::shared::{in_fours, prefetch_row, KvRows, PREFETCH_ROWS};

/// Keys a transposed chunk holds (its row stride in `kt`).
pub(super) const CHUNK: usize = 64;

/// The fewest units that take their scores from keys transposed along the lanes
/// (`vertical`): the transposition costs about 16 instructions a key, and each unit then
/// saves about 3 of the ~9 a score costs with a key in the lanes.
pub(super) const VERTICAL_UNITS: usize = 8;

/// `super::loops::vertical_scores` where AVX-512 runs (the caller checks): computed on keys
/// transposed into `kt` when the head size is a multiple of 16 and the units are
/// [`VERTICAL_UNITS`] or more. Returns whether it did.
#[allow(clippy::too_many_arguments)]
pub(super) fn transposed_scores<'q, K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    n: usize,
    (units, query): (usize, &dyn Fn(usize) -> &'q [f32]),
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
    kt: &mut Vec<f32>,
) -> bool {
    let dim = query(0).len();
    if units < VERTICAL_UNITS || !dim.is_multiple_of(16) {
        return false;
    }
    assert!(n <= CHUNK);
    assert!(n == 0 || (n - 1) * stride + offset + dim <= keys.elements());
    assert!(n == 0 || (units - 1) * out_stride + n <= out.len());
    if kt.len() < dim * CHUNK {
        kt.resize(dim * CHUNK, 0.0);
    }
    // Units `m..m + M` at once (the queries' pointers and their scores').
    macro_rules! group {
        ($m:expr, $M:literal) => {{
            let p: [_; $M] = std::array::from_fn(|k| {
                let out = out[($m + k) * out_stride..].as_mut_ptr();
                (query($m + k).as_ptr(), out)
            });
            vertical_scores::<$M>(p.map(|x| x.0), dim, kt, n, scale, p.map(|x| x.1))
        }};
    }
    // SAFETY: AVX-512 was checked by the caller; every key read is inside `keys`, the
    // transposed chunk inside `kt`, every score written inside `out` (asserted above) and
    // every query is `dim` long.
    unsafe {
        transpose_keys(keys, (stride, offset), dim, n, kt);
        in_fours!(units, group);
    }
    true
}

/// Widens keys `0..n` (`n ≤ CHUNK`; key `j` is `keys.skip(j * stride + offset)`, `dim`
/// elements, a multiple of 16) into `kt[e * CHUNK + j]`; keys `n..` of the last tile of 16 are
/// zeros. `kt` holds `dim * CHUNK` elements and every key read is inside `keys` (the caller
/// checks both).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn transpose_keys<K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    dim: usize,
    n: usize,
    kt: &mut [f32],
) {
    let out = kt.as_mut_ptr();
    for tile in 0..n.div_ceil(16) {
        for r in 0..16 {
            let j = tile * 16 + r + PREFETCH_ROWS;
            prefetch_row(keys, j * stride + offset, dim);
        }
        for t in 0..dim / 16 {
            let rows: [__m512; 16] = std::array::from_fn(|r| {
                let j = tile * 16 + r;
                if j < n {
                    super::avx512::load16(keys, j * stride + offset + 16 * t)
                } else {
                    _mm512_setzero_ps()
                }
            });
            let cols = transpose16(rows);
            for (e, c) in cols.iter().enumerate() {
                _mm512_storeu_ps(out.add((16 * t + e) * CHUNK + 16 * tile), *c);
            }
        }
    }
}

/// A 16 × 16 transpose: `out[e]` lane `r` is `rows[r]` lane `e`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let pd = _mm512_castps_pd;
    let ps = _mm512_castpd_ps;
    // Pairs of rows interleaved by element, then by pairs of elements.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let base = i / 4 * 4;
        let (a, b) = (t[base + (i % 4) / 2], t[base + (i % 4) / 2 + 2]);
        if i % 2 == 0 {
            ps(_mm512_unpacklo_pd(pd(a), pd(b)))
        } else {
            ps(_mm512_unpackhi_pd(pd(a), pd(b)))
        }
    });
    // 128-bit blocks: rows 4 apart, then 8 apart.
    let v: [__m512; 16] = std::array::from_fn(|i| {
        let base = i / 8 * 8;
        let (a, b) = (u[base + i % 4], u[base + i % 4 + 4]);
        if (i % 8) < 4 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    std::array::from_fn(|i| {
        let (a, b) = (v[i % 8], v[i % 8 + 8]);
        if i < 8 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    })
}

/// `out[m][j] = dot(q[m], key j) * scale` for keys `j < n` of a transposed chunk `kt`, for `M`
/// queries of `dim` elements (a multiple of 16) at once; every read and write is inside its
/// buffer (the caller checks). The bits are `dot`'s: lane `l`'s chain over the query's
/// 16-element blocks from zero, `lane l + lane l+8`, then `lane_sum`'s pairing.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn vertical_scores<const M: usize>(
    q: [*const f32; M],
    dim: usize,
    kt: &[f32],
    n: usize,
    scale: f32,
    out: [*mut f32; M],
) {
    let ktp = kt.as_ptr();
    let sv = _mm512_set1_ps(scale);
    for tile in 0..n.div_ceil(16) {
        // Lanes `ls`' chains for the M queries over sixteen keys, four chains side by side.
        let chains = |ls: [usize; 4]| -> [[__m512; M]; 4] {
            let mut acc = [[_mm512_setzero_ps(); M]; 4];
            for c in 0..dim / 16 {
                for (a, l) in acc.iter_mut().zip(ls) {
                    let e = 16 * c + l;
                    let k = _mm512_loadu_ps(ktp.add(e * CHUNK + 16 * tile));
                    for m in 0..M {
                        a[m] = _mm512_fmadd_ps(_mm512_set1_ps(*q[m].add(e)), k, a[m]);
                    }
                }
            }
            acc
        };
        store_scores(fold_chains(chains), sv, (n, tile), out);
    }
}

/// `M` queries' sixteen lane chains (each a register of sixteen keys) folded as `dot` folds a
/// key's lanes: `lane l + lane l+8`, then `lane_sum`'s pairing. `chains(ls)` computes the four
/// chains `ls` side by side: one chain at a time, each multiply-add waited on the one before
/// it (a head of 64 is only 2 to 4 of them a chain), where four give the units independent
/// work. Shared with the bf16 kernels, whose chains run over pairs.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn fold_chains<const M: usize>(
    chains: impl Fn([usize; 4]) -> [[__m512; M]; 4],
) -> [__m512; M] {
    let add = |a: [__m512; M], b: [__m512; M]| -> [__m512; M] {
        std::array::from_fn(|m| _mm512_add_ps(a[m], b[m]))
    };
    // `(l + l+8) + (l+4 + l+12)`: two of the first fold's sums and the first pairing of them.
    let quad = |l: usize| {
        let [a, b, c, d] = chains([l, l + 8, l + 4, l + 12]);
        add(add(a, b), add(c, d))
    };
    add(add(quad(0), quad(1)), add(quad(2), quad(3)))
}

/// Tile `tile`'s sixteen keys' scores (`sums`, times `sv`) into each query's `out`, the keys
/// from `n` on left alone.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_scores<const M: usize>(
    sums: [__m512; M],
    sv: __m512,
    (n, tile): (usize, usize),
    out: [*mut f32; M],
) {
    let left = (n - 16 * tile).min(16);
    let mask: __mmask16 = if left == 16 { !0 } else { (1 << left) - 1 };
    for (o, s) in out.iter().zip(sums) {
        _mm512_mask_storeu_ps(o.add(16 * tile), mask, _mm512_mul_ps(s, sv));
    }
}

/// Value rows `0..n` (`n ≤ CHUNK`; row `j` is `rows.skip(j * stride + offset)`, `dim`
/// elements, a multiple of 16) widened to f32 into `out[j * dim..][..dim]`, once for all of a
/// run's units: each f16 or q8 element was otherwise widened again for every query of the run
/// (q8: three instructions a register, on the ports the multiply-adds need). Exact, so the
/// value sums over them are the bits of the sums over `rows`. Where AVX-512 runs (the caller
/// checks); returns whether it did (a head size a multiple of 16).
pub(super) fn widen_rows<K: KvRows>(
    rows: K,
    (stride, offset): (usize, usize),
    n: usize,
    dim: usize,
    out: &mut Vec<f32>,
) -> bool {
    if !dim.is_multiple_of(16) {
        return false;
    }
    assert!(n <= CHUNK);
    assert!(n == 0 || (n - 1) * stride + offset + dim <= rows.elements());
    if out.len() < dim * CHUNK {
        out.resize(dim * CHUNK, 0.0);
    }
    // SAFETY: AVX-512 was checked by the caller; every read is inside `rows` and every write
    // inside `out` (asserted above).
    unsafe { widen_rows_wide(rows, (stride, offset), n, dim, out) };
    true
}

#[target_feature(enable = "avx512f,avx512vl,f16c")]
unsafe fn widen_rows_wide<K: KvRows>(
    rows: K,
    (stride, offset): (usize, usize),
    n: usize,
    dim: usize,
    out: &mut [f32],
) {
    let op = out.as_mut_ptr();
    for j in 0..n {
        prefetch_row(rows, (j + PREFETCH_ROWS) * stride + offset, dim);
        for e in (0..dim).step_by(16) {
            let v = super::avx512::load16(rows, j * stride + offset + e);
            _mm512_storeu_ps(op.add(j * dim + e), v);
        }
    }
}
