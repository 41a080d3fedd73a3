//! A GGUF file's metadata read under its architecture's prefix, typed, with the key named in
//! every error: what each family's hyperparameters are read through.

use candle_core::quantized::gguf_file;

use crate::model::spec::block::Experts;
use crate::model::spec::rope::{yarn_attention_factor, RopeScaling};
use crate::model::{ModelError, Result};

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

    /// The rope scaling the file states (`rope.scaling.*`).
    pub fn rope_scaling(&self) -> Result<RopeScaling> {
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
            Some("yarn") => Ok(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: self.u("rope.scaling.original_context_length")?,
                beta_fast: self.f("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
                beta_slow: self.f("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
                attention_factor: yarn_attention_factor(factor)
                    * self.f("rope.scaling.attn_factor").unwrap_or(1.0),
                truncate: true,
            }),
            Some("none") | Some("linear") | None => Ok(RopeScaling::None),
            Some(other) => Err(ModelError::Unsupported(format!(
                "rope scaling type '{other}' ({} GGUF)",
                self.arch
            ))),
        }
    }

    /// The mixture of experts the file states (`expert_count` and its companions), `None` for
    /// a dense model. Only a softmax router is run; the others are refused by name.
    pub fn experts(&self) -> Result<Option<Experts>> {
        let Some(count) = self.opt_u("expert_count").filter(|&n| n > 0) else {
            return Ok(None);
        };
        // llama.cpp: 1 softmax, 2 sigmoid, 3 softmax over the chosen only.
        if let Some(f) = self.opt_u("expert_gating_func").filter(|&f| f != 1) {
            return Err(ModelError::Unsupported(format!(
                "{} = {f} (tandem runs the softmax router, 1)",
                self.key("expert_gating_func")
            )));
        }
        if let Some(n) = self.opt_u("expert_shared_count").filter(|&n| n > 1) {
            return Err(ModelError::Unsupported(format!(
                "{} = {n} (tandem runs at most one shared expert)",
                self.key("expert_shared_count")
            )));
        }
        let ffn_len = match self.opt_u("expert_feed_forward_length") {
            Some(n) => n,
            None => self.u("feed_forward_length")?,
        };
        let norm_top_k = self
            .content
            .metadata
            .get(&self.key("expert_weights_norm"))
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(true);
        Ok(Some(Experts {
            count,
            used: self.u("expert_used_count")?,
            ffn_len,
            norm_top_k,
            shared_ffn_len: self.opt_u("expert_shared_feed_forward_length").unwrap_or(0),
        }))
    }
}
