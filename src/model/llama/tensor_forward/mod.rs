//! The forward on candle tensors, for any candle device (a GPU above all; the CPU device runs
//! it in tests against the own kernels).
//!
//! The same Llama as `own_forward`, built from candle's operations: quantized or dense matmuls
//! (`Linear`), `rms_norm`, rotary embeddings per token (each token has its own position, since
//! sequences of different lengths share one pass), SiLU, and attention over a cache of device
//! tensors (`attention`). Linear layers run on all new tokens of all sequences at once;
//! attention runs per sequence.

mod attention;

use candle_core::{DType, Device, Tensor};

use crate::model::cache::kv_cache::KvCache;
use crate::model::llama::batch::{logits_rows, BatchLogits, SeqInput, TreeLayout};
use crate::model::llama::rope::angle_tables;
use crate::model::llama::weights::LlamaWeights;
use crate::model::load::hparams::{LlamaHparams, RopeLayout};
use crate::model::Result;
use attention::{attend, attend_tree, Heads};

/// Rotary tables on the device: `cos[pos][i]`, `sin[pos][i]` for frequency pair `i`.
pub(crate) struct TensorRope {
    cos: Tensor,
    sin: Tensor,
    layout: RopeLayout,
}

impl TensorRope {
    pub fn new(hp: &LlamaHparams, max_positions: usize, device: &Device) -> Result<Self> {
        let (half, cos, sin) = angle_tables(hp, max_positions);
        Ok(Self {
            cos: Tensor::from_vec(cos, (max_positions, half), device)?,
            sin: Tensor::from_vec(sin, (max_positions, half), device)?,
            layout: hp.rope_layout,
        })
    }

    /// Rotates `x` (`(tokens, heads, 1, head_dim)`) with `cos`/`sin` rows gathered per token.
    fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(match self.layout {
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
            RopeLayout::HalfSplit => candle_nn::rotary_emb::rope(x, cos, sin)?,
        })
    }
}

pub(crate) fn forward(
    w: &LlamaWeights,
    hp: &LlamaHparams,
    rope: &TensorRope,
    cache: &mut KvCache,
    batch: &[SeqInput],
    taps: &[usize],
) -> Result<(BatchLogits, Tensor, Vec<Tensor>)> {
    let device = w.embed.device().clone();
    let heads = Heads {
        num_heads: hp.num_heads,
        num_kv_heads: hp.num_kv_heads,
        head_dim: hp.head_dim,
    };
    let hd = hp.head_dim;
    let (q_dim, kv_dim) = (hp.num_heads * hd, hp.num_kv_heads * hd);
    let eps = hp.rms_norm_eps as f32;
    for s in batch {
        cache.ensure_device_capacity(s.slot, s.start_pos + s.tokens.len())?;
    }

    let ids: Vec<u32> = batch
        .iter()
        .flat_map(|s| s.tokens.iter().copied())
        .collect();
    // Tree inputs: each token's depth (its position past start_pos) and its path.
    let trees: Vec<Option<TreeLayout>> = batch.iter().map(SeqInput::tree_layout).collect();
    let positions: Vec<u32> = batch
        .iter()
        .zip(&trees)
        .flat_map(|(s, tree)| {
            (0..s.tokens.len())
                .map(move |i| (s.start_pos + tree.as_ref().map_or(i, |(d, _)| d[i])) as u32)
        })
        .collect();
    let total = ids.len();
    let ids = Tensor::from_vec(ids, total, &device)?;
    let positions = Tensor::from_vec(positions, total, &device)?;
    let half = hd / 2;
    let cos = rope
        .cos
        .index_select(&positions, 0)?
        .reshape((total, 1, half))?;
    let sin = rope
        .sin
        .index_select(&positions, 0)?
        .reshape((total, 1, half))?;
    let mut x = w.embed.index_select(&ids, 0)?.to_dtype(DType::F32)?;

    let mut tapped = Vec::with_capacity(taps.len());
    for &t in taps {
        if t > w.layers.len() {
            return Err(crate::model::ModelError::BadInput(format!(
                "layer {t} is tapped, but the model has {} layers",
                w.layers.len()
            )));
        }
    }
    let mut layer_inputs: Vec<Option<Tensor>> = vec![None; taps.len()];
    for (l, layer) in w.layers.iter().enumerate() {
        for (i, _) in taps.iter().enumerate().filter(|(_, &t)| t == l) {
            layer_inputs[i] = Some(x.clone());
        }
        let h = layer.attn_input(&x, eps)?;
        let qkv = layer.qkv.forward(&h)?;
        let q = qkv
            .narrow(1, 0, q_dim)?
            .contiguous()?
            .reshape((total, hp.num_heads, 1, hd))?;
        let k =
            qkv.narrow(1, q_dim, kv_dim)?
                .contiguous()?
                .reshape((total, hp.num_kv_heads, 1, hd))?;
        let v = qkv
            .narrow(1, q_dim + kv_dim, kv_dim)?
            .contiguous()?
            .reshape((total, hp.num_kv_heads, hd))?;
        let q = rope
            .apply(&q, &cos, &sin)?
            .reshape((total, hp.num_heads, hd))?;
        let k = rope
            .apply(&k, &cos, &sin)?
            .reshape((total, hp.num_kv_heads, hd))?;
        let mut outs = Vec::with_capacity(batch.len());
        let mut offset = 0;
        for (s, tree) in batch.iter().zip(&trees) {
            let n = s.tokens.len();
            let k_new = k.narrow(0, offset, n)?.transpose(0, 1)?;
            let v_new = v.narrow(0, offset, n)?.transpose(0, 1)?;
            cache.write_device_layer(s.slot, l, s.start_pos, &k_new, &v_new)?;
            let (keys, values) = cache.device_layer(s.slot, l, s.start_pos + n)?;
            let q_seq = q.narrow(0, offset, n)?;
            outs.push(match tree {
                None => attend(heads, &q_seq, &keys, &values, s.start_pos)?,
                Some((_, paths)) => attend_tree(heads, &q_seq, &keys, &values, s.start_pos, paths)?,
            });
            offset += n;
        }
        let attn = if outs.len() == 1 {
            outs.pop().expect("one sequence")
        } else {
            Tensor::cat(&outs, 0)?
        };
        x = layer.after_attention(&x, &attn, eps)?;
    }

    let (rows, ranges) = logits_rows(batch);
    let logits = BatchLogits::new(w.output_logits(&x, rows, eps)?, ranges)?;
    for (i, _) in taps
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == w.layers.len())
    {
        layer_inputs[i] = Some(x.clone());
    }
    tapped.extend(layer_inputs.into_iter().flatten());
    Ok((logits, x, tapped))
}
