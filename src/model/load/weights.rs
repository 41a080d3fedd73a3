//! Reading Llama weights by role from either a GGUF file or a Hugging Face safetensors folder,
//! so the model builder asks for "layer 3's q projection" and not for a format's tensor name.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::model::llama::linear::RawWeight;
use crate::model::{ModelError, Result};

/// A weight's role in a Llama model.
#[derive(Clone, Copy, Debug)]
pub enum WeightName {
    Embed,
    OutputNorm,
    Output,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
}

impl WeightName {
    /// The tensor's name in a GGUF file.
    pub fn gguf(self) -> String {
        match self {
            Self::Embed => "token_embd.weight".into(),
            Self::OutputNorm => "output_norm.weight".into(),
            Self::Output => "output.weight".into(),
            Self::AttnNorm(l) => format!("blk.{l}.attn_norm.weight"),
            Self::Q(l) => format!("blk.{l}.attn_q.weight"),
            Self::K(l) => format!("blk.{l}.attn_k.weight"),
            Self::V(l) => format!("blk.{l}.attn_v.weight"),
            Self::O(l) => format!("blk.{l}.attn_output.weight"),
            Self::FfnNorm(l) => format!("blk.{l}.ffn_norm.weight"),
            Self::Gate(l) => format!("blk.{l}.ffn_gate.weight"),
            Self::Up(l) => format!("blk.{l}.ffn_up.weight"),
            Self::Down(l) => format!("blk.{l}.ffn_down.weight"),
        }
    }

    fn hf(self) -> String {
        match self {
            Self::Embed => "model.embed_tokens.weight".into(),
            Self::OutputNorm => "model.norm.weight".into(),
            Self::Output => "lm_head.weight".into(),
            Self::AttnNorm(l) => format!("model.layers.{l}.input_layernorm.weight"),
            Self::Q(l) => format!("model.layers.{l}.self_attn.q_proj.weight"),
            Self::K(l) => format!("model.layers.{l}.self_attn.k_proj.weight"),
            Self::V(l) => format!("model.layers.{l}.self_attn.v_proj.weight"),
            Self::O(l) => format!("model.layers.{l}.self_attn.o_proj.weight"),
            Self::FfnNorm(l) => format!("model.layers.{l}.post_attention_layernorm.weight"),
            Self::Gate(l) => format!("model.layers.{l}.mlp.gate_proj.weight"),
            Self::Up(l) => format!("model.layers.{l}.mlp.up_proj.weight"),
            Self::Down(l) => format!("model.layers.{l}.mlp.down_proj.weight"),
        }
    }
}

enum Store {
    Gguf {
        content: gguf_file::Content,
        reader: BufReader<File>,
        path: PathBuf,
    },
    Safetensors(MmapedSafetensors),
}

pub struct WeightReader {
    store: Store,
    device: Device,
}

/// The `*.safetensors` files of a folder, sorted; none is an error naming the folder.
pub(crate) fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::Unreadable {
            path: dir.to_owned(),
            reason: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::Unreadable {
            path: dir.to_owned(),
            reason: "no *.safetensors files in the folder".into(),
        });
    }
    Ok(files)
}

impl WeightReader {
    pub fn gguf(content: gguf_file::Content, path: &Path, device: &Device) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            store: Store::Gguf {
                content,
                reader: BufReader::new(file),
                path: path.to_owned(),
            },
            device: device.clone(),
        })
    }

    /// All `*.safetensors` files of a folder (sharded checkpoints included).
    pub fn safetensors_dir(dir: &Path, device: &Device) -> Result<Self> {
        let files = safetensors_files(dir)?;
        // SAFETY: the files are memory-mapped read-only; tandem never writes model files.
        let st =
            unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| ModelError::Unreadable {
                path: dir.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            store: Store::Safetensors(st),
            device: device.clone(),
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn has(&self, name: WeightName) -> bool {
        match &self.store {
            Store::Gguf { content, .. } => content.tensor_infos.contains_key(&name.gguf()),
            Store::Safetensors(st) => st.get(&name.hf()).is_ok(),
        }
    }

    /// A matrix weight, kept in its stored type.
    pub fn raw(&mut self, name: WeightName) -> Result<RawWeight> {
        match &mut self.store {
            Store::Gguf {
                content,
                reader,
                path,
            } => {
                let key = name.gguf();
                if !content.tensor_infos.contains_key(&key) {
                    return Err(ModelError::MissingTensor(format!(
                        "{key} in {}",
                        path.display()
                    )));
                }
                let q = content.tensor(reader, &key, &self.device).map_err(|e| {
                    ModelError::Unreadable {
                        path: path.clone(),
                        reason: format!("tensor {key}: {e}"),
                    }
                })?;
                Ok(RawWeight::Quantized(q))
            }
            Store::Safetensors(st) => {
                let key = name.hf();
                let t = st
                    .load(&key, &self.device)
                    .map_err(|_| ModelError::MissingTensor(key.clone()))?;
                Ok(RawWeight::Dense(t))
            }
        }
    }

    /// A weight as a dense f32 tensor (norm scales, embeddings).
    pub fn dense_f32(&mut self, name: WeightName) -> Result<Tensor> {
        let device = self.device.clone();
        Ok(match self.raw(name)? {
            RawWeight::Quantized(q) => q.dequantize(&device)?,
            RawWeight::Dense(t) => t.to_dtype(DType::F32)?,
        })
    }
}
