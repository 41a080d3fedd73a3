//! The head's forward in differentiable tensor operations over a whole sequence: the first
//! drafting step with causal attention, and the second step fed the first's output.
//!
//! Why it exists: it must compute what the inference forward ([`crate::model::head::DraftHead`])
//! computes, position for position, so it is kept apart where the two can be read side by side.

use candle_core::{Device, Tensor, D};

use super::trainer::HeadTrainer;
use crate::model::Result;

/// One step's output over a sequence and the keys and values it attended with.
pub(super) struct Pass {
    pub(super) out: Tensor,
    k: Tensor,
    v: Tensor,
}

/// `(n, n)`: 0 where row `i` may see column `j <= i`, minus infinity above the diagonal.
fn causal_mask(n: usize) -> Result<Tensor> {
    let mask: Vec<f32> = (0..n * n)
        .map(|i| {
            if i % n > i / n {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Ok(Tensor::from_vec(mask, (n, n), &Device::Cpu)?)
}

impl HeadTrainer {
    /// The head over a whole sequence: `embeds` and `features` are `(n, hidden)`, row `t` the
    /// token after position `start + t` and the feature there; causal attention over the rows.
    pub(super) fn first_step(
        &self,
        embeds: &Tensor,
        features: &Tensor,
        start: usize,
    ) -> Result<Pass> {
        let n = embeds.dim(0)?;
        let (x, a) = self.layer_input(embeds, features)?;
        let (q, k, v) = self.qkv(&a, start)?;
        let scores = (q.matmul(&k.t()?)? * self.attention_scale())?;
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(&causal_mask(n)?)?, D::Minus1)?;
        let out = self.finish(&x, &probs.matmul(&v)?)?;
        Ok(Pass { out, k, v })
    }

    /// The second drafting step over the sequence: row `r` (position `start + r + 1`) reads the
    /// token `embeds[r]` and the first step's output at row `r`, and attends to the first
    /// step's keys of rows `0..=r` and to its own.
    pub(super) fn second_step(
        &self,
        embeds: &Tensor,
        first: &Pass,
        start: usize,
    ) -> Result<Tensor> {
        let m = embeds.dim(0)?;
        let (x, a) = self.layer_input(embeds, &first.out.narrow(0, 0, m)?)?;
        let (q, k, v) = self.qkv(&a, start + 1)?;
        let scale = self.attention_scale();
        let (k1, v1) = (first.k.narrow(1, 0, m)?, first.v.narrow(1, 0, m)?);
        let cross = (q.matmul(&k1.t()?)? * scale)?.broadcast_add(&causal_mask(m)?)?;
        let own = ((&q * &k)?.sum_keepdim(2)? * scale)?;
        let probs = candle_nn::ops::softmax(&Tensor::cat(&[cross, own], 2)?, D::Minus1)?;
        let attn =
            (probs.narrow(2, 0, m)?.matmul(&v1)? + probs.narrow(2, m, 1)?.broadcast_mul(&v)?)?;
        self.finish(&x, &attn)
    }

    fn attention_scale(&self) -> f64 {
        1.0 / (self.hp.head_dim as f64).sqrt()
    }

    /// The layer's residual input and what its attention reads, from the token embeddings and
    /// the input states: EAGLE's fc over both (one tensor, both roles); EAGLE-3's state as the
    /// residual and `[input_norm(embedding), hidden_norm(state)]` for attention.
    fn layer_input(&self, embeds: &Tensor, states: &Tensor) -> Result<(Tensor, Tensor)> {
        match &self.vars.eagle3 {
            None => {
                let x = self.fuse(embeds, states)?;
                Ok((x.clone(), x))
            }
            Some(e) => {
                let eps = self.hp.rms_norm_eps as f32;
                let a = Tensor::cat(
                    &[
                        candle_nn::ops::rms_norm_slow(embeds, e.input_norm.as_tensor(), eps)?,
                        candle_nn::ops::rms_norm_slow(states, e.hidden_norm.as_tensor(), eps)?,
                    ],
                    1,
                )?;
                Ok((states.clone(), a))
            }
        }
    }

    /// EAGLE's fc over the concatenated embedding and feature.
    fn fuse(&self, embeds: &Tensor, features: &Tensor) -> Result<Tensor> {
        let v = &self.vars;
        let mut x = Tensor::cat(&[embeds, features], 1)?.matmul(&v.fc.t()?)?;
        if let Some(b) = &v.fc_bias {
            x = x.broadcast_add(b.as_tensor())?;
        }
        Ok(x)
    }

    /// Rotated queries, rotated keys and values at positions `start..`, `(heads, n, head_dim)`,
    /// each key/value head repeated for the query heads it serves (grouped-query attention).
    fn qkv(&self, x: &Tensor, start: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let hp = &self.hp;
        let v = &self.vars;
        let n = x.dim(0)?;
        let (nh, nkv, hd) = (hp.num_heads, hp.num_kv_heads, hp.head_dim);
        let heads = |t: Tensor, count: usize| -> Result<Tensor> {
            Ok(t.reshape((n, count, hd))?.transpose(0, 1)?.contiguous()?)
        };
        let q = self.rotate(&heads(x.matmul(&v.q.t()?)?, nh)?, start)?;
        let k = self.rotate(&heads(x.matmul(&v.k.t()?)?, nkv)?, start)?;
        let val = heads(x.matmul(&v.v.t()?)?, nkv)?;
        let group = nh / nkv;
        if group == 1 {
            return Ok((q, k, val));
        }
        let spread = |t: Tensor| -> Result<Tensor> {
            Ok(t.unsqueeze(1)?
                .broadcast_as((nkv, group, n, hd))?
                .contiguous()?
                .reshape((nh, n, hd))?)
        };
        Ok((q, spread(k)?, spread(val)?))
    }

    /// The attention's output projection and residual, then the normed MLP and its residual.
    fn finish(&self, x: &Tensor, attn: &Tensor) -> Result<Tensor> {
        let hp = &self.hp;
        let v = &self.vars;
        let (_, n, _) = attn.dims3()?;
        let attn = attn
            .transpose(0, 1)?
            .contiguous()?
            .reshape((n, hp.num_heads * hp.head_dim))?;
        let x = (x + attn.matmul(&v.o.t()?)?)?;
        let normed =
            candle_nn::ops::rms_norm_slow(&x, v.ffn_norm.as_tensor(), hp.rms_norm_eps as f32)?;
        let act =
            (candle_nn::ops::silu(&normed.matmul(&v.gate.t()?)?)? * normed.matmul(&v.up.t()?)?)?;
        Ok((x + act.matmul(&v.down.t()?)?)?)
    }

    /// Half-split rotary embedding of `(heads, n, head_dim)` at positions `start..start + n`.
    fn rotate(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let (_, n, hd) = x.dims3()?;
        let half = hd / 2;
        let cos = self.cos.narrow(0, start, n)?;
        let sin = self.sin.narrow(0, start, n)?;
        let (a, b) = (x.narrow(2, 0, half)?, x.narrow(2, half, half)?);
        let lo = (a.broadcast_mul(&cos)? - b.broadcast_mul(&sin)?)?;
        let hi = (a.broadcast_mul(&sin)? + b.broadcast_mul(&cos)?)?;
        Ok(Tensor::cat(&[lo, hi], 2)?)
    }
}
