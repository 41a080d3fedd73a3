//! Reading Llama weights by role from either a GGUF file or a Hugging Face safetensors folder,
//! so the model builder asks for "layer 3's q projection" and not for a format's tensor name.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::model::load::expert_stacks::{mxfp4_experts, stacked_hf_experts, StackedPart};
use crate::model::load::mxfp4::Mxfp4Tensors;
use crate::model::load::raw_weight::RawWeight;
use crate::model::spec::block::Block;
use crate::model::{ModelError, Result};

pub use super::weight_names::{ExpertPart, WeightName};

enum Store {
    Gguf {
        content: gguf_file::Content,
        /// The tensors of a type candle does not read (`load::mxfp4`).
        mxfp4: Mxfp4Tensors,
        reader: BufReader<File>,
        path: PathBuf,
    },
    Safetensors(MmapedSafetensors),
}

pub struct WeightReader {
    store: Store,
    device: Device,
    /// Hugging Face names follow the sandwich-norm naming (see [`WeightName`]).
    hf_sandwich: bool,
    /// GGUF names the norm before the MLP `post_attention_norm` (gpt-oss).
    gguf_ffn_norm_post_attention: bool,
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
    pub fn gguf(
        content: gguf_file::Content,
        mxfp4: Mxfp4Tensors,
        path: &Path,
        device: &Device,
    ) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            store: Store::Gguf {
                content,
                mxfp4,
                reader: BufReader::new(file),
                path: path.to_owned(),
            },
            device: device.clone(),
            hf_sandwich: false,
            gguf_ffn_norm_post_attention: false,
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
            hf_sandwich: false,
            gguf_ffn_norm_post_attention: false,
        })
    }

    /// A safetensors folder's tensors as the memory check sees them: name, element type
    /// (`None` for one candle does not read) and shape. Empty for a GGUF file.
    pub fn safetensors_shapes(&self) -> Vec<(String, Option<DType>, Vec<usize>)> {
        match &self.store {
            Store::Safetensors(st) => st
                .tensors()
                .into_iter()
                .map(|(name, view)| {
                    let dtype = DType::try_from(view.dtype()).ok();
                    (name, dtype, view.shape().to_vec())
                })
                .collect(),
            Store::Gguf { .. } => Vec::new(),
        }
    }

    /// Names tensors as the block does: Hugging Face's with sandwich norms (Gemma), GGUF's
    /// MLP norm after attention's (gpt-oss).
    pub fn set_block_names(&mut self, block: &Block) {
        self.hf_sandwich = block.sandwich_norms;
        self.gguf_ffn_norm_post_attention = block.gguf_ffn_norm_post_attention;
    }

    /// A weight's name in this store's file.
    fn gguf_name(&self, name: WeightName) -> String {
        match name {
            WeightName::FfnNorm(l) if self.gguf_ffn_norm_post_attention => {
                WeightName::AttnPostNorm(l).gguf()
            }
            _ => name.gguf(),
        }
    }

    /// Whether the weights come from a Hugging Face folder (not a GGUF file).
    pub fn is_safetensors(&self) -> bool {
        matches!(self.store, Store::Safetensors(_))
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn has(&self, name: WeightName) -> bool {
        match &self.store {
            Store::Gguf { content, mxfp4, .. } => {
                let key = self.gguf_name(name);
                content.tensor_infos.contains_key(&key) || mxfp4.contains_key(&key)
            }
            Store::Safetensors(st) => st.get(&name.hf(self.hf_sandwich)).is_ok(),
        }
    }

    /// A matrix weight, kept in its stored type.
    pub fn raw(&mut self, name: WeightName) -> Result<RawWeight> {
        match &self.store {
            Store::Gguf { .. } => self.gguf_named(&self.gguf_name(name)),
            Store::Safetensors(st) => {
                let key = name.hf(self.hf_sandwich);
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

    /// A routed layer's router, by any family's Hugging Face name (Qwen-MoE's `mlp.gate`,
    /// Mixtral's `block_sparse_moe.gate`, gpt-oss's `mlp.router`).
    pub fn router(&mut self, l: usize) -> Result<RawWeight> {
        if let Store::Safetensors(st) = &self.store {
            for other in ["block_sparse_moe.gate", "mlp.router"] {
                let key = format!("model.layers.{l}.{other}.weight");
                if st.get(&key).is_ok() {
                    return Ok(RawWeight::Dense(st.load(&key, &self.device)?));
                }
            }
        }
        self.raw(WeightName::Router(l))
    }

    /// One part of each of layer `l`'s `count` experts, expert 0 first, each `(out, in)` in
    /// its stored type. A GGUF stacks them in one tensor (`ffn_gate_exps`), read expert by
    /// expert so no second copy of the stack is held; older Mixtral files and Hugging Face
    /// checkpoints name each expert's.
    pub fn experts(&mut self, l: usize, part: ExpertPart, count: usize) -> Result<Vec<RawWeight>> {
        match &mut self.store {
            Store::Gguf {
                content,
                mxfp4,
                reader,
                path,
            } => {
                let stacked = format!("blk.{l}.ffn_{}_exps.weight", part.gguf());
                if let Some(t) = mxfp4.get(&stacked) {
                    let base = content.tensor_data_offset + t.offset;
                    return mxfp4_experts(reader, path, (&stacked, &t.dims, base), count);
                }
                let Some(info) = content.tensor_infos.get(&stacked) else {
                    let one = |e: usize| format!("blk.{l}.ffn_{}.{e}.weight", part.gguf());
                    if !content.tensor_infos.contains_key(&one(0)) {
                        return Err(ModelError::MissingTensor(format!(
                            "{stacked} (nor {}) in {}",
                            one(0),
                            path.display()
                        )));
                    }
                    return (0..count).map(|e| self.gguf_named(&one(e))).collect();
                };
                let unreadable = |reason: String| ModelError::Unreadable {
                    path: path.clone(),
                    reason: format!("tensor {stacked}: {reason}"),
                };
                let (n, out, inp) = info.shape.dims3().map_err(|_| {
                    unreadable(format!("shape {:?} is not (experts, out, in)", info.shape))
                })?;
                let (block, type_size) =
                    (info.ggml_dtype.block_size(), info.ggml_dtype.type_size());
                if n != count || !(out * inp).is_multiple_of(block) {
                    return Err(unreadable(format!(
                        "{n} experts of {out}x{inp} {:?} (the file states {count})",
                        info.ggml_dtype
                    )));
                }
                let bytes = (out * inp / block * type_size) as u64;
                (0..count)
                    .map(|e| {
                        let one = gguf_file::TensorInfo {
                            ggml_dtype: info.ggml_dtype,
                            shape: (out, inp).into(),
                            offset: info.offset + e as u64 * bytes,
                        };
                        one.read(reader, content.tensor_data_offset, &self.device)
                            .map(RawWeight::Quantized)
                            .map_err(|err| unreadable(format!("expert {e}: {err}")))
                    })
                    .collect()
            }
            Store::Safetensors(st) => {
                let fused = format!("model.layers.{l}.mlp.experts.gate_up_proj");
                if st.get(&fused).is_ok() {
                    let (name, stacked) = match part {
                        ExpertPart::Gate => ("gate_up_proj", StackedPart::Alternate(0)),
                        ExpertPart::Up => ("gate_up_proj", StackedPart::Alternate(1)),
                        ExpertPart::Down => ("down_proj", StackedPart::Whole),
                    };
                    return stacked_hf_experts(st, (l, name, stacked), count, &self.device);
                }
                let mixtral = st
                    .get(&format!("model.layers.{l}.block_sparse_moe.gate.weight"))
                    .is_ok();
                let prefix = match mixtral {
                    true => format!("model.layers.{l}.block_sparse_moe.experts"),
                    false => format!("model.layers.{l}.mlp.experts"),
                };
                (0..count)
                    .map(|e| {
                        let key = format!("{prefix}.{e}.{}.weight", part.hf(mixtral));
                        st.load(&key, &self.device)
                            .map(RawWeight::Dense)
                            .map_err(|_| ModelError::MissingTensor(key))
                    })
                    .collect()
            }
        }
    }

    /// Each of layer `l`'s `count` experts' biases (gpt-oss), expert 0 first: gate|up's
    /// (gate first, `2 · width`) and down's, in f32.
    pub fn expert_biases(&mut self, l: usize, count: usize) -> Result<Vec<(Tensor, Tensor)>> {
        let (gate, up, down) = match &self.store {
            Store::Gguf { .. } => {
                let mut part = |p: &str| {
                    let key = format!("blk.{l}.ffn_{p}_exps.bias");
                    self.gguf_named(&key)?.dequantize(&Device::Cpu)
                };
                (part("gate")?, part("up")?, part("down")?)
            }
            Store::Safetensors(st) => {
                let load = |name: &str| -> Result<Tensor> {
                    let key = format!("model.layers.{l}.mlp.experts.{name}");
                    let t = st
                        .load(&key, &Device::Cpu)
                        .map_err(|_| ModelError::MissingTensor(key))?;
                    Ok(t.to_dtype(DType::F32)?)
                };
                let gate_up = load("gate_up_proj_bias")?;
                let (experts, both) = gate_up.dims2()?;
                // Gate and up alternate along the last dimension.
                let pairs = gate_up.reshape((experts, both / 2, 2))?;
                let half = |i| -> Result<Tensor> { Ok(pairs.narrow(2, i, 1)?.squeeze(2)?) };
                (half(0)?, half(1)?, load("down_proj_bias")?)
            }
        };
        let rows = |t: &Tensor| -> Result<usize> { Ok(t.dims2()?.0) };
        if [rows(&gate)?, rows(&up)?, rows(&down)?] != [count; 3] {
            return Err(ModelError::BadConfig(format!(
                "layer {l}'s expert biases are not one per expert ({count})"
            )));
        }
        (0..count)
            .map(|e| {
                let gate_up = Tensor::cat(&[gate.get(e)?, up.get(e)?], 0)?;
                Ok((
                    gate_up.to_device(&self.device)?,
                    down.get(e)?.to_device(&self.device)?,
                ))
            })
            .collect()
    }

    /// A GGUF tensor by its name.
    fn gguf_named(&mut self, key: &str) -> Result<RawWeight> {
        let Store::Gguf {
            content,
            mxfp4,
            reader,
            path,
        } = &mut self.store
        else {
            return Err(ModelError::MissingTensor(key.to_owned()));
        };
        if let Some(t) = mxfp4.get(key) {
            let base = content.tensor_data_offset + t.offset;
            let mut one =
                mxfp4_experts(reader, path, (key, &[&[1], &t.dims[..]].concat(), base), 1)?;
            return Ok(one.remove(0));
        }
        if !content.tensor_infos.contains_key(key) {
            return Err(ModelError::MissingTensor(format!(
                "{key} in {}",
                path.display()
            )));
        }
        content
            .tensor(reader, key, &self.device)
            .map(RawWeight::Quantized)
            .map_err(|e| ModelError::Unreadable {
                path: path.clone(),
                reason: format!("tensor {key}: {e}"),
            })
    }
}
