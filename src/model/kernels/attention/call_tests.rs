//! The whole attention call (causal and tree, grouped heads, key chunks, threads, a deep
//! context's segments, sinks) against definitions computed apart: each row's bits are those of
//! the loops it is built of, whichever call computes it and beside whichever others.

use super::tests::{bits, noise, on_one_thread, val, weighted_values};
use super::{scaled_dots, softmax_weights};

/// Past one segment of keys, each query's output is its segments' softmaxes merged
/// (`merge_segments`, checked here against the plain softmax in f64); a row's bits are the
/// same computed alone, as one of two or four, beside 7 others, or as a tree's chain, with and
/// without sinks, short of the depth where a step's heads take turns along the cache rows
/// (`interleaved`) and past it; and a query within the first segment keeps the plain softmax's
/// bits in a deep call.
#[test]
fn deep_contexts_merge_segments_the_same_whichever_call_computes_a_row() {
    deep_contexts_case(half::f16::from_f32, half::f16::to_f64, 1e-5);
}

/// The same on a bf16 cache, whose arithmetic is its own (`bf16_pairs`: queries and weights
/// rounded to bf16, pairs of products): every row the same bits whichever call computes it,
/// the tree's chain included (its path's value rows paired as the chain's), and within bf16's
/// rounding of the plain softmax.
#[test]
fn a_bf16_cache_merges_segments_the_same_whichever_call_computes_a_row() {
    deep_contexts_case(super::round_bf16, half::bf16::to_f64, 1e-2);
}

fn deep_contexts_case<T: Copy + Send + Sync>(
    store: impl Fn(f32) -> T,
    wide: impl Fn(T) -> f64,
    tolerance: f64,
) where
    for<'a> &'a [T]: super::KvRows,
{
    use super::{causal_attention, tree_attention, AttnShape, SEGMENT};
    let shape = AttnShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
    };
    let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
    let total = 4 * SEGMENT + 300;
    let keys: Vec<T> = (0..total * kv_dim).map(|i| store(noise(2 * i))).collect();
    let values: Vec<T> = (0..total * kv_dim)
        .map(|i| store(noise(2 * i + 1)))
        .collect();
    let q_at = |pos: usize| -> Vec<f32> {
        (0..q_dim)
            .map(|i| 6.0 * noise(1 << 40 | (pos * q_dim + i)))
            .collect()
    };
    let sinks = [0.5f32, -2.0, 3.0, 1.0, 0.0, -1.0, 2.0, 0.25, -0.5];
    // Queries at `start..start + n`, one call.
    let call = |start: usize, n: usize, sinks: Option<&[f32]>| {
        let q: Vec<f32> = (start..start + n).flat_map(q_at).collect();
        let mut out = vec![0f32; n * q_dim];
        let kv = (start + n) * kv_dim;
        causal_attention(
            shape,
            &q,
            &keys[..kv],
            &values[..kv],
            (start, sinks),
            &mut out,
        );
        out
    };
    for sinks in [None, Some(&sinks[..])] {
        // 8 queries across the first segment's end, then the second's, then deep in the fifth.
        for start in [SEGMENT - 4, 2 * SEGMENT - 3, total - 8] {
            let together = call(start, 8, sinks);
            // Two and four queries: a step's and a short verification's runs, interleaved
            // over every key-value head past a few segments.
            for n in [2, 4] {
                let few = on_one_thread(|| call(start + 3, n, sinks));
                assert_eq!(
                    bits(&together[3 * q_dim..][..n * q_dim]),
                    bits(&few),
                    "queries {}.. as {n} and beside {} others",
                    start + 3,
                    8 - n
                );
            }
            for i in 0..8 {
                let alone = call(start + i, 1, sinks);
                assert_eq!(
                    bits(&together[i * q_dim..][..q_dim]),
                    bits(&alone),
                    "query {} alone and beside 7 others",
                    start + i
                );
                let one_thread = on_one_thread(|| call(start + i, 1, sinks));
                assert_eq!(
                    bits(&one_thread),
                    bits(&alone),
                    "query {} on one thread",
                    start + i
                );
            }
            let q: Vec<f32> = (start..start + 8).flat_map(q_at).collect();
            let paths: Vec<Vec<usize>> = (0..8).map(|i| (0..=i).collect()).collect();
            let mut tree = vec![0f32; 8 * q_dim];
            let kv = (start + 8) * kv_dim;
            tree_attention(
                shape,
                &q,
                &keys[..kv],
                &values[..kv],
                (start, sinks),
                &paths,
                &mut tree,
            );
            assert_eq!(bits(&tree), bits(&together), "a tree's chain at {start}");
        }
        // A 700-token prefill from nothing: its first queries (one segment) keep the plain
        // softmax's bits, as a shallow call computes them.
        let prefill = call(0, SEGMENT + 188, sinks);
        let shallow = call(0, 40, sinks);
        assert_eq!(bits(&prefill[..40 * q_dim]), bits(&shallow));
    }
    // Against the softmax over all keys in f64.
    let pos = total - 1;
    let out = call(pos, 1, Some(&sinks));
    let q = q_at(pos);
    for (h, &sink) in sinks.iter().enumerate() {
        let kv = h / 3 * 64;
        let scores: Vec<f64> = (0..=pos)
            .map(|j| {
                (0..64)
                    .map(|d| q[h * 64 + d] as f64 * wide(keys[j * kv_dim + kv + d]))
                    .sum::<f64>()
                    / 8.0
            })
            .collect();
        let max = scores.iter().copied().fold(sink as f64, f64::max);
        let total_weight: f64 =
            scores.iter().map(|s| (s - max).exp()).sum::<f64>() + (sink as f64 - max).exp();
        for d in 0..64 {
            let want: f64 = scores
                .iter()
                .enumerate()
                .map(|(j, s)| (s - max).exp() / total_weight * wide(values[j * kv_dim + kv + d]))
                .sum();
            let got = out[h * 64 + d] as f64;
            assert!(
                (got - want).abs() <= tolerance * (1.0 + want.abs()),
                "head {h}, value {d}: {got} against {want}"
            );
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
        let (keys32, values32) = (widen(keys16.as_slice()), widen(values16.as_slice()));
        let mut from16 = vec![0f32; n_new * q_dim];
        causal_attention(
            shape,
            &q,
            keys16.as_slice(),
            values16.as_slice(),
            (start, None),
            &mut from16,
        );
        let mut from32 = vec![0f32; n_new * q_dim];
        causal_attention(
            shape,
            &q,
            keys32.as_slice(),
            values32.as_slice(),
            (start, None),
            &mut from32,
        );
        assert_eq!(bits(&from16), bits(&from32), "start {start}, {n_new} new");
    }
}

