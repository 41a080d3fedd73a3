//! Experts stacked in one tensor that candle cannot hand out one by one: a GGUF's MXFP4
//! stacks (read expert by expert at their offsets) and transformers' gpt-oss parameters (gate
//! and up alternating in one `gate_up_proj`). `weight_roles` reads every other weight.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::Device;

use crate::model::load::mxfp4;
use crate::model::load::raw_weight::RawWeight;
use crate::model::{ModelError, Result};

/// `count` experts' `(out, in)` weights from a stacked MXFP4 tensor `(name, dims, start)`
/// (dims `(experts, out, in)`, its blocks from byte `start` of the file), each read alone.
pub(super) fn mxfp4_experts(
    reader: &mut BufReader<File>,
    path: &Path,
    (name, dims, start): (&str, &[usize], u64),
    count: usize,
) -> Result<Vec<RawWeight>> {
    let unreadable = |reason: String| ModelError::Unreadable {
        path: path.to_owned(),
        reason: format!("tensor {name}: {reason}"),
    };
    let &[n, out, inp] = dims else {
        return Err(unreadable(format!(
            "MXFP4 of shape {dims:?}: (experts, out, in) or (out, in)"
        )));
    };
    if n != count || !inp.is_multiple_of(mxfp4::BLOCK) {
        return Err(unreadable(format!(
            "{n} MXFP4 experts of {out}x{inp} (the file states {count}; rows of whole blocks)"
        )));
    }
    let bytes = out * inp / mxfp4::BLOCK * mxfp4::BLOCK_BYTES;
    (0..count)
        .map(|e| {
            let mut buf = vec![0u8; bytes];
            reader
                .seek(std::io::SeekFrom::Start(start + (e * bytes) as u64))
                .and_then(|_| reader.read_exact(&mut buf))
                .map_err(|err| unreadable(format!("expert {e}: {err}")))?;
            mxfp4::weight(&buf, (out, inp))
        })
        .collect()
}

/// A part of transformers' stacked gpt-oss experts, `(experts, rows, cols)`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum StackedPart {
    /// `down_proj` `(experts, width, hidden)`, each expert's taken whole.
    Whole,
    /// Gate (0) or up (1) of `gate_up_proj` `(experts, hidden, 2 · width)`, the two
    /// alternating along its last dimension.
    Alternate(usize),
}

/// One part of each of layer `l`'s `count` experts from transformers' stacked gpt-oss
/// parameters, the tensor `name` (`mlp.experts.NAME`); each returned `(out, in)`.
pub(super) fn stacked_hf_experts(
    st: &MmapedSafetensors,
    (l, name, part): (usize, &str, StackedPart),
    count: usize,
    device: &Device,
) -> Result<Vec<RawWeight>> {
    let key = format!("model.layers.{l}.mlp.experts.{name}");
    let t = st
        .load(&key, device)
        .map_err(|_| ModelError::MissingTensor(key.clone()))?;
    let (n, rows, cols) = t.dims3()?;
    if n != count {
        return Err(ModelError::BadConfig(format!(
            "{key} holds {n} experts, the config states {count}"
        )));
    }
    (0..count)
        .map(|e| {
            let m = t.get(e)?;
            let m = match part {
                StackedPart::Whole => m,
                StackedPart::Alternate(i) => m
                    .reshape((rows, cols / 2, 2))?
                    .narrow(2, i, 1)?
                    .squeeze(2)?,
            };
            Ok(RawWeight::Dense(m.t()?.contiguous()?))
        })
        .collect()
}
