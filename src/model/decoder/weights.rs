//! A checkpoint's weights as a forward needs them: the embedding, per layer the norms and
//! the fused projections (q/k/v, gate/up), the final norm and the output head.
//!
//! Both backends load through here; only where the weights end up (host or device) and which
//! kernel multiplies them differ, and `Linear` decides that from the forward kind.

use candle_core::{DType, Device, Tensor};

use crate::model::decoder::device::ForwardKind;
use crate::model::decoder::embedding::Embedding;
use crate::model::decoder::ffn::{Ffn, FfnBuffers};
use crate::model::decoder::linear::{Linear, WeightsDtype};
use crate::model::decoder::op_profile::{timed, Op};
use crate::model::kernels::elementwise::add_bias_rows;
use crate::model::kernels::rms_norm::{
    add_norm_rows, norm_in_place, norm_rows, rms_norm, with_host,
};
use crate::model::load::weight_roles::{WeightName, WeightReader};
use crate::model::spec::hparams::Hparams;
use crate::model::{ModelError, Result};

mod layer_parts;
use layer_parts::LayerParts;

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

pub(crate) struct DecoderWeights {
    pub embed: Embedding,
    pub layers: Vec<Layer>,
    pub norm: Tensor,
    pub lm_head: Linear,
    /// The output head is the embedding (no separate output weight in the file).
    pub output_tied: bool,
}

impl DecoderWeights {
    /// Reads every weight (on the CPU), converts linear weights to `weights_dtype` and places
    /// them on `device` for the forward `kind`.
    pub fn load(
        reader: &mut WeightReader,
        hp: &Hparams,
        weights_dtype: WeightsDtype,
        device: &Device,
        kind: ForwardKind,
    ) -> Result<Self> {
        let embed = Embedding::from_raw(
            reader.raw(WeightName::Embed)?,
            device,
            kind == ForwardKind::Own && device.is_cpu(),
        )?;
        let (vocab, hidden) = embed.dims()?;
        if vocab != hp.vocab_size || hidden != hp.hidden_size {
            return Err(ModelError::BadConfig(format!(
                "embedding is {vocab}x{hidden}, config says {}x{}",
                hp.vocab_size, hp.hidden_size
            )));
        }
        reader.set_block_names(&hp.block);
        let parts = LayerParts {
            hp,
            weights_dtype,
            device,
            kind,
        };
        let layers = (0..hp.num_layers)
            .map(|l| parts.load(reader, l))
            .collect::<Result<Vec<_>>>()?;
        let head_src = if reader.has(WeightName::Output) {
            WeightName::Output
        } else {
            WeightName::Embed
        };
        let lm_head = Linear::convert(reader.raw(head_src)?, weights_dtype, device, kind)?;
        let norm = parts.norm(reader, WeightName::OutputNorm)?;
        let weights = Self {
            embed,
            layers,
            norm,
            lm_head,
            output_tied: matches!(head_src, WeightName::Embed),
        };
        let slow = weights.types_without_own_kernel();
        if kind == ForwardKind::Own && !slow.is_empty() {
            tracing::warn!(
                types = %slow.join(", "),
                "some weights have no own kernel on this CPU: candle's generic quantized matmul \
                 runs them (correct and batch-invariant, slower)"
            );
        }
        Ok(weights)
    }

    /// The first layer's input rows for `ids` (checked against the vocabulary), in f32 on
    /// `device`: the embedding rows, scaled where the family scales them.
    pub fn input_rows(&self, hp: &Hparams, ids: &[u32], device: &Device) -> Result<Tensor> {
        let rows = self.embed.rows(ids, device)?;
        Ok(match hp.block.embed_scale {
            true => rows.affine((hp.hidden_size as f32).sqrt() as f64, 0.0)?,
            false => rows,
        })
    }

    /// The output head over the given rows of the last hidden states `x`: final norm, then
    /// logits in f32 (`None` when no row is wanted).
    pub fn output_logits(&self, x: &Tensor, rows: Vec<u32>, eps: f32) -> Result<Option<Tensor>> {
        if rows.is_empty() {
            return Ok(None);
        }
        let n = rows.len();
        let idx = Tensor::from_vec(rows, n, x.device())?;
        let x = timed(Op::Norm, || {
            rms_norm(&x.index_select(&idx, 0)?, &self.norm, eps)
        })?;
        let logits = timed(Op::LmHead, || self.lm_head.forward(&x))?;
        Ok(Some(logits.to_dtype(DType::F32)?))
    }

    /// Bytes of every linear weight (the output head included) in its ggml type: what the
    /// model holds.
    pub fn weight_bytes(&self) -> usize {
        self.linears().map(Linear::weight_bytes).sum()
    }

    /// Bytes of the linear weights one token reads: all of a dense model's, a mixture's
    /// router and `used` experts per layer (what one forward streams at least).
    pub fn bytes_per_token(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.qkv.weight_bytes() + l.o.weight_bytes() + l.ffn.bytes_per_token())
            .sum::<usize>()
            + self.lm_head.weight_bytes()
    }

    /// Multiply-adds per token of each kind of matmul, summed over the layers.
    pub fn macs_per_token(&self) -> Vec<(Op, usize)> {
        let sum = |f: &dyn Fn(&Layer) -> &Linear| -> usize {
            self.layers
                .iter()
                .map(|l| f(l).in_features() * f(l).out_features())
                .sum()
        };
        let ffn = |op: Op| -> usize { self.layers.iter().map(|l| l.ffn.macs_per_token(op)).sum() };
        vec![
            (Op::QkvMatmul, sum(&|l| &l.qkv)),
            (Op::OutMatmul, sum(&|l| &l.o)),
            (Op::GateUpMatmul, ffn(Op::GateUpMatmul)),
            (Op::DownMatmul, ffn(Op::DownMatmul)),
            (Op::Router, ffn(Op::Router)),
            (
                Op::LmHead,
                self.lm_head.in_features() * self.lm_head.out_features(),
            ),
        ]
    }

    /// The ggml types the linear weights ended up as (after any fallback), for reporting.
    pub fn linear_dtypes(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .linears()
            .flat_map(|l| l.dtypes())
            .map(|d| format!("{d:?}"))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Every linear layer, the output head last.
    fn linears(&self) -> impl Iterator<Item = &Linear> {
        self.layers
            .iter()
            .flat_map(|l| [&l.qkv, &l.o].into_iter().chain(l.ffn.linears()))
            .chain(std::iter::once(&self.lm_head))
    }

    /// The types among the linear weights that no own kernel runs on this CPU (candle's
    /// generic quantized matmul multiplies them: correct, not as fast), sorted.
    pub fn types_without_own_kernel(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .linears()
            .flat_map(|l| l.parts())
            .filter(|(_, kernel)| *kernel == "candle")
            .map(|(t, _)| format!("{t:?}"))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}
