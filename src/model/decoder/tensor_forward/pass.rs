//! One forward pass on candle tensors: embeddings, every layer (its attention per sequence
//! over the device cache), the logits rows asked for, and the tapped layer inputs.

use candle_core::{Device, Tensor};

use super::attention::{attend, attend_tree, Heads};
use super::rope_tensors::{TensorRope, TensorRopes};
use crate::model::cache::kv_cache::KvCache;
use crate::model::decoder::batch::{logits_rows, BatchLogits, SeqInput, TreeLayout};
use crate::model::decoder::weights::DecoderWeights;
use crate::model::spec::hparams::Hparams;
use crate::model::Result;

/// The forward over `batch` on the weights' device: the logits rows each sequence asks for,
/// the last layer's output, and the inputs of the layers `taps` names.
pub(crate) fn forward(
    w: &DecoderWeights,
    hp: &Hparams,
    ropes: &TensorRopes,
    cache: &mut KvCache,
    batch: &[SeqInput],
    taps: &[usize],
) -> Result<(BatchLogits, Tensor, Vec<Tensor>)> {
    let device = w.norm.device().clone();
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
    let angles = rope_rows(&ropes.global, hp, batch, &trees, &device)?;
    let local_angles = match &ropes.local {
        Some(local) => Some(rope_rows(local, hp, batch, &trees, &device)?),
        None => None,
    };
    let mut x = w.input_rows(hp, &ids, &device)?;
    for &t in taps {
        if t > w.layers.len() {
            return Err(crate::model::ModelError::BadInput(format!(
                "layer {t} is tapped, but the model has {} layers",
                w.layers.len()
            )));
        }
    }
    let pass = LayerPass {
        hp,
        ropes,
        angles: (&angles, local_angles.as_ref()),
        batch,
        trees: &trees,
    };
    let mut layer_inputs: Vec<Option<Tensor>> = vec![None; taps.len()];
    for (l, layer) in w.layers.iter().enumerate() {
        for (i, _) in taps.iter().enumerate().filter(|(_, &t)| t == l) {
            layer_inputs[i] = Some(x.clone());
        }
        let h = layer.attn_input(&x, eps)?;
        let mut qkv = layer.qkv.forward(&h)?;
        if let Some(bias) = &layer.extras.qkv_bias {
            qkv = qkv.broadcast_add(bias)?;
        }
        let sinks = layer
            .extras
            .sinks
            .as_ref()
            .map(|s| {
                let (kvh, g) = (hp.num_kv_heads, hp.num_heads / hp.num_kv_heads);
                Tensor::from_slice(s, (kvh, g, 1), x.device())
            })
            .transpose()?;
        let attn = pass.attention(
            &qkv,
            (layer.extras.qk_norm.as_ref(), sinks.as_ref()),
            cache,
            l,
        )?;
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
    let tapped = layer_inputs.into_iter().flatten().collect();
    Ok((logits, x, tapped))
}

/// Each token's rotary `cos` and `sin` rows, `(tokens, 1, head_dim / 2)`, at its position (a
/// tree token's at its depth).
fn rope_rows(
    rope: &TensorRope,
    hp: &Hparams,
    batch: &[SeqInput],
    trees: &[Option<TreeLayout>],
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let positions: Vec<u32> = batch
        .iter()
        .zip(trees)
        .flat_map(|(s, tree)| {
            (0..s.tokens.len())
                .map(move |i| (s.start_pos + tree.as_ref().map_or(i, |(d, _)| d[i])) as u32)
        })
        .collect();
    let total = positions.len();
    let positions = Tensor::from_vec(positions, total, device)?;
    let half = hp.head_dim / 2;
    let cos = rope
        .cos
        .index_select(&positions, 0)?
        .reshape((total, 1, half))?;
    let sin = rope
        .sin
        .index_select(&positions, 0)?
        .reshape((total, 1, half))?;
    Ok((cos, sin))
}

/// What every layer's attention reads: the batch, its trees and its tokens' rotary rows.
struct LayerPass<'a, 'b> {
    hp: &'a Hparams,
    ropes: &'a TensorRopes,
    /// The global table's rows, and the local one's where the model has it.
    angles: (&'a (Tensor, Tensor), Option<&'a (Tensor, Tensor)>),
    batch: &'a [SeqInput<'b>],
    trees: &'a [Option<TreeLayout>],
}

impl LayerPass<'_, '_> {
    /// Layer `l`'s attention from its fused q|k|v rows: rope, the new keys and values into the
    /// cache, then each sequence's queries over its cache (causal, or over a tree's paths).
    fn attention(
        &self,
        qkv: &Tensor,
        (qk_norm, sinks): (Option<&(Tensor, Tensor)>, Option<&Tensor>),
        cache: &mut KvCache,
        l: usize,
    ) -> Result<Tensor> {
        let hp = self.hp;
        let hd = hp.head_dim;
        let (q_dim, kv_dim) = (hp.num_heads * hd, hp.num_kv_heads * hd);
        let total = qkv.dim(0)?;
        let heads = Heads {
            num_heads: hp.num_heads,
            num_kv_heads: hp.num_kv_heads,
            head_dim: hd,
            scale: hp.attn_scale.map_or(1.0 / (hd as f64).sqrt(), f64::from),
            window: hp.window(l),
            sinks,
        };
        let (rope, (cos, sin)): (&TensorRope, _) = match self.angles {
            (_, Some(local)) if self.ropes.is_local(hp, l) => {
                (self.ropes.local.as_ref().expect("a local table"), local)
            }
            (global, _) => (&self.ropes.global, global),
        };
        // RMS norms of queries and keys before rotation, over each head's values or (a
        // weight as wide as all the heads, OLMoE) over all of them.
        let eps = hp.rms_norm_eps as f32;
        let norm_heads = |t: Tensor, w: Option<&Tensor>, n: usize| -> Result<Tensor> {
            Ok(match w {
                Some(w) => {
                    let width = w.elem_count();
                    let rows = total * n * hd / width;
                    crate::model::kernels::rms_norm::rms_norm(&t.reshape((rows, width))?, w, eps)?
                        .reshape((total, n * hd))?
                }
                None => t,
            })
        };
        let q_part = norm_heads(
            qkv.narrow(1, 0, q_dim)?.contiguous()?,
            qk_norm.map(|n| &n.0),
            hp.num_heads,
        )?;
        let k_part = norm_heads(
            qkv.narrow(1, q_dim, kv_dim)?.contiguous()?,
            qk_norm.map(|n| &n.1),
            hp.num_kv_heads,
        )?;
        let q = q_part.reshape((total, hp.num_heads, 1, hd))?;
        let k = k_part.reshape((total, hp.num_kv_heads, 1, hd))?;
        let v = qkv
            .narrow(1, q_dim + kv_dim, kv_dim)?
            .contiguous()?
            .reshape((total, hp.num_kv_heads, hd))?;
        let q = rope
            .apply(&q, cos, sin)?
            .reshape((total, hp.num_heads, hd))?;
        let k = rope
            .apply(&k, cos, sin)?
            .reshape((total, hp.num_kv_heads, hd))?;
        let mut outs = Vec::with_capacity(self.batch.len());
        let mut offset = 0;
        for (s, tree) in self.batch.iter().zip(self.trees) {
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
        Ok(if outs.len() == 1 {
            outs.pop().expect("one sequence")
        } else {
            Tensor::cat(&outs, 0)?
        })
    }
}
