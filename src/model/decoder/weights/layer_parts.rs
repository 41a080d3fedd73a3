//! One layer's weights read and converted for the forward: its norms, its fused projections
//! and its feed-forward (dense, gated, routed experts, a shared expert), each checked against
//! the family's sizes.

use candle_core::{Device, Tensor};

use crate::model::decoder::device::ForwardKind;
use crate::model::decoder::ffn::{Ffn, GatedMlp, RoutedFfn, SharedExpert};
use crate::model::decoder::linear::{Linear, RawWeight, WeightsDtype};
use crate::model::load::weight_roles::{ExpertPart, WeightName, WeightReader};
use crate::model::spec::block::Experts;
use crate::model::spec::hparams::Hparams;
use crate::model::{ModelError, Result};

use super::{Layer, LayerExtras};

/// What loading a layer needs besides the file.
pub(super) struct LayerParts<'a> {
    pub(super) hp: &'a Hparams,
    pub(super) weights_dtype: WeightsDtype,
    pub(super) device: &'a Device,
    pub(super) kind: ForwardKind,
}

impl LayerParts<'_> {
    fn linear(&self, raw: Vec<RawWeight>) -> Result<Linear> {
        Linear::fuse(raw, self.weights_dtype, self.device, self.kind)
    }

    /// An RMS norm's weight as the forward multiplies by it: `1 + w` where the family's
    /// Hugging Face checkpoints store `w`.
    pub(super) fn norm(&self, reader: &mut WeightReader, name: WeightName) -> Result<Tensor> {
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

    pub(super) fn load(&self, reader: &mut WeightReader, l: usize) -> Result<Layer> {
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
