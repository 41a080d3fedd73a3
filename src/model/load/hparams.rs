//! A decoder model's hyperparameters, normalised from either GGUF metadata or a Hugging Face
//! config.json, so the forward pass never cares where a model came from. The keys every family
//! states alike are read here; each family's file (`model::arch`) reads its own extras.

use crate::model::arch::block::{Block, Experts};
pub use crate::model::load::gguf_keys::GgufKeys;
pub use crate::model::load::hf_config::{rope_scaling_from_hf, HfConfig};
pub use crate::model::load::rope_config::{longrope_attention_factor, RopeLayout, RopeScaling};
use crate::model::{ModelError, Result};

/// More experts per layer than any released model has: a file stating more is refused before
/// its tensors are read.
pub const MAX_EXPERTS: usize = 1024;

#[derive(Clone, Debug, PartialEq)]
pub struct LlamaHparams {
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

impl LlamaHparams {
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

    /// The hyperparameters every family's GGUF states under `{arch}.*`, for a family whose
    /// block is `block` and whose converter pairs rope dimensions as `rope_layout`: what is
    /// left to a family's own file is its extras (windows, per-layer rope).
    pub fn from_gguf_keys(keys: &GgufKeys, block: Block, rope_layout: RopeLayout) -> Result<Self> {
        let hidden_size = keys.u("embedding_length")?;
        let num_heads = keys.u("attention.head_count")?;
        let num_kv_heads = keys.opt_u("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = keys
            .opt_u("attention.key_length")
            .or_else(|| keys.opt_u("rope.dimension_count"))
            .unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match keys.opt_u("vocab_size") {
            Some(v) => v,
            None => keys
                .content
                .metadata
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| ModelError::BadConfig("GGUF metadata lacks a vocab size".into()))?,
        };
        let rope_scaling = keys.rope_scaling()?;
        let experts = keys.experts()?;
        let intermediate_size = match (keys.opt_u("feed_forward_length"), &experts) {
            (Some(n), _) => n,
            (None, Some(e)) => e.ffn_len,
            (None, None) => keys.u("feed_forward_length")?,
        };
        Ok(Self {
            family: keys.arch.clone(),
            block,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers: keys.u("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: keys.f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64,
            rope_theta: keys.f("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling,
            rope_layout,
            max_position_embeddings: keys.opt_u("context_length").unwrap_or(4096),
            tie_word_embeddings: !keys.content.tensor_infos.contains_key("output.weight"),
            windows: LayerWindows::none(),
            attn_scale: None,
            experts,
        })
    }

    /// The hyperparameters every family's `config.json` states the same way.
    pub fn from_hf(c: &HfConfig, block: Block) -> Result<Self> {
        let mut rope_scaling = c.rope_scaling()?;
        if let RopeScaling::LongRope {
            original_max_position_embeddings: original,
            attention_factor,
            ..
        } = &mut rope_scaling
        {
            let max = c.max_position_embeddings.unwrap_or(4096);
            if *original == 0 {
                *original = c.original_max_position_embeddings.unwrap_or(max);
            }
            if attention_factor.is_nan() {
                *attention_factor = longrope_attention_factor(max, *original);
            }
        }
        let num_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        Ok(Self {
            family: c.model_type.clone().unwrap_or_default(),
            block,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads,
            head_dim: c
                .head_dim
                .unwrap_or(c.hidden_size / c.num_attention_heads.max(1)),
            rms_norm_eps: c.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: c.rope_theta().unwrap_or(10_000.0),
            rope_scaling,
            rope_layout: RopeLayout::HalfSplit,
            max_position_embeddings: c.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            windows: LayerWindows::none(),
            attn_scale: None,
            experts: c.experts(),
        })
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
