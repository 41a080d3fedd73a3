//! One slot's keys and values as candle tensors on the model's device (the tensor backend's
//! cache).
//!
//! Each layer holds a preallocated `(kv_heads, capacity, head_dim)` tensor for keys and one for
//! values, written in place with `slice_set`; the slot's length says how much of it is real, so
//! truncation is a length change and appending is one copy per layer. Capacity grows by doubling
//! (copying what is held) up to the context length, so a short request does not hold a whole
//! context's memory.

use candle_core::{DType, Device, Tensor};

use crate::model::Result;

pub(crate) struct DeviceSlot {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    capacity: usize,
}

/// The shape of one layer's keys or values and where they live.
#[derive(Clone, Debug)]
pub(crate) struct DeviceLayout {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
    pub device: Device,
}

impl DeviceLayout {
    fn zeros(&self, capacity: usize) -> Result<Tensor> {
        Ok(Tensor::zeros(
            (self.kv_heads, capacity, self.head_dim),
            self.dtype,
            &self.device,
        )?)
    }
}

/// The first allocation of a slot that was not reserved.
const FIRST_CAPACITY: usize = 256;

impl DeviceSlot {
    pub(crate) fn new(layout: &DeviceLayout, num_layers: usize, capacity: usize) -> Result<Self> {
        let capacity = capacity.max(1);
        let mut keys = Vec::with_capacity(num_layers);
        let mut values = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            keys.push(layout.zeros(capacity)?);
            values.push(layout.zeros(capacity)?);
        }
        Ok(Self {
            keys,
            values,
            capacity,
        })
    }

    /// An empty slot that allocates on first use.
    pub(crate) fn empty() -> Self {
        Self {
            keys: Vec::new(),
            values: Vec::new(),
            capacity: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Makes room for `want` tokens (at most `max_len`), keeping the first `len`.
    pub(crate) fn ensure_capacity(
        &mut self,
        layout: &DeviceLayout,
        num_layers: usize,
        len: usize,
        want: usize,
        max_len: usize,
    ) -> Result<()> {
        if want <= self.capacity {
            return Ok(());
        }
        let new_cap = want
            .max(2 * self.capacity)
            .max(FIRST_CAPACITY)
            .min(max_len.max(want));
        let mut grown = Self::new(layout, num_layers, new_cap)?;
        if len > 0 {
            grown.copy_prefix_from(self, len)?;
        }
        *self = grown;
        Ok(())
    }

    /// Writes `len..len + n` of one layer; `keys` and `values` are `(kv_heads, n, head_dim)`
    /// in the cache's type, and capacity must already be there.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        len: usize,
        keys: &Tensor,
        values: &Tensor,
    ) -> Result<()> {
        self.keys[layer].slice_set(&keys.contiguous()?, 1, len)?;
        self.values[layer].slice_set(&values.contiguous()?, 1, len)?;
        Ok(())
    }

    /// The first `len` positions of one layer, `(kv_heads, len, head_dim)` each.
    pub(crate) fn layer(&self, layer: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((
            self.keys[layer].narrow(1, 0, len)?,
            self.values[layer].narrow(1, 0, len)?,
        ))
    }

    /// Moves rows `start + rows[d]` to `start + d` in every layer (`rows` increasing, so no
    /// row is overwritten before it is read).
    pub(crate) fn keep_rows(
        &mut self,
        layout: &DeviceLayout,
        start: usize,
        rows: &[usize],
    ) -> Result<()> {
        let idx: Vec<u32> = rows.iter().map(|&r| (start + r) as u32).collect();
        let idx = Tensor::from_vec(idx, rows.len(), &layout.device)?;
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let kept = t.index_select(&idx, 1)?;
            t.slice_set(&kept, 1, start)?;
        }
        Ok(())
    }

    /// Overwrites this slot's first `len` positions with `src`'s (capacity must be there).
    pub(crate) fn copy_prefix_from(&mut self, src: &DeviceSlot, len: usize) -> Result<()> {
        for (d, s) in self
            .keys
            .iter()
            .zip(&src.keys)
            .chain(self.values.iter().zip(&src.values))
        {
            d.slice_set(&s.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
        }
        Ok(())
    }

    pub(crate) fn bytes(&self, layout: &DeviceLayout) -> usize {
        2 * self.keys.len()
            * self.capacity
            * layout.kv_heads
            * layout.head_dim
            * layout.dtype.size_in_bytes()
    }
}
