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

/// Dot product as eight lanes of fused multiply-add chains summed in a fixed order: the same
/// bits for the same inputs wherever it is called, and what the vector path computes.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let sum = lane_sum(&acc);
    if ra.is_empty() {
        return sum;
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail = x.mul_add(*y, tail);
    }
    sum + tail
}

/// The fixed reduction of eight lanes: `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`.
#[inline]
fn lane_sum(a: &[f32; 8]) -> f32 {
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
/// The vector path computes each score with exactly `dot`'s arithmetic, eight keys at a time
/// with their eight-lane reductions done in registers (a transpose by shuffles and horizontal
/// adds that pairs the lanes as `lane_sum` does): bitwise the same scores as the scalar path,
/// whatever the number of keys.
fn scaled_dots(
    q: &[f32],
    keys: &[f32],
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if q.len().is_multiple_of(8) && simd_available() {
            // SAFETY: AVX2 was checked; every key read is inside `keys`, as the slicing of
            // the scalar path below would check (asserted once here).
            assert!(
                scores.is_empty() || (scores.len() - 1) * stride + offset + q.len() <= keys.len()
            );
            unsafe { scaled_dots_avx2(q, keys, stride, offset, scale, scores) };
            return;
        }
    }
    for (j, s) in scores.iter_mut().enumerate() {
        let k = &keys[j * stride + offset..j * stride + offset + q.len()];
        *s = dot(q, k) * scale;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scaled_dots_avx2(
    q: &[f32],
    keys: &[f32],
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    use std::arch::x86_64::*;
    let chunks = q.len() / 8;
    let qp = q.as_ptr();
    let kp = keys.as_ptr().add(offset);
    let n = scores.len();
    let sv = _mm256_set1_ps(scale);
    // x_i = a_i + a_(i+4) for two accumulators at once: [A.x0..x3, B.x0..x3].
    #[inline(always)]
    unsafe fn fold(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    }
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut j = 0;
    while j + 8 <= n {
        let mut a = [_mm256_setzero_ps(); 8];
        for c in 0..chunks {
            let qv = _mm256_loadu_ps(qp.add(c * 8));
            for (i, acc) in a.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp.add((j + i) * stride + c * 8)), *acc);
            }
        }
        // hadd pairs (x0 + x1), (x2 + x3) within each key, then their sums: lanes come out
        // as keys [0, 2, 4, 6, 1, 3, 5, 7], put back in order by one permute.
        let h0 = _mm256_hadd_ps(fold(a[0], a[1]), fold(a[2], a[3]));
        let h1 = _mm256_hadd_ps(fold(a[4], a[5]), fold(a[6], a[7]));
        let sums = _mm256_permutevar8x32_ps(_mm256_hadd_ps(h0, h1), order);
        _mm256_storeu_ps(scores.as_mut_ptr().add(j), _mm256_mul_ps(sums, sv));
        j += 8;
    }
    while j < n {
        let k = kp.add(j * stride);
        let mut acc = _mm256_setzero_ps();
        for c in 0..chunks {
            acc = _mm256_fmadd_ps(
                _mm256_loadu_ps(qp.add(c * 8)),
                _mm256_loadu_ps(k.add(c * 8)),
                acc,
            );
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
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

/// `out = (Σ_j weights[j] · value j) · inv`, one fused multiply-add per element and key in
/// key order, where value `j` is `values[j * stride + offset..][..out.len()]`.
///
/// The vector path keeps 64 outputs in registers while it streams the values, with the same
/// operations per element in the same order as the scalar path: bitwise the same result.
fn weighted_values(
    weights: &[f32],
    inv: f32,
    values: &[f32],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if out.len().is_multiple_of(64) && simd_available() {
            assert!(
                weights.is_empty()
                    || (weights.len() - 1) * stride + offset + out.len() <= values.len()
            );
            // SAFETY: AVX2 was checked; every value read is inside `values` (asserted above).
            unsafe { weighted_values_avx2(weights, inv, values, stride, offset, out) };
            return;
        }
    }
    out.fill(0.);
    for (j, &w) in weights.iter().enumerate() {
        let v = &values[j * stride + offset..j * stride + offset + out.len()];
        for (od, vd) in out.iter_mut().zip(v) {
            *od = w.mul_add(*vd, *od);
        }
    }
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_values_avx2(
    weights: &[f32],
    inv: f32,
    values: &[f32],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let iv = _mm256_set1_ps(inv);
    for block in 0..out.len() / 64 {
        let vp = values.as_ptr().add(offset + block * 64);
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, &w) in weights.iter().enumerate() {
            let wv = _mm256_set1_ps(w);
            let v = vp.add(j * stride);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(v.add(r * 8)), *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(
                out.as_mut_ptr().add(block * 64 + r * 8),
                _mm256_mul_ps(*a, iv),
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn simd_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// Attention for queries at absolute positions `start_pos..start_pos + n_new`.
///
/// `q`: `n_new * q_dim` (already rotated); `keys`/`values`: the sequence's whole cache,
/// `(start_pos + n_new) * kv_dim`, new tokens included; `out`: `n_new * q_dim`.
/// Work is split over (query, head) units on candle's thread pool; the split never changes a
/// unit's arithmetic.
pub fn causal_attention(
    shape: AttnShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
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
    let out_ptr = out.as_mut_ptr() as usize;

    thread_local! {
        // Per-thread score buffer, kept across calls so decoding does not allocate per layer.
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let run_units = |range: std::ops::Range<usize>, scores: &mut Vec<f32>| {
        for unit in range {
            let (i, h) = (unit / num_heads, unit % num_heads);
            let kvh = h / group;
            let seen = start_pos + i + 1;
            let qv = &q[i * q_dim + h * head_dim..i * q_dim + (h + 1) * head_dim];
            scores.clear();
            scores.resize(seen, 0.0);
            scaled_dots(qv, keys, kv_dim, kvh * head_dim, scale, scores);
            let inv = 1f32 / softmax_weights(scores);
            // SAFETY: each unit writes only its own head_dim-long span of `out`.
            let o = unsafe {
                std::slice::from_raw_parts_mut(
                    (out_ptr as *mut f32).add(i * q_dim + h * head_dim),
                    head_dim,
                )
            };
            weighted_values(scores, inv, values, kv_dim, kvh * head_dim, o);
        }
    };
    let run =
        |range: std::ops::Range<usize>| SCORES.with_borrow_mut(|scores| run_units(range, scores));
    if units * (start_pos + n_new) < 4096 {
        run(0..units);
    } else {
        super::parallel::for_each_chunk(units, run);
    }
}

#[cfg(test)]
mod tests {
    use super::{dot, scaled_dots, softmax_exp, softmax_weights, weighted_values};

    fn val(i: usize) -> f32 {
        ((i * 104_729 % 2000) as f32 - 1000.0) * 1e-3
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn vector_value_sums_equal_the_scalar_loop_bit_for_bit() {
        let (dim, stride, offset, n) = (128, 384, 128, 37);
        let values: Vec<f32> = (0..n * stride).map(val).collect();
        let weights: Vec<f32> = (0..n).map(|j| val(j * 31 + 7).abs()).collect();
        let mut ours = vec![0f32; dim];
        weighted_values(&weights, 0.37, &values, stride, offset, &mut ours);
        let mut want = vec![0f32; dim];
        for (j, &w) in weights.iter().enumerate() {
            for (d, o) in want.iter_mut().enumerate() {
                *o = w.mul_add(values[j * stride + offset + d], *o);
            }
        }
        for o in want.iter_mut() {
            *o *= 0.37;
        }
        assert_eq!(bits(&ours), bits(&want));
    }

    #[test]
    fn vector_scores_equal_the_scalar_dot_bit_for_bit() {
        // 8-key blocks and a tail; 23 keys also leave a tail after two blocks.
        for n in [1, 7, 8, 23, 64] {
            let (dim, stride, offset) = (64, 192, 64);
            let q: Vec<f32> = (0..dim).map(|i| val(i * 13 + 5)).collect();
            let keys: Vec<f32> = (0..n * stride).map(|i| val(i * 7 + 3)).collect();
            let mut scores = vec![0f32; n];
            scaled_dots(&q, &keys, stride, offset, 0.125, &mut scores);
            for (j, &s) in scores.iter().enumerate() {
                let k = &keys[j * stride + offset..j * stride + offset + dim];
                assert_eq!(
                    s.to_bits(),
                    (dot(&q, k) * 0.125).to_bits(),
                    "key {j} of {n}"
                );
            }
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
