//! Attention of a token tree's nodes: each node attends to the cache before the tree and to its
//! own ancestors (and itself), as if its path had been fed alone.
//!
//! Bitwise the linear forward of the node's path: the keys a node sees are presented in the
//! order the path's own forward would hold them (cache rows, then the path from the root down),
//! each score is the same `dot`, the softmax runs over the same score array, and each value
//! goes into the even or odd running sum by its index in that order, with the same fused
//! multiply-add the chunked kernels use; past one segment of keys, each segment's softmax is
//! kept apart and merged as the causal kernel merges them. So greedy verification of a tree
//! emits exactly what verifying the accepted path as a chain would.

use super::q8_query::{rounded_for, Q8Queries};
use super::q8_scores::scaled_q8_dots;
use super::shared::KvForm;
use super::KvRows;
use super::{
    accumulate_values, finish_values, merge_segments, scaled_dots, softmax_sum, softmax_weights,
    AttnShape, SegmentPart, SEGMENT,
};

/// Attention for the tree nodes whose queries are `q` (`n * q_dim`, rotated at their depths),
/// their keys and values appended after the first `start_pos` rows of `keys`/`values` in input
/// order. `paths[k]` lists node `k`'s ancestors and itself as input indices, from the first
/// input token down. `sinks`: as [`super::causal_attention`]'s.
pub fn tree_attention<K: KvRows>(
    shape: AttnShape,
    q: &[f32],
    keys: K,
    values: K,
    (start_pos, sinks): (usize, Option<&[f32]>),
    paths: &[Vec<usize>],
    out: &mut [f32],
) {
    rounded_for::<K, _>(q, |q8| {
        attend_nodes(
            shape,
            (q, q8),
            (keys, values),
            (start_pos, sinks),
            paths,
            out,
        )
    })
}

