//! A head's weights as a checkpoint holds them ([`HeadTensors`]), its shape from the target's,
//! and where the default model's shipped head lives.

use candle_core::Tensor;

use super::eagle3::Eagle3Parts;
use crate::model::spec::hparams::Hparams;

/// A head's weights in f32 as a checkpoint stores them (Hugging Face layout: `(out, in)`,
/// q/k rotated by halves), for saving and training.
#[derive(Clone, Debug)]
pub struct HeadTensors {
    /// `(hidden, 2·hidden)` over `[embedding, feature]`; an EAGLE-3 head's `(hidden,
    /// 3·hidden)` over its three taps.
    pub fc: Tensor,
    pub fc_bias: Option<Tensor>,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub ffn_norm: Tensor,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
    /// Target token ids, most frequent first (in the target's own answers): a reduced draft
    /// vocabulary of K tokens is the first K. Empty: no ranking shipped.
    pub token_rank: Vec<u32>,
    /// An EAGLE-3 head's own parts (its q/k/v then read `2·hidden` columns).
    pub eagle3: Option<Eagle3Parts>,
}

/// The folder of the default model's shipped head: the source tree's copy this binary was
/// built from when it is there (it matches the build), else where `scripts/fetch-default-model`
/// puts it beside the default model (a binary run elsewhere: a container, a portable build).
pub fn default_head_dir() -> std::path::PathBuf {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("heads")
        .join(DEFAULT_HEAD);
    if source.join("config.json").exists() {
        return source;
    }
    crate::model::loaded::cache_dir()
        .join("heads")
        .join(DEFAULT_HEAD)
}

/// The shipped head's folder name (under `heads/` in the repository and the cache).
pub const DEFAULT_HEAD: &str = "SmolLM2-135M-Instruct";

/// The head's shape: its layer's sizes (those of a target layer) and the target's vocabulary.
pub fn head_hparams(target: &Hparams) -> Hparams {
    // The head's layer is a Llama block whatever the target's family.
    Hparams {
        num_layers: 1,
        rope_layout: crate::model::spec::hparams::RopeLayout::HalfSplit,
        block: crate::model::spec::block::Block::LLAMA,
        windows: crate::model::spec::hparams::LayerWindows::none(),
        attn_scale: None,
        ..target.clone()
    }
}
