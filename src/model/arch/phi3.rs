//! Phi-3 (mini, small, medium; 4k and 128k): Llama's block with q|k|v and gate|up each stored
//! as one tensor, every layer's attention in a sliding window where the config sets one, and
//! the 128k variants' LongRoPE (per-frequency factors, a cos/sin scale).

use crate::model::arch::family::Family;
use crate::model::load::hparams::{
    longrope_attention_factor, GgufKeys, HfConfig, Hparams, LayerWindows, RopeLayout, RopeScaling,
};
use crate::model::spec::block::Block;
use crate::model::{ModelError, Result};

pub const FAMILY: Family = Family {
    gguf: "phi3",
    hf_architectures: &["Phi3ForCausalLM"],
    hf_model_types: &["phi3"],
    block: Block {
        fused_projections: true,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras,
    hf_extras,
};

fn gguf_extras(keys: &GgufKeys, hp: &mut Hparams) -> Result<()> {
    let long = keys.f32_tensor("rope_factors_long.weight")?;
    let short = keys.f32_tensor("rope_factors_short.weight")?;
    match (short, long) {
        (Some(short_factor), Some(long_factor)) => {
            let original = keys
                .opt_u("rope.scaling.original_context_length")
                .unwrap_or(hp.max_position_embeddings);
            hp.rope_scaling = RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings: original,
                attention_factor: keys.f("rope.scaling.attn_factor").unwrap_or_else(|| {
                    longrope_attention_factor(hp.max_position_embeddings, original)
                }),
            };
        }
        (None, None) => {}
        _ => {
            return Err(ModelError::MissingTensor(
                "rope_factors_short.weight and rope_factors_long.weight go together".into(),
            ))
        }
    }
    if let Some(w) = keys.opt_u("attention.sliding_window").filter(|&w| w > 0) {
        hp.windows = LayerWindows::all(w);
    }
    Ok(())
}

fn hf_extras(c: &HfConfig, hp: &mut Hparams) -> Result<()> {
    if !matches!(
        hp.rope_scaling,
        RopeScaling::None | RopeScaling::LongRope { .. }
    ) {
        return Err(ModelError::Unsupported(format!(
            "Phi-3 rope scaling {:?} (LongRoPE is Phi-3's)",
            hp.rope_scaling
        )));
    }
    if let Some(w) = c.sliding_window.filter(|&w| w > 0) {
        hp.windows = LayerWindows::all(w);
    }
    Ok(())
}
