//! One slot's keys and values in host memory (the own CPU forward's cache): per layer a growing
//! buffer of f32, f16, bf16 or q8_0 elements, token-major, whose capacity is kept across truncation.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::q8::Q8Buf;
use super::KvDtype;
use crate::model::kernels::attention::{round_bf16, Q8Rows};

/// One layer's keys or values, `len * kv_dim` elements in use.
pub(super) enum LayerBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Q8(Q8Buf),
}

impl LayerBuf {
    pub(super) fn new(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => LayerBuf::F32(Vec::new()),
            KvDtype::F16 => LayerBuf::F16(Vec::new()),
            KvDtype::Bf16 => LayerBuf::Bf16(Vec::new()),
            KvDtype::Q8_0 => LayerBuf::Q8(Q8Buf::default()),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            LayerBuf::F32(v) => v.len(),
            LayerBuf::F16(v) => v.len(),
            LayerBuf::Bf16(v) => v.len(),
            LayerBuf::Q8(v) => v.len(),
        }
    }

    pub(super) fn truncate(&mut self, len: usize) {
        match self {
            LayerBuf::F32(v) => v.truncate(len),
            LayerBuf::F16(v) => v.truncate(len),
            LayerBuf::Bf16(v) => v.truncate(len),
            LayerBuf::Q8(v) => v.truncate(len),
        }
    }

    pub(super) fn reserve_total(&mut self, want: usize) {
        match self {
            LayerBuf::F32(v) if v.capacity() < want => v.reserve_exact(want - v.len()),
            LayerBuf::F16(v) if v.capacity() < want => v.reserve_exact(want - v.len()),
            LayerBuf::Bf16(v) if v.capacity() < want => v.reserve_exact(want - v.len()),
            LayerBuf::Q8(v) => v.reserve_total(want),
            _ => {}
        }
    }

    /// Copies row `from` (of `dim` elements) over row `to`.
    pub(super) fn move_row(&mut self, dim: usize, from: usize, to: usize) {
        match self {
            LayerBuf::F32(v) => v.copy_within(from * dim..(from + 1) * dim, to * dim),
            LayerBuf::F16(v) => v.copy_within(from * dim..(from + 1) * dim, to * dim),
            LayerBuf::Bf16(v) => v.copy_within(from * dim..(from + 1) * dim, to * dim),
            LayerBuf::Q8(v) => v.move_row(dim, from, to),
        }
    }

    pub(super) fn capacity_bytes(&self) -> usize {
        match self {
            LayerBuf::F32(v) => v.capacity() * 4,
            LayerBuf::F16(v) => v.capacity() * 2,
            LayerBuf::Bf16(v) => v.capacity() * 2,
            LayerBuf::Q8(v) => v.capacity_bytes(),
        }
    }

    /// Elements `a..b`, in a buffer of exactly that size.
    pub(super) fn copy_range(&self, a: usize, b: usize) -> LayerBuf {
        match self {
            LayerBuf::F32(v) => LayerBuf::F32(v[a..b].to_vec()),
            LayerBuf::F16(v) => LayerBuf::F16(v[a..b].to_vec()),
            LayerBuf::Bf16(v) => LayerBuf::Bf16(v[a..b].to_vec()),
            LayerBuf::Q8(v) => LayerBuf::Q8(v.copy_range(a, b)),
        }
    }

    /// Keeps elements `..at` (the memory shrunk to them) and returns the rest.
    pub(super) fn split_off(&mut self, at: usize) -> LayerBuf {
        match self {
            LayerBuf::F32(v) => {
                let tail = v.split_off(at);
                v.shrink_to_fit();
                LayerBuf::F32(tail)
            }
            LayerBuf::F16(v) => {
                let tail = v.split_off(at);
                v.shrink_to_fit();
                LayerBuf::F16(tail)
            }
            LayerBuf::Bf16(v) => {
                let tail = v.split_off(at);
                v.shrink_to_fit();
                LayerBuf::Bf16(tail)
            }
            LayerBuf::Q8(v) => LayerBuf::Q8(v.split_off(at)),
        }
    }

    /// Appends the first `n` elements of `src`, a buffer of the same type.
    pub(super) fn extend_same(&mut self, src: &LayerBuf, n: usize) {
        match (self, src) {
            (LayerBuf::F32(d), LayerBuf::F32(s)) => d.extend_from_slice(&s[..n]),
            (LayerBuf::F16(d), LayerBuf::F16(s)) => d.extend_from_slice(&s[..n]),
            (LayerBuf::Bf16(d), LayerBuf::Bf16(s)) => d.extend_from_slice(&s[..n]),
            (LayerBuf::Q8(d), LayerBuf::Q8(s)) => d.extend_same(s, n),
            _ => unreachable!("a cache's buffers all have its type"),
        }
    }

    pub(super) fn extend(&mut self, src: &[f32]) {
        match self {
            LayerBuf::F32(v) => v.extend_from_slice(src),
            LayerBuf::F16(v) => {
                let start = v.len();
                v.resize(start + src.len(), f16::ZERO);
                v[start..].convert_from_f32_slice(src);
            }
            LayerBuf::Bf16(v) => v.extend(src.iter().map(|&x| round_bf16(x))),
            LayerBuf::Q8(v) => v.extend(src),
        }
    }
}

/// One layer's cached keys and values, in the cache's element type.
pub(crate) enum LayerKv<'a> {
    F32 {
        keys: &'a [f32],
        values: &'a [f32],
    },
    F16 {
        keys: &'a [f16],
        values: &'a [f16],
    },
    Bf16 {
        keys: &'a [bf16],
        values: &'a [bf16],
    },
    Q8 {
        keys: Q8Rows<'a>,
        values: Q8Rows<'a>,
    },
}
