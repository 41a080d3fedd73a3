//! What a forward writes into a slot and reads back: one layer's keys and values at a time,
//! in host buffers (the own CPU forward) or device tensors (the tensor backend), the slot's
//! length committed once every layer has written.
//!
//! Why it exists apart: the model layer's forwards are the only writers; the engine sees
//! slots and what a round keeps ([`super::keep`]).

use candle_core::Tensor;

use super::host::{LayerBuf, LayerKv};
use super::slots::SlotStore;
use super::KvCache;
use crate::model::{ModelError, Result};

impl KvCache {
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
            (LayerBuf::Bf16(keys), LayerBuf::Bf16(values)) => LayerKv::Bf16 { keys, values },
            (LayerBuf::Q8(keys), LayerBuf::Q8(values)) => LayerKv::Q8 {
                keys: keys.rows(),
                values: values.rows(),
            },
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
    pub(crate) fn undo_partial_append(&mut self, slot: usize) -> Result<()> {
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
