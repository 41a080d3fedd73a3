//! Causal grouped-query attention of one sequence's new tokens against its KV cache.
//!
//! Written by hand on f32 slices instead of with tensor matmuls so that each (query, head) pair
//! is computed alone, over exactly the keys it may see, in a fixed order: its result is then
//! bitwise independent of how many tokens share the forward pass (batch invariance), which is
//! what keeps greedy speculative decoding identical to plain greedy decoding.
//!
//! The three inner loops (query·key scores, softmax weights, the weighted sum of values) have
//! AVX2 paths that do exactly the scalar arithmetic, in the same order: fused multiply-adds,
//! eight-lane sums reduced in a fixed pairing, and our own `exp` (a fixed polynomial, so a
//! vector and a scalar evaluation agree bit for bit, which libm's `expf` would not promise).
//! Profiled at a depth of 1000, the score and value loops and `expf` were ~30% of a multi-token
//! forward: separate multiply and add, a scalar eight-lane reduction per key, and one libm
//! call per key.
//!
//! Keys and values are f32 or f16 ([`KvElement`]); f16 ones are widened to f32 as they are
//! loaded (exactly, and by one instruction on the vector paths), so the arithmetic and its bits
//! are those of f32 keys and values holding the same numbers, while a deep cache, whose reads
//! bound attention, is half the bytes.

/// An element of a KV cache as attention reads it.
pub trait KvElement: Copy + Send + Sync + 'static {
    /// IEEE half precision (else f32): the vector paths widen it as they load.
    const HALF: bool;
    /// The value as f32 (exact for both types).
    fn widen(self) -> f32;
}

impl KvElement for f32 {
    const HALF: bool = false;
    #[inline]
    fn widen(self) -> f32 {
        self
    }
}

impl KvElement for half::f16 {
    const HALF: bool = true;
    #[inline]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// Eight elements from `p` as f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn load8<T: KvElement>(p: *const T) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if T::HALF {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    } else {
        _mm256_loadu_ps(p.cast())
    }
}

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// Dot product as sixteen lanes of fused multiply-add chains (element `i` of every 16-element
/// block in lane `i`), folded to eight (`lane i + lane i+8`) and summed in a fixed order: the
/// same bits for the same inputs wherever it is called, and what the vector paths compute
/// (AVX-512 as one 16-lane register, AVX2 as two 8-lane ones).
#[inline]
fn dot<T: KvElement>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l].widen(), acc[l]);
        }
    }
    let folded: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
    let sum = lane_sum(&folded);
    if ra.is_empty() {
        return sum;
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail = x.mul_add(y.widen(), tail);
    }
    sum + tail
}

/// The fixed reduction of eight lanes: `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`.
#[inline]
pub(super) fn lane_sum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// `e^x` for softmax weights, by a fixed sequence of fused operations (Cephes' expf: write
/// x as n·ln2 plus r, a degree-5 polynomial in r, then scale by 2ⁿ), so the vector path gives
/// exactly these bits. Within 2 ulp of `exp` on `[-87, 0]`; below -87 it clamps (≈ 1.6e-38, a
/// negligible weight). libm's `expf` took 5-6% of a decode step at a depth of 1000, one call
/// per key.
#[inline]
fn softmax_exp(x: f32) -> f32 {
    // Not `max`: a NaN score must stay NaN (and surface as NaN logits), not become a weight.
    let x = if x < EXP_MIN { EXP_MIN } else { x };
    let n = x.mul_add(LOG2E, 0.5).floor();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let e = (p * r).mul_add(r, r) + 1.0;
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

const EXP_MIN: f32 = -87.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `scores[j] = dot(q, key j) * scale` for every key `j < scores.len()`, where key `j` is
/// `keys[j * stride + offset..][..q.len()]`.
///
/// The vector paths compute each score with exactly `dot`'s arithmetic, eight keys at a time
/// with their eight-lane reductions done in registers (a transpose by shuffles and horizontal
/// adds that pairs the lanes as `lane_sum` does): bitwise the same scores as the scalar path,
/// whatever the number of keys or the instruction set.
fn scaled_dots<T: KvElement>(
    q: &[f32],
    keys: &[T],
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if q.len().is_multiple_of(16) && simd_available() {
            // SAFETY: AVX2 (and for the wide path AVX-512) was checked; every key read is
            // inside `keys`, as the slicing of the scalar path below would check (asserted
            // once here).
            assert!(
                scores.is_empty() || (scores.len() - 1) * stride + offset + q.len() <= keys.len()
            );
            unsafe {
                if wide_available() {
                    super::attention_avx512::scaled_dots(q, keys, stride, offset, scale, scores);
                } else {
                    scaled_dots_avx2(q, keys, stride, offset, scale, scores);
                }
            }
            return;
        }
    }
    for (j, s) in scores.iter_mut().enumerate() {
        let k = &keys[j * stride + offset..j * stride + offset + q.len()];
        *s = dot(q, k) * scale;
    }
}

