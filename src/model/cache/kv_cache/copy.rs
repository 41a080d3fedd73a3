//! A slot's first tokens copied into another slot: sequences sharing a prompt (a request's
//! choices, or a running sequence's start) are prefilled once.

use super::slots::{Slot, SlotStore};
use super::KvCache;
use crate::model::{ModelError, Result};

impl KvCache {
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
                    d.truncate(0);
                    d.extend_same(s, n);
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
}
