//! Qwen 3 mixtures of experts (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B): Qwen 3's
//! block (q/k norms) with every layer's feed-forward routed to 8 of 128 experts by a softmax
//! router whose chosen probabilities are renormalised.

use crate::model::arch::family::{no_gguf_extras, refuse_qwen_sliding_window, Family};
use crate::model::load::hparams::RopeLayout;
use crate::model::spec::block::{Block, Feedforward};

pub const FAMILY: Family = Family {
    gguf: "qwen3moe",
    hf_architectures: &["Qwen3MoeForCausalLM"],
    hf_model_types: &["qwen3_moe"],
    block: Block {
        qk_norm: true,
        feedforward: Feedforward::Routed,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras: no_gguf_extras,
    hf_extras: refuse_qwen_sliding_window,
};
