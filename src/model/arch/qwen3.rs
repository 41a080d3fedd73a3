//! Qwen 3 (dense): Llama's block with each query and key head RMS-normed before rotation.

use crate::model::arch::family::{no_gguf_extras, refuse_qwen_sliding_window, Family};
use crate::model::load::hparams::RopeLayout;
use crate::model::spec::block::Block;

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
    hf_extras: refuse_qwen_sliding_window,
};
