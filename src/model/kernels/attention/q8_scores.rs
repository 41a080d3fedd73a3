//! Scores against q8_0 keys on the integer units: the query rounded to q8 blocks as the keys
//! are (llama.cpp's flash attention does the same for a q8_0 K cache), each block's dot
//! product summed exactly in i32, and the blocks joined in f32 in a fixed order.
//!
//! Why it exists: widened to f32, a q8 key element costs three instructions before its
//! multiply-add (sign extension, conversion, scale), which held a deep step's reads at 54-73% of
//! the memory bound and made the scores a quarter of a verification's time. A byte dot product
//! does 64 multiply-adds an instruction (`vpdpbusd`) where f32 does 16, with no widening.
//!
//! The definition (`q8_dot`): for each block `b` of 32 elements, `isum_b` = Σ q_i · k_i in i32
//! (exact: at most 32 · 127 · 127), then `acc = fma(isum_b as f32, dq_b · dk_b, acc)` over the
//! blocks in order from `acc = 0`, and the score is `acc · scale`. An integer sum has one value
//! whatever order adds it, so every path (scalar, AVX2, AVX-512 VNNI, keys in the lanes or
//! across them) gives the same bits, and a row's score never depends on its batch.

use super::q8_query::Q8Query;
use super::shared::{KvForm, KvRows, Q8Rows};

/// Elements per query scale: the keys' block.
const BLOCK: usize = Q8Rows::BLOCK;

/// The unscaled score of `query` against the q8 key at element `at` of `keys` (a block
/// start): the definition every path computes (module docs).
pub(super) fn q8_dot<K: KvRows>(query: Q8Query, keys: K, at: usize) -> f32 {
    let dim = query.dim();
    assert!(K::FORM == KvForm::Q8 && at + dim <= keys.elements());
    // SAFETY: a q8 view's base points at its i8 elements, `at + dim` of them inside it
    // (asserted); the slice is read only within this call.
    let k = unsafe { std::slice::from_raw_parts(keys.base().add(at).cast::<i8>(), dim) };
    let mut acc = 0f32;
    for (b, (qb, kb)) in query
        .quants
        .chunks_exact(BLOCK)
        .zip(k.chunks_exact(BLOCK))
        .enumerate()
    {
        let isum: i32 = qb
            .iter()
            .zip(kb)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        // SAFETY: element `at + 32 b` is inside the view (asserted for the whole row).
        let dk = unsafe { keys.scale(at + BLOCK * b) };
        acc = (isum as f32).mul_add(query.scales[b] * dk, acc);
    }
    acc
}

/// `scores[j] = q8_dot(query, key j) * scale`, key `j` at element `j * stride + offset`.
pub(super) fn scaled_q8_dots<K: KvRows>(
    query: Q8Query,
    keys: K,
    (stride, offset): (usize, usize),
    scale: f32,
    scores: &mut [f32],
) {
    let n = scores.len();
    assert!(n == 0 || (n - 1) * stride + offset + query.dim() <= keys.elements());
    #[cfg(target_arch = "x86_64")]
    {
        use super::q8_vnni;
        match q8_vnni::Isa::best() {
            Some(q8_vnni::Isa::Avx512Vnni) => {
                thread_local! {
                    static KT: std::cell::RefCell<Vec<f32>> =
                        const { std::cell::RefCell::new(Vec::new()) };
                }
                return KT.with_borrow_mut(|kt| {
                    for (c, out) in scores.chunks_mut(q8_vnni::CHUNK).enumerate() {
                        let at = offset + c * q8_vnni::CHUNK * stride;
                        let one = |_: usize| query;
                        q8_vnni::transposed_scores(
                            keys,
                            (stride, at),
                            out.len(),
                            (1, &one),
                            scale,
                            (out, 0),
                            kt,
                        );
                    }
                });
            }
            // SAFETY: AVX2 was checked; every key read is inside `keys` (asserted above).
            Some(q8_vnni::Isa::Avx2) => {
                return unsafe {
                    q8_vnni::scaled_dots(query, keys, (stride, offset), scale, scores)
                }
            }
            None => {}
        }
    }
    for (j, s) in scores.iter_mut().enumerate() {
        *s = q8_dot(query, keys, j * stride + offset) * scale;
    }
}

/// Scores of `units` queries (`query(m)`, writing to `out.0[m * out.1..][..n]`) against `n ≤
/// 64` q8 keys (`keys` from key 0, `(stride, offset)` as [`scaled_q8_dots`]'): on AVX-512
/// VNNI from the chunk transposed once for all of them, else query by query.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_scores<'q, K: KvRows>(
    keys: K,
    (stride, offset): (usize, usize),
    n: usize,
    (units, query): (usize, &dyn Fn(usize) -> Q8Query<'q>),
    scale: f32,
    (out, out_stride): (&mut [f32], usize),
    kt: &mut Vec<f32>,
) {
    assert!(n <= 64);
    #[cfg(target_arch = "x86_64")]
    if super::q8_vnni::Isa::best() == Some(super::q8_vnni::Isa::Avx512Vnni) {
        super::q8_vnni::transposed_scores(
            keys,
            (stride, offset),
            n,
            (units, query),
            scale,
            (out, out_stride),
            kt,
        );
        return;
    }
    let _ = kt;
    for m in 0..units {
        let s = &mut out[m * out_stride..][..n];
        scaled_q8_dots(query(m), keys, (stride, offset), scale, s);
    }
}
