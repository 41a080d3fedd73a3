//! How a model's rotary embeddings are laid out and scaled, as its files state it: the leaf
//! both file formats' readers and the rope tables share.

/// Frequency scaling applied to RoPE (Llama 3.1/3.2 use `llama3`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (Gemma 3's global layers at 4B and up).
    Linear {
        factor: f32,
    },
    /// Phi-3's LongRoPE: each frequency divided by its own factor (the short set, or the long
    /// one where the context configured passes the original, as llama.cpp chooses), and
    /// cos/sin scaled by `attention_factor`.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f32,
    },
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// YaRN (gpt-oss): each frequency blended between itself (where it turns more than
    /// `beta_fast` times over the original context) and itself divided by `factor` (fewer than
    /// `beta_slow` times), linearly in between, and cos/sin scaled by `attention_factor`.
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
        /// The blend's ends are rounded out to whole dimensions (llama.cpp; transformers'
        /// default); gpt-oss's own code does not round them.
        truncate: bool,
    },
}

/// YaRN's default cos/sin scale: `0.1 · ln(factor) + 1` (1 where `factor ≤ 1`).
pub fn yarn_attention_factor(factor: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    }
}

/// How q/k head dimensions are paired for rotation. GGUF converters permute q/k weights so that
/// adjacent pairs rotate together; Hugging Face checkpoints rotate the two halves of each head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    Interleaved,
    HalfSplit,
}

/// LongRoPE's default cos/sin scale (transformers' and llama.cpp's converter's):
/// `√(1 + ln(s) / ln(original))` with `s = max / original`, 1 where `s ≤ 1`.
pub fn longrope_attention_factor(max: usize, original: usize) -> f32 {
    let scale = max as f64 / original.max(2) as f64;
    if scale <= 1.0 {
        1.0
    } else {
        (1.0 + scale.ln() / (original.max(2) as f64).ln()).sqrt() as f32
    }
}
