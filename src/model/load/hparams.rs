//! A decoder model's hyperparameters, normalised from either GGUF metadata or a Hugging Face
//! config.json, so the forward pass never cares where a model came from. The keys every family
//! states alike are read here; each family's file (`model::arch`) reads its own extras.

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use crate::model::arch::block::Block;
use crate::model::{ModelError, Result};

/// Frequency scaling applied to RoPE (Llama 3.1/3.2 use `llama3`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (Gemma 3's global layers at 4B and up).
    Linear {
        factor: f32,
    },
    /// Phi-3's LongRoPE: each frequency divided by its own factor (the short set, or the long
    /// one where the context configured passes the original, as llama.cpp chooses), and
    /// cos/sin scaled by `attention_factor`.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f32,
    },
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// How q/k head dimensions are paired for rotation. GGUF converters permute q/k weights so that
/// adjacent pairs rotate together; Hugging Face checkpoints rotate the two halves of each head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    Interleaved,
    HalfSplit,
}

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
        Ok(Self {
            family: keys.arch.clone(),
            block,
            vocab_size,
            hidden_size,
            intermediate_size: keys.u("feed_forward_length")?,
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
        })
    }

    /// The hyperparameters every family's `config.json` states the same way.
    pub fn from_hf(c: &HfConfig, block: Block) -> Result<Self> {
        let mut rope_scaling = match c.rope_scaling_value() {
            None => RopeScaling::None,
            Some(v) => rope_scaling_from_hf(&v)?,
        };
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

/// A GGUF's metadata under one architecture's prefix (`gemma3.block_count`), and the file
/// for the few hyperparameters stored as tensors (Phi-3's rope factors).
pub struct GgufKeys<'a> {
    pub content: &'a gguf_file::Content,
    pub arch: String,
    pub path: &'a std::path::Path,
}

impl<'a> GgufKeys<'a> {
    /// The file's architecture and its keys.
    pub fn new(content: &'a gguf_file::Content, path: &'a std::path::Path) -> Self {
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        Self {
            content,
            arch,
            path,
        }
    }

    /// A small tensor of the file, in f32 (`None` when the file has none of that name).
    pub fn f32_tensor(&self, name: &str) -> Result<Option<Vec<f32>>> {
        if !self.content.tensor_infos.contains_key(name) {
            return Ok(None);
        }
        let unreadable = |e: String| ModelError::Unreadable {
            path: self.path.to_owned(),
            reason: format!("tensor {name}: {e}"),
        };
        let mut file = std::fs::File::open(self.path).map_err(|e| unreadable(e.to_string()))?;
        let q = self
            .content
            .tensor(&mut file, name, &candle_core::Device::Cpu)
            .map_err(|e| unreadable(e.to_string()))?;
        let t = q.dequantize(&candle_core::Device::Cpu)?;
        Ok(Some(t.flatten_all()?.to_vec1()?))
    }

    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    /// A required count.
    pub fn u(&self, key: &str) -> Result<usize> {
        let full = self.key(key);
        self.content
            .metadata
            .get(&full)
            .ok_or_else(|| ModelError::BadConfig(format!("GGUF metadata lacks {full}")))?
            .to_u32()
            .map(|v| v as usize)
            .map_err(|e| ModelError::BadConfig(format!("GGUF {full}: {e}")))
    }

    pub fn opt_u(&self, key: &str) -> Option<usize> {
        self.u(key).ok()
    }

    pub fn f(&self, key: &str) -> Option<f32> {
        self.content
            .metadata
            .get(&self.key(key))
            .and_then(|v| v.to_f32().ok())
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.content
            .metadata
            .get(&self.key(key))
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
    }

    /// A per-layer array of booleans (`attention.sliding_window_pattern` as an array).
    pub fn bools(&self, key: &str) -> Option<Vec<bool>> {
        let v = self.content.metadata.get(&self.key(key))?.to_vec().ok()?;
        v.iter().map(|b| b.to_bool().ok()).collect()
    }

    fn rope_scaling(&self) -> Result<RopeScaling> {
        let factor = self.f("rope.scaling.factor").unwrap_or(1.0);
        match self.str("rope.scaling.type") {
            Some("llama3") => Ok(RopeScaling::Llama3 {
                factor,
                low_freq_factor: self.f("rope.scaling.low_freq_factor").unwrap_or(1.0),
                high_freq_factor: self.f("rope.scaling.high_freq_factor").unwrap_or(4.0),
                original_max_position_embeddings: self
                    .opt_u("rope.scaling.original_context_length")
                    .unwrap_or(8192),
            }),
            Some("linear") if factor != 1.0 => Ok(RopeScaling::Linear { factor }),
            Some("none") | Some("linear") | None => Ok(RopeScaling::None),
            Some(other) => Err(ModelError::Unsupported(format!(
                "rope scaling type '{other}' ({} GGUF)",
                self.arch
            ))),
        }
    }
}

