//! The cache's slots: taking and freeing them, their lengths, and the memory they hold.
//!
//! Why it exists apart: the rest of the cache (what a forward writes, what a round keeps, a
//! prefix copied between slots) works on slots this file hands out.

use candle_core::{DType, Device};

use super::device_slot::{DeviceLayout, DeviceSlot};
use super::host::LayerBuf;
use super::KvDtype;
use crate::model::{ModelError, Result};

pub(super) struct Slot {
    pub(super) len: usize,
    pub(super) store: SlotStore,
}

pub(super) enum SlotStore {
    /// Per layer, in host memory; capacity is kept across truncation.
    Host {
        keys: Vec<LayerBuf>,
        values: Vec<LayerBuf>,
    },
    /// Per layer, device tensors (the tensor backend).
    Device(DeviceSlot),
}

pub struct KvCache {
    pub(super) num_layers: usize,
    pub(super) kv_dim: usize,
    pub(super) max_len: usize,
    pub(super) dtype: KvDtype,
    /// Set for a cache on candle tensors.
    pub(super) device: Option<DeviceLayout>,
    pub(super) slots: Vec<Option<Slot>>,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        kv_dim: usize,
        num_slots: usize,
        max_len: usize,
        dtype: KvDtype,
    ) -> Self {
        assert!(
            dtype != KvDtype::Q8_0 || kv_dim.is_multiple_of(KvDtype::Q8_BLOCK),
            "a q8_0 cache's rows are whole blocks of 32"
        );
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
                // Refused at load (`kv_cache_dtype`); f16 keeps a caller who got past that
                // working.
                KvDtype::F16 | KvDtype::Bf16 | KvDtype::Q8_0 => DType::F16,
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
        2 * self.num_layers * self.dtype.bytes_for(self.kv_dim)
    }

    pub(super) fn slot(&self, slot: usize) -> Result<&Slot> {
        self.slots
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::Cache(format!("slot {slot} is not allocated")))
    }

    pub(super) fn slot_mut(&mut self, slot: usize) -> Result<&mut Slot> {
        self.slots
            .get_mut(slot)
            .and_then(Option::as_mut)
            .ok_or_else(|| ModelError::Cache(format!("slot {slot} is not allocated")))
    }
}
