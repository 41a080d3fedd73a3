//! Qwen 2 mixtures of experts (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen 2's block (q/k/v
//! biases) with every layer's feed-forward routed, plus a shared expert every token reads whose
//! output a sigmoid gate scales; the chosen experts' probabilities are not renormalised unless
//! the model says so.

use crate::model::arch::family::{refuse_qwen_sliding_window, Family};
use crate::model::load::hparams::{GgufKeys, Hparams, RopeLayout};
use crate::model::spec::block::{Block, Feedforward};
use crate::model::Result;

pub const FAMILY: Family = Family {
    gguf: "qwen2moe",
    hf_architectures: &["Qwen2MoeForCausalLM"],
    hf_model_types: &["qwen2_moe"],
    block: Block {
        qkv_bias: true,
        feedforward: Feedforward::Routed,
        shared_expert: true,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras,
    hf_extras: refuse_qwen_sliding_window,
};

/// llama.cpp runs these files without renormalising the chosen experts' probabilities
/// (`norm_topk_prob` is false in the released models) unless the file states
/// `expert_weights_norm`.
fn gguf_extras(keys: &GgufKeys, hp: &mut Hparams) -> Result<()> {
    unnormalized_unless_stated(keys, hp)
}

/// A mixture's chosen probabilities as the file states (`expert_weights_norm`), else not
/// renormalised (llama.cpp's rule for Qwen2-MoE and OLMoE files).
pub(super) fn unnormalized_unless_stated(keys: &GgufKeys, hp: &mut Hparams) -> Result<()> {
    let stated = keys
        .content
        .metadata
        .get(&format!("{}.expert_weights_norm", keys.arch))
        .and_then(|v| v.to_bool().ok());
    if let Some(e) = &mut hp.experts {
        e.norm_top_k = stated.unwrap_or(false);
    }
    Ok(())
}
