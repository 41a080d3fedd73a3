//! The checks a model passes before its tensors are read: a GGUF file is complete (a download
//! cut short still has a valid header), and the weights fit in the memory the process could
//! take now, counted in the types they load as (GGUF files and safetensors folders alike).
//!
//! Why it exists: being refused with both numbers named beats being killed partway through
//! reading an 18 GB file; `loaded` runs these checks, this module only counts and compares.

use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::DType;

use crate::model::decoder::linear::WeightsDtype;
use crate::model::load::mxfp4::{self, Mxfp4Tensors};
use crate::model::load::weight_roles::WeightReader;
use crate::model::{ModelError, Result};

/// A tensor of a GGUF file as the checks before loading see it: its name, its bytes in the
/// file (`None` past any size), the type it is read as (MXFP4 as Q5_0), its shape (rows
/// last) and its offset.
pub(crate) struct FileTensor<'a> {
    name: &'a str,
    bytes: Option<u64>,
    read_as: GgmlDType,
    dims: &'a [usize],
    offset: u64,
}

/// Every tensor of the file, candle's types and MXFP4 ones (read as Q5_0: 22 bytes a block
/// of their 17).
pub(crate) fn file_tensors<'a>(
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

pub(crate) fn gguf_weight_bytes(
    tensors: &[FileTensor],
    layers: usize,
    want: WeightsDtype,
) -> usize {
    let loaded = tensors
        .iter()
        .map(|t| (t.name, loaded_bytes(t.read_as, t.dims, want)));
    weight_bytes(loaded, layers)
}

/// A safetensors folder's weights once loaded: float tensors as `want` converts them, any
/// other type as the file holds it.
pub(crate) fn safetensors_weight_bytes(
    reader: &WeightReader,
    layers: usize,
    want: WeightsDtype,
) -> usize {
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
pub(crate) fn check_fits(need: usize, available: Option<usize>) -> Result<()> {
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
pub(crate) fn check_gguf_complete(
    path: &Path,
    tensors: &[FileTensor],
    data_offset: u64,
) -> Result<()> {
    let len = std::fs::metadata(path)
        .map_err(|e| ModelError::unreadable(path, e))?
        .len();
    // Checked arithmetic: a hostile header's dimensions and offsets may overflow.
    let mut end = 0u64;
    for t in tensors {
        let reach = t
            .bytes
            .and_then(|bytes| bytes.checked_add(t.offset)?.checked_add(data_offset));
        let Some(reach) = reach else {
            return Err(ModelError::unreadable(
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
        return Err(ModelError::unreadable(
            path,
            format!("the file is truncated: tensors need {end} bytes, the file has {len}"),
        ));
    }
    Ok(())
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
        let reader = WeightReader::safetensors_dir(&dir, &candle_core::Device::Cpu).unwrap();
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
