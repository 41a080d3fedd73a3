//! One model family as the loader sees it: the names its files go by, its block, and how it
//! reads the hyperparameters only it has. Each family's file declares one of these.

use candle_core::quantized::gguf_file;

use crate::model::load::hparams::{GgufKeys, HfConfig, Hparams, RopeLayout};
use crate::model::spec::block::{Activation, Block, Feedforward};
use crate::model::{ModelError, Result};

pub struct Family {
    /// GGUF `general.architecture`.
    pub gguf: &'static str,
    /// `config.json` `architectures` entries and `model_type`s.
    pub hf_architectures: &'static [&'static str],
    pub hf_model_types: &'static [&'static str],
    pub block: Block,
    /// How llama.cpp's converter lays out rope pairs in this family's q/k weights (it permutes
    /// Llama's to interleaved pairs and leaves the others' halves split).
    pub gguf_rope: RopeLayout,
    /// Sets what only this family's GGUF states (windows, per-layer rope), or refuses it.
    pub gguf_extras: fn(&GgufKeys, &mut Hparams) -> Result<()>,
    /// Sets what only this family's `config.json` states, or refuses it.
    pub hf_extras: fn(&HfConfig, &mut Hparams) -> Result<()>,
}

impl Family {
    pub fn hparams_from_gguf(
        &self,
        content: &gguf_file::Content,
        path: &std::path::Path,
    ) -> Result<Hparams> {
        let keys = GgufKeys::new(content, path);
        let mut hp = Hparams::from_gguf_keys(&keys, self.block, self.gguf_rope)?;
        (self.gguf_extras)(&keys, &mut hp)?;
        self.check_feedforward(&hp)?;
        hp.validate()?;
        Ok(hp)
    }

    pub fn hparams_from_hf(&self, config: &HfConfig) -> Result<Hparams> {
        refuse_unread_hf_keys(config, self.block)?;
        let mut hp = Hparams::from_hf(config, self.block)?;
        (self.hf_extras)(config, &mut hp)?;
        self.check_feedforward(&hp)?;
        hp.validate()?;
        Ok(hp)
    }

    /// A file's experts (or their absence) against what the family's layers have.
    fn check_feedforward(&self, hp: &Hparams) -> Result<()> {
        match (self.block.feedforward, &hp.experts) {
            (Feedforward::Dense, Some(e)) => Err(ModelError::Unsupported(format!(
                "a mixture of {} experts in a '{}' model (tandem runs mixtures of experts \
                 as 'qwen3moe', 'qwen2moe', 'olmoe', 'gpt-oss' and Mixtral's 'llama' files)",
                e.count, hp.family
            ))),
            (Feedforward::Routed, None) => Err(ModelError::BadConfig(format!(
                "a '{}' model must state its experts (expert_count, num_experts)",
                hp.family
            ))),
            (_, Some(e)) if e.shared_ffn_len > 0 && !self.block.shared_expert => {
                Err(ModelError::Unsupported(format!(
                    "a shared expert in a '{}' model (its family has none)",
                    hp.family
                )))
            }
            (_, Some(e)) if e.shared_ffn_len == 0 && self.block.shared_expert => {
                Err(ModelError::BadConfig(format!(
                    "a '{}' model must state its shared expert's width \
                     (expert_shared_feed_forward_length, shared_expert_intermediate_size)",
                    hp.family
                )))
            }
            _ => Ok(()),
        }
    }
}

/// The `config.json` settings no family here runs, refused by name rather than ignored.
fn refuse_unread_hf_keys(c: &HfConfig, block: Block) -> Result<()> {
    let refuse = |what: String| Err(ModelError::Unsupported(format!("config.json {what}")));
    if c.attention_bias == Some(true) && !block.qkv_bias {
        return refuse("attention_bias = true".into());
    }
    if c.mlp_bias == Some(true) {
        return refuse("mlp_bias = true".into());
    }
    if let Some(f) = c.partial_rotary_factor.filter(|&f| f != 1.0) {
        return refuse(format!("partial_rotary_factor = {f} (only full rotation)"));
    }
    if let Some(q) = &c.quantization_config {
        let method = q
            .get("quant_method")
            .and_then(|m| m.as_str())
            .unwrap_or("?");
        return refuse(format!(
            "quantization_config (quant_method '{method}'): tandem reads float safetensors, \
             or a GGUF file of the model"
        ));
    }
    if let Some(clip) = c.clip_qkv {
        return refuse(format!("clip_qkv = {clip}"));
    }
    if c.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty()) {
        return refuse("mlp_only_layers (dense layers among routed ones)".into());
    }
    if let Some(step) = c.decoder_sparse_step.filter(|&s| s != 1) {
        return refuse(format!(
            "decoder_sparse_step = {step} (every layer routed only)"
        ));
    }
    if let Some(cap) = c.final_logit_softcapping.or(c.attn_logit_softcapping) {
        return refuse(format!("logit soft-capping ({cap})"));
    }
    let act = c.hidden_activation.as_deref().or(c.hidden_act.as_deref());
    let ok = match (block.activation, act) {
        (_, None) => true,
        (Activation::Silu, Some(a)) => a == "silu" || a == "swish",
        (Activation::GeluTanh, Some(a)) => a == "gelu_pytorch_tanh" || a == "gelu_tanh",
        // gpt-oss's config names its clamped SwiGLU "silu".
        (Activation::SwigluOai, Some(a)) => a == "silu",
    };
    if !ok {
        return refuse(format!("activation '{}'", act.unwrap_or_default()));
    }
    Ok(())
}

/// Qwen's sliding window (layers past `max_window_layers`) is off in every released model; a
/// config that turns it on is refused rather than run without it.
pub fn refuse_qwen_sliding_window(c: &HfConfig, _: &mut Hparams) -> Result<()> {
    if c.use_sliding_window == Some(true) {
        return Err(ModelError::Unsupported(
            "config.json use_sliding_window = true (Qwen's windowed layers)".into(),
        ));
    }
    Ok(())
}

/// Nothing beyond the keys every family's `config.json` states.
pub fn no_hf_extras(_: &HfConfig, _: &mut Hparams) -> Result<()> {
    Ok(())
}

/// Nothing beyond the keys every family's GGUF states.
pub fn no_gguf_extras(_: &GgufKeys, _: &mut Hparams) -> Result<()> {
    Ok(())
}
