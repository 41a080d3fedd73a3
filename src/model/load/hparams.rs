//! Llama hyperparameters, normalised from either GGUF metadata or a Hugging Face config.json,
//! so the forward pass never cares where a model came from.

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use crate::model::{ModelError, Result};

/// Frequency scaling applied to RoPE (Llama 3.1/3.2 use `llama3`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
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

    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let arch = md
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if arch != "llama" {
            return Err(ModelError::Unsupported(format!(
                "GGUF architecture '{arch}' (only 'llama' is supported)"
            )));
        }
        let get_u = |key: &str| -> Result<usize> {
            md.get(key)
                .ok_or_else(|| ModelError::BadConfig(format!("GGUF metadata lacks {key}")))?
                .to_u32()
                .map(|v| v as usize)
                .map_err(|e| ModelError::BadConfig(format!("GGUF {key}: {e}")))
        };
        let get_f = |key: &str| -> Option<f32> { md.get(key).and_then(|v| v.to_f32().ok()) };
        let hidden_size = get_u("llama.embedding_length")?;
        let num_heads = get_u("llama.attention.head_count")?;
        let num_kv_heads = get_u("llama.attention.head_count_kv").unwrap_or(num_heads);
        let head_dim =
            get_u("llama.rope.dimension_count").unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match get_u("llama.vocab_size") {
            Ok(v) => v,
            Err(_) => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| ModelError::BadConfig("GGUF metadata lacks a vocab size".into()))?,
        };
        let rope_scaling = match md
            .get("llama.rope.scaling.type")
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
        {
            Some("llama3") => RopeScaling::Llama3 {
                factor: get_f("llama.rope.scaling.factor").unwrap_or(1.0),
                low_freq_factor: get_f("llama.rope.scaling.low_freq_factor").unwrap_or(1.0),
                high_freq_factor: get_f("llama.rope.scaling.high_freq_factor").unwrap_or(4.0),
                original_max_position_embeddings: get_u(
                    "llama.rope.scaling.original_context_length",
                )
                .unwrap_or(8192),
            },
            Some("none") | None => RopeScaling::None,
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling type '{other}'"
                )))
            }
        };
        let hp = Self {
            vocab_size,
            hidden_size,
            intermediate_size: get_u("llama.feed_forward_length")?,
            num_layers: get_u("llama.block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: get_f("llama.attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f64,
            rope_theta: get_f("llama.rope.freq_base").unwrap_or(10_000.0),
            rope_scaling,
            rope_layout: RopeLayout::Interleaved,
            max_position_embeddings: get_u("llama.context_length").unwrap_or(4096),
            tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        };
        hp.validate()?;
        Ok(hp)
    }

    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_config(json: &str) -> Result<Self> {
        let c: HfConfig = serde_json::from_str(json)
            .map_err(|e| ModelError::BadConfig(format!("config.json: {e}")))?;
        if let Some(arch) = c.architectures.as_ref().and_then(|a| a.first()) {
            if arch != "LlamaForCausalLM" {
                return Err(ModelError::Unsupported(format!(
                    "architecture '{arch}' (only LlamaForCausalLM is supported)"
                )));
            }
        }
        if let Some(mt) = &c.model_type {
            if mt != "llama" {
                return Err(ModelError::Unsupported(format!(
                    "model_type '{mt}' (only 'llama' is supported)"
                )));
            }
        }
        let rope_scaling = match c.rope_scaling {
            None => RopeScaling::None,
            Some(rs) => rs.scaling()?,
        };
        let num_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        let hp = Self {
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
            rope_theta: c.rope_theta.unwrap_or(10_000.0),
            rope_scaling,
            rope_layout: RopeLayout::HalfSplit,
            max_position_embeddings: c.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
        };
        hp.validate()?;
        Ok(hp)
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
}

#[derive(Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f32>,
    rope_scaling: Option<HfRopeScaling>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
}