/// [`tree_attention`] with q8 keys' queries rounded (`q8`, see `q8_scores`).
fn attend_nodes<K: KvRows>(
    shape: AttnShape,
    (q, q8): (&[f32], Option<&Q8Queries>),
    (keys, values): (K, K),
    (start_pos, sinks): (usize, Option<&[f32]>),
    paths: &[Vec<usize>],
    out: &mut [f32],
) {
    let AttnShape {
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
    let n = paths.len();
    debug_assert_eq!(q.len(), n * q_dim);
    debug_assert_eq!(out.len(), q.len());
    debug_assert!(keys.elements() >= (start_pos + n) * kv_dim);
    let group = num_heads / num_kv_heads;
    let scale = 1f32 / (head_dim as f32).sqrt();
    let out_ptr = out.as_mut_ptr() as usize;

    thread_local! {
        static BUFFERS: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }
    // Unit u: node u / num_heads, head u % num_heads.
    let attend = |u: usize, scores: &mut Vec<f32>, acc: &mut Vec<f32>| {
        let (k, h) = (u / num_heads, u % num_heads);
        let kv_off = (h / group) * head_dim;
        let path = &paths[k];
        let seen = start_pos + path.len();
        let at = k * q_dim + h * head_dim;
        // The scores of the keys of `rows` (`kv_dim` apart), as the causal kernel takes them.
        let dots = |rows: K, scores: &mut [f32]| match q8 {
            Some(queries) => {
                let query = queries.query(at, head_dim);
                scaled_q8_dots(query, rows, (kv_dim, kv_off), scale, scores)
            }
            None => scaled_dots(&q[at..][..head_dim], rows, kv_dim, kv_off, scale, scores),
        };
        scores.clear();
        scores.resize(seen, 0.0);
        dots(keys, &mut scores[..start_pos]);
        for (d, &r) in path.iter().enumerate() {
            let row = keys.skip((start_pos + r) * kv_dim);
            dots(row, &mut scores[start_pos + d..][..1]);
        }
        // SAFETY: each (node, head) unit writes only its own head_dim-long span of `out`, and
        // every unit runs exactly once.
        let o = unsafe {
            std::slice::from_raw_parts_mut(
                (out_ptr as *mut f32).add(k * q_dim + h * head_dim),
                head_dim,
            )
        };
        let sink = sinks.map(|s| s[h]);
        // Keys `range`'s weighted values into `acc` (even and odd sums), as the chunked
        // kernels add them: the cache's rows by `accumulate_values`, the path's one by one.
        let add_values = |range: std::ops::Range<usize>, weights: &[f32], acc: &mut [f32]| {
            if K::FORM == KvForm::Bf16 {
                return add_paired_values(
                    range,
                    weights,
                    (values, kv_dim, kv_off),
                    path,
                    start_pos,
                    acc,
                );
            }
            let cached = range.start..range.end.min(start_pos);
            if !cached.is_empty() {
                let base = values.skip(cached.start * kv_dim);
                accumulate_values(&weights[..cached.len()], base, kv_dim, kv_off, acc);
            }
            let (even, odd) = acc.split_at_mut(head_dim);
            for j in range.start.max(start_pos)..range.end {
                let w = weights[j - range.start];
                let sums = if j.is_multiple_of(2) {
                    &mut *even
                } else {
                    &mut *odd
                };
                let row = (start_pos + path[j - start_pos]) * kv_dim + kv_off;
                assert!(row + head_dim <= values.elements());
                for (d, o) in sums.iter_mut().enumerate() {
                    *o = w.mul_add(values.get(row + d), *o);
                }
            }
        };
        if seen <= SEGMENT {
            let inv = 1f32 / softmax_sum(scores, sink);
            acc.clear();
            acc.resize(2 * head_dim, 0.0);
            add_values(0..seen, scores, acc);
            finish_values(acc, inv, o);
            return;
        }
        // Segments as the causal kernel takes them: each its own softmax and value sums
        // (`acc` holds them one after another), merged in order.
        let segments = seen.div_ceil(SEGMENT);
        let part_len = head_dim + 2;
        acc.clear();
        acc.resize(segments * part_len + 2 * head_dim, 0.0);
        let (parts, sums) = acc.split_at_mut(segments * part_len);
        for (g, part) in parts.chunks_exact_mut(part_len).enumerate() {
            let range = g * SEGMENT..seen.min((g + 1) * SEGMENT);
            let weights = &mut scores[range.clone()];
            (part[0], part[1]) = softmax_weights(weights);
            sums.fill(0.0);
            add_values(range.clone(), &scores[range], sums);
            let (even, odd) = sums.split_at(head_dim);
            for ((p, e), d) in part[2..].iter_mut().zip(even).zip(odd) {
                *p = e + d;
            }
        }
        let each = parts.chunks_exact(part_len).map(|p| SegmentPart {
            max: p[0],
            sum: p[1],
            values: &p[2..],
        });
        merge_segments(each, sink, o);
    };
    let run = |range: std::ops::Range<usize>| {
        BUFFERS.with_borrow_mut(|(scores, acc)| range.for_each(|u| attend(u, scores, acc)))
    };
    let units = n * num_heads;
    if units * (start_pos + n) < 4096 {
        run(0..units);
    } else {
        crate::model::kernels::parallel::for_each_chunk(units, run);
    }
}

/// A bf16 cache's value sums for keys `range` of a node's sequence (`bf16_pairs` pairs
/// neighbouring keys, so the path's rows cannot be added one by one): the cache's rows up to a
/// multiple of 4 keys from the range's start as they lie, then the rest, a last few cache rows
/// and the path's, gathered in the path's order. Pair parity counts from the range's start (a
/// segment's), as the causal kernel's chunks count it.
fn add_paired_values<K: KvRows>(
    range: std::ops::Range<usize>,
    weights: &[f32],
    (values, kv_dim, kv_off): (K, usize, usize),
    path: &[usize],
    start_pos: usize,
    acc: &mut [f32],
) {
    let head_dim = acc.len() / 2;
    let cached_end = range.end.min(start_pos).max(range.start);
    let split = range.start + (cached_end - range.start) / 4 * 4;
    if split > range.start {
        let base = values.skip(range.start * kv_dim);
        accumulate_values(&weights[..split - range.start], base, kv_dim, kv_off, acc);
    }
    let row = |j: usize| {
        if j < start_pos {
            j
        } else {
            start_pos + path[j - start_pos]
        }
    };
    // Exact: the values are bf16 already.
    let gathered: Vec<half::bf16> = (split..range.end)
        .flat_map(|j| (0..head_dim).map(move |d| row(j) * kv_dim + kv_off + d))
        .map(|i| half::bf16::from_f32(values.get(i)))
        .collect();
    let rest = &weights[split - range.start..][..range.end - split];
    accumulate_values(rest, gathered.as_slice(), head_dim, 0, acc);
}