/// Eight keys' eight-lane partial sums reduced to their eight scores, in key order, pairing
/// the lanes as [`lane_sum`] does.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn reduce_eight_keys(
    a: [std::arch::x86_64::__m256; 8],
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // x_i = a_i + a_(i+4) for two accumulators at once: [A.x0..x3, B.x0..x3].
    let fold = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    // hadd pairs (x0 + x1), (x2 + x3) within each key, then their sums: lanes come out as
    // keys [0, 2, 4, 6, 1, 3, 5, 7], put back in order by one permute.
    let h0 = _mm256_hadd_ps(fold(a[0], a[1]), fold(a[2], a[3]));
    let h1 = _mm256_hadd_ps(fold(a[4], a[5]), fold(a[6], a[7]));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_permutevar8x32_ps(_mm256_hadd_ps(h0, h1), order)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_dots_avx2<T: KvElement>(
    q: &[f32],
    keys: &[T],
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let blocks = q.len() / 16;
    let qp = q.as_ptr();
    let kp = keys.as_ptr().add(offset);
    let n = scores.len();
    let sv = _mm256_set1_ps(scale);
    // One key's sixteen lanes as two registers (`lo`: elements 0-7 of each block, `hi`:
    // 8-15), folded into one.
    let key_lanes = |k: *const T| {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for c in 0..blocks {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(c * 16)), load8(k.add(c * 16)), lo);
            hi = _mm256_fmadd_ps(
                _mm256_loadu_ps(qp.add(c * 16 + 8)),
                load8(k.add(c * 16 + 8)),
                hi,
            );
        }
        _mm256_add_ps(lo, hi)
    };
    let mut j = 0;
    while j + 8 <= n {
        let mut folded = [_mm256_setzero_ps(); 8];
        // Four keys at a time keep their 8 accumulators and the query in registers.
        for half in 0..2 {
            let mut lo = [_mm256_setzero_ps(); 4];
            let mut hi = [_mm256_setzero_ps(); 4];
            for c in 0..blocks {
                let q0 = _mm256_loadu_ps(qp.add(c * 16));
                let q1 = _mm256_loadu_ps(qp.add(c * 16 + 8));
                for i in 0..4 {
                    let k = kp.add((j + half * 4 + i) * stride + c * 16);
                    lo[i] = _mm256_fmadd_ps(q0, load8(k), lo[i]);
                    hi[i] = _mm256_fmadd_ps(q1, load8(k.add(8)), hi[i]);
                }
            }
            for i in 0..4 {
                folded[half * 4 + i] = _mm256_add_ps(lo[i], hi[i]);
            }
        }
        let sums = reduce_eight_keys(folded);
        _mm256_storeu_ps(scores.as_mut_ptr().add(j), _mm256_mul_ps(sums, sv));
        j += 8;
    }
    while j < n {
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), key_lanes(kp.add(j * stride)));
        scores[j] = lane_sum(&lanes) * scale;
        j += 1;
    }
}

