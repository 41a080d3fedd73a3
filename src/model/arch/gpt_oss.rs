//! gpt-oss (OpenAI's gpt-oss-20b and -120b): every layer's feed-forward routed to 4 of 32 or
//! 128 experts by a router with a bias, the chosen experts weighted by a softmax over their
//! logits alone; experts with biases and a clamped SwiGLU; attention with q/k/v/o biases and a
//! learned sink per head; every other layer (the even ones) attending within a sliding
//! window; NeoX rope with YaRN. llama.cpp's files keep the experts in MXFP4 (read as they are,
//! `load::mxfp4`).

use crate::model::arch::family::Family;
use crate::model::kernels::elementwise::{SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT};
use crate::model::load::hparams::{GgufKeys, HfConfig, Hparams, LayerWindows, RopeLayout};
use crate::model::spec::block::{Activation, Block, Feedforward};
use crate::model::{ModelError, Result};

/// Windowed layers per global one: layers 0, 2, 4, ... attend within the window (llama.cpp's
/// `set_swa_pattern(2)`, transformers' `layer_types`).
const PATTERN: usize = 2;

pub const FAMILY: Family = Family {
    gguf: "gpt-oss",
    hf_architectures: &["GptOssForCausalLM"],
    hf_model_types: &["gpt_oss"],
    block: Block {
        qkv_bias: true,
        activation: Activation::SwigluOai,
        feedforward: Feedforward::Routed,
        ffn_and_out_bias: true,
        attn_sinks: true,
        gguf_ffn_norm_post_attention: true,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::HalfSplit,
    gguf_extras,
    hf_extras,
};

/// The softmax over the chosen experts' logits is the renormalised softmax over all of them.
fn routed_softmax_over_chosen(hp: &mut Hparams) {
    if let Some(e) = &mut hp.experts {
        e.norm_top_k = true;
    }
}

fn gguf_extras(keys: &GgufKeys, hp: &mut Hparams) -> Result<()> {
    routed_softmax_over_chosen(hp);
    if let Some(size) = keys.opt_u("attention.sliding_window").filter(|&w| w > 0) {
        hp.windows = LayerWindows::pattern(size, PATTERN, hp.num_layers);
    }
    // The real files' rope (YaRN over a 4096-token original context) is not rounded where
    // gpt-oss's own code does not round it (`RopeScaling::Yarn::truncate`).
    if let crate::model::spec::rope::RopeScaling::Yarn { truncate, .. } = &mut hp.rope_scaling {
        *truncate = false;
    }
    Ok(())
}

fn hf_extras(c: &HfConfig, hp: &mut Hparams) -> Result<()> {
    routed_softmax_over_chosen(hp);
    if let Some(limit) = c.swiglu_limit.filter(|&l| l != SWIGLU_OAI_LIMIT) {
        return Err(ModelError::Unsupported(format!(
            "config.json swiglu_limit = {limit} (gpt-oss's is {SWIGLU_OAI_LIMIT})"
        )));
    }
    if let Some(alpha) = c.swiglu_alpha.filter(|&a| a != SWIGLU_OAI_ALPHA) {
        return Err(ModelError::Unsupported(format!(
            "config.json swiglu_alpha = {alpha} (gpt-oss's is {SWIGLU_OAI_ALPHA})"
        )));
    }
    if let Some(size) = c.sliding_window.filter(|&w| w > 0) {
        hp.windows = match c.windowed_by_type() {
            Some(windowed) => LayerWindows {
                size: Some(size),
                windowed,
                local_rope_theta: None,
            },
            None => LayerWindows::pattern(size, PATTERN, hp.num_layers),
        };
    }
    Ok(())
}
