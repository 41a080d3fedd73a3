//! The KV cache: a fixed number of sequence slots, each holding keys and values for every
//! layer, that can be truncated (speculative rollback) and freed.
//!
//! Memory laid out token-major (`[pos][kv_head][head_dim]`), so appending a round's tokens is a
//! copy and truncation is a length change that keeps the allocation for reuse. Elements are
//! f32 or f16 ([`KvDtype`]): attention over a deep cache is bound by reading it, and f16 halves
//! both the reads and the memory a sequence holds (llama.cpp's default cache type too). Keys
//! and values are rounded to f16 once, when they are appended, so a token's cached values are
//! the same bits however it was batched: greedy parity does not depend on the type.
//!
//! This file keeps the slots and their lengths; the memory is host buffers (`host`) for the own
//! CPU forward or device tensors (`device`) for the tensor backend, so the engine sees one
//! cache type whichever forward fills it.

use candle_core::{DType, Device, Tensor};

use crate::model::{ModelError, Result};

mod device;
mod dtype;
mod host;

use device::{DeviceLayout, DeviceSlot};
pub use dtype::KvDtype;
use host::LayerBuf;
pub(crate) use host::LayerKv;

struct Slot {
    len: usize,
    store: SlotStore,
}

enum SlotStore {
    /// Per layer, in host memory; capacity is kept across truncation.
    Host {
        keys: Vec<LayerBuf>,
        values: Vec<LayerBuf>,
    },
    /// Per layer, device tensors (the tensor backend).
    Device(DeviceSlot),
}