/// Turns scores into unnormalised softmax weights in place, `s ← softmax_exp(s − max)`, and
/// returns their sum: eight lanes (key `j` in lane `j mod 8`) over whole blocks of eight,
/// reduced by `lane_sum`, then the remaining keys one by one.
fn softmax_weights(scores: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if simd_available() {
            // SAFETY: AVX2 and FMA were checked; every access is inside `scores`.
            return unsafe { softmax_weights_avx2(scores) };
        }
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut lanes = [0f32; 8];
    let mut blocks = scores.chunks_exact_mut(8);
    for b in &mut blocks {
        for (l, s) in b.iter_mut().enumerate() {
            *s = softmax_exp(*s - max);
            lanes[l] += *s;
        }
    }
    let mut sum = lane_sum(&lanes);
    for s in blocks.into_remainder() {
        *s = softmax_exp(*s - max);
        sum += *s;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_weights_avx2(scores: &mut [f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = scores.len();
    let p = scores.as_mut_ptr();
    let full = n / 8 * 8;
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    for j in (0..full).step_by(8) {
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(p.add(j)));
    }
    let mut m = [0f32; 8];
    _mm256_storeu_ps(m.as_mut_ptr(), mv);
    let max = scores[full..]
        .iter()
        .chain(&m)
        .fold(f32::NEG_INFINITY, |a, &s| a.max(s));
    let maxv = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    for j in (0..full).step_by(8) {
        let e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p.add(j)), maxv));
        _mm256_storeu_ps(p.add(j), e);
        acc = _mm256_add_ps(acc, e);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    let mut sum = lane_sum(&lanes);
    for s in &mut scores[full..] {
        *s = softmax_exp(*s - max);
        sum += *s;
    }
    sum
}

