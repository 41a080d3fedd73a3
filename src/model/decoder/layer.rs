//! One decoder layer's weights and the work of a layer that is not attention: its norms, the
//! output projection and residual, and the feed-forward. Loading them is `weights`' job; this
//! is what a forward (either backend's, and a draft head's) calls per layer.

use candle_core::Tensor;

use crate::model::decoder::ffn::{Ffn, FfnBuffers};
use crate::model::decoder::linear::Linear;
use crate::model::decoder::op_profile::{timed, Op};
use crate::model::kernels::elementwise::add_bias_rows;
use crate::model::kernels::rms_norm::{
    add_norm_rows, norm_in_place, norm_rows, rms_norm, with_host,
};
use crate::model::Result;

pub(crate) struct Layer {
    /// `None`: the layer takes its input as it is (an EAGLE head's first layer, whose input
    /// is already a projection of normed states).
    pub attn_norm: Option<Tensor>,
    pub qkv: Linear,
    pub o: Linear,
    pub ffn_norm: Tensor,
    pub ffn: Ffn,
    /// What the family's block adds to Llama's (none for Llama).
    pub extras: LayerExtras,
}

/// A layer's weights beyond Llama's block, each present where the family's block has it.
#[derive(Default)]
pub(crate) struct LayerExtras {
    /// q|k|v biases side by side (Qwen 2).
    pub qkv_bias: Option<Tensor>,
    /// Per-head RMS norm weights of queries and of keys (`head_dim` each).
    pub qk_norm: Option<(Tensor, Tensor)>,
    /// The norms of attention's and the MLP's outputs before their residual adds.
    pub post_norms: Option<(Tensor, Tensor)>,
    /// The output projection's bias (gpt-oss).
    pub o_bias: Option<Tensor>,
    /// Each attention head's sink logit (gpt-oss), on the host: attention reads them there.
    pub sinks: Option<Vec<f32>>,
}

impl Layer {
    /// What attention's projections read: the input, normed when the layer has a norm.
    pub fn attn_input(&self, x: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(match &self.attn_norm {
            Some(norm) => rms_norm(x, norm, eps)?,
            None => x.clone(),
        })
    }

    /// [`Self::attn_input`] on host rows (the own kernels' forward): written into `out`.
    pub fn attn_input_rows(&self, x: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
        match &self.attn_norm {
            Some(norm) => with_host(norm, |w| norm_rows(x, w, eps, out))?,
            None => out.copy_from_slice(x),
        }
        Ok(())
    }

    /// [`Self::after_attention`] on host rows: `x` (the residual stream) is updated in place;
    /// `scratch` (as long as `x`) holds the MLP's normed input, `bufs` the outputs in between
    /// (kept across a forward's layers).
    pub fn after_attention_rows(
        &self,
        x: &mut [f32],
        attn: &[f32],
        eps: f32,
        scratch: &mut [f32],
        bufs: &mut MlpBuffers,
    ) -> Result<()> {
        let rows = attn.len() / self.o.in_features();
        let MlpBuffers { o, down, ffn } = bufs;
        timed(Op::OutMatmul, || self.o.forward_rows_into(attn, rows, o))?;
        if let Some(bias) = &self.extras.o_bias {
            timed(Op::OutMatmul, || add_bias_rows(o, bias))?;
        }
        if let Some((after_attn, _)) = &self.extras.post_norms {
            timed(Op::Norm, || norm_in_place(after_attn, o, eps, scratch))?;
        }
        timed(Op::Norm, || {
            with_host(&self.ffn_norm, |w| add_norm_rows(x, o, w, eps, scratch))
        })?;
        self.ffn.forward_rows_into(scratch, rows, down, ffn)?;
        if let Some((_, after_mlp)) = &self.extras.post_norms {
            // The output projection's rows are spent: scratch for the in-place norm.
            timed(Op::Norm, || norm_in_place(after_mlp, down, eps, o))?;
        }
        timed(Op::Elementwise, || {
            for (v, d) in x.iter_mut().zip(down.iter()) {
                *v += d;
            }
        });
        Ok(())
    }

    /// The rest of a layer once attention has run: the output projection and residual, then
    /// the SiLU-gated MLP and its residual. Row-wise, on whatever device `x` is.
    pub fn after_attention(&self, x: &Tensor, attn: &Tensor, eps: f32) -> Result<Tensor> {
        let post = self.extras.post_norms.as_ref();
        let mut o = timed(Op::OutMatmul, || self.o.forward(attn))?;
        if let Some(bias) = &self.extras.o_bias {
            o = o.broadcast_add(&bias.to_dtype(o.dtype())?)?;
        }
        if let Some((after_attn, _)) = post {
            o = timed(Op::Norm, || rms_norm(&o, after_attn, eps))?;
        }
        let x = timed(Op::Elementwise, || x + o)?;
        let h = timed(Op::Norm, || rms_norm(&x, &self.ffn_norm, eps))?;
        let mut down = self.ffn.forward(&h)?;
        if let Some((_, after_mlp)) = post {
            down = timed(Op::Norm, || rms_norm(&down, after_mlp, eps))?;
        }
        Ok(timed(Op::Elementwise, || x + down)?)
    }
}

/// The host rows between a layer's attention and its output: the output projection, the
/// feed-forward's output and what it passes through. One set serves every layer of a
/// forward, so their memory is allocated once per forward, not once per layer.
#[derive(Default)]
pub(crate) struct MlpBuffers {
    o: Vec<f32>,
    down: Vec<f32>,
    ffn: FfnBuffers,
}
