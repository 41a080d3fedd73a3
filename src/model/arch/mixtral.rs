//! Mixtral (8x7B, 8x22B): Llama's block with every layer's feed-forward routed to 2 of 8
//! experts by a softmax router whose chosen probabilities are renormalised. This is its
//! Hugging Face form; llama.cpp writes its GGUF files as the `llama` architecture, which the
//! Llama family reads with the experts the file states.

use crate::model::arch::family::{no_gguf_extras, Family};
use crate::model::load::hparams::{HfConfig, Hparams, LayerWindows, RopeLayout};
use crate::model::spec::block::{Block, Feedforward};
use crate::model::Result;

pub const FAMILY: Family = Family {
    gguf: "llama",
    hf_architectures: &["MixtralForCausalLM"],
    hf_model_types: &["mixtral"],
    block: Block {
        feedforward: Feedforward::Routed,
        ..Block::LLAMA
    },
    gguf_rope: RopeLayout::Interleaved,
    gguf_extras: no_gguf_extras,
    hf_extras,
};

/// Mixtral always renormalises its chosen experts' probabilities; its config may set a window
/// (Mistral's, off in the released models).
fn hf_extras(c: &HfConfig, hp: &mut Hparams) -> Result<()> {
    if let Some(e) = &mut hp.experts {
        e.norm_top_k = true;
    }
    if let Some(w) = c.sliding_window.filter(|&w| w > 0) {
        hp.windows = LayerWindows::all(w);
    }
    Ok(())
}
