//! A checkpoint's weights as a forward needs them: the embedding, per layer the norms and
//! the fused projections (q/k/v, gate/up), the final norm and the output head.
//!
//! Both backends load through here; only where the weights end up (host or device) and which
//! kernel multiplies them differ, and `Linear` decides that from the forward kind.

use candle_core::{DType, Device, Tensor};

use crate::model::decoder::device::ForwardKind;
use crate::model::decoder::embedding::Embedding;
use crate::model::decoder::ffn::{Ffn, GatedMlp, RoutedFfn, SharedExpert};
use crate::model::decoder::layer::{Layer, LayerExtras};
use crate::model::decoder::linear::{Linear, RawWeight, WeightsDtype};
use crate::model::decoder::op_profile::{timed, Op};
use crate::model::kernels::rms_norm::rms_norm;
use crate::model::load::weight_roles::{ExpertPart, WeightName, WeightReader};
use crate::model::spec::block::Experts;
use crate::model::spec::hparams::Hparams;
use crate::model::{ModelError, Result};

/// What loading a layer needs besides the file.
struct LayerParts<'a> {
    hp: &'a Hparams,
    weights_dtype: WeightsDtype,
    device: &'a Device,
    kind: ForwardKind,
}

impl LayerParts<'_> {
    fn linear(&self, raw: Vec<RawWeight>) -> Result<Linear> {
        Linear::fuse(raw, self.weights_dtype, self.device, self.kind)
    }

    /// An RMS norm's weight as the forward multiplies by it: `1 + w` where the family's
    /// Hugging Face checkpoints store `w`.
    fn norm(&self, reader: &mut WeightReader, name: WeightName) -> Result<Tensor> {
        let w = reader.dense_f32(name)?;
        let w = if self.hp.block.hf_norm_plus_one && reader.is_safetensors() {
            (w + 1.0)?
        } else {
            w
        };
        Ok(w.to_device(self.device)?)
    }

    /// Layer `l`'s dense MLP.
    fn dense_ffn(&self, reader: &mut WeightReader, l: usize) -> Result<Ffn> {
        let gate_up = match self.hp.block.fused_projections {
            true => vec![reader.raw(WeightName::GateUp(l))?],
            false => vec![
                reader.raw(WeightName::Gate(l))?,
                reader.raw(WeightName::Up(l))?,
            ],
        };
        let down = reader.raw(WeightName::Down(l))?;
        let mlp = self.gated_mlp(l, gate_up, down, self.hp.intermediate_size)?;
        Ok(Ffn::Dense(mlp))
    }

    /// A gated MLP of `width` from its gate|up parts and its down projection, sizes checked.
    fn gated_mlp(
        &self,
        l: usize,
        gate_up: Vec<RawWeight>,
        down: RawWeight,
        width: usize,
    ) -> Result<GatedMlp> {
        let mlp = GatedMlp {
            gate_up: self.linear(gate_up)?,
            down: self.linear(vec![down])?,
            act: self.hp.block.activation,
            biases: None,
        };
        let hidden = self.hp.hidden_size;
        let fits = mlp.gate_up.out_features() == 2 * width
            && mlp.gate_up.in_features() == hidden
            && mlp.down.in_features() == width
            && mlp.down.out_features() == hidden;
        self.sizes_fit(l, fits)?;
        Ok(mlp)
    }

    /// A small weight the forward multiplies in f32 whatever the weight type (a router, a
    /// shared expert's gate; llama.cpp's files keep them in f32): rounded, a router would
    /// flip near-tied choices, and they are a small part of what a token reads.
    fn f32_linear(&self, raw: RawWeight) -> Result<Linear> {
        Linear::convert(raw, WeightsDtype::F32, self.device, self.kind)
    }

    /// Layer `l`'s mixture of experts: its router and each expert's gate|up and down.
    fn routed_ffn(&self, reader: &mut WeightReader, l: usize, e: &Experts) -> Result<Ffn> {
        let router = self.f32_linear(reader.router(l)?)?;
        let gates = reader.experts(l, ExpertPart::Gate, e.count)?;
        let ups = reader.experts(l, ExpertPart::Up, e.count)?;
        let downs = reader.experts(l, ExpertPart::Down, e.count)?;
        let mut experts = gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((g, u), d)| self.gated_mlp(l, vec![g, u], d, e.ffn_len))
            .collect::<Result<Vec<_>>>()?;
        let hidden = self.hp.hidden_size;
        let fits = router.out_features() == e.count && router.in_features() == hidden;
        self.sizes_fit(l, fits)?;
        let mut router_bias = None;
        if self.hp.block.ffn_and_out_bias {
            let bias = reader.dense_f32(WeightName::RouterBias(l))?;
            self.sizes_fit(l, bias.elem_count() == e.count)?;
            router_bias = Some(bias.flatten_all()?.to_device(self.device)?);
            for (mlp, (gate_up, down)) in experts.iter_mut().zip(reader.expert_biases(l, e.count)?)
            {
                let fits = gate_up.elem_count() == 2 * e.ffn_len && down.elem_count() == hidden;
                self.sizes_fit(l, fits)?;
                mlp.biases = Some((gate_up, down));
            }
        }
        let shared = match e.shared_ffn_len {
            0 => None,
            width => Some(self.shared_expert(reader, l, width)?),
        };
        Ok(Ffn::Routed(RoutedFfn {
            router,
            router_bias,
            experts,
            used: e.used,
            renormalize: e.norm_top_k,
            shared,
        }))
    }

    /// Layer `l`'s shared expert of `width` and its gate (in f32, as the router: a
    /// `(1, hidden)` row, which llama.cpp's files store as a vector).
    fn shared_expert(
        &self,
        reader: &mut WeightReader,
        l: usize,
        width: usize,
    ) -> Result<SharedExpert> {
        let hidden = self.hp.hidden_size;
        let gate_up = vec![
            reader.raw(WeightName::SharedGate(l))?,
            reader.raw(WeightName::SharedUp(l))?,
        ];
        let down = reader.raw(WeightName::SharedDown(l))?;
        let mlp = self.gated_mlp(l, gate_up, down, width)?;
        let gate = reader.dense_f32(WeightName::SharedExpertGate(l))?;
        self.sizes_fit(l, gate.elem_count() == hidden)?;
        let gate = self.f32_linear(RawWeight::Dense(gate.reshape((1, hidden))?))?;
        Ok(SharedExpert { mlp, gate })
    }

    fn sizes_fit(&self, l: usize, fits: bool) -> Result<()> {
        match fits {
            true => Ok(()),
            false => Err(ModelError::BadConfig(format!(
                "layer {l} projection sizes do not match the config"
            ))),
        }
    }

    fn load(&self, reader: &mut WeightReader, l: usize) -> Result<Layer> {
        let (hp, block) = (self.hp, self.hp.block);
        let qkv = if block.fused_projections {
            vec![reader.raw(WeightName::Qkv(l))?]
        } else {
            let names = [WeightName::Q(l), WeightName::K(l), WeightName::V(l)];
            names
                .map(|n| reader.raw(n))
                .into_iter()
                .collect::<Result<_>>()?
        };
        let mut extras = LayerExtras::default();
        if block.qkv_bias {
            let names = [
                WeightName::QBias(l),
                WeightName::KBias(l),
                WeightName::VBias(l),
            ];
            let parts = names
                .map(|n| reader.dense_f32(n))
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
            extras.qkv_bias = Some(Tensor::cat(&parts, 0)?.to_device(self.device)?);
        }
        if block.qk_norm {
            extras.qk_norm = Some((
                self.norm(reader, WeightName::QNorm(l))?,
                self.norm(reader, WeightName::KNorm(l))?,
            ));
        }
        if block.sandwich_norms {
            extras.post_norms = Some((
                self.norm(reader, WeightName::AttnPostNorm(l))?,
                self.norm(reader, WeightName::FfnPostNorm(l))?,
            ));
        }
        if block.ffn_and_out_bias {
            let bias = reader.dense_f32(WeightName::OBias(l))?;
            self.sizes_fit(l, bias.elem_count() == hp.hidden_size)?;
            extras.o_bias = Some(bias.flatten_all()?.to_device(self.device)?);
        }
        if block.attn_sinks {
            let sinks: Vec<f32> = reader
                .dense_f32(WeightName::Sinks(l))?
                .flatten_all()?
                .to_vec1()?;
            self.sizes_fit(l, sinks.len() == hp.num_heads)?;
            extras.sinks = Some(sinks);
        }
        let layer = Layer {
            attn_norm: Some(self.norm(reader, WeightName::AttnNorm(l))?),
            qkv: self.linear(qkv)?,
            o: self.linear(vec![reader.raw(WeightName::O(l))?])?,
            ffn_norm: self.norm(reader, WeightName::FfnNorm(l))?,
            ffn: match &hp.experts {
                Some(e) => self.routed_ffn(reader, l, e)?,
                None => self.dense_ffn(reader, l)?,
            },
            extras,
        };
        let qkv_out = hp.num_heads * hp.head_dim + 2 * hp.num_kv_heads * hp.head_dim;
        let sizes_fit = layer.qkv.out_features() == qkv_out
            && layer.o.in_features() == hp.num_heads * hp.head_dim
            && layer
                .extras
                .qkv_bias
                .as_ref()
                .is_none_or(|b| b.elem_count() == qkv_out)
            && layer.extras.qk_norm.as_ref().is_none_or(|(q, k)| {
                let (q_len, k_len) = match block.qk_norm_whole {
                    true => (hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim),
                    false => (hp.head_dim, hp.head_dim),
                };
                q.elem_count() == q_len && k.elem_count() == k_len
            });
        self.sizes_fit(l, sizes_fit)?;
        Ok(layer)
    }
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
