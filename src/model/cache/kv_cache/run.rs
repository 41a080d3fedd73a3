//! A run of consecutive tokens' keys and values taken out of a slot: what the prefix cache
//! stores, split where two texts part, and appends to a new sequence's slot.
//!
//! Why it exists apart from slots: a stored run outlives the slot it came from and is shared
//! by every later prompt that starts with its text, so it owns its memory, sized to exactly its
//! tokens, in the cache's element type (the bits a slot would hold).

use candle_core::Tensor;

use super::host::LayerBuf;
use super::slots::SlotStore;
use super::KvCache;
use crate::model::{ModelError, Result};

/// Keys and values of `len` consecutive positions, every layer.
pub struct KvRun {
    len: usize,
    store: RunStore,
}

enum RunStore {
    /// Per layer, `len * kv_dim` elements, token-major.
    Host {
        keys: Vec<LayerBuf>,
        values: Vec<LayerBuf>,
    },
    /// Per layer, `(kv_heads, len, head_dim)` tensors.
    Device {
        keys: Vec<Tensor>,
        values: Vec<Tensor>,
    },
}

impl KvRun {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Cuts the run at `at`: it keeps the first `at` positions and returns the rest.
    pub fn split_off(&mut self, at: usize) -> Result<KvRun> {
        if at > self.len {
            return Err(ModelError::Cache(format!(
                "cannot split a run of {} tokens at {at}",
                self.len
            )));
        }
        let (total, rest) = (self.len, self.len - at);
        let store = match &mut self.store {
            RunStore::Host { keys, values } => {
                let split = |bufs: &mut Vec<LayerBuf>| -> Vec<LayerBuf> {
                    bufs.iter_mut()
                        .map(|b| {
                            let kv_dim = b.len() / total.max(1);
                            b.split_off(at * kv_dim)
                        })
                        .collect()
                };
                RunStore::Host {
                    keys: split(keys),
                    values: split(values),
                }
            }
            RunStore::Device { keys, values } => {
                let split = |ts: &mut Vec<Tensor>| -> Result<Vec<Tensor>> {
                    let mut tails = Vec::with_capacity(ts.len());
                    for t in ts.iter_mut() {
                        tails.push(t.narrow(1, at, rest)?.contiguous()?);
                        *t = t.narrow(1, 0, at)?.contiguous()?;
                    }
                    Ok(tails)
                };
                RunStore::Device {
                    keys: split(keys)?,
                    values: split(values)?,
                }
            }
        };
        self.len = at;
        Ok(KvRun { len: rest, store })
    }
}

impl KvCache {
    /// A copy of positions `start..start + len` of `slot`.
    pub fn read_run(&self, slot: usize, start: usize, len: usize) -> Result<KvRun> {
        let s = self.slot(slot)?;
        if start + len > s.len {
            return Err(ModelError::Cache(format!(
                "cannot read positions {start}..{} of slot {slot}: it holds {}",
                start + len,
                s.len
            )));
        }
        let store = match &s.store {
            SlotStore::Host { keys, values } => {
                let (a, b) = (start * self.kv_dim, (start + len) * self.kv_dim);
                RunStore::Host {
                    keys: keys.iter().map(|k| k.copy_range(a, b)).collect(),
                    values: values.iter().map(|v| v.copy_range(a, b)).collect(),
                }
            }
            SlotStore::Device(d) => {
                let mut keys = Vec::with_capacity(self.num_layers);
                let mut values = Vec::with_capacity(self.num_layers);
                for layer in 0..self.num_layers {
                    let (k, v) = d.layer(layer, start + len)?;
                    keys.push(k.narrow(1, start, len)?.contiguous()?);
                    values.push(v.narrow(1, start, len)?.contiguous()?);
                }
                RunStore::Device { keys, values }
            }
        };
        Ok(KvRun { len, store })
    }

    /// Appends the first `len` positions of `run` to `slot` (allocating it if free): the slot
    /// then holds exactly what computing those tokens after what it held would have left.
    pub fn append_run(&mut self, slot: usize, run: &KvRun, len: usize) -> Result<()> {
        if len > run.len {
            return Err(ModelError::Cache(format!(
                "cannot append {len} tokens of a run of {}",
                run.len
            )));
        }
        if !self.is_allocated(slot) {
            self.allocate_slot(slot)?;
        }
        let held = self.len(slot)?;
        if held + len > self.max_len {
            return Err(ModelError::Cache(format!(
                "slot {slot} cannot hold {} tokens (context {})",
                held + len,
                self.max_len
            )));
        }
        let n = len * self.kv_dim;
        match &run.store {
            RunStore::Host { keys, values } => {
                let s = self.slot_mut(slot)?;
                let SlotStore::Host {
                    keys: sk,
                    values: sv,
                } = &mut s.store
                else {
                    return Err(ModelError::Cache("a host run for a device cache".into()));
                };
                for (d, r) in sk.iter_mut().zip(keys).chain(sv.iter_mut().zip(values)) {
                    d.extend_same(r, n);
                }
            }
            RunStore::Device { keys, values } => {
                self.ensure_device_capacity(slot, held + len)?;
                for layer in 0..self.num_layers {
                    let k = keys[layer].narrow(1, 0, len)?;
                    let v = values[layer].narrow(1, 0, len)?;
                    self.write_device_layer(slot, layer, held, &k, &v)?;
                }
            }
        }
        self.commit_len(slot, held + len)
    }
}
