//! The inner loops attention is built of (scores, softmax weights, the weighted sum of values,
//! alone or for heads sharing keys), each choosing the scalar, AVX2 or AVX-512 form where it
//! runs: what `causal` and `tree_attention` call, so that a loop's instruction set is chosen in
//! one place and every form gives the scalar definition's bits.

use super::bf16_pairs::WeightBits;
#[cfg(target_arch = "x86_64")]
use super::shared::{simd_available, wide_available};
use super::shared::{KvForm, KvRows};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512, bf16_avx512, vertical};
use super::{bf16_pairs, scalar};

/// `scores[j] = dot(q, key j) * scale` for every key `j < scores.len()`, where key `j` is
/// `keys[j * stride + offset..][..q.len()]`.
///
/// The vector paths compute each score with exactly `dot`'s arithmetic, eight keys at a time
/// with their eight-lane reductions done in registers (a transpose by shuffles and horizontal
/// adds that pairs the lanes as `lane_sum` does): bitwise the same scores as the scalar path,
/// whatever the number of keys or the instruction set.
pub(super) fn scaled_dots<K: KvRows>(
    q: &[f32],
    keys: K,
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    if K::FORM == KvForm::Bf16 {
        let at = (stride, offset);
        return with_bf16_query(q, |q| scaled_dots_bf16(q, keys, at, scale, scores));
    }
    #[cfg(target_arch = "x86_64")]
    {
        if q.len().is_multiple_of(16) && simd_available() {
            // SAFETY: AVX2 (and for the wide path AVX-512) was checked; every key read is
            // inside `keys`, as the slicing of the scalar path below would check (asserted
            // once here).
            assert!(
                scores.is_empty()
                    || (scores.len() - 1) * stride + offset + q.len() <= keys.elements()
            );
            unsafe {
                if wide_available() {
                    avx512::scaled_dots(q, keys, stride, offset, scale, scores);
                } else {
                    avx2::scaled_dots(q, keys, stride, offset, scale, scores);
                }
            }
            return;
        }
    }
    scalar::scaled_dots(q, keys, stride, offset, scale, scores)
}

/// Turns scores into unnormalised softmax weights in place, `s ← softmax_exp(s − max)`, and
/// returns `(max, sum)`, their sum taken in eight lanes (key `j` in lane `j mod 8`) over whole
/// blocks of eight, reduced by `lane_sum`, then the remaining keys one by one.
pub(super) fn softmax_weights(scores: &mut [f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if simd_available() {
            // SAFETY: AVX2 and FMA (and for the wide path AVX-512) were checked; every access
            // is inside `scores`.
            return unsafe {
                if wide_available() {
                    avx512::softmax_weights(scores)
                } else {
                    avx2::softmax_weights(scores)
                }
            };
        }
    }
    scalar::softmax_weights(scores)
}

/// [`scaled_dots`] on a bf16 cache with the query already rounded (bf16 bits, a multiple of
/// 32 long).
pub(super) fn scaled_dots_bf16<K: KvRows>(
    q: &[u16],
    keys: K,
    at: (usize, usize),
    scale: f32,
    scores: &mut [f32],
) {
    let (stride, offset) = at;
    assert!(scores.is_empty() || (scores.len() - 1) * stride + offset + q.len() <= keys.elements());
    #[cfg(target_arch = "x86_64")]
    if bf16_avx512::available() {
        // SAFETY: AVX-512 BF16 was checked; every key read is inside `keys` (asserted).
        return unsafe { bf16_avx512::scaled_dots(q, keys, at, scale, scores) };
    }
    bf16_pairs::scaled_dots(q, keys, at, scale, scores)
}

/// `src` rounded to bf16 bits into `dst` (as long): `bf16_pairs::round` for each, by
/// `vcvtne2ps2bf16` where it runs.
pub(super) fn round_bf16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if bf16_avx512::available() {
        // SAFETY: AVX-512 BF16 was checked; the slices are as long (asserted).
        return unsafe { bf16_avx512::round_slice(src, dst) };
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16_pairs::round(x).to_bits();
    }
}

