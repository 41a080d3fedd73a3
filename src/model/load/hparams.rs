//! A decoder model's hyperparameters read from either GGUF metadata or a Hugging Face
//! config.json, so the forward pass never cares where a model came from. The keys every family
//! states alike are read here; each family's file (`model::arch`) reads its own extras. The
//! type itself is the model layer's leaf, `model::spec::hparams`.

pub use crate::model::load::gguf_keys::GgufKeys;
pub use crate::model::load::hf_config::{rope_scaling_from_hf, HfConfig};
use crate::model::spec::block::Block;
pub use crate::model::spec::hparams::{Hparams, LayerRope, LayerWindows, MAX_EXPERTS};
pub use crate::model::spec::rope::{longrope_attention_factor, RopeLayout, RopeScaling};
use crate::model::{ModelError, Result};

impl Hparams {
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
        if let RopeScaling::Yarn {
            original_max_position_embeddings: original,
            ..
        } = &mut rope_scaling
        {
            if *original == 0 {
                *original = c
                    .original_max_position_embeddings
                    .or(c.max_position_embeddings)
                    .unwrap_or(4096);
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
}
