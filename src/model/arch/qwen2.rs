//! Qwen 2 and 2.5: Llama's block with biases on the q, k and v projections.

use crate::model::arch::block::Block;
use crate::model::arch::family::Family;
use crate::model::load::hparams::{GgufKeys, HfConfig, LlamaHparams, RopeLayout};
use crate::model::{ModelError, Result};

pub const FAMILY: Family = Family {
    gguf: "qwen2",
    hf_architectures: &["Qwen2ForCausalLM"],
    hf_model_types: &["qwen2"],
    block: Block {
        qkv_bias: true,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras: no_gguf_extras,
    hf_extras,
};

/// Qwen 2's sliding window (layers past `max_window_layers`) is off in every released model;
/// a config that turns it on is refused rather than run without it.
fn hf_extras(c: &HfConfig, _: &mut LlamaHparams) -> Result<()> {
    if c.use_sliding_window == Some(true) {
        return Err(ModelError::Unsupported(
            "config.json use_sliding_window = true (Qwen 2's windowed layers)".into(),
        ));
    }
    Ok(())
}

fn no_gguf_extras(_: &GgufKeys, _: &mut LlamaHparams) -> Result<()> {
    Ok(())
}