/// Calls `f` with `q` rounded to bf16 bits ([`round_bf16`]) in the calling thread's buffer: a
/// forward's calls reuse it, so it allocates only while it grows. For the calls that take f32
/// queries; a causal call rounds its queries once ([`bf16_rounded_for`]).
fn with_bf16_query<R>(q: &[f32], f: impl FnOnce(&[u16]) -> R) -> R {
    thread_local! {
        static ROUNDED: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    rounded_in(&ROUNDED, q, f)
}

/// Calls `f` with all of a call's queries `q` rounded to bf16 bits where keys of form `K` are
/// bf16 (rounded once, where each key chunk would round them again), else with `None`; in a
/// buffer of its own, so the calls inside `f` may round as well.
pub(super) fn bf16_rounded_for<K: KvRows, R>(q: &[f32], f: impl FnOnce(Option<&[u16]>) -> R) -> R {
    thread_local! {
        static CALL: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    if K::FORM != KvForm::Bf16 {
        return f(None);
    }
    rounded_in(&CALL, q, |q| f(Some(q)))
}

/// `q` rounded ([`round_bf16`]) into the thread's `buffer`, grown as needed, for `f`.
fn rounded_in<R>(
    buffer: &'static std::thread::LocalKey<std::cell::RefCell<Vec<u16>>>,
    q: &[f32],
    f: impl FnOnce(&[u16]) -> R,
) -> R {
    buffer.with_borrow_mut(|buf| {
        buf.resize(q.len(), 0);
        round_bf16(q, buf);
        f(buf)
    })
}

/// `heads` heads' weights `weights.0[m * weights.1..][..n]` as bf16 bits ([`round_bf16`]) in
/// the calling thread's buffer, for `f`: the rounding the f32 forms of the value sums do.
fn with_weight_bits<R>(
    (weights, weight_stride): (&[f32], usize),
    n: usize,
    heads: usize,
    f: impl FnOnce(WeightBits) -> R,
) -> R {
    thread_local! {
        static BITS: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    assert!(n == 0 || (heads - 1) * weight_stride + n <= weights.len());
    BITS.with_borrow_mut(|buf| {
        let stride = n + 1;
        buf.resize(heads * stride, 0);
        for m in 0..heads {
            round_bf16(
                &weights[m * weight_stride..][..n],
                &mut buf[m * stride..][..n],
            );
        }
        f(WeightBits { bits: buf, stride })
    })
}

/// [`accumulate_values_heads`] on a bf16 cache with the weights already rounded
/// ([`WeightBits`], head `m`'s sums `acc[m * 2 * dim..][..2 * dim]`).
pub(super) fn accumulate_values_bf16<K: KvRows>(
    weights: WeightBits,
    n: usize,
    heads: usize,
    values: K,
    at: (usize, usize),
    acc: &mut [f32],
) {
    let dim = acc.len() / (2 * heads);
    weights.check(heads, n);
    #[cfg(target_arch = "x86_64")]
    if dim.is_multiple_of(32) && bf16_avx512::available() {
        return bf16_avx512::accumulate_rows(weights, n, heads, values, at, acc);
    }
    for m in 0..heads {
        let sums = &mut acc[m * 2 * dim..][..2 * dim];
        bf16_pairs::accumulate_values(weights.head(m), n, values, at, sums);
    }
}

/// Adds keys' weighted values to two running sums, `acc = [even | odd]` (each `dim` long):
/// key `j` (counted from the start of `weights`, which must sit at an even key of the whole
/// sequence) goes to the even sum when `j` is even, else to the odd one, one fused
/// multiply-add per element, in key order. Value `j` is `values[j * stride + offset..][..dim]`.
///
/// The whole result is `(even + odd) · inv` ([`finish_values`]); taking the keys in chunks
/// continues the same chains, so the bits do not depend on the chunking. Two chains instead of
/// one let the vector paths keep twice as many independent accumulators in flight; they keep
/// a block of sums in registers while they stream the values (32 on AVX2, 64 on AVX-512), with
/// the same operations per element in the same order as the scalar path.
pub(super) fn accumulate_values<K: KvRows>(
    weights: &[f32],
    values: K,
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    let dim = acc.len() / 2;
    if K::FORM == KvForm::Bf16 {
        let n = weights.len();
        return with_weight_bits((weights, 0), n, 1, |w| {
            accumulate_values_bf16(w, n, 1, values, (stride, offset), acc)
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        if dim.is_multiple_of(32) && simd_available() {
            assert!(
                weights.is_empty()
                    || (weights.len() - 1) * stride + offset + dim <= values.elements()
            );
            // SAFETY: AVX2 (and for the wide path AVX-512) was checked; every value read is
            // inside `values` (asserted above), every sum inside `acc`.
            unsafe {
                if dim.is_multiple_of(64) && wide_available() {
                    avx512::accumulate_values(weights, values, stride, offset, acc);
                } else {
                    avx2::accumulate_values(weights, values, stride, offset, acc);
                }
            }
            return;
        }
    }
    scalar::accumulate_values(weights, values, stride, offset, acc)
}

/// The most heads [`scaled_dots_heads`] and [`accumulate_values_heads`] take side by side:
/// the AVX-512 kernels keep 8 accumulators a head in registers (32 of them in all).
pub(super) const SHARED_HEADS: usize = 3;

/// Calls the AVX-512 kernel `$kernel::<K, M>(args)` with the const `M` equal to `$heads`
/// (2 or 3), so each head count gets a kernel whose loops over heads are unrolled.
#[cfg(target_arch = "x86_64")]
macro_rules! with_const_heads {
    ($heads:expr, $kernel:ident::<$t:ty>($($arg:expr),*)) => {
        match $heads {
            2 => avx512::$kernel::<$t, 2>($($arg),*),
            _ => avx512::$kernel::<$t, 3>($($arg),*),
        }
    };
}

/// [`scaled_dots`] for `heads` queries (at most [`SHARED_HEADS`]) over the same `n` keys: query
/// `m` is `q[m * dim..][..dim]` (`dim = q.len() / heads`), its scores go to
/// `scores[m * score_stride..][..n]`. Every score is the bits [`scaled_dots`] gives it; the
/// AVX-512 path loads and widens each key once for all the heads.
#[allow(clippy::too_many_arguments)]
pub(super) fn scaled_dots_heads<K: KvRows>(
    q: &[f32],
    heads: usize,
    keys: K,
    (stride, offset): (usize, usize),
    scale: f32,
    scores: &mut [f32],
    score_stride: usize,
    n: usize,
) {
    let dim = q.len() / heads;
    assert!(heads > 0 && heads <= SHARED_HEADS && q.len() == heads * dim);
    assert!(n == 0 || scores.len() >= (heads - 1) * score_stride + n);
    if K::FORM == KvForm::Bf16 {
        let at = (stride, offset);
        return with_bf16_query(q, |q| {
            scaled_dots_heads_bf16(q, heads, keys, at, scale, (scores, score_stride), n)
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        let shared = heads > 1 && K::FORM != KvForm::Bf16;
        if shared && dim.is_multiple_of(16) && simd_available() && wide_available() {
            assert!(n == 0 || (n - 1) * stride + offset + dim <= keys.elements());
            // SAFETY: AVX-512 was checked; every key read is inside `keys` and every score
            // written inside `scores` (asserted above).
            unsafe {
                with_const_heads!(
                    heads,
                    scaled_dots_shared::<K>(
                        q,
                        keys,
                        stride,
                        offset,
                        scale,
                        scores,
                        score_stride,
                        n
                    )
                )
            }
            return;
        }
    }
    for m in 0..heads {
        let s = &mut scores[m * score_stride..][..n];
        scaled_dots(&q[m * dim..][..dim], keys, stride, offset, scale, s);
    }
}

/// [`scaled_dots_heads`] on a bf16 cache with the queries already rounded (bf16 bits).
pub(super) fn scaled_dots_heads_bf16<K: KvRows>(
    q: &[u16],
    heads: usize,
    keys: K,
    (stride, offset): (usize, usize),
    scale: f32,
    (scores, score_stride): (&mut [f32], usize),
    n: usize,
) {
    let dim = q.len() / heads;
    assert!(heads > 0 && heads <= SHARED_HEADS && q.len() == heads * dim);
    assert!(n == 0 || scores.len() >= (heads - 1) * score_stride + n);
    #[cfg(target_arch = "x86_64")]
    if heads > 1 && bf16_avx512::available() {
        assert!(n == 0 || (n - 1) * stride + offset + dim <= keys.elements());
        let out = (scores, score_stride);
        // SAFETY: AVX-512 BF16 was checked; every key read is inside `keys` and every score
        // written inside `scores` (asserted above).
        unsafe {
            match heads {
                2 => bf16_avx512::scaled_dots_shared::<K, 2>(
                    q,
                    keys,
                    (stride, offset),
                    scale,
                    out,
                    n,
                ),
                _ => bf16_avx512::scaled_dots_shared::<K, 3>(
                    q,
                    keys,
                    (stride, offset),
                    scale,
                    out,
                    n,
                ),
            }
        }
        return;
    }
    for m in 0..heads {
        let s = &mut scores[m * score_stride..][..n];
        scaled_dots_bf16(&q[m * dim..][..dim], keys, (stride, offset), scale, s);
    }
}

/// [`accumulate_values`] for `heads` heads (at most [`SHARED_HEADS`]) weighing the same `n`
/// values: head `m`'s weights are `weights[m * weight_stride..][..n]`, its sums
/// `acc[m * 2 * dim..][..2 * dim]`. Every sum is the bits [`accumulate_values`] gives it; the
/// AVX-512 path loads and widens each value once for all the heads.
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate_values_heads<K: KvRows>(
    weights: &[f32],
    weight_stride: usize,
    n: usize,
    heads: usize,
    values: K,
    (stride, offset): (usize, usize),
    acc: &mut [f32],
) {
    let dim = acc.len() / (2 * heads);
    assert!(heads > 0 && heads <= SHARED_HEADS && acc.len() == heads * 2 * dim);
    assert!(n == 0 || weights.len() >= (heads - 1) * weight_stride + n);
    if K::FORM == KvForm::Bf16 {
        let at = (stride, offset);
        return with_weight_bits((weights, weight_stride), n, heads, |w| {
            accumulate_values_bf16(w, n, heads, values, at, acc)
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        let shared = heads > 1 && K::FORM != KvForm::Bf16;
        if shared && dim.is_multiple_of(64) && simd_available() && wide_available() {
            assert!(n == 0 || (n - 1) * stride + offset + dim <= values.elements());
            // SAFETY: AVX-512 was checked; every value read is inside `values`, every weight
            // inside `weights` and every sum inside `acc` (asserted above).
            unsafe {
                with_const_heads!(
                    heads,
                    accumulate_values_shared::<K>(
                        weights,
                        weight_stride,
                        n,
                        values,
                        stride,
                        offset,
                        acc
                    )
                )
            }
            return;
        }
    }
    for m in 0..heads {
        accumulate_values(
            &weights[m * weight_stride..][..n],
            values,
            stride,
            offset,
            &mut acc[m * 2 * dim..][..2 * dim],
        );
    }
}

/// [`softmax_weights`], its sum joined by `exp(sink − max)` where the head has a sink: the
/// softmax over the scores and the sink, of which only the scores carry values.
pub(super) fn softmax_sum(scores: &mut [f32], sink: Option<f32>) -> f32 {
    let (max, sum) = softmax_weights(scores);
    match sink {
        Some(sink) => sum + (sink - max).exp(),
        None => sum,
    }
}

/// `out = (even + odd) · inv` from [`accumulate_values`]' sums.
pub(super) fn finish_values(acc: &[f32], inv: f32, out: &mut [f32]) {
    let (even, odd) = acc.split_at(out.len());
    for ((o, e), d) in out.iter_mut().zip(even).zip(odd) {
        *o = (e + d) * inv;
    }
}

/// Scores of `units` queries (`query(m)`, writing to `out.0[m * out.1..][..n]`) against `n ≤
/// vertical::CHUNK` keys (`keys` from key 0, `(stride, offset)` as [`scaled_dots`]'), from keys
/// transposed along the lanes where that kernel runs (`vertical::transposed_scores`): the bits
/// of [`scaled_dots`]. Returns whether it did.
#[allow(clippy::too_many_arguments)]
pub(super) fn vertical_scores<'q, K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    n: usize,
    (units, query): (usize, &dyn Fn(usize) -> &'q [f32]),
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
    kt: &mut Vec<f32>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(n <= vertical::CHUNK);
        let q = (units, query);
        let able = K::FORM != KvForm::Bf16 && simd_available() && wide_available();
        able && vertical::transposed_scores(
            keys,
            (stride, offset),
            n,
            q,
            scale,
            (out, out_stride),
            kt,
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (
            keys, stride, offset, n, units, query, scale, out, out_stride, kt,
        );
        false
    }
}

/// [`vertical_scores`] on a bf16 cache, the queries already rounded (bf16 bits):
/// `bf16_avx512::transposed_scores` where it runs, the bits of [`scaled_dots_bf16`]. Returns
/// whether it did.
pub(super) fn vertical_scores_bf16<'q, K: KvRows>(
    keys: K,
    at: (usize, usize),
    n: usize,
    (units, query): (usize, &dyn Fn(usize) -> &'q [u16]),
    scale: f32,
    out: (&mut [f32], usize),
    kt: &mut Vec<f32>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(n <= vertical::CHUNK);
        let able = units >= vertical::VERTICAL_UNITS && query(0).len().is_multiple_of(32);
        if able && bf16_avx512::available() {
            bf16_avx512::transposed_scores(keys, at, n, (units, query), scale, out, kt);
            return true;
        }
        false
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (keys, at, n, units, query, scale, out, kt);
        false
    }
}

/// [`vertical::widen_rows`] where it runs; returns whether it did (never for bf16 rows, whose
/// arithmetic is not f32's).
pub(super) fn widen_rows<K: KvRows>(
    (rows, at): (K, (usize, usize)),
    n: usize,
    dim: usize,
    out: &mut Vec<f32>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        K::FORM != KvForm::Bf16
            && simd_available()
            && wide_available()
            && vertical::widen_rows(rows, at, n, dim, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, at, n, dim, out);
        false
    }
}

/// `bf16_avx512::pair_rows` where it runs (bf16 rows, AVX-512 BF16); returns whether it did.
pub(super) fn pair_rows<K: KvRows>(
    (rows, at): (K, (usize, usize)),
    n: usize,
    dim: usize,
    out: &mut Vec<f32>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::bf16_avx512::pair_rows(rows, at, n, dim, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, at, n, dim, out);
        false
    }
}

/// `bf16_avx512::accumulate_paired` over rows [`pair_rows`] paired (only after it said it
/// did): the bits of [`accumulate_values_heads`] on the rows themselves.
pub(super) fn accumulate_paired(
    weights: WeightBits,
    n: usize,
    heads: usize,
    paired: &[f32],
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    super::bf16_avx512::accumulate_paired(weights, n, heads, paired, acc);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (weights, n, heads, paired, acc);
        unreachable!("rows are paired only on x86-64");
    }
}
