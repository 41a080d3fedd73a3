//! The scalar definitions of the attention kernels: the arithmetic every vector kernel
//! reproduces exactly, and the path taken where no vector kernel applies (no AVX2, or a head
//! size that is not a multiple of the vector block).

use super::shared::{lane_sum, KvElement};
use crate::model::kernels::fast_exp::softmax_exp;

/// Dot product as sixteen lanes of fused multiply-add chains (element `i` of every 16-element
/// block in lane `i`), folded to eight (`lane i + lane i+8`) and summed in a fixed order: the
/// same bits for the same inputs wherever it is called, and what the vector paths compute
/// (AVX-512 as one 16-lane register, AVX2 as two 8-lane ones).
#[inline]
pub(super) fn dot<T: KvElement>(a: &[f32], b: &[T]) -> f32 {
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

/// The scalar form of [`super::scaled_dots`]: `scores[j] = dot(q, key j) * scale`.
pub(super) fn scaled_dots<T: KvElement>(
    q: &[f32],
    keys: &[T],
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    for (j, s) in scores.iter_mut().enumerate() {
        let k = &keys[j * stride + offset..j * stride + offset + q.len()];
        *s = dot(q, k) * scale;
    }
}

/// The scalar form of [`super::softmax_weights`].
pub(super) fn softmax_weights(scores: &mut [f32]) -> f32 {
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

/// The scalar form of [`super::accumulate_values`]: one fused multiply-add per element, key
/// `j` into the even sum when `j` is even, else into the odd one.
pub(super) fn accumulate_values<T: KvElement>(
    weights: &[f32],
    values: &[T],
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    let dim = acc.len() / 2;
    let (even, odd) = acc.split_at_mut(dim);
    for (j, &w) in weights.iter().enumerate() {
        let v = &values[j * stride + offset..][..dim];
        let sums = if j % 2 == 0 { &mut *even } else { &mut *odd };
        for (o, vd) in sums.iter_mut().zip(v) {
            *o = w.mul_add(vd.widen(), *o);
        }
    }
}
