//! Qwen 2 and 2.5: Llama's block with biases on the q, k and v projections.

use crate::model::arch::family::{no_gguf_extras, refuse_qwen_sliding_window, Family};
use crate::model::load::hparams::RopeLayout;
use crate::model::spec::block::Block;

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
    hf_extras: refuse_qwen_sliding_window,
};
