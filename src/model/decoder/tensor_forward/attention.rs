//! Causal attention of a sequence's new tokens over its cache, on candle tensors.
//!
//! Decode and verify widths (up to [`ROW_WISE_MAX`] new tokens) attend one query row at a time
//! over exactly the positions it may see: a row's arithmetic then has the same shapes whether
//! it is decoded alone or verified beside γ drafts, so the result is the same bits (on the CPU
//! device; on a GPU this holds as far as its BLAS is deterministic per shape). Wider inputs
//! (prefill chunks) attend all rows at once under a causal mask, in a few large matmuls.

use candle_core::{DType, Tensor};

use crate::model::Result;

/// The widest input attended row by row.
pub(crate) const ROW_WISE_MAX: usize = 16;

/// Head counts of one attention, its score scale, and the window its layer attends within.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads<'a> {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Scores are multiplied by this (`1/√head_dim` unless the family says otherwise).
    pub scale: f64,
    /// A query sees itself and the `window - 1` positions before it.
    pub window: Option<usize>,
    /// Each head's sink logit, `(num_kv_heads, groups, 1)` (gpt-oss): one more softmax
    /// column with no value.
    pub sinks: Option<&'a Tensor>,
}

impl Heads<'_> {
    fn groups(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    fn scale(&self) -> f64 {
        self.scale
    }

    /// The first position a query that sees `visible` positions attends to.
    fn first_visible(&self, visible: usize) -> usize {
        self.window.map_or(0, |w| visible.saturating_sub(w))
    }
}

/// Attention of `q` (`(n, num_heads, head_dim)`, f32, rotated) for positions
/// `start..start + n` over `keys` and `values` (`(kv_heads, start + n, head_dim)`, any float
/// type); returns `(n, num_heads * head_dim)` in f32.
pub(crate) fn attend(
    heads: Heads<'_>,
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    start: usize,
) -> Result<Tensor> {
    let n = q.dim(0)?;
    let keys = keys.to_dtype(DType::F32)?;
    let values = values.to_dtype(DType::F32)?;
    if n <= ROW_WISE_MAX {
        let rows = (0..n)
            .map(|t| attend_one(heads, &q.narrow(0, t, 1)?, &keys, &values, start + t + 1))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&rows, 0)?)
    } else {
        attend_masked(heads, q, &keys, &values, start)
    }
}

/// Attention of a tree input's tokens (see `SeqInput::parents`): row `k` of `q` attends to the
/// first `start` positions and to the rows `start + paths[k][..]` (its ancestors and itself),
/// presented in path order, one query row at a time: the shapes of the linear forward of its
/// path, so on the CPU device the bits of that forward. A node on the tree's first chain (its
/// path is `0..=k`) reads the cache where it lies; another gathers its keys and values (a copy
/// of the cache before the tree, per node and layer: fine for the few off-chain nodes a tree
/// has, and the price of exactness here).
pub(crate) fn attend_tree(
    heads: Heads<'_>,
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    start: usize,
    paths: &[Vec<usize>],
) -> Result<Tensor> {
    let keys = keys.to_dtype(DType::F32)?;
    let values = values.to_dtype(DType::F32)?;
    let rows = paths
        .iter()
        .enumerate()
        .map(|(k, path)| {
            let q_row = q.narrow(0, k, 1)?;
            let visible = start + path.len();
            if path.iter().enumerate().all(|(d, &r)| d == r) {
                return attend_one(heads, &q_row, &keys, &values, visible);
            }
            let gather = |t: &Tensor| -> Result<Tensor> {
                let mut parts = Vec::with_capacity(1 + path.len());
                if start > 0 {
                    parts.push(t.narrow(1, 0, start)?);
                }
                for &r in path {
                    parts.push(t.narrow(1, start + r, 1)?);
                }
                Ok(Tensor::cat(&parts, 1)?)
            };
            let (k_rows, v_rows) = (gather(&keys)?, gather(&values)?);
            attend_one(heads, &q_row, &k_rows, &v_rows, visible)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&rows, 0)?)
}

/// One query row over the first `visible` positions.
fn attend_one(
    heads: Heads<'_>,
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    visible: usize,
) -> Result<Tensor> {
    let g = heads.groups();
    let q = q.reshape((heads.num_kv_heads, g, heads.head_dim))?;
    let lo = heads.first_visible(visible);
    let k = keys.narrow(1, lo, visible - lo)?;
    let v = values.narrow(1, lo, visible - lo)?;
    let scores = (q.matmul(&k.t()?)? * heads.scale())?;
    let probs = softmax_with_sinks(&scores, heads.sinks.cloned())?;
    let out = probs.matmul(&v)?;
    Ok(out.reshape((1, heads.num_heads * heads.head_dim))?)
}

/// All rows at once: row `t` sees positions `..= start + t`.
fn attend_masked(
    heads: Heads<'_>,
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    start: usize,
) -> Result<Tensor> {
    let (n, g, hd, kvh) = (
        q.dim(0)?,
        heads.groups(),
        heads.head_dim,
        heads.num_kv_heads,
    );
    let len = start + n;
    // (n, kv_heads, g, hd) -> (kv_heads, n * g, hd): query head h uses kv head h / g.
    let q = q
        .reshape((n, kvh, g, hd))?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((kvh, n * g, hd))?;
    let mut mask = vec![0f32; n * g * len];
    for t in 0..n {
        for gi in 0..g {
            let row = &mut mask[(t * g + gi) * len..(t * g + gi + 1) * len];
            row[start + t + 1..].fill(f32::NEG_INFINITY);
            row[..heads.first_visible(start + t + 1)].fill(f32::NEG_INFINITY);
        }
    }
    let mask = Tensor::from_vec(mask, (n * g, len), q.device())?;
    let scores = (q.matmul(&keys.t()?)? * heads.scale())?.broadcast_add(&mask)?;
    let sinks = heads
        .sinks
        .map(|s| -> Result<Tensor> {
            let s = s.reshape((kvh, 1, g, 1))?.broadcast_as((kvh, n, g, 1))?;
            Ok(s.reshape((kvh, n * g, 1))?)
        })
        .transpose()?;
    let probs = softmax_with_sinks(&scores, sinks)?;
    let out = probs.matmul(values)?;
    Ok(out
        .reshape((kvh, n, g, hd))?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((n, heads.num_heads * hd))?)
}

/// The softmax over the last dimension of `scores`, with a sink column beside them where the
/// heads have sinks (shaped as `scores` but one column), dropped again after: the sinks
/// take their share of each row and carry no value.
fn softmax_with_sinks(scores: &Tensor, sinks: Option<Tensor>) -> Result<Tensor> {
    let Some(sinks) = sinks else {
        return Ok(candle_nn::ops::softmax_last_dim(scores)?);
    };
    let last = scores.rank() - 1;
    let width = scores.dim(last)?;
    let joined = Tensor::cat(&[scores, &sinks.to_dtype(scores.dtype())?], last)?;
    Ok(candle_nn::ops::softmax_last_dim(&joined)?.narrow(last, 0, width)?)
}
