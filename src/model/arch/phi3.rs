//! Phi-3 (mini, medium; 4k context): Llama's block with q|k|v and gate|up each stored as one
//! tensor, and every layer's attention in a sliding window where the config sets one.
//! The 128k variants' `longrope` scaling is refused by name.

use crate::model::arch::block::Block;
use crate::model::arch::family::Family;
use crate::model::load::hparams::{
    GgufKeys, HfConfig, LayerWindows, LlamaHparams, RopeLayout, RopeScaling,
};
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

fn gguf_extras(keys: &GgufKeys, hp: &mut LlamaHparams) -> Result<()> {
    if keys
        .content
        .tensor_infos
        .contains_key("rope_factors_long.weight")
    {
        return Err(ModelError::Unsupported(
            "Phi-3 long-context rope factors (the 128k variants' longrope scaling)".into(),
        ));
    }
    if let Some(w) = keys.opt_u("attention.sliding_window").filter(|&w| w > 0) {
        hp.windows = LayerWindows::all(w);
    }
    Ok(())
}

fn hf_extras(c: &HfConfig, hp: &mut LlamaHparams) -> Result<()> {
    if hp.rope_scaling != RopeScaling::None {
        return Err(ModelError::Unsupported(
            "Phi-3 rope scaling (the 128k variants' longrope)".into(),
        ));
    }
    if let Some(w) = c.sliding_window.filter(|&w| w > 0) {
        hp.windows = LayerWindows::all(w);
    }
    Ok(())
}
