//! The KV cache: a fixed number of sequence slots, each holding keys and values for every
//! layer, that can be truncated (speculative rollback) and freed.
//!
//! Plain f32 memory laid out token-major (`[pos][kv_head][head_dim]`), so appending a round's
//! tokens is a copy and truncation is a length change that keeps the allocation for reuse.

use super::{ModelError, Result};

struct Slot {
    len: usize,
    /// Per layer, `len * kv_dim` keys (and values) in use; capacity is kept across truncation.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

pub struct KvCache {
    num_layers: usize,
    kv_dim: usize,
    max_len: usize,
    slots: Vec<Option<Slot>>,
}

impl KvCache {
    pub fn new(num_layers: usize, kv_dim: usize, num_slots: usize, max_len: usize) -> Self {
        Self {
            num_layers,
            kv_dim,
            max_len,
            slots: (0..num_slots).map(|_| None).collect(),
        }
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
                self.slots[slot] = Some(Slot {
                    len: 0,
                    keys: (0..self.num_layers).map(|_| Vec::new()).collect(),
                    values: (0..self.num_layers).map(|_| Vec::new()).collect(),
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

    /// Makes room for `len` tokens in a slot up front, so decoding does not reallocate.
    pub fn reserve(&mut self, slot: usize, len: usize) -> Result<()> {
        let (kv_dim, max_len) = (self.kv_dim, self.max_len);
        let s = self.slot_mut(slot)?;
        let want = len.min(max_len) * kv_dim;
        for buf in s.keys.iter_mut().chain(s.values.iter_mut()) {
            if buf.capacity() < want {
                buf.reserve_exact(want - buf.len());
            }
        }
        Ok(())
    }

    /// Bytes allocated for a slot (0 when free).
    pub fn slot_memory_bytes(&self, slot: usize) -> usize {
        match self.slots.get(slot) {
            Some(Some(s)) => {
                s.keys
                    .iter()
                    .chain(s.values.iter())
                    .map(Vec::capacity)
                    .sum::<usize>()
                    * std::mem::size_of::<f32>()
            }
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
        2 * self.num_layers * self.kv_dim * std::mem::size_of::<f32>()
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

    /// Appends one layer's keys and values for new tokens (the slot's length is committed
    /// separately, once every layer has appended).
    pub(crate) fn append_layer(
        &mut self,
        slot: usize,
        layer: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let s = self.slot_mut(slot)?;
        s.keys[layer].extend_from_slice(keys);
        s.values[layer].extend_from_slice(values);
        Ok(())
    }

    pub(crate) fn layer(&self, slot: usize, layer: usize) -> Result<(&[f32], &[f32])> {
        let s = self.slot(slot)?;
        Ok((&s.keys[layer], &s.values[layer]))
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
