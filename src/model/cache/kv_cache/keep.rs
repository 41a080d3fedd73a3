//! What a round keeps of a slot: the one operation by which rejected tokens leave the cache.
//!
//! Why it exists: after a verification (or a draft step the target did not take) a slot holds
//! tokens that do not stand. [`KvCache::keep`] keeps what stands and drops the rest, for a
//! chain (the first tokens) or a token tree (one path of its rows, moved into place).

use super::slots::SlotStore;
use super::KvCache;
use crate::model::{ModelError, Result};

/// What of a slot stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept<'a> {
    /// Its first tokens, this many (the allocation is kept for reuse).
    First(usize),
    /// After a tree forward: the rows `start + rows[d]` (the accepted path, in depth order,
    /// strictly increasing, `rows[0] = 0`), as positions `start + d`.
    Path { start: usize, rows: &'a [usize] },
}

impl KvCache {
    /// Keeps what stands of `slot` and drops every other token. A tree's path rows were
    /// computed at their depth's positions, so the slot then holds exactly what feeding the
    /// path alone would have left (the same bits).
    pub fn keep(&mut self, slot: usize, kept: Kept) -> Result<()> {
        match kept {
            Kept::First(len) => self.keep_first(slot, len),
            Kept::Path { start, rows } => self.keep_path(slot, start, rows),
        }
    }

    fn keep_first(&mut self, slot: usize, len: usize) -> Result<()> {
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

    fn keep_path(&mut self, slot: usize, start: usize, rows: &[usize]) -> Result<()> {
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
        self.keep_first(slot, start + rows.len())
    }
}
