//! The model families tandem runs, one file each (`llama`, `qwen2`, `qwen3`, `gemma3`,
//! `phi3`, and the mixtures of experts `qwen3moe`, `qwen2moe`, `olmoe`, `mixtral` and
//! `gpt-oss`), over the shared forward,
//! kernels, attention, KV cache and rope.
//!
//! A family is mostly a declared [`block::Block`] (norm placement, activation, biases, q/k
//! norms, embedding scale) and the keys only its files carry (windows, per-layer rope); code
//! is written for it only where a description cannot say it. Adding the next family is a file
//! here, its entry in [`FAMILIES`] and a test against an independent implementation.

pub mod family;
pub mod gemma3;
pub mod gpt_oss;
pub mod llama;
pub mod mixtral;
pub mod olmoe;
pub mod phi3;
pub mod qwen2;
pub mod qwen2moe;
pub mod qwen3;
pub mod qwen3moe;

use candle_core::quantized::gguf_file;

use crate::model::load::hparams::{GgufKeys, HfConfig, Hparams};
use crate::model::{ModelError, Result};
use family::Family;

/// Every family, in the order errors list them.
pub const FAMILIES: &[&Family] = &[
    &llama::FAMILY,
    &qwen2::FAMILY,
    &qwen3::FAMILY,
    &gemma3::FAMILY,
    &phi3::FAMILY,
    &qwen3moe::FAMILY,
    &qwen2moe::FAMILY,
    &olmoe::FAMILY,
    &gpt_oss::FAMILY,
    // Its GGUF files are `llama`'s, found above: listed for its Hugging Face names.
    &mixtral::FAMILY,
];

/// Mixtures of experts llama.cpp writes that tandem does not run (yet), named in the refusal
/// so a user reads why rather than a missing tensor.
const UNRUN_MIXTURES: &[&str] = &[
    "deepseek2",
    "granitemoe",
    "dbrx",
    "arctic",
    "grok",
    "phimoe",
    "llama4",
    "qwen3next",
    "glm4moe",
    "ernie4_5-moe",
    "bailingmoe",
    "hunyuan-moe",
];

fn names(f: impl Fn(&Family) -> Vec<&'static str>) -> String {
    let mut seen = Vec::new();
    for n in FAMILIES.iter().flat_map(|fam| f(fam)) {
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
    seen.iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The hyperparameters of a GGUF file of any family here.
pub fn hparams_from_gguf(content: &gguf_file::Content, path: &std::path::Path) -> Result<Hparams> {
    let arch = GgufKeys::new(content, path).arch;
    let family = FAMILIES.iter().find(|f| f.gguf == arch).ok_or_else(|| {
        let what = match UNRUN_MIXTURES.contains(&arch.as_str()) {
            true => " (a mixture of experts tandem does not run yet)",
            false => "",
        };
        ModelError::Unsupported(format!(
            "GGUF architecture '{arch}'{what} (tandem runs {})",
            names(|f| vec![f.gguf])
        ))
    })?;
    family.hparams_from_gguf(content, path)
}

/// The hyperparameters of a Hugging Face `config.json` of any family here, found by its
/// `architectures`, else its `model_type`.
pub fn hparams_from_hf(json: &str) -> Result<Hparams> {
    let config = HfConfig::parse(json)?;
    let by_arch = config.architectures.as_ref().and_then(|a| a.first());
    let family = match (by_arch, &config.model_type) {
        (Some(arch), _) => FAMILIES
            .iter()
            .find(|f| f.hf_architectures.contains(&arch.as_str()))
            .ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "architecture '{arch}' (tandem runs {})",
                    names(|f| f.hf_architectures.to_vec())
                ))
            })?,
        (None, Some(mt)) => FAMILIES
            .iter()
            .find(|f| f.hf_model_types.contains(&mt.as_str()))
            .ok_or_else(|| {
                ModelError::Unsupported(format!(
                    "model_type '{mt}' (tandem runs {})",
                    names(|f| f.hf_model_types.to_vec())
                ))
            })?,
        (None, None) => {
            return Err(ModelError::BadConfig(
                "config.json names neither architectures nor model_type".into(),
            ))
        }
    };
    family.hparams_from_hf(&config)
}
