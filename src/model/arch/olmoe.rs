//! OLMoE (OLMoE-1B-7B): Llama's block with queries and keys RMS-normed over all their heads'
//! values at once (one weight per value), and every layer's feed-forward routed to 8 of 64
//! experts whose probabilities are not renormalised unless the model says so.

use crate::model::arch::family::{no_hf_extras, Family};
use crate::model::load::hparams::{GgufKeys, Hparams, RopeLayout};
use crate::model::spec::block::{Block, Feedforward};
use crate::model::Result;

pub const FAMILY: Family = Family {
    gguf: "olmoe",
    hf_architectures: &["OlmoeForCausalLM"],
    hf_model_types: &["olmoe"],
    block: Block {
        qk_norm: true,
        qk_norm_whole: true,
        feedforward: Feedforward::Routed,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras,
    hf_extras: no_hf_extras,
};

/// llama.cpp runs these files without renormalising the chosen experts' probabilities unless
/// the file states `expert_weights_norm`.
fn gguf_extras(keys: &GgufKeys, hp: &mut Hparams) -> Result<()> {
    crate::model::arch::qwen2moe::unnormalized_unless_stated(keys, hp)
}