pub struct KvCache {
    num_layers: usize,
    kv_dim: usize,
    max_len: usize,
    dtype: KvDtype,
    /// Set for a cache on candle tensors.
    device: Option<DeviceLayout>,
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
            device: None,
            slots: (0..num_slots).map(|_| None).collect(),
        }
    }

    /// A cache whose keys and values live in `(kv_heads, len, head_dim)` tensors on `device`
    /// (the tensor backend's).
    pub fn on_device(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        num_slots: usize,
        max_len: usize,
        dtype: KvDtype,
        device: &Device,
    ) -> Self {
        let mut cache = Self::new(num_layers, kv_heads * head_dim, num_slots, max_len, dtype);
        cache.device = Some(DeviceLayout {
            kv_heads,
            head_dim,
            dtype: match dtype {
                KvDtype::F32 => DType::F32,
                KvDtype::F16 => DType::F16,
            },
            device: device.clone(),
        });
        cache
    }

    /// Whether the memory is device tensors (the tensor backend) rather than host buffers.
    pub fn is_on_device(&self) -> bool {
        self.device.is_some()
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
                let store = match &self.device {
                    None => SlotStore::Host {
                        keys: (0..self.num_layers).map(|_| LayerBuf::new(dtype)).collect(),
                        values: (0..self.num_layers).map(|_| LayerBuf::new(dtype)).collect(),
                    },
                    Some(_) => SlotStore::Device(DeviceSlot::empty()),
                };
                self.slots[slot] = Some(Slot { len: 0, store });
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
        if let SlotStore::Host { keys, values } = &mut s.store {
            for buf in keys.iter_mut().chain(values.iter_mut()) {
                buf.truncate(len * kv_dim);
            }
        }
        s.len = len;
        Ok(())
    }

    /// After a tree forward: keeps the rows `start + rows[d]` (the accepted path, in depth
    /// order, strictly increasing, `rows[0] = 0`) as positions `start + d`, and drops the rest.
    /// A row's keys and values were computed at its depth's position, so the slot then holds
    /// exactly what feeding the path alone would have left (the same bits).
    pub fn keep_path(&mut self, slot: usize, start: usize, rows: &[usize]) -> Result<()> {
        let held = self.len(slot)?;
        let increasing = rows.windows(2).all(|w| w[0] < w[1]);
        if rows.first().is_some_and(|&r| r != 0)
            || !increasing
            || rows.last().is_some_and(|&r| start + r >= held)
        {
            return Err(ModelError::Cache(format!(
                "cannot keep rows {rows:?} after position {start} of slot {slot}: it holds {held}"
            )));
        }
        let kv_dim = self.kv_dim;
        let layout = self.device.clone();
        let s = self.slot_mut(slot)?;
        match &mut s.store {
            SlotStore::Host { keys, values } => {
                for buf in keys.iter_mut().chain(values.iter_mut()) {
                    for (d, &r) in rows.iter().enumerate().filter(|&(d, &r)| d != r) {
                        buf.move_row(kv_dim, start + r, start + d);
                    }
                }
            }
            SlotStore::Device(dev) => {
                let layout = layout.expect("a device cache has a layout");
                dev.keep_rows(&layout, start, rows)?;
            }
        }
        self.truncate_to(slot, start + rows.len())
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
        let copied = self.copy_store(from, &mut dst, len, n);
        dst.len = if copied.is_ok() { len } else { 0 };
        self.slots[to] = Some(dst);
        copied
    }

    fn copy_store(&self, from: usize, dst: &mut Slot, len: usize, n: usize) -> Result<()> {
        let src = self.slot(from)?;
        match (&mut dst.store, &src.store) {
            (
                SlotStore::Host { keys, values },
                SlotStore::Host {
                    keys: src_keys,
                    values: src_values,
                },
            ) => {
                for (d, s) in keys
                    .iter_mut()
                    .zip(src_keys)
                    .chain(values.iter_mut().zip(src_values))
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
                Ok(())
            }
            (SlotStore::Device(d), SlotStore::Device(s)) => {
                let layout = self.device.as_ref().expect("a device cache has a layout");
                d.ensure_capacity(layout, self.num_layers, 0, len, self.max_len)?;
                d.copy_prefix_from(s, len)
            }
            _ => unreachable!("a cache's slots all live in one place"),
        }
    }

    /// Makes room for `len` tokens in a slot up front, so decoding does not reallocate.
    pub fn reserve(&mut self, slot: usize, len: usize) -> Result<()> {
        let (kv_dim, max_len, layers) = (self.kv_dim, self.max_len, self.num_layers);
        let layout = self.device.clone();
        let s = self.slot_mut(slot)?;
        match &mut s.store {
            SlotStore::Host { keys, values } => {
                let want = len.min(max_len) * kv_dim;
                for buf in keys.iter_mut().chain(values.iter_mut()) {
                    buf.reserve_total(want);
                }
            }
            SlotStore::Device(d) => {
                let layout = layout.expect("a device cache has a layout");
                d.ensure_capacity(&layout, layers, s.len, len.min(max_len), max_len)?;
            }
        }
        Ok(())
    }

    /// Bytes allocated for a slot (0 when free).
    pub fn slot_memory_bytes(&self, slot: usize) -> usize {
        match self.slots.get(slot) {
            Some(Some(Slot {
                store: SlotStore::Host { keys, values },
                ..
            })) => keys
                .iter()
                .chain(values.iter())
                .map(LayerBuf::capacity_bytes)
                .sum(),
            Some(Some(Slot {
                store: SlotStore::Device(d),
                ..
            })) => d.bytes(self.device.as_ref().expect("a device cache has a layout")),
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
        match &mut self.slot_mut(slot)?.store {
            SlotStore::Host { keys: k, values: v } => {
                k[layer].extend(keys);
                v[layer].extend(values);
                Ok(())
            }
            SlotStore::Device(_) => Err(host_only()),
        }
    }

    pub(crate) fn layer(&self, slot: usize, layer: usize) -> Result<LayerKv<'_>> {
        let s = self.slot(slot)?;
        let SlotStore::Host { keys, values } = &s.store else {
            return Err(host_only());
        };
        Ok(match (&keys[layer], &values[layer]) {
            (LayerBuf::F32(keys), LayerBuf::F32(values)) => LayerKv::F32 { keys, values },
            (LayerBuf::F16(keys), LayerBuf::F16(values)) => LayerKv::F16 { keys, values },
            _ => unreachable!("a slot's buffers all have the cache's type"),
        })
    }

    /// Makes room on the device for a slot to hold `len` tokens (before a forward writes them).
    pub(crate) fn ensure_device_capacity(&mut self, slot: usize, len: usize) -> Result<()> {
        let (layers, max_len) = (self.num_layers, self.max_len);
        let layout = self.device.clone().ok_or_else(device_only)?;
        let s = self.slot_mut(slot)?;
        match &mut s.store {
            SlotStore::Device(d) => d.ensure_capacity(&layout, layers, s.len, len, max_len),
            SlotStore::Host { .. } => Err(device_only()),
        }
    }

    /// Writes one layer's keys and values (`(kv_heads, n, head_dim)`, any float type) at
    /// positions `start..start + n` of a device slot; the length is committed separately.
    pub(crate) fn write_device_layer(
        &mut self,
        slot: usize,
        layer: usize,
        start: usize,
        keys: &Tensor,
        values: &Tensor,
    ) -> Result<()> {
        let dtype = self.device.as_ref().ok_or_else(device_only)?.dtype;
        match &mut self.slot_mut(slot)?.store {
            SlotStore::Device(d) => {
                let need = start + keys.dim(1)?;
                if need > d.capacity() {
                    return Err(ModelError::Cache(format!(
                        "slot {slot} has room for {} tokens, {need} written",
                        d.capacity()
                    )));
                }
                d.write(
                    layer,
                    start,
                    &keys.to_dtype(dtype)?,
                    &values.to_dtype(dtype)?,
                )
            }
            SlotStore::Host { .. } => Err(device_only()),
        }
    }

    /// A device slot's first `len` keys and values of one layer, `(kv_heads, len, head_dim)`.
    pub(crate) fn device_layer(
        &self,
        slot: usize,
        layer: usize,
        len: usize,
    ) -> Result<(Tensor, Tensor)> {
        match &self.slot(slot)?.store {
            SlotStore::Device(d) => d.layer(layer, len),
            SlotStore::Host { .. } => Err(device_only()),
        }
    }

    /// Sets a slot's length after a forward appended to every layer.
    pub(crate) fn commit_len(&mut self, slot: usize, len: usize) -> Result<()> {
        let kv_dim = self.kv_dim;
        let s = self.slot_mut(slot)?;
        if let SlotStore::Host { keys, .. } = &s.store {
            debug_assert!(keys.iter().all(|k| k.len() == len * kv_dim));
        }
        s.len = len;
        Ok(())
    }

    /// Undoes a partial append (a forward that failed midway) back to the committed length.
    pub(crate) fn rollback_uncommitted(&mut self, slot: usize) -> Result<()> {
        let len = self.len(slot)?;
        let kv_dim = self.kv_dim;
        let s = self.slot_mut(slot)?;
        if let SlotStore::Host { keys, values } = &mut s.store {
            for buf in keys.iter_mut().chain(values.iter_mut()) {
                buf.truncate(len * kv_dim);
            }
        }
        Ok(())
    }
}

fn host_only() -> ModelError {
    ModelError::Cache("this cache lives on a device; the own CPU forward cannot use it".into())
}

fn device_only() -> ModelError {
    ModelError::Cache("this cache lives in host buffers; the tensor forward cannot use it".into())
}
