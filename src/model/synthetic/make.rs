//! Writing a synthetic or re-quantized Llama GGUF: every weight by role, in the recipe's type,
//! with the tokenizer (and, re-quantizing, every other key) of an existing file.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::model::decoder::linear::RawWeight;
use crate::model::load::weight_roles::{WeightName, WeightReader};
use crate::model::synthetic::{Recipe, Shape};
use crate::model::{ModelError, Result};

/// Where a made file's weights come from.
pub enum WeightSource<'a> {
    /// Random weights at a shape, from a seed.
    Random { shape: Shape, seed: u64 },
    /// The weights of an existing Llama GGUF, re-quantized (a weight already in the wanted
    /// type is copied as it is).
    Model(&'a Path),
}

/// What was written.
#[derive(Debug)]
pub struct Made {
    /// Tensors per ggml type, sorted by type name.
    pub types: Vec<(String, usize)>,
    /// The file's size.
    pub bytes: u64,
}

/// Writes a Llama GGUF at `out`: weights from `source` in `recipe`'s types; the tokenizer
/// from `tokenizer_from` (for random weights; a re-quantized model keeps its own metadata).
pub fn make_model(
    source: WeightSource,
    tokenizer_from: &Path,
    recipe: Recipe,
    out: &Path,
) -> Result<Made> {
    let (metadata, mut weights) = match source {
        WeightSource::Random { shape, seed } => {
            let md = read_metadata(tokenizer_from)?;
            let vocab = vocab_size(&md, tokenizer_from)?;
            let md = random_metadata(md, &shape, vocab, recipe);
            (
                md,
                Weights::Random {
                    shape,
                    vocab,
                    rng: Uniform(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
                },
            )
        }
        WeightSource::Model(path) => {
            let content = read_content(path)?;
            let hp = crate::model::arch::hparams_from_gguf(&content, path)?;
            let md = content.metadata.clone();
            let reader = WeightReader::gguf(content, Default::default(), path, &Device::Cpu)?;
            (
                md,
                Weights::Model {
                    layers: hp.num_layers,
                    reader: Box::new(reader),
                },
            )
        }
    };
    let (layers, tied) = weights.layers_and_tied();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for name in roles(layers, tied) {
        let q = weights.quantized(name, recipe, layers, tied)?;
        tensors.push((name.gguf(), q));
    }
    let mut types: HashMap<String, usize> = HashMap::new();
    for (_, t) in &tensors {
        *types.entry(format!("{:?}", t.dtype())).or_default() += 1;
    }
    let unreadable = |e: &dyn std::fmt::Display| ModelError::Unreadable {
        path: out.to_owned(),
        reason: e.to_string(),
    };
    let mut file = std::io::BufWriter::new(std::fs::File::create(out).map_err(|e| unreadable(&e))?);
    let md: Vec<(&str, &gguf_file::Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut file, &md, &ts)?;
    drop(file);
    let bytes = std::fs::metadata(out).map_err(|e| unreadable(&e))?.len();
    let mut types: Vec<(String, usize)> = types.into_iter().collect();
    types.sort();
    Ok(Made { types, bytes })
}

/// Every weight of a Llama with `layers` layers, in llama.cpp's order.
fn roles(layers: usize, tied: bool) -> Vec<WeightName> {
    let mut out = vec![WeightName::Embed];
    for l in 0..layers {
        out.extend([
            WeightName::AttnNorm(l),
            WeightName::Q(l),
            WeightName::K(l),
            WeightName::V(l),
            WeightName::O(l),
            WeightName::FfnNorm(l),
            WeightName::Gate(l),
            WeightName::Up(l),
            WeightName::Down(l),
        ]);
    }
    out.push(WeightName::OutputNorm);
    if !tied {
        out.push(WeightName::Output);
    }
    out
}

enum Weights {
    Random {
        shape: Shape,
        vocab: usize,
        rng: Uniform,
    },
    Model {
        layers: usize,
        reader: Box<WeightReader>,
    },
}

impl Weights {
    fn layers_and_tied(&self) -> (usize, bool) {
        match self {
            Self::Random { shape, .. } => (shape.layers, shape.tied),
            Self::Model { layers, reader } => (*layers, !reader.has(WeightName::Output)),
        }
    }

    /// Weight `name` in the recipe's type.
    fn quantized(
        &mut self,
        name: WeightName,
        recipe: Recipe,
        layers: usize,
        tied: bool,
    ) -> Result<QTensor> {
        let values = match self {
            Self::Random { shape, vocab, rng } => {
                let (rows, cols) = random_dims(shape, *vocab, name);
                let scale = match name {
                    WeightName::AttnNorm(_) | WeightName::FfnNorm(_) | WeightName::OutputNorm => {
                        let ones = Tensor::ones(cols, candle_core::DType::F32, &Device::Cpu)?;
                        return Ok(QTensor::quantize(&ones, GgmlDType::F32)?);
                    }
                    WeightName::Embed => 0.05,
                    _ => (3.0 / cols as f32).sqrt(),
                };
                let v: Vec<f32> = (0..rows * cols).map(|_| rng.next() * scale).collect();
                Tensor::from_vec(v, (rows, cols), &Device::Cpu)?
            }
            Self::Model { reader, .. } => match reader.raw(name)? {
                RawWeight::Quantized(q) => {
                    let cols = *q.shape().dims().last().unwrap_or(&1);
                    if q.dtype() == recipe.weight_type(name, layers, cols, tied) {
                        return Ok(q);
                    }
                    q.dequantize(&Device::Cpu)?
                }
                RawWeight::Dense(t) => t.to_dtype(candle_core::DType::F32)?,
            },
        };
        let cols = *values.dims().last().unwrap_or(&1);
        Ok(QTensor::quantize(
            &values,
            recipe.weight_type(name, layers, cols, tied),
        )?)
    }
}

/// `(rows, values per row)` of a weight at a shape.
fn random_dims(shape: &Shape, vocab: usize, name: WeightName) -> (usize, usize) {
    let (h, kv) = (shape.hidden, shape.kv_heads * shape.head_dim());
    match name {
        WeightName::Embed | WeightName::Output => (vocab, h),
        WeightName::AttnNorm(_) | WeightName::FfnNorm(_) | WeightName::OutputNorm => (1, h),
        WeightName::Q(_) | WeightName::O(_) => (h, h),
        WeightName::K(_) | WeightName::V(_) => (kv, h),
        WeightName::Gate(_) | WeightName::Up(_) => (shape.ffn, h),
        WeightName::Down(_) => (h, shape.ffn),
        // make-model writes Llama files only (`roles` never names another family's weights).
        other => unreachable!("make-model writes no {other:?}"),
    }
}

fn read_content(path: &Path) -> Result<gguf_file::Content> {
    let unreadable = |reason: String| ModelError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let mut f = std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?;
    gguf_file::Content::read(&mut f).map_err(|e| unreadable(e.to_string()))
}

fn read_metadata(path: &Path) -> Result<HashMap<String, gguf_file::Value>> {
    Ok(read_content(path)?.metadata)
}

fn vocab_size(md: &HashMap<String, gguf_file::Value>, path: &Path) -> Result<usize> {
    md.get("tokenizer.ggml.tokens")
        .and_then(|v| v.to_vec().ok())
        .map(|v| v.len())
        .ok_or_else(|| ModelError::BadConfig(format!("{} has no tokenizer", path.display())))
}

/// The tokenizer's keys of `md` and a Llama's keys for `shape`.
fn random_metadata(
    md: HashMap<String, gguf_file::Value>,
    shape: &Shape,
    vocab: usize,
    recipe: Recipe,
) -> HashMap<String, gguf_file::Value> {
    use gguf_file::Value::{String as S, F32, U32};
    let mut out: HashMap<String, gguf_file::Value> = md
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect();
    let name = format!(
        "tandem synthetic {} {recipe:?} (random weights: for timing only)",
        shape.name
    );
    let u = |v: usize| U32(v as u32);
    for (k, v) in [
        ("general.architecture", S("llama".into())),
        ("general.name", S(name)),
        ("llama.block_count", u(shape.layers)),
        ("llama.context_length", u(8192)),
        ("llama.embedding_length", u(shape.hidden)),
        ("llama.feed_forward_length", u(shape.ffn)),
        ("llama.attention.head_count", u(shape.heads)),
        ("llama.attention.head_count_kv", u(shape.kv_heads)),
        ("llama.rope.dimension_count", u(shape.head_dim())),
        ("llama.rope.freq_base", F32(500_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", F32(1e-5)),
        ("llama.vocab_size", u(vocab)),
    ] {
        out.insert(k.to_string(), v);
    }
    out
}

/// Values uniform in [-1, 1) from a seed (xorshift64*): the weights' values only need to be
/// spread like a model's and the same for a seed, and the model layer sits below `sampling`'s
/// generator.
struct Uniform(u64);

impl Uniform {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        bits as f32 / (1u64 << 23) as f32 - 1.0
    }
}
