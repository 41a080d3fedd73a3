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
//! Keys and values are f32, f16, bf16 or q8_0 ([`KvRows`]); f16 and q8_0 ones are widened to f32 as
//! they are loaded (exactly: f16 by one instruction on the vector paths, q8_0 as its byte times
//! its block's scale, a product f32 holds exactly), so the arithmetic and its bits are those of
//! f32 keys and values holding the same numbers, while a deep cache, whose reads bound
//! attention, is half the bytes (f16) or about a quarter (q8_0). q8_0 keys are the exception:
//! their scores are byte dot products with the query rounded to q8 blocks (`q8_scores`, on
//! AVX-512 VNNI in `q8_vnni`), exact in i32 and so the same bits on every path. bf16 keys
//! and values are not widened either: their arithmetic is bf16 pairs summed into f32, as
//! `vdpbf16ps` computes it (`bf16_pairs` defines it, `bf16_avx512` runs it), the queries and
//! softmax weights rounded to bf16 as they are used.
//!
//! The scalar definitions are in `scalar`, the vector kernels in `avx2` and `avx512` (one file
//! per instruction set), and what they all share (the element type, the fixed lane reductions,
//! the softmax exponential) in `shared`, which imports none of them; `loops` chooses among them
//! for each inner loop; `causal` holds the public call and groups its work into runs and
//! segments, `tree` a token tree's attention over its paths, and `segments` how both take a
//! deep context's keys in fixed segments and merge them.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod bf16_avx512;
mod bf16_pairs;
#[cfg(test)]
mod bf16_tests;
#[cfg(test)]
mod call_tests;
mod causal;
#[cfg(test)]
mod element_tests;
mod loops;
mod q8_query;
#[cfg(test)]
mod q8_score_tests;
mod q8_scores;
#[cfg(target_arch = "x86_64")]
mod q8_vnni;
mod scalar;
mod segments;
mod shared;
#[cfg(test)]
mod tests;
mod tree_attention;
#[cfg(target_arch = "x86_64")]
mod vertical;

pub use bf16_pairs::{round as round_bf16, BF16_BLOCK};
pub use causal::{causal_attention, prefetch_cache, AttnShape};

/// Whether a bf16 cache's attention runs on `vdpbf16ps` here (AVX-512 BF16); elsewhere its
/// scalar definition gives the same bits, slowly.
pub fn bf16_kernels_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        bf16_avx512::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
pub use shared::{KvRows, Q8Rows};
pub use tree_attention::tree_attention;

// The loops `tree` and the tests share with the causal call.
use loops::{accumulate_values, finish_values, scaled_dots, softmax_sum, softmax_weights};
#[cfg(test)]
use loops::{accumulate_values_heads, scaled_dots_heads};
pub use segments::SEGMENT;
use segments::{merge_segments, SegmentPart};
#[cfg(all(test, target_arch = "x86_64"))]
use shared::{simd_available, wide_available};
