//! A deep context's keys in segments at fixed positions, each with its own softmax, and the
//! merge that gives a query's output from them (flash-decoding): what the causal and tree
//! kernels share so a row's bits do not depend on which of them computes it, or on how the
//! threads split the segments.

/// Keys of one segment: a query's keys are taken in segments of this many, at fixed absolute
/// positions (`0..SEGMENT`, `SEGMENT..2 SEGMENT`, ...), each with its own softmax (its own
/// maximum, sum and value sums), merged by [`merge_segments`] in segment order. The
/// segments of a deep context are the unit of work the threads share (flash-decoding): a
/// step's few heads alone would leave a thread idle (SmolLM2's three key-value heads on two
/// threads) or read a key-value head's cache on both (Gemma 3's one). Where the segments fall
/// depends only on the query's position, never on the threads or on the tokens beside it, so
/// a row's bits stay what they are alone. A context of at most this many keys is one segment,
/// whose softmax is the plain one. A multiple of the causal kernel's key chunk.
pub const SEGMENT: usize = 512;

/// One segment's softmax, for [`merge_segments`]: the segment's greatest score, the sum of its
/// weights (each `softmax_exp(score − max)`), and the weighted sums of its values.
pub(super) struct SegmentPart<'a> {
    pub max: f32,
    pub sum: f32,
    pub values: &'a [f32],
}

/// Merges a query's segments, in order, into its attention output: each segment's sums are
/// scaled to the greatest maximum, `softmax_exp(max − greatest)` (exactly 1 for the segment
/// holding it), and added in segment order; a sink joins the denominator as in
/// `softmax_sum`. (A query of one segment never comes here: its output is the plain
/// softmax's, computed in one pass.) Compiled for AVX-512 too where it runs: each element's
/// product and sum are the same operations, sixteen elements an instruction.
pub(super) fn merge_segments<'a>(
    parts: impl Iterator<Item = SegmentPart<'a>> + Clone,
    sink: Option<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::shared::simd_available() && super::shared::wide_available() {
        // SAFETY: AVX-512 was checked.
        return unsafe { merge_wide(parts, sink, out) };
    }
    merge(parts, sink, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn merge_wide<'a>(
    parts: impl Iterator<Item = SegmentPart<'a>> + Clone,
    sink: Option<f32>,
    out: &mut [f32],
) {
    merge(parts, sink, out)
}

#[inline(always)]
fn merge<'a>(
    parts: impl Iterator<Item = SegmentPart<'a>> + Clone,
    sink: Option<f32>,
    out: &mut [f32],
) {
    let greatest = parts.clone().fold(f32::NEG_INFINITY, |m, p| m.max(p.max));
    let mut sum = 0f32;
    out.fill(0.0);
    for p in parts {
        let scale = if p.max == greatest {
            1.0
        } else {
            crate::model::kernels::fast_exp::softmax_exp(p.max - greatest)
        };
        // A product and a sum, not a fused multiply-add: the build's baseline has no FMA
        // instruction, and `mul_add` there is a library call per element.
        sum += p.sum * scale;
        for (o, v) in out.iter_mut().zip(p.values) {
            *o += v * scale;
        }
    }
    if let Some(sink) = sink {
        sum += (sink - greatest).exp();
    }
    let inv = 1f32 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}