#[test]
fn heads_computed_together_give_each_heads_own_result() {
    use super::{causal_attention, AttnShape};
    // 9 heads on 3 key-value heads (SmolLM2's shape), and 8 on 2 (groups of 4, as Llama 3's,
    // which the kernels take 3 heads and 1 at a time). 150 cached tokens span three key
    // chunks, the last one odd; 3 new tokens fit one run per key-value head, 8 (24 or 32
    // units) fill one and 11 (33 or 44) split into two, and a 70-token prefill from an empty
    // cache runs queries that see different numbers of chunks together. Large enough
    // shapes are split over threads; 4 heads on one key-value head (Gemma-3's) split their
    // one-segment step of 400 keys into runs, one a thread.
    for (num_heads, num_kv_heads) in [(9, 3), (8, 2), (4, 1)] {
        let shape = AttnShape {
            num_heads,
            num_kv_heads,
            head_dim: 64,
        };
        let group = num_heads / num_kv_heads;
        for (start, n_new) in [(150, 3), (150, 8), (150, 11), (0, 70), (400, 1)] {
            let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
            let q: Vec<f32> = (0..n_new * q_dim).map(|i| val(i * 11 + 2)).collect();
            let keys: Vec<f32> = (0..(start + n_new) * kv_dim)
                .map(|i| val(i * 7 + 3))
                .collect();
            let values: Vec<f32> = (0..(start + n_new) * kv_dim)
                .map(|i| val(i * 5 + 1))
                .collect();
            let mut ours = vec![0f32; n_new * q_dim];
            causal_attention(
                shape,
                &q,
                keys.as_slice(),
                values.as_slice(),
                (start, None),
                &mut ours,
            );
            let mut want = vec![0f32; n_new * q_dim];
            for i in 0..n_new {
                for h in 0..num_heads {
                    let seen = start + i + 1;
                    let mut scores = vec![0f32; seen];
                    let qv = &q[i * q_dim + h * 64..][..64];
                    scaled_dots(
                        qv,
                        keys.as_slice(),
                        kv_dim,
                        h / group * 64,
                        0.125,
                        &mut scores,
                    );
                    let inv = 1.0 / softmax_weights(&mut scores).1;
                    let o = &mut want[i * q_dim + h * 64..][..64];
                    weighted_values(&scores, inv, values.as_slice(), kv_dim, h / group * 64, o);
                }
            }
            assert_eq!(
                bits(&ours),
                bits(&want),
                "{num_heads} heads: {n_new} new tokens after {start}"
            );
        }
    }
}

