//! Gemma 3 (text): q/k norms, norms before and after both attention and the MLP, a GELU-tanh
//! gated MLP, embeddings scaled by √hidden, and five of every six layers attending within a
//! sliding window at their own rope base (10k) while the sixth is global (1M).

use crate::model::arch::family::Family;
use crate::model::load::hparams::{GgufKeys, HfConfig, Hparams, LayerWindows, RopeLayout};
use crate::model::spec::block::{Activation, Block, Feedforward};
use crate::model::{ModelError, Result};

/// Layers per global layer when the file does not say (llama.cpp's and transformers' default).
const PATTERN: usize = 6;
/// The windowed layers' rope base when the file does not say.
const LOCAL_ROPE_THETA: f32 = 10_000.0;

pub const FAMILY: Family = Family {
    gguf: "gemma3",
    hf_architectures: &["Gemma3ForCausalLM"],
    hf_model_types: &["gemma3_text"],
    block: Block {
        qkv_bias: false,
        qk_norm: true,
        qk_norm_whole: false,
        sandwich_norms: true,
        activation: Activation::GeluTanh,
        embed_scale: true,
        hf_norm_plus_one: true,
        fused_projections: false,
        feedforward: Feedforward::Dense,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras,
    hf_extras,
};

fn gguf_extras(keys: &GgufKeys, hp: &mut Hparams) -> Result<()> {
    if keys.f("final_logit_softcapping").is_some_and(|c| c > 0.0) {
        return Err(ModelError::Unsupported(
            "gemma3.final_logit_softcapping".into(),
        ));
    }
    if let Some(size) = keys.opt_u("attention.sliding_window").filter(|&w| w > 0) {
        let mut windows = match keys.bools("attention.sliding_window_pattern") {
            Some(windowed) => LayerWindows {
                size: Some(size),
                windowed,
                local_rope_theta: None,
            },
            None => {
                let period = keys
                    .opt_u("attention.sliding_window_pattern")
                    .unwrap_or(PATTERN);
                LayerWindows::pattern(size, period, hp.num_layers)
            }
        };
        windows.local_rope_theta = Some(keys.f("rope.freq_base_swa").unwrap_or(LOCAL_ROPE_THETA));
        hp.windows = windows;
    }
    // llama.cpp: 1/√(hidden/heads) for the 27B (62 layers), 1/√head_dim (the default) else.
    if hp.num_layers == 62 {
        hp.attn_scale = Some(1.0 / ((hp.hidden_size / hp.num_heads) as f32).sqrt());
    }
    Ok(())
}

fn hf_extras(c: &HfConfig, hp: &mut Hparams) -> Result<()> {
    if c.use_bidirectional_attention == Some(true) {
        return Err(ModelError::Unsupported(
            "config.json use_bidirectional_attention = true (an embedding model, not a decoder)"
                .into(),
        ));
    }
    if let Some(size) = c.sliding_window.filter(|&w| w > 0) {
        let mut windows = match c.windowed_by_type() {
            Some(windowed) => LayerWindows {
                size: Some(size),
                windowed,
                local_rope_theta: None,
            },
            None => {
                let period = c
                    .sliding_window_pattern
                    .or(c.sliding_window_pattern_private)
                    .unwrap_or(PATTERN);
                LayerWindows::pattern(size, period, hp.num_layers)
            }
        };
        windows.local_rope_theta = Some(c.local_rope_theta().unwrap_or(LOCAL_ROPE_THETA));
        hp.windows = windows;
    }
    if let Some(s) = c.query_pre_attn_scalar {
        hp.attn_scale = Some(1.0 / s.sqrt());
    }
    Ok(())
}
