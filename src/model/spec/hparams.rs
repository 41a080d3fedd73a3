//! A decoder model's hyperparameters, normalised: what the forward, the caches and the engine
//! read, wherever the model came from. A leaf of the model layer: the file formats' readers
//! (`load`) fill it and the families (`arch`) declare their parts of it, and it imports
//! neither.

use crate::model::spec::block::{Block, Experts};
pub use crate::model::spec::rope::{RopeLayout, RopeScaling};
use crate::model::{ModelError, Result};

/// More experts per layer than any released model has: a file stating more is refused before
/// its tensors are read.
pub const MAX_EXPERTS: usize = 1024;

#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    /// The family, as its files name it (GGUF `general.architecture`, or `model_type`).
    pub family: String,
    /// What the family's decoder block does beyond Llama's.
    pub block: Block,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub rope_layout: RopeLayout,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Sliding-window attention, where the family has it.
    pub windows: LayerWindows,
    /// The attention score scale where it is not `1/√head_dim` (Gemma 3's
    /// `query_pre_attn_scalar`).
    pub attn_scale: Option<f32>,
    /// The mixture of experts every layer's feed-forward is, where the model has one.
    pub experts: Option<Experts>,
}

impl Hparams {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::BadConfig(m));
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.num_layers == 0 {
            return bad("head and layer counts must be positive".into());
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even and positive",
                self.head_dim
            ));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.intermediate_size == 0 {
            return bad("vocab, hidden and intermediate sizes must be positive".into());
        }
        if let Some(e) = &self.experts {
            if e.used == 0 || e.used > e.count || e.ffn_len == 0 {
                return bad(format!(
                    "experts: {} used of {} (width {}) is not a mixture",
                    e.used, e.count, e.ffn_len
                ));
            }
            if e.count > MAX_EXPERTS {
                return bad(format!(
                    "{} experts per layer (tandem runs at most {MAX_EXPERTS})",
                    e.count
                ));
            }
        }
        Ok(())
    }

    /// The window layer `l` attends within (`None`: every earlier token).
    pub fn window(&self, l: usize) -> Option<usize> {
        self.windows.of(l)
    }

    /// The rope base layer `l` rotates with: a windowed layer's own base where the family
    /// gives one (Gemma 3's local layers), else the model's.
    pub fn layer_rope(&self, l: usize) -> LayerRope {
        match (self.windows.local_rope_theta, self.window(l)) {
            (Some(_), Some(_)) => LayerRope::Local,
            _ => LayerRope::Global,
        }
    }

    /// These hyperparameters as a windowed layer with its own rope base rotates: that base,
    /// unscaled.
    pub fn local_rope(&self) -> Option<Self> {
        self.windows.local_rope_theta.map(|theta| Self {
            rope_theta: theta,
            rope_scaling: RopeScaling::None,
            ..self.clone()
        })
    }
}

/// Which of a model's rope tables a layer rotates with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerRope {
    Global,
    Local,
}

/// Sliding-window attention: the window, which layers use it, and their rope base.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LayerWindows {
    /// Keys a windowed layer's query sees: itself and the `size - 1` before it.
    pub size: Option<usize>,
    /// `windowed[l]`: layer `l` attends within the window (empty with a window: all layers).
    pub windowed: Vec<bool>,
    /// The rope base of windowed layers, where it differs from the model's.
    pub local_rope_theta: Option<f32>,
}

impl LayerWindows {
    pub fn none() -> Self {
        Self::default()
    }

    /// Every layer within `size`.
    pub fn all(size: usize) -> Self {
        Self {
            size: Some(size),
            ..Self::default()
        }
    }

    /// Layers `l` with `l % period < period - 1` windowed, every `period`-th global (Gemma's
    /// pattern; llama.cpp's `set_swa_pattern`).
    pub fn pattern(size: usize, period: usize, layers: usize) -> Self {
        Self {
            size: Some(size),
            windowed: (0..layers)
                .map(|l| period == 0 || l % period < period.saturating_sub(1))
                .collect(),
            local_rope_theta: None,
        }
    }

    fn of(&self, l: usize) -> Option<usize> {
        let size = self.size?;
        (self.windowed.is_empty() || self.windowed.get(l).copied().unwrap_or(false)).then_some(size)
    }
}
