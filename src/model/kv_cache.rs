//! The KV cache: a fixed number of sequence slots, each holding keys and values for every
//! layer, that can be truncated (speculative rollback) and freed.
//!
//! Memory laid out token-major (`[pos][kv_head][head_dim]`), so appending a round's tokens is a
//! copy and truncation is a length change that keeps the allocation for reuse. Elements are
//! f32 or f16 ([`KvDtype`]): attention over a deep cache is bound by reading it, and f16 halves
//! both the reads and the memory a sequence holds (llama.cpp's default cache type too). Keys
//! and values are rounded to f16 once, when they are appended, so a token's cached values are
//! the same bits however it was batched: greedy parity does not depend on the type.

use std::str::FromStr;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::{ModelError, Result};

/// Element type of a KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Exactly the projections' values.
    #[default]
    F32,
    /// Rounded to half precision (to nearest, ties to even) when appended.
    F16,
}

impl KvDtype {
    pub fn size_of(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

impl FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            _ => Err(format!("unknown KV cache type {s:?} (expected f32 or f16)")),
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        })
    }
}

/// One layer's keys or values, `len * kv_dim` elements in use.
enum LayerBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl LayerBuf {
    fn new(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => LayerBuf::F32(Vec::new()),
            KvDtype::F16 => LayerBuf::F16(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        match self {
            LayerBuf::F32(v) => v.len(),
            LayerBuf::F16(v) => v.len(),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            LayerBuf::F32(v) => v.truncate(len),
            LayerBuf::F16(v) => v.truncate(len),
        }
    }

    fn reserve_total(&mut self, want: usize) {
        match self {
            LayerBuf::F32(v) if v.capacity() < want => v.reserve_exact(want - v.len()),
            LayerBuf::F16(v) if v.capacity() < want => v.reserve_exact(want - v.len()),
            _ => {}
        }
    }

    fn capacity_bytes(&self) -> usize {
        match self {
            LayerBuf::F32(v) => v.capacity() * 4,
            LayerBuf::F16(v) => v.capacity() * 2,
        }
    }

    fn extend(&mut self, src: &[f32]) {
        match self {
            LayerBuf::F32(v) => v.extend_from_slice(src),
            LayerBuf::F16(v) => {
                let start = v.len();
                v.resize(start + src.len(), f16::ZERO);
                v[start..].convert_from_f32_slice(src);
            }
        }
    }
}

/// One layer's cached keys and values, in the cache's element type.
pub(crate) enum LayerKv<'a> {
    F32 { keys: &'a [f32], values: &'a [f32] },
    F16 { keys: &'a [f16], values: &'a [f16] },
}

struct Slot {
    len: usize,
    /// Per layer; capacity is kept across truncation.
    keys: Vec<LayerBuf>,
    values: Vec<LayerBuf>,
}

