//! Attention arithmetic on a bf16 cache: products of bf16 pairs summed into f32, as the
//! AVX-512 BF16 instruction `vdpbf16ps` computes them, defined here in scalar code.
//!
//! Why it exists: an 8-token verification at depth is bound by its multiply-adds, not by its
//! reads, and `vdpbf16ps` does two of them a lane where `vfmadd231ps` does one, at about the
//! same rate. Its arithmetic is not f32's (both factors are bf16, and each instruction sums a
//! lane's two products into its accumulator, subnormals flushed), so a bf16 cache has a
//! definition of its own: queries and softmax weights rounded to bf16 as they are used, keys
//! and values rounded as they are stored. The vector kernels (`bf16_avx512`, which import this
//! module; `loops` chooses) give these bits exactly, and the tests run this definition on any
//! CPU.
//!
//! One lane's step ([`dp`]), matched bit for bit against the instruction on Zen 5 on 3.2 M
//! random lanes: `acc ← flush(fma(a₀, b₀, flush(fma(a₁, b₁, acc))))`, where `a₁, b₁` are the
//! pair's odd (high) halves and `flush` takes subnormal results to zero.
//!
//! - Scores: the dot of a query and a key of `dim` elements (a multiple of 32) is sixteen
//!   chains, chain `l` over the pairs `16c + l` (elements `32c + 2l` and `32c + 2l + 1`),
//!   folded as the f32 `dot` folds its lanes (`l + l+8`, then `lane_sum`).
//! - Value sums: keys `j, j + 1` (`j` even, counted from the sequence's first key) are one
//!   pair, pair `t` into the even sums when `t` is even, else the odd ones; a last key alone
//!   is a pair with a zero weight and a zero row. `(even + odd) · inv` finishes them, as for
//!   f32.

use half::bf16;

use super::shared::{lane_sum, KvForm, KvRows};

/// Elements of a head a bf16 cache needs whole multiples of: 16 pairs, one register.
pub const BF16_BLOCK: usize = 32;

/// `x` rounded to bf16 as `vcvtne2ps2bf16` rounds it: to nearest, ties to even; subnormals to
/// a zero of their sign; a NaN stays a (quiet) NaN.
#[inline]
pub fn round(x: f32) -> bf16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return bf16::from_bits(((bits >> 16) as u16) | 0x40);
    }
    if bits & 0x7f80_0000 == 0 {
        return bf16::from_bits(((bits >> 16) as u16) & 0x8000);
    }
    let bias = 0x7fff + ((bits >> 16) & 1);
    bf16::from_bits((bits.wrapping_add(bias) >> 16) as u16)
}

/// A subnormal to a zero of its sign; anything else as it is.
#[inline]
fn flush(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE {
        0f32.copysign(x)
    } else {
        x
    }
}

/// bf16 bits widened to f32, subnormals read as zero.
#[inline]
fn widen(b: u16) -> f32 {
    flush(f32::from_bits(u32::from(b) << 16))
}

/// One lane of `vdpbf16ps`: `acc` plus the pair `(a₀, a₁) · (b₀, b₁)`, the odd product first.
#[inline]
pub(super) fn dp(acc: f32, a: [u16; 2], b: [u16; 2]) -> f32 {
    let odd = flush(widen(a[1]).mul_add(widen(b[1]), flush(acc)));
    flush(widen(a[0]).mul_add(widen(b[0]), odd))
}

/// The bits of a bf16 view's element `i`.
#[inline]
fn bits<K: KvRows>(rows: K, i: usize) -> u16 {
    debug_assert!(K::FORM == KvForm::Bf16 && i < rows.elements());
    // SAFETY: a bf16 view's base holds `elements()` u16s; `i` is inside (asserted by callers).
    unsafe { *rows.base().cast::<u16>().add(i) }
}

/// `q` rounded to bf16 bits, into `out` (cleared first): the tests' reference rounding.
#[cfg(test)]
pub(super) fn round_into(q: &[f32], out: &mut Vec<u16>) {
    out.clear();
    out.extend(q.iter().map(|&x| round(x).to_bits()));
}

/// The scalar form of the bf16 score: query bits `q` (a multiple of 32 long) against the key
/// at element `at` of `rows`.
pub(super) fn dot<K: KvRows>(q: &[u16], rows: K, at: usize) -> f32 {
    assert!(q.len().is_multiple_of(BF16_BLOCK) && at + q.len() <= rows.elements());
    let mut lanes = [0f32; 16];
    for c in 0..q.len() / BF16_BLOCK {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let e = BF16_BLOCK * c + 2 * l;
            let k = [bits(rows, at + e), bits(rows, at + e + 1)];
            *lane = dp(*lane, [q[e], q[e + 1]], k);
        }
    }
    let folded: [f32; 8] = std::array::from_fn(|l| lanes[l] + lanes[l + 8]);
    lane_sum(&folded)
}

/// `scores[j] = dot(q, key j) · scale` on a bf16 cache, `q` already rounded (bf16 bits): the
/// scalar form of `super::loops::scaled_dots`' bf16 path.
pub(super) fn scaled_dots<K: KvRows>(
    q: &[u16],
    keys: K,
    (stride, offset): (usize, usize),
    scale: f32,
    scores: &mut [f32],
) {
    for (j, s) in scores.iter_mut().enumerate() {
        *s = dot(q, keys, j * stride + offset) * scale;
    }
}

/// Heads' softmax weights as bf16 bits, each rounded once (`round`) for all its uses: head
/// `m`'s weight of key `j` (counted from a key of the sequence a multiple of 4 from its first)
/// is `bits[m * stride + j]`. The vector kernels read them two at a time, as the pair of keys
/// `2t, 2t + 1`, so a lone last key's partner must be inside `bits` too (it never counts).
#[derive(Clone, Copy)]
pub(super) struct WeightBits<'a> {
    pub(super) bits: &'a [u16],
    pub(super) stride: usize,
}

impl<'a> WeightBits<'a> {
    /// Checks that `heads` heads' pairs of weights for `n` keys are inside the bits.
    pub(super) fn check(&self, heads: usize, n: usize) {
        assert!(heads > 0);
        assert!(n == 0 || (heads - 1) * self.stride + 2 * n.div_ceil(2) <= self.bits.len());
    }

    /// Head `m`'s weights.
    pub(super) fn head(self, m: usize) -> &'a [u16] {
        &self.bits[m * self.stride..]
    }
}

/// The scalar form of `super::loops::accumulate_values`' bf16 path for one head: the first
/// `n` keys paired (`weights` starts at a key of the sequence a multiple of 4 from its first).
pub(super) fn accumulate_values<K: KvRows>(
    weights: &[u16],
    n: usize,
    values: K,
    (stride, offset): (usize, usize),
    acc: &mut [f32],
) {
    let dim = acc.len() / 2;
    assert!(n <= weights.len());
    assert!(n == 0 || (n - 1) * stride + offset + dim <= values.elements());
    let (even, odd) = acc.split_at_mut(dim);
    for (t, pair) in weights[..n].chunks(2).enumerate() {
        let sums = if t % 2 == 0 { &mut *even } else { &mut *odd };
        let w = [pair[0], pair.get(1).copied().unwrap_or(0)];
        let (r0, r1) = (2 * t * stride + offset, (2 * t + 1) * stride + offset);
        for (d, o) in sums.iter_mut().enumerate() {
            let v1 = if pair.len() == 2 {
                bits(values, r1 + d)
            } else {
                0
            };
            *o = dp(*o, w, [bits(values, r0 + d), v1]);
        }
    }
}
