//! What a batched forward takes and gives back, whichever backend runs it: each sequence's new
//! tokens with its cache slot and start position, and the logits rows it asked for.

use std::ops::Range;

use candle_core::Tensor;

use crate::model::Result;

/// Which logits rows a sequence wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsRows {
    /// None (e.g. a prefill chunk that is not the prompt's last).
    None,
    /// The last new token's (prefill, plain decoding).
    Last,
    /// Every new token's (speculative verification).
    All,
}

/// One sequence's part of a batched forward.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    pub slot: usize,
    /// Position of `tokens[0]`; must equal the tokens already in the slot.
    pub start_pos: usize,
    pub tokens: &'a [u32],
    pub logits: LogitsRows,
    /// Empty for a chain (each token follows the one before it). For a token tree (a
    /// speculation round's drafts packed as a prefix tree), one entry per token: `parents[0]`
    /// is [`TREE_ROOT`] (the first token follows the cache) and `parents[k]` is the index of an
    /// earlier token. Token `k` then sits at position `start_pos + depth(k)` and attends to the
    /// cache and to its own ancestors only; its keys and values are appended in input order,
    /// and [`crate::model::KvCache::keep`] moves an accepted path into place afterwards.
    pub parents: &'a [u32],
}

/// A tree input's depth of each token and each token's path from the first token.
pub(crate) type TreeLayout = (Vec<usize>, Vec<Vec<usize>>);

/// The parent of a tree input's first token.
pub const TREE_ROOT: u32 = u32::MAX;

impl SeqInput<'_> {
    /// The depth of each token of a tree input (0 for the first): its position is
    /// `start_pos + depth`. `None` for a chain.
    pub fn tree_depths(&self) -> Option<Vec<usize>> {
        if self.parents.is_empty() {
            return None;
        }
        let mut d: Vec<usize> = Vec::with_capacity(self.parents.len());
        for (k, &p) in self.parents.iter().enumerate() {
            d.push(if k == 0 { 0 } else { d[p as usize] + 1 });
        }
        Some(d)
    }

    /// A tree input's depths and, per token, its path ([`SeqInput::tree_path`]); `None` for a
    /// chain.
    pub(crate) fn tree_layout(&self) -> Option<TreeLayout> {
        let depths = self.tree_depths()?;
        let paths = (0..self.tokens.len()).map(|k| self.tree_path(k)).collect();
        Some((depths, paths))
    }

    /// Token `k`'s ancestors and itself, from the first token down (a tree input).
    pub fn tree_path(&self, k: usize) -> Vec<usize> {
        let mut path = vec![k];
        let mut at = k;
        while at != 0 {
            at = self.parents[at] as usize;
            path.push(at);
        }
        path.reverse();
        path
    }
}

/// Logits of a batched forward: `(rows, vocab)` with each sequence's rows contiguous, in f32 on
/// the host.
pub struct BatchLogits {
    logits: Option<Tensor>,
    ranges: Vec<Range<usize>>,
}

impl BatchLogits {
    /// Sequence `i`'s logits as `(rows, vocab)`, or `None` if it asked for none.
    pub fn seq(&self, i: usize) -> Result<Option<Tensor>> {
        let r = self.ranges[i].clone();
        match &self.logits {
            Some(t) if !r.is_empty() => Ok(Some(t.narrow(0, r.start, r.len())?)),
            _ => Ok(None),
        }
    }

    /// Sequence `i`'s logits rows as plain vectors.
    pub fn seq_rows(&self, i: usize) -> Result<Vec<Vec<f32>>> {
        Ok(match self.seq(i)? {
            Some(t) => t.to_vec2::<f32>()?,
            None => Vec::new(),
        })
    }
}

/// The rows of the flattened batch whose logits are wanted, and each sequence's range of them.
pub(crate) fn logits_rows(batch: &[SeqInput]) -> (Vec<u32>, Vec<Range<usize>>) {
    let mut rows: Vec<u32> = Vec::new();
    let mut ranges = Vec::with_capacity(batch.len());
    let mut offset = 0u32;
    for s in batch {
        let n = s.tokens.len() as u32;
        let start = rows.len();
        match s.logits {
            LogitsRows::None => {}
            LogitsRows::Last => rows.push(offset + n - 1),
            LogitsRows::All => rows.extend(offset..offset + n),
        }
        ranges.push(start..rows.len());
        offset += n;
    }
    (rows, ranges)
}

impl BatchLogits {
    /// Logits of the selected rows (`None` when no sequence asked for any), moved to the host.
    pub(crate) fn new(logits: Option<Tensor>, ranges: Vec<Range<usize>>) -> Result<Self> {
        let logits = match logits {
            Some(t) if !t.device().is_cpu() => Some(t.to_device(&candle_core::Device::Cpu)?),
            other => other,
        };
        Ok(Self { logits, ranges })
    }
}

/// Every new token's last hidden state after the final norm, on the host, each sequence's rows
/// contiguous: what a draft head drafts from.
/// Which hidden states a forward hands a draft head, per new token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeatureTaps {
    /// The last layer's output after the final norm, what the output head reads (EAGLE).
    LastNormed,
    /// The residual stream entering each of these layers, concatenated in this order
    /// (EAGLE-3); the number of layers names the last layer's output (before the final norm).
    LayerInputs(Vec<usize>),
}

pub struct BatchFeatures {
    data: Vec<f32>,
    hidden: usize,
    ranges: Vec<Range<usize>>,
}

impl BatchFeatures {
    /// `normed`: `(rows, hidden)`, one row per token of `batch` in order.
    pub(crate) fn new(normed: Tensor, batch: &[SeqInput]) -> Result<Self> {
        let (_, hidden) = normed.dims2()?;
        let data = normed
            .to_device(&candle_core::Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let mut ranges = Vec::with_capacity(batch.len());
        let mut offset = 0;
        for s in batch {
            ranges.push(offset..offset + s.tokens.len());
            offset += s.tokens.len();
        }
        Ok(Self {
            data,
            hidden,
            ranges,
        })
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Sequence `i`'s rows, flattened (`tokens × hidden`).
    pub fn seq(&self, i: usize) -> &[f32] {
        let r = &self.ranges[i];
        &self.data[r.start * self.hidden..r.end * self.hidden]
    }
}
