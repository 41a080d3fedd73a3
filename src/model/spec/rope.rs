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