/// LongRoPE's default cos/sin scale (transformers' and llama.cpp's converter's):
/// `√(1 + ln(s) / ln(original))` with `s = max / original`, 1 where `s ≤ 1`.
pub fn longrope_attention_factor(max: usize, original: usize) -> f32 {
    let scale = max as f64 / original.max(2) as f64;
    if scale <= 1.0 {
        1.0
    } else {
        (1.0 + scale.ln() / (original.max(2) as f64).ln()).sqrt() as f32
    }
}

/// A config.json's `rope_scaling` object (a draft head's config reads it too).
pub fn rope_scaling_from_hf(value: &serde_json::Value) -> Result<RopeScaling> {
    let rs: HfRopeScaling = serde_json::from_value(value.clone())
        .map_err(|e| ModelError::BadConfig(format!("rope_scaling: {e}")))?;
    rs.scaling()
}

impl HfRopeScaling {
    fn scaling(self) -> Result<RopeScaling> {
        let kind = self.rope_type.or(self.r#type).unwrap_or_default();
        match kind.as_str() {
            "llama3" => Ok(RopeScaling::Llama3 {
                factor: self.factor.unwrap_or(1.0),
                low_freq_factor: self.low_freq_factor.unwrap_or(1.0),
                high_freq_factor: self.high_freq_factor.unwrap_or(4.0),
                original_max_position_embeddings: self
                    .original_max_position_embeddings
                    .unwrap_or(8192),
            }),
            "linear" => Ok(RopeScaling::Linear {
                factor: self.factor.unwrap_or(1.0),
            }),
            "longrope" | "su" => match (self.short_factor, self.long_factor) {
                (Some(short_factor), Some(long_factor)) => Ok(RopeScaling::LongRope {
                    short_factor,
                    long_factor,
                    // Filled from the config around it where absent (`HfConfig`).
                    original_max_position_embeddings: self
                        .original_max_position_embeddings
                        .unwrap_or(0),
                    attention_factor: self.attention_factor.unwrap_or(f32::NAN),
                }),
                _ => Err(ModelError::BadConfig(
                    "rope_scaling longrope needs short_factor and long_factor".into(),
                )),
            },
            "default" | "" => Ok(RopeScaling::None),
            other => Err(ModelError::Unsupported(format!(
                "rope_scaling.rope_type '{other}'"
            ))),
        }
    }
}

#[derive(Deserialize)]
struct HfRopeScaling {
    rope_type: Option<String>,
    r#type: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    short_factor: Option<Vec<f32>>,
    long_factor: Option<Vec<f32>>,
    attention_factor: Option<f32>,
}

/// A `config.json`: the keys every family shares, and the ones some read.
#[derive(Deserialize)]
pub struct HfConfig {
    pub architectures: Option<Vec<String>>,
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    /// transformers 5's form of the rope settings: flat, or one object per layer type.
    rope_parameters: Option<serde_json::Value>,
    pub max_position_embeddings: Option<usize>,
    pub original_max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    pub layer_types: Option<Vec<String>>,
    pub sliding_window_pattern: Option<usize>,
    #[serde(rename = "_sliding_window_pattern")]
    pub sliding_window_pattern_private: Option<usize>,
    rope_local_base_freq: Option<f32>,
    pub query_pre_attn_scalar: Option<f32>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub partial_rotary_factor: Option<f32>,
    pub hidden_act: Option<String>,
    pub hidden_activation: Option<String>,
    pub final_logit_softcapping: Option<f32>,
    pub attn_logit_softcapping: Option<f32>,
}

impl HfConfig {
    pub fn parse(json: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| ModelError::BadConfig(format!("config.json: {e}")))
    }

    /// The rope settings of the global (full-attention) layers, from either form.
    fn rope_params(&self) -> Option<&serde_json::Value> {
        let p = self.rope_parameters.as_ref()?;
        Some(p.get("full_attention").unwrap_or(p))
    }

    fn rope_theta(&self) -> Option<f32> {
        self.rope_theta.or_else(|| {
            self.rope_params()?
                .get("rope_theta")?
                .as_f64()
                .map(|v| v as f32)
        })
    }

    fn rope_scaling_value(&self) -> Option<serde_json::Value> {
        self.rope_scaling
            .clone()
            .filter(|v| !v.is_null())
            .or_else(|| self.rope_params().cloned())
    }

    /// The rope base of sliding-window layers where they have their own (Gemma 3).
    pub fn local_rope_theta(&self) -> Option<f32> {
        self.rope_local_base_freq.or_else(|| {
            self.rope_parameters
                .as_ref()?
                .get("sliding_attention")?
                .get("rope_theta")?
                .as_f64()
                .map(|v| v as f32)
        })
    }

    /// Layer `l`'s attention is windowed, by `layer_types` when the config lists them.
    pub fn windowed_by_type(&self) -> Option<Vec<bool>> {
        self.layer_types
            .as_ref()
            .map(|t| t.iter().map(|k| k == "sliding_attention").collect())
    }
}
