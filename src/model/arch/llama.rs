//! Llama 2 and 3.x, SmolLM, and Mistral (a Llama block with every layer's attention in a
//! sliding window, where its config sets one): the block every other family is told apart
//! from. llama.cpp writes Mixtral's files under this architecture too (with `expert_count`
//! and routed tensors), so a Llama GGUF's feed-forward is dense or routed as the file says.

use crate::model::arch::family::Family;
use crate::model::load::hparams::{GgufKeys, HfConfig, Hparams, LayerWindows, RopeLayout};
use crate::model::spec::block::{Block, Feedforward};
use crate::model::Result;

pub const FAMILY: Family = Family {
    gguf: "llama",
    hf_architectures: &["LlamaForCausalLM", "MistralForCausalLM"],
    hf_model_types: &["llama", "mistral"],
    block: Block {
        feedforward: Feedforward::DenseOrRouted,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::Interleaved,
    gguf_extras,
    hf_extras,
};

fn gguf_extras(keys: &GgufKeys, hp: &mut Hparams) -> Result<()> {
    if let Some(w) = keys.opt_u("attention.sliding_window").filter(|&w| w > 0) {
        hp.windows = LayerWindows::all(w);
    }
    Ok(())
}

fn hf_extras(c: &HfConfig, hp: &mut Hparams) -> Result<()> {
    if let Some(w) = c.sliding_window.filter(|&w| w > 0) {
        hp.windows = LayerWindows::all(w);
    }
    Ok(())
}
