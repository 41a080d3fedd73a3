//! Qwen 3 (dense): Llama's block with each query and key head RMS-normed before rotation.

use crate::model::arch::block::Block;
use crate::model::arch::family::Family;
use crate::model::load::hparams::{GgufKeys, HfConfig, LlamaHparams, RopeLayout};
use crate::model::{ModelError, Result};

pub const FAMILY: Family = Family {
    gguf: "qwen3",
    hf_architectures: &["Qwen3ForCausalLM"],
    hf_model_types: &["qwen3"],
    block: Block {
        qk_norm: true,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras: no_gguf_extras,
    hf_extras,
};

fn hf_extras(c: &HfConfig, _: &mut LlamaHparams) -> Result<()> {
    if c.use_sliding_window == Some(true) {
        return Err(ModelError::Unsupported(
            "config.json use_sliding_window = true (Qwen 3's windowed layers)".into(),
        ));
    }
    Ok(())
}

fn no_gguf_extras(_: &GgufKeys, _: &mut LlamaHparams) -> Result<()> {
    Ok(())
}
