//! The scalar definitions of the attention kernels: the arithmetic every vector kernel
//! reproduces exactly, and the path taken where no vector kernel applies (no AVX2, or a head
//! size that is not a multiple of the vector block).

use super::shared::{lane_sum, KvRows};
use crate::model::kernels::fast_exp::softmax_exp;

/// Dot product as sixteen lanes of fused multiply-add chains (element `i` of every 16-element
/// block in lane `i`), folded to eight (`lane i + lane i+8`) and summed in a fixed order: the
/// same bits for the same inputs wherever it is called, and what the vector paths compute
/// (AVX-512 as one 16-lane register, AVX2 as two 8-lane ones).
/// `b` is the `a.len()` elements of `rows` from element `at`.
#[inline]
pub(super) fn dot<K: KvRows>(a: &[f32], rows: K, at: usize) -> f32 {
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let ra = ca.remainder();
    for (c, x) in ca.enumerate() {
        for l in 0..16 {
            acc[l] = x[l].mul_add(rows.get(at + c * 16 + l), acc[l]);
        }
    }
    let folded: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
    let sum = lane_sum(&folded);
    if ra.is_empty() {
        return sum;
    }
    let tail_at = at + a.len() - ra.len();
    let mut tail = 0f32;
    for (i, x) in ra.iter().enumerate() {
        tail = x.mul_add(rows.get(tail_at + i), tail);
    }
    sum + tail
}

/// The scalar form of [`super::scaled_dots`]: `scores[j] = dot(q, key j) * scale`.
pub(super) fn scaled_dots<K: KvRows>(
    q: &[f32],
    keys: K,
    stride: usize,
    offset: usize,
    scale: f32,
    scores: &mut [f32],
) {
    for (j, s) in scores.iter_mut().enumerate() {
        assert!(j * stride + offset + q.len() <= keys.elements());
        *s = dot(q, keys, j * stride + offset) * scale;
    }
}

/// The scalar form of [`super::softmax_weights`].
pub(super) fn softmax_weights(scores: &mut [f32]) -> (f32, f32) {
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
    (max, sum)
}

/// The scalar form of [`super::accumulate_values`]: one fused multiply-add per element, key
/// `j` into the even sum when `j` is even, else into the odd one.
pub(super) fn accumulate_values<K: KvRows>(
    weights: &[f32],
    values: K,
    stride: usize,
    offset: usize,
    acc: &mut [f32],
) {
    let dim = acc.len() / 2;
    let (even, odd) = acc.split_at_mut(dim);
    for (j, &w) in weights.iter().enumerate() {
        let at = j * stride + offset;
        assert!(at + dim <= values.elements());
        let sums = if j % 2 == 0 { &mut *even } else { &mut *odd };
        for (d, o) in sums.iter_mut().enumerate() {
            *o = w.mul_add(values.get(at + d), *o);
        }
    }
}