/// Attention sinks (gpt-oss): each head's output is the softmax over its scores and its sink
/// logit, of which only the scores carry values, computed here in f64 by that definition; a
/// sink of -inf is no sink at all (the same bits), and a tree's chain gives the causal bits.
#[test]
fn sinks_join_each_heads_softmax_without_a_value() {
    use super::{causal_attention, tree_attention, AttnShape};
    let shape = AttnShape {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
    };
    let (start, n_new) = (40, 5);
    let (q_dim, kv_dim) = (shape.q_dim(), shape.kv_dim());
    let q: Vec<f32> = (0..n_new * q_dim).map(|i| 3.0 * val(i * 11 + 2)).collect();
    let keys: Vec<f32> = (0..(start + n_new) * kv_dim)
        .map(|i| val(i * 7 + 3))
        .collect();
    let values: Vec<f32> = (0..(start + n_new) * kv_dim)
        .map(|i| val(i * 5 + 1))
        .collect();
    let run = |sinks: Option<&[f32]>| {
        let mut out = vec![0f32; n_new * q_dim];
        causal_attention(
            shape,
            &q,
            keys.as_slice(),
            values.as_slice(),
            (start, sinks),
            &mut out,
        );
        out
    };
    let sinks = [0.5f32, -2.0, 3.0, 40.0];
    let ours = run(Some(&sinks));
    for i in 0..n_new {
        for (h, &sink) in sinks.iter().enumerate() {
            let kv = h / 2 * 64;
            let qv = &q[i * q_dim + h * 64..][..64];
            let scores: Vec<f64> = (0..start + i + 1)
                .map(|j| {
                    let k = &keys[j * kv_dim + kv..][..64];
                    qv.iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        / 8.0
                })
                .collect();
            let max = scores.iter().copied().fold(sink as f64, f64::max);
            let total: f64 =
                scores.iter().map(|s| (s - max).exp()).sum::<f64>() + (sink as f64 - max).exp();
            for d in 0..64 {
                let want: f64 = scores
                    .iter()
                    .enumerate()
                    .map(|(j, s)| (s - max).exp() / total * values[j * kv_dim + kv + d] as f64)
                    .sum();
                let got = ours[i * q_dim + h * 64 + d] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "query {i}, head {h}, value {d}: {got} against {want}"
                );
            }
        }
    }
    // A sink far above every score leaves the head almost nothing to attend to.
    let last_head = &ours[(n_new - 1) * q_dim + 3 * 64..][..64];
    assert!(last_head.iter().all(|v| v.abs() < 1e-6), "{last_head:?}");
    assert_eq!(bits(&run(Some(&[f32::NEG_INFINITY; 4]))), bits(&run(None)));
    let paths: Vec<Vec<usize>> = (0..n_new).map(|i| (0..=i).collect()).collect();
    let mut tree = vec![0f32; n_new * q_dim];
    tree_attention(
        shape,
        &q,
        keys.as_slice(),
        values.as_slice(),
        (start, Some(&sinks)),
        &paths,
        &mut tree,
    );
    assert_eq!(bits(&tree), bits(&ours));
}
