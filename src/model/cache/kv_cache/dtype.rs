//! The KV cache's element type: f16 (the default, half the reads and the memory), f32, bf16
//! (f16's bytes with f32's range, and attention on bf16 pairs), or q8_0 (8-bit integers with
//! one scale per 32 elements, about a quarter of f32's bytes).

use std::str::FromStr;

/// Element type of a KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Exactly the projections' values.
    #[default]
    F32,
    /// Rounded to half precision (to nearest, ties to even) when appended.
    F16,
    /// Rounded to bfloat16 (to nearest, ties to even; subnormals to zero) when appended; its
    /// attention multiplies bf16 pairs (queries and softmax weights rounded to bf16 too), as
    /// AVX-512 BF16's `vdpbf16ps` does, where the other types' attention is f32.
    Bf16,
    /// Each block of 32 elements rounded to `scale · q` when appended: `q` an integer in
    /// −127..=127, `scale` the block's largest magnitude over 127 rounded to f16 (so `scale · q`
    /// is exact in f32), held as f32 beside the block.
    Q8_0,
}

impl KvDtype {
    /// Elements one q8_0 scale covers (the attention kernels' blocks).
    pub const Q8_BLOCK: usize = crate::model::kernels::attention::Q8Rows::BLOCK;

    /// Bytes `elements` take (for q8_0, a multiple of [`Self::Q8_BLOCK`]).
    pub fn bytes_for(self, elements: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * elements,
            KvDtype::F16 | KvDtype::Bf16 => 2 * elements,
            KvDtype::Q8_0 => elements + 4 * elements.div_ceil(Self::Q8_BLOCK),
        }
    }
}

/// The cache types `FromStr` takes, as its errors list them.
const OFFERED: &str = "f32, f16, bf16 or q8_0";

impl FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "bf16" => Ok(KvDtype::Bf16),
            "q8_0" => Ok(KvDtype::Q8_0),
            // llama.cpp's other cache types: named, so a user coming from `-ctk` learns why.
            "q4_0" | "q4_1" | "iq4_nl" | "q5_0" | "q5_1" => Err(format!(
                "KV cache type {s:?} is not offered: keys of 4 or 5 bits move the model's \
                 next-token distribution far more than q8_0 does (docs/operations.md, \
                 \"Memory for the KV caches\"); expected {OFFERED}"
            )),
            _ => Err(format!("unknown KV cache type {s:?} (expected {OFFERED})")),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8_0 => "q8_0",
        })
    }
}