pub struct KvCache {
    num_layers: usize,
    kv_dim: usize,
    max_len: usize,
    dtype: KvDtype,
    slots: Vec<Option<Slot>>,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        kv_dim: usize,
        num_slots: usize,
        max_len: usize,
        dtype: KvDtype,
    ) -> Self {
        Self {
            num_layers,
            kv_dim,
            max_len,
            dtype,
            slots: (0..num_slots).map(|_| None).collect(),
        }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The most tokens one slot may hold (the context limit).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.is_none()).count()
    }

    /// Takes a free slot, or `None` when all are in use.
    pub fn allocate(&mut self) -> Option<usize> {
        let idx = self.slots.iter().position(Option::is_none)?;
        self.allocate_slot(idx).ok()?;
        Some(idx)
    }

    /// Takes the given slot (for callers that assign slots themselves); fails if it is in use
    /// or out of range.
    pub fn allocate_slot(&mut self, slot: usize) -> Result<()> {
        match self.slots.get(slot) {
            Some(None) => {
                let dtype = self.dtype;
                self.slots[slot] = Some(Slot {
                    len: 0,
                    keys: (0..self.num_layers).map(|_| LayerBuf::new(dtype)).collect(),
                    values: (0..self.num_layers).map(|_| LayerBuf::new(dtype)).collect(),
                });
                Ok(())
            }
            Some(Some(_)) => Err(ModelError::Cache(format!("slot {slot} is already in use"))),
            None => Err(ModelError::Cache(format!(
                "slot {slot} out of range ({} slots)",
                self.slots.len()
            ))),
        }
    }

    /// Releases a slot and its memory.
    pub fn free(&mut self, slot: usize) -> Result<()> {
        self.slot_mut(slot)?;
        self.slots[slot] = None;
        Ok(())
    }

    pub fn is_allocated(&self, slot: usize) -> bool {
        matches!(self.slots.get(slot), Some(Some(_)))
    }

    /// Tokens held by a slot.
    pub fn len(&self, slot: usize) -> Result<usize> {
        Ok(self.slot(slot)?.len)
    }

    /// Drops every token at position `len` and beyond (keeps the allocation).
    pub fn truncate_to(&mut self, slot: usize, len: usize) -> Result<()> {
        let kv_dim = self.kv_dim;
        let s = self.slot_mut(slot)?;
        if len > s.len {
            return Err(ModelError::Cache(format!(
                "cannot truncate slot {slot} to {len}: it holds only {} tokens",
                s.len
            )));
        }
        for buf in s.keys.iter_mut().chain(s.values.iter_mut()) {
            buf.truncate(len * kv_dim);
        }
        s.len = len;
        Ok(())
    }

    /// Makes slot `to` hold exactly the first `len` tokens of slot `from` (allocating `to` if
    /// it is free): several sequences sharing a prompt are prefilled once. The bits are those
    /// of `from`, which are the bits `to` would have computed itself (keys and values of a
    /// token do not depend on how it was batched).
    pub fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> Result<()> {
        if from == to {
            return Err(ModelError::Cache(format!(
                "cannot copy slot {from} onto itself"
            )));
        }
        let held = self.len(from)?;
        if len > held {
            return Err(ModelError::Cache(format!(
                "cannot copy {len} tokens of slot {from}: it holds only {held}"
            )));
        }
        if !self.is_allocated(to) {
            self.allocate_slot(to)?;
        }
        let n = len * self.kv_dim;
        let mut dst = self.slots[to].take().expect("allocated above");
        let src = self.slot(from)?;
        for (d, s) in dst
            .keys
            .iter_mut()
            .zip(&src.keys)
            .chain(dst.values.iter_mut().zip(&src.values))
        {
            match (d, s) {
                (LayerBuf::F32(d), LayerBuf::F32(s)) => {
                    d.clear();
                    d.extend_from_slice(&s[..n]);
                }
                (LayerBuf::F16(d), LayerBuf::F16(s)) => {
                    d.clear();
                    d.extend_from_slice(&s[..n]);
                }
                _ => unreachable!("a cache's slots all have its type"),
            }
        }
        dst.len = len;
        self.slots[to] = Some(dst);
        Ok(())
    }

    /// Makes room for `len` tokens in a slot up front, so decoding does not reallocate.
    pub fn reserve(&mut self, slot: usize, len: usize) -> Result<()> {
        let (kv_dim, max_len) = (self.kv_dim, self.max_len);
        let s = self.slot_mut(slot)?;
        let want = len.min(max_len) * kv_dim;
        for buf in s.keys.iter_mut().chain(s.values.iter_mut()) {
            buf.reserve_total(want);
        }
        Ok(())
    }

    /// Bytes allocated for a slot (0 when free).
    pub fn slot_memory_bytes(&self, slot: usize) -> usize {
        match self.slots.get(slot) {
            Some(Some(s)) => s
                .keys
                .iter()
                .chain(s.values.iter())
                .map(LayerBuf::capacity_bytes)
                .sum(),
            _ => 0,
        }
    }

    pub fn memory_bytes(&self) -> usize {
        (0..self.slots.len())
            .map(|s| self.slot_memory_bytes(s))
            .sum()
    }

    /// Bytes one token occupies across all layers (keys and values).
    pub fn bytes_per_token(&self) -> usize {
        2 * self.num_layers * self.kv_dim * self.dtype.size_of()
    }

    fn slot(&self, slot: usize) -> Result<&Slot> {
        self.slots
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::Cache(format!("slot {slot} is not allocated")))
    }

    fn slot_mut(&mut self, slot: usize) -> Result<&mut Slot> {
        self.slots
            .get_mut(slot)
            .and_then(Option::as_mut)
            .ok_or_else(|| ModelError::Cache(format!("slot {slot} is not allocated")))
    }

    /// Appends one layer's keys and values for new tokens, converted to the cache's type (the
    /// slot's length is committed separately, once every layer has appended).
    pub(crate) fn append_layer(
        &mut self,
        slot: usize,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let s = self.slot_mut(slot)?;
        s.keys[layer].extend(keys);
        s.values[layer].extend(values);
        Ok(())
    }

    pub(crate) fn layer(&self, slot: usize, layer: usize) -> Result<LayerKv<'_>> {
        let s = self.slot(slot)?;
        Ok(match (&s.keys[layer], &s.values[layer]) {
            (LayerBuf::F32(keys), LayerBuf::F32(values)) => LayerKv::F32 { keys, values },
            (LayerBuf::F16(keys), LayerBuf::F16(values)) => LayerKv::F16 { keys, values },
            _ => unreachable!("a slot's buffers all have the cache's type"),
        })
    }

    /// Sets a slot's length after a forward appended to every layer.
    pub(crate) fn commit_len(&mut self, slot: usize, len: usize) -> Result<()> {
        let kv_dim = self.kv_dim;
        let s = self.slot_mut(slot)?;
        debug_assert!(s.keys.iter().all(|k| k.len() == len * kv_dim));
        s.len = len;
        Ok(())
    }

    /// Undoes a partial append (a forward that failed midway) back to the committed length.
    pub(crate) fn rollback_uncommitted(&mut self, slot: usize) -> Result<()> {
        let len = self.len(slot)?;
        let kv_dim = self.kv_dim;
        let s = self.slot_mut(slot)?;
        for buf in s.keys.iter_mut().chain(s.values.iter_mut()) {
            buf.truncate(len * kv_dim);
        }
        Ok(())
    }
}
