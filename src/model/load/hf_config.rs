//! A Hugging Face `config.json`: the keys every family shares, the ones some families read,
//! and the `rope_scaling` object (in either of transformers' forms).

use serde::Deserialize;

use crate::model::spec::block::Experts;
use crate::model::spec::rope::{yarn_attention_factor, RopeScaling};
use crate::model::{ModelError, Result};

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
            "yarn" => {
                if self.mscale.is_some() || self.mscale_all_dim.is_some() {
                    return Err(ModelError::Unsupported(
                        "rope_scaling yarn with mscale / mscale_all_dim (DeepSeek's)".into(),
                    ));
                }
                let factor = self.factor.unwrap_or(1.0);
                Ok(RopeScaling::Yarn {
                    factor,
                    // Filled from the config around it where absent (`HfConfig`).
                    original_max_position_embeddings: self
                        .original_max_position_embeddings
                        .unwrap_or(0),
                    beta_fast: self.beta_fast.unwrap_or(32.0),
                    beta_slow: self.beta_slow.unwrap_or(1.0),
                    attention_factor: self
                        .attention_factor
                        .unwrap_or_else(|| yarn_attention_factor(factor)),
                    truncate: self.truncate.unwrap_or(true),
                })
            }
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
    beta_fast: Option<f32>,
    beta_slow: Option<f32>,
    truncate: Option<bool>,
    mscale: Option<f32>,
    mscale_all_dim: Option<f32>,
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
    pub use_bidirectional_attention: Option<bool>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub partial_rotary_factor: Option<f32>,
    pub hidden_act: Option<String>,
    pub hidden_activation: Option<String>,
    pub final_logit_softcapping: Option<f32>,
    pub attn_logit_softcapping: Option<f32>,
    /// Experts per layer: `num_local_experts` (Mixtral) or `num_experts` (Qwen-MoE).
    pub num_local_experts: Option<usize>,
    pub num_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    /// One expert's width where it differs from `intermediate_size` (Qwen-MoE).
    pub moe_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    /// Qwen-MoE's dense layers: every `decoder_sparse_step`-th layer routed, and those listed.
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
    pub shared_expert_intermediate_size: Option<usize>,
    /// OLMoE's clamp of queries, keys and values.
    pub clip_qkv: Option<f32>,
    /// gpt-oss's clamp of its SwiGLU's gate and up, and its sigmoid's slope.
    pub swiglu_limit: Option<f32>,
    pub swiglu_alpha: Option<f32>,
    /// Weights stored quantized by a scheme of transformers' (GPTQ, AWQ, gpt-oss's MXFP4).
    pub quantization_config: Option<serde_json::Value>,
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

    pub fn rope_theta(&self) -> Option<f32> {
        self.rope_theta.or_else(|| {
            self.rope_params()?
                .get("rope_theta")?
                .as_f64()
                .map(|v| v as f32)
        })
    }

    /// The rope scaling of the global layers, `None` where the config sets none.
    pub fn rope_scaling(&self) -> Result<RopeScaling> {
        match self.rope_scaling_value() {
            None => Ok(RopeScaling::None),
            Some(v) => rope_scaling_from_hf(&v),
        }
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

    /// The mixture of experts the config states, `None` for a dense model. The chosen
    /// experts' probabilities are renormalised unless `norm_topk_prob` is false (Mixtral
    /// always renormalises and states no key).
    pub fn experts(&self) -> Option<Experts> {
        let count = self
            .num_local_experts
            .or(self.num_experts)
            .filter(|&n| n > 0)?;
        Some(Experts {
            count,
            used: self.num_experts_per_tok.unwrap_or(0),
            ffn_len: self.moe_intermediate_size.unwrap_or(self.intermediate_size),
            norm_top_k: self.norm_topk_prob.unwrap_or(true),
            shared_ffn_len: self.shared_expert_intermediate_size.unwrap_or(0),
        })
    }

    /// Layer `l`'s attention is windowed, by `layer_types` when the config lists them.
    pub fn windowed_by_type(&self) -> Option<Vec<bool>> {
        self.layer_types
            .as_ref()
            .map(|t| t.iter().map(|k| k == "sliding_attention").collect())
    }
}