/// [`softmax_exp`] on eight lanes, operation for operation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // max_ps returns its second operand when either is NaN: a NaN stays NaN, as in the scalar.
    let x = _mm256_max_ps(_mm256_set1_ps(EXP_MIN), x);
    let n = _mm256_floor_ps(_mm256_fmadd_ps(
        x,
        _mm256_set1_ps(LOG2E),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut poly = _mm256_set1_ps(EXP_P[0]);
    for &c in &EXP_P[1..] {
        poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(c));
    }
    let e = _mm256_add_ps(
        _mm256_fmadd_ps(_mm256_mul_ps(poly, r), r, r),
        _mm256_set1_ps(1.0),
    );
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(e, _mm256_castsi256_ps(pow2))
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
fn accumulate_values<T: KvElement>(
    weights: &[f32],
    values: &[T],
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    let dim = acc.len() / 2;
    #[cfg(target_arch = "x86_64")]
    {
        if dim.is_multiple_of(32) && simd_available() {
            assert!(
                weights.is_empty() || (weights.len() - 1) * stride + offset + dim <= values.len()
            );
            // SAFETY: AVX2 (and for the wide path AVX-512) was checked; every value read is
            // inside `values` (asserted above), every sum inside `acc`.
            unsafe {
                if dim.is_multiple_of(64) && wide_available() {
                    super::attention_avx512::accumulate_values(
                        weights, values, stride, offset, acc,
                    );
                } else {
                    accumulate_values_avx2(weights, values, stride, offset, acc);
                }
            }
            return;
        }
    }
    let (even, odd) = acc.split_at_mut(dim);
    for (j, &w) in weights.iter().enumerate() {
        let v = &values[j * stride + offset..][..dim];
        let sums = if j % 2 == 0 { &mut *even } else { &mut *odd };
        for (o, vd) in sums.iter_mut().zip(v) {
            *o = w.mul_add(vd.widen(), *o);
        }
    }
}

/// `out = (even + odd) · inv` from [`accumulate_values`]' sums.
fn finish_values(acc: &[f32], inv: f32, out: &mut [f32]) {
    let (even, odd) = acc.split_at(out.len());
    for ((o, e), d) in out.iter_mut().zip(even).zip(odd) {
        *o = (e + d) * inv;
    }
}

/// `out = (Σ_{j even} weights[j] · value j + Σ_{j odd} weights[j] · value j) · inv` in one go.
#[cfg(test)]
fn weighted_values<T: KvElement>(
    weights: &[f32],
    inv: f32,
    values: &[T],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    let mut acc = vec![0f32; 2 * out.len()];
    accumulate_values(weights, values, stride, offset, &mut acc);
    finish_values(&acc, inv, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_values_avx2<T: KvElement>(
    weights: &[f32],
    values: &[T],
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    use std::arch::x86_64::*;
    let dim = acc.len() / 2;
    let n = weights.len();
    for block in 0..dim / 32 {
        let vp = values.as_ptr().add(offset + block * 32);
        let ep = acc.as_mut_ptr().add(block * 32);
        let op = acc.as_mut_ptr().add(dim + block * 32);
        let mut even: [__m256; 4] = std::array::from_fn(|r| _mm256_loadu_ps(ep.add(r * 8)));
        let mut odd: [__m256; 4] = std::array::from_fn(|r| _mm256_loadu_ps(op.add(r * 8)));
        let mut j = 0;
        while j + 2 <= n {
            let (we, wo) = (_mm256_set1_ps(weights[j]), _mm256_set1_ps(weights[j + 1]));
            let (ve, vo) = (vp.add(j * stride), vp.add((j + 1) * stride));
            for r in 0..4 {
                even[r] = _mm256_fmadd_ps(we, load8(ve.add(r * 8)), even[r]);
                odd[r] = _mm256_fmadd_ps(wo, load8(vo.add(r * 8)), odd[r]);
            }
            j += 2;
        }
        if j < n {
            let we = _mm256_set1_ps(weights[j]);
            let ve = vp.add(j * stride);
            for (r, e) in even.iter_mut().enumerate() {
                *e = _mm256_fmadd_ps(we, load8(ve.add(r * 8)), *e);
            }
        }
        for r in 0..4 {
            _mm256_storeu_ps(ep.add(r * 8), even[r]);
            _mm256_storeu_ps(op.add(r * 8), odd[r]);
        }
    }
}

/// Whether the AVX-512 attention kernels may run: the f16 kernel's switch
/// (`TANDEM_DISABLE_AVX512=1` turns both off).
#[cfg(target_arch = "x86_64")]
fn wide_available() -> bool {
    super::f16_gemm::wide_available()
}

#[cfg(target_arch = "x86_64")]
fn simd_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// Keys taken at a time by every head of a group before the next ones: 64 keys of 64 values
/// are 16 KiB, read from memory once and from L1 by the group's other heads. Even, so each
/// chunk starts at an even key (see [`accumulate_values`]).
const KEY_CHUNK: usize = 64;

/// Attention for queries at absolute positions `start_pos..start_pos + n_new`.
///
/// `q`: `n_new * q_dim` (already rotated); `keys`/`values`: the sequence's whole cache,
/// `(start_pos + n_new) * kv_dim`, new tokens included; `out`: `n_new * q_dim`.
/// Work is split over (query, head) units on candle's thread pool, ordered by key-value head
/// first, then query, then head, so consecutive units read the same keys and values: runs of
/// up to [`MAX_GROUP`] of them are computed together, key chunk by key chunk, and each key and
/// value row is read from memory once per run instead of once per query and head. The reads,
/// not the arithmetic, bound attention at depth: a depth-800 cache is 37 MB of keys and values,
/// and each extra query token of a verification re-read it, ~0.6 ms a token (measured with
/// `forward-bench`), before queries shared a run. Neither the split nor the grouping changes a
/// unit's arithmetic.
pub fn causal_attention<T: KvElement>(
    shape: AttnShape,
    q: &[f32],
    keys: &[T],
    values: &[T],
    start_pos: usize,
    out: &mut [f32],
) {
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    let q_dim = shape.q_dim();
    let kv_dim = shape.kv_dim();
    let n_new = q.len() / q_dim;
    debug_assert_eq!(out.len(), q.len());
    debug_assert!(keys.len() >= (start_pos + n_new) * kv_dim);
    let group = num_heads / num_kv_heads;
    let scale = 1f32 / (head_dim as f32).sqrt();
    let units = n_new * num_heads;
    let per_kv_head = n_new * group;
    // Unit `u` is query `i`, head `h`: key-value head first, then query, then head.
    let unit = |u: usize| {
        let (kvh, r) = (u / per_kv_head, u % per_kv_head);
        (r / group, kvh * group + r % group)
    };
    let out_ptr = out.as_mut_ptr() as usize;

    thread_local! {
        // Per-thread score and value-sum buffers, kept across calls so decoding does not
        // allocate per layer.
        static BUFFERS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    // Units `members` (in order, so the last query sees the most keys), all reading key-value
    // head `kvh`. Member `m`'s scores start at `m * stride`.
    let attend = |members: std::ops::Range<usize>, scores: &mut Vec<f32>, acc: &mut Vec<f32>| {
        let nm = members.len();
        let kv_off = (members.start / per_kv_head) * head_dim;
        let seen_of = |u: usize| start_pos + unit(u).0 + 1;
        let stride = seen_of(members.end - 1);
        let q_of = |u: usize| {
            let (i, h) = unit(u);
            &q[i * q_dim + h * head_dim..][..head_dim]
        };
        // Key chunk by key chunk, so a chunk is read once for all members: calls
        // `f(member, unit, first key, keys in the chunk)` for each member that sees it.
        let each_chunk = |f: &mut dyn FnMut(usize, usize, usize, usize)| {
            for j0 in (0..stride).step_by(KEY_CHUNK) {
                for (m, u) in members.clone().enumerate() {
                    let seen = seen_of(u);
                    if j0 < seen {
                        f(m, u, j0, KEY_CHUNK.min(seen - j0));
                    }
                }
            }
        };
        scores.clear();
        scores.resize(nm * stride, 0.0);
        each_chunk(&mut |m, u, j0, len| {
            let s = &mut scores[m * stride + j0..][..len];
            scaled_dots(q_of(u), &keys[j0 * kv_dim..], kv_dim, kv_off, scale, s);
        });
        let mut inv = [0f32; MAX_GROUP];
        for (m, u) in members.clone().enumerate() {
            inv[m] = 1f32 / softmax_weights(&mut scores[m * stride..][..seen_of(u)]);
        }
        acc.clear();
        acc.resize(nm * 2 * head_dim, 0.0);
        each_chunk(&mut |m, _, j0, len| {
            accumulate_values(
                &scores[m * stride + j0..][..len],
                &values[j0 * kv_dim..],
                kv_dim,
                kv_off,
                &mut acc[m * 2 * head_dim..][..2 * head_dim],
            );
        });
        for (m, u) in members.enumerate() {
            let (i, h) = unit(u);
            // SAFETY: each (query, head) unit writes only its own head_dim-long span of `out`,
            // and every unit belongs to exactly one call.
            let o = unsafe {
                std::slice::from_raw_parts_mut(
                    (out_ptr as *mut f32).add(i * q_dim + h * head_dim),
                    head_dim,
                )
            };
            finish_values(&acc[m * 2 * head_dim..][..2 * head_dim], inv[m], o);
        }
    };
    let run_units = |range: std::ops::Range<usize>, scores: &mut Vec<f32>, acc: &mut Vec<f32>| {
        let mut u = range.start;
        while u < range.end {
            // The rest of this key-value head's units, within the range, at most MAX_GROUP.
            let kv_end = (u / per_kv_head + 1) * per_kv_head;
            let end = kv_end.min(u + MAX_GROUP).min(range.end);
            attend(u..end, scores, acc);
            u = end;
        }
    };
    let run = |range: std::ops::Range<usize>| {
        BUFFERS.with_borrow_mut(|(scores, acc)| run_units(range, scores, acc))
    };
    if units * (start_pos + n_new) < 4096 {
        run(0..units);
    } else {
        super::parallel::for_each_chunk(units, run);
    }
}

/// The most (query, head) units computed together: the 3 heads of each of 8 verified tokens
/// on SmolLM2. Measured at depth 1500 (8 tokens / a 256-token chunk): 12 units 29.0 / 642 ms,
/// 24 28.6 / 616, 48 30.4 / 631; grouping heads of one query only, 34.1 / 856.
const MAX_GROUP: usize = 24;

#[cfg(test)]
mod tests {
    use super::{dot, scaled_dots, softmax_exp, softmax_weights, weighted_values};

    fn val(i: usize) -> f32 {
        ((i * 104_729 % 2000) as f32 - 1000.0) * 1e-3
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The definition of `weighted_values`, written out plainly.
    fn value_sums_by_definition(
        weights: &[f32],
        inv: f32,
        values: &[f32],
        stride: usize,
        offset: usize,
        dim: usize,
    ) -> Vec<f32> {
        let mut sums = vec![vec![0f32; dim]; 2];
        for (j, &w) in weights.iter().enumerate() {
            for (d, o) in sums[j % 2].iter_mut().enumerate() {
                *o = w.mul_add(values[j * stride + offset + d], *o);
            }
        }
        (0..dim).map(|d| (sums[0][d] + sums[1][d]) * inv).collect()
    }

    type ValuePath = fn(&[f32], f32, &[f32], usize, usize, &mut [f32]);

    /// Every `weighted_values` path this machine can run, by name: accumulated in one go or
    /// in chunks of 6 keys, then finished.
    fn value_paths() -> Vec<(&'static str, ValuePath)> {
        let mut paths: Vec<(&'static str, ValuePath)> = vec![
            ("dispatch", weighted_values),
            ("dispatch, chunked", |w, i, v, s, o, out| {
                let mut acc = vec![0f32; 2 * out.len()];
                for (c, ws) in w.chunks(6).enumerate() {
                    super::accumulate_values(ws, &v[c * 6 * s..], s, o, &mut acc);
                }
                super::finish_values(&acc, i, out);
            }),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            if super::simd_available() {
                paths.push(("avx2", |w, i, v, s, o, out| {
                    let mut acc = vec![0f32; 2 * out.len()];
                    unsafe { super::accumulate_values_avx2(w, v, s, o, &mut acc) };
                    super::finish_values(&acc, i, out);
                }));
            }
            if super::simd_available() && is_x86_feature_detected!("avx512f") {
                paths.push(("avx512", |w, i, v, s, o, out| {
                    let mut acc = vec![0f32; 2 * out.len()];
                    unsafe {
                        if out.len() % 64 == 0 {
                            super::super::attention_avx512::accumulate_values(w, v, s, o, &mut acc)
                        } else {
                            super::accumulate_values_avx2(w, v, s, o, &mut acc)
                        }
                    }
                    super::finish_values(&acc, i, out);
                }));
            }
        }
        paths
    }

    #[test]
    fn vector_value_sums_equal_the_scalar_loop_bit_for_bit() {
        // 128 and 64 outputs run on every path, 96 on AVX2 only, 40 on the scalar loop; odd
        // and even key counts end the two chains differently.
        for (dim, n) in [(128, 37), (64, 1), (64, 8), (96, 5), (40, 6), (64, 19)] {
            let (stride, offset) = (3 * dim, dim);
            let values: Vec<f32> = (0..n * stride).map(val).collect();
            let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
            let want = value_sums_by_definition(&weights, 0.37, &values, stride, offset, dim);
            for (name, path) in value_paths() {
                if name.starts_with("avx") && dim % 32 != 0 {
                    continue;
                }
                let mut ours = vec![0f32; dim];
                path(&weights, 0.37, &values, stride, offset, &mut ours);
                assert_eq!(bits(&ours), bits(&want), "{name}: {dim} outputs, {n} keys");
            }
        }
    }

    /// f16 keys and values give, on every path, the bits f32 ones holding the same numbers
    /// give: the scalar loops (head sizes 40 and 48 for values, 40 for scores), AVX2 and
    /// AVX-512.
    #[test]
    fn f16_keys_and_values_give_the_bits_of_their_f32_values_on_every_path() {
        use half::f16;
        let half_and_wide = |n: usize, k: usize| -> (Vec<f16>, Vec<f32>) {
            let h: Vec<f16> = (0..n)
                .map(|i| f16::from_f32(val(i * k + 3) * 1.7))
                .collect();
            let w = h.iter().map(|x| x.to_f32()).collect();
            (h, w)
        };
        for dim in [128, 64, 48, 40] {
            for n in [1, 8, 23, 64] {
                let (stride, offset) = (3 * dim, dim);
                let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
                let (k16, k32) = half_and_wide(n * stride, 7);
                let (v16, v32) = half_and_wide(n * stride, 5);
                let mut want = vec![0f32; n];
                scaled_dots(&q, &k32, stride, offset, 0.125, &mut want);
                let mut got = vec![0f32; n];
                scaled_dots(&q, &k16, stride, offset, 0.125, &mut got);
                assert_eq!(bits(&got), bits(&want), "scores: head size {dim}, {n} keys");
                #[cfg(target_arch = "x86_64")]
                if super::simd_available() && dim % 16 == 0 {
                    unsafe { super::scaled_dots_avx2(&q, &k16, stride, offset, 0.125, &mut got) };
                    assert_eq!(bits(&got), bits(&want), "avx2 scores: {dim}, {n}");
                    if is_x86_feature_detected!("avx512f") {
                        unsafe {
                            super::super::attention_avx512::scaled_dots(
                                &q, &k16, stride, offset, 0.125, &mut got,
                            )
                        };
                        assert_eq!(bits(&got), bits(&want), "avx512 scores: {dim}, {n}");
                    }
                }
                let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
                let want = value_sums_by_definition(&weights, 0.37, &v32, stride, offset, dim);
                let mut got = vec![0f32; dim];
                weighted_values(&weights, 0.37, &v16, stride, offset, &mut got);
                assert_eq!(bits(&got), bits(&want), "values: head size {dim}, {n} keys");
                #[cfg(target_arch = "x86_64")]
                if super::simd_available() && dim % 32 == 0 {
                    let mut acc = vec![0f32; 2 * dim];
                    unsafe {
                        super::accumulate_values_avx2(&weights, &v16, stride, offset, &mut acc)
                    };
                    super::finish_values(&acc, 0.37, &mut got);
                    assert_eq!(bits(&got), bits(&want), "avx2 values: {dim}, {n}");
                    if is_x86_feature_detected!("avx512f") && dim % 64 == 0 {
                        acc.fill(0.0);
                        unsafe {
                            super::super::attention_avx512::accumulate_values(
                                &weights, &v16, stride, offset, &mut acc,
                            )
                        };
                        super::finish_values(&acc, 0.37, &mut got);
                        assert_eq!(bits(&got), bits(&want), "avx512 values: {dim}, {n}");
                    }
                }
            }
        }
    }

    /// The same through the whole attention call (grouped heads, key chunks, threads).
    #[test]
    fn an_f16_cache_gives_the_bits_of_its_values_in_f32() {
        use super::{causal_attention, AttnShape};
        use half::f16;
        let shape = AttnShape {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
        };
        // One token, a verification that fills a run, and a prefill spanning two key chunks.
        for (start, n_new) in [(150, 1), (150, 8), (0, 70)] {
            let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
            let q: Vec<f32> = (0..n_new * q_dim).map(|i| val(i * 11 + 2)).collect();
            let half_of = |k: usize| -> Vec<f16> {
                (0..(start + n_new) * kv_dim)
                    .map(|i| f16::from_f32(val(i * k + 3) * 1.7))
                    .collect()
            };
            let (keys16, values16) = (half_of(7), half_of(5));
            let widen = |v: &[f16]| -> Vec<f32> { v.iter().map(|x| x.to_f32()).collect() };
            let (keys32, values32) = (widen(&keys16), widen(&values16));
            let mut from16 = vec![0f32; n_new * q_dim];
            causal_attention(shape, &q, &keys16, &values16, start, &mut from16);
            let mut from32 = vec![0f32; n_new * q_dim];
            causal_attention(shape, &q, &keys32, &values32, start, &mut from32);
            assert_eq!(bits(&from16), bits(&from32), "start {start}, {n_new} new");
        }
    }

    #[test]
    fn heads_computed_together_give_each_heads_own_result() {
        use super::{causal_attention, AttnShape};
        // 9 heads on 3 key-value heads (SmolLM2's shape). 150 cached tokens span three key
        // chunks, the last one odd; 3 new tokens fit one run per key-value head, 8 (24 units)
        // fill one exactly and 11 spill into a second, and a 70-token prefill from an empty
        // cache runs queries that see different numbers of chunks together. Large enough
        // shapes are split over threads.
        let shape = AttnShape {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
        };
        for (start, n_new) in [(150, 3), (150, 8), (150, 11), (0, 70)] {
            let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
            let q: Vec<f32> = (0..n_new * q_dim).map(|i| val(i * 11 + 2)).collect();
            let keys: Vec<f32> = (0..(start + n_new) * kv_dim)
                .map(|i| val(i * 7 + 3))
                .collect();
            let values: Vec<f32> = (0..(start + n_new) * kv_dim)
                .map(|i| val(i * 5 + 1))
                .collect();
            let mut ours = vec![0f32; n_new * q_dim];
            causal_attention(shape, &q, &keys, &values, start, &mut ours);
            let mut want = vec![0f32; n_new * q_dim];
            for i in 0..n_new {
                for h in 0..9 {
                    let seen = start + i + 1;
                    let mut scores = vec![0f32; seen];
                    let qv = &q[i * q_dim + h * 64..][..64];
                    scaled_dots(qv, &keys, kv_dim, h / 3 * 64, 0.125, &mut scores);
                    let inv = 1.0 / softmax_weights(&mut scores);
                    let o = &mut want[i * q_dim + h * 64..][..64];
                    weighted_values(&scores, inv, &values, kv_dim, h / 3 * 64, o);
                }
            }
            assert_eq!(bits(&ours), bits(&want), "{n_new} new tokens after {start}");
        }
    }

    #[test]
    fn vector_scores_equal_the_scalar_dot_bit_for_bit() {
        type Dots = fn(&[f32], &[f32], usize, usize, f32, &mut [f32]);
        let mut paths: Vec<(&str, Dots)> = vec![("dispatch", scaled_dots)];
        #[cfg(target_arch = "x86_64")]
        {
            if super::simd_available() {
                paths.push(("avx2", |q, k, s, o, sc, out| unsafe {
                    super::scaled_dots_avx2(q, k, s, o, sc, out)
                }));
            }
            if super::simd_available() && is_x86_feature_detected!("avx512f") {
                paths.push(("avx512", |q, k, s, o, sc, out| unsafe {
                    super::super::attention_avx512::scaled_dots(q, k, s, o, sc, out)
                }));
            }
        }
        // 8-key blocks and a tail; 23 keys also leave a tail after two blocks. Head sizes
        // of 64 and 48 run the vector paths, 40 the scalar one.
        for dim in [64, 48, 40] {
            for n in [1, 7, 8, 23, 64] {
                let (stride, offset) = (3 * dim, dim);
                let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
                let keys: Vec<f32> = (0..n * stride).map(|i| val(i * 7 + 3)).collect();
                for (name, path) in &paths {
                    if *name != "dispatch" && dim % 16 != 0 {
                        continue;
                    }
                    let mut scores = vec![0f32; n];
                    path(&q, &keys, stride, offset, 0.125, &mut scores);
                    for (j, &s) in scores.iter().enumerate() {
                        let k = &keys[j * stride + offset..j * stride + offset + dim];
                        assert_eq!(
                            s.to_bits(),
                            (dot(&q, k) * 0.125).to_bits(),
                            "{name}: key {j} of {n}, head size {dim}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn dot_is_close_to_the_exact_product() {
        for dim in [16, 64, 70] {
            let a: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let b: Vec<f32> = (0..dim).map(|i| val(i * 7 + 3)).collect();
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let scale: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (*x as f64 * *y as f64).abs())
                .sum();
            assert!(
                ((dot(&a, &b) as f64) - exact).abs() <= 1e-6 * scale,
                "{dim}"
            );
        }
    }

    #[test]
    fn vector_softmax_weights_equal_the_scalar_ones_bit_for_bit() {
        for n in [1, 5, 8, 13, 100, 1001] {
            let scores: Vec<f32> = (0..n).map(|j| val(j * 17 + 1) * 9.0).collect();
            let mut ours = scores.clone();
            let sum = softmax_weights(&mut ours);
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let want: Vec<f32> = scores.iter().map(|&s| softmax_exp(s - max)).collect();
            let mut lanes = [0f32; 8];
            let full = n / 8 * 8;
            for (j, w) in want[..full].iter().enumerate() {
                lanes[j % 8] += w;
            }
            let mut want_sum = super::lane_sum(&lanes);
            for w in &want[full..] {
                want_sum += w;
            }
            assert_eq!(bits(&ours), bits(&want), "{n} keys");
            assert_eq!(sum.to_bits(), want_sum.to_bits(), "{n} keys");
            // And they are softmax: the largest weight is 1, the sum is close to exact.
            let exact: f64 = scores.iter().map(|&s| ((s - max) as f64).exp()).sum();
            assert!(
                (sum as f64 - exact).abs() < 1e-6 * exact,
                "{sum} vs {exact}"
            );
        }
    }

    #[test]
    fn softmax_exp_is_within_two_ulp_of_exp() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = softmax_exp(x) as f64;
            let rel = (got - want).abs() / want;
            assert!(rel < 2.5e-7, "exp({x}) = {got}, want {want} ({rel:e})");
            x += 0.0137;
        }
        assert_eq!(softmax_exp(0.0), 1.0);
        assert!(softmax_exp(-1e9) < 2e-38 && softmax_exp(-1e9) > 0.0);
        assert!(softmax_exp(f32::NAN).is_nan());
        // A NaN score (a broken model) stays visible in the sum, vector lanes and tail alike.
        for at in [3, 9] {
            let mut s = vec![0.5f32; 10];
            s[at] = f32::NAN;
            assert!(softmax_weights(&mut s).is_nan(), "NaN at {at}");
        }
    }
}
