//! A layer's feed-forward as a component: one gated MLP (dense), or a mixture of experts
//! (routed) whose router picks a few gated MLPs per token. A family's block says which its
//! layers have; the forward calls the one method either way.
//!
//! Routed rows are grouped by expert, so the rows of one forward that chose the same expert
//! read its weights once. Each expert runs on the same batch-invariant kernels as a dense
//! layer, and a row's outputs are added in ascending expert order whatever other rows share
//! the forward, so a row's bits never depend on its company.

use candle_core::{DType, Tensor};

use crate::model::decoder::expert_trace;
use crate::model::decoder::linear::Linear;
use crate::model::decoder::op_profile::{timed, Op};
use crate::model::decoder::routing::{route, Choice};
use crate::model::kernels::elementwise::{
    add_bias_rows, gelu_gate_rows, silu_gate, silu_gate_rows, swiglu_oai_gate_rows,
    SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT,
};
use crate::model::spec::block::Activation;
use crate::model::Result;

/// `down(act(gate) · up)`, gate|up fused in one matmul.
pub(crate) struct GatedMlp {
    pub gate_up: Linear,
    pub down: Linear,
    pub act: Activation,
    /// Biases added to gate|up's and down's outputs (gpt-oss's experts), in f32.
    pub biases: Option<(Tensor, Tensor)>,
}

impl GatedMlp {
    fn width(&self) -> usize {
        self.down.in_features()
    }

    /// The MLP on `rows` host rows of `x` into `out`, through `gu` and `act`.
    fn forward_rows_into(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut Vec<f32>,
        gu: &mut Vec<f32>,
        act: &mut Vec<f32>,
    ) -> Result<()> {
        timed(Op::GateUpMatmul, || {
            self.gate_up.forward_rows_into(x, rows, gu)
        })?;
        let inter = self.width();
        timed(Op::Elementwise, || -> Result<()> {
            if let Some((gate_up, _)) = &self.biases {
                add_bias_rows(gu, gate_up)?;
            }
            act.resize(rows * inter, 0.0);
            match self.act {
                Activation::Silu => silu_gate_rows(gu, inter, act),
                Activation::GeluTanh => gelu_gate_rows(gu, inter, act),
                Activation::SwigluOai => swiglu_oai_gate_rows(gu, inter, act),
            }
            Ok(())
        })?;
        timed(Op::DownMatmul, || {
            self.down.forward_rows_into(act, rows, out)
        })?;
        match &self.biases {
            Some((_, down)) => Ok(timed(Op::Elementwise, || add_bias_rows(out, down))?),
            None => Ok(()),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut gu = timed(Op::GateUpMatmul, || self.gate_up.forward(x))?;
        if let Some((gate_up, _)) = &self.biases {
            gu = gu.broadcast_add(&gate_up.to_dtype(gu.dtype())?)?;
        }
        let act = timed(Op::Elementwise, || {
            let inter = gu.dim(1)? / 2;
            let (gate, up) = (gu.narrow(1, 0, inter)?, gu.narrow(1, inter, inter)?);
            match self.act {
                Activation::Silu => silu_gate(&gu),
                Activation::GeluTanh => gate.gelu()? * up,
                Activation::SwigluOai => {
                    let g = gate.minimum(SWIGLU_OAI_LIMIT as f64)?;
                    let s = candle_nn::ops::sigmoid(&g.affine(SWIGLU_OAI_ALPHA as f64, 0.0)?)?;
                    let u = up.clamp(-SWIGLU_OAI_LIMIT as f64, SWIGLU_OAI_LIMIT as f64)?;
                    (g * s)? * (u + 1.0)?
                }
            }
        })?;
        let down = timed(Op::DownMatmul, || self.down.forward(&act))?;
        Ok(match &self.biases {
            Some((_, bias)) => down.broadcast_add(&bias.to_dtype(down.dtype())?)?,
            None => down,
        })
    }
}

/// A mixture of experts: a router (one logit per expert) and the experts, of which each token
/// reads `used`, and where the model has one a shared expert every token reads.
pub(crate) struct RoutedFfn {
    pub router: Linear,
    /// Added to the router's logits (gpt-oss), in f32.
    pub router_bias: Option<Tensor>,
    pub experts: Vec<GatedMlp>,
    pub used: usize,
    pub renormalize: bool,
    pub shared: Option<SharedExpert>,
}

/// An expert every token reads, its output scaled by `sigmoid(gate · x)` (Qwen2-MoE).
pub(crate) struct SharedExpert {
    pub mlp: GatedMlp,
    /// One output: the gate's logit.
    pub gate: Linear,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The host rows a feed-forward passes through, kept across a forward's layers.
#[derive(Default)]
pub(crate) struct FfnBuffers {
    gu: Vec<f32>,
    act: Vec<f32>,
    logits: Vec<f32>,
    choices: Vec<Choice>,
    /// Per expert, the rows that chose it (ascending) and their weights.
    members: Vec<Vec<(u32, f32)>>,
    gathered: Vec<f32>,
    expert_out: Vec<f32>,
    shared_gate: Vec<f32>,
}

impl RoutedFfn {
    /// Each row's chosen experts, `used` per row, from the router's logits.
    fn choose(&self, logits: &[f32], choices: &mut Vec<Choice>) {
        let count = self.experts.len();
        let rows = logits.len() / count;
        choices.resize(rows * self.used, Choice::default());
        for (row, out) in logits
            .chunks_exact(count)
            .zip(choices.chunks_exact_mut(self.used))
        {
            route(row, self.renormalize, out);
        }
        expert_trace::note(choices, self.used);
    }

    /// Per expert, the rows that chose it (ascending) and their weights.
    fn group_by_expert(&self, choices: &[Choice], members: &mut Vec<Vec<(u32, f32)>>) {
        members.resize_with(self.experts.len(), Vec::new);
        members.iter_mut().for_each(Vec::clear);
        for (r, row) in choices.chunks_exact(self.used).enumerate() {
            for c in row {
                members[c.expert as usize].push((r as u32, c.weight));
            }
        }
        expert_trace::note_reads(|| members.iter().filter(|m| !m.is_empty()).count());
    }

    fn forward_rows_into(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut Vec<f32>,
        b: &mut FfnBuffers,
    ) -> Result<()> {
        let hidden = self.router.in_features();
        timed(Op::Router, || -> Result<()> {
            self.router.forward_rows_into(x, rows, &mut b.logits)?;
            if let Some(bias) = &self.router_bias {
                add_bias_rows(&mut b.logits, bias)?;
            }
            self.choose(&b.logits, &mut b.choices);
            self.group_by_expert(&b.choices, &mut b.members);
            out.clear();
            out.resize(rows * hidden, 0.0);
            Ok(())
        })?;
        for (expert, members) in self.experts.iter().zip(&b.members) {
            if members.is_empty() {
                continue;
            }
            timed(Op::Router, || {
                b.gathered.clear();
                for &(r, _) in members {
                    let r = r as usize;
                    b.gathered
                        .extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
                }
            });
            let n = members.len();
            expert.forward_rows_into(&b.gathered, n, &mut b.expert_out, &mut b.gu, &mut b.act)?;
            timed(Op::Router, || {
                for (&(r, w), y) in members.iter().zip(b.expert_out.chunks_exact(hidden)) {
                    let dst = &mut out[r as usize * hidden..][..hidden];
                    for (d, v) in dst.iter_mut().zip(y) {
                        *d += w * v;
                    }
                }
            });
        }
        if let Some(shared) = &self.shared {
            timed(Op::Router, || {
                shared.gate.forward_rows_into(x, rows, &mut b.shared_gate)
            })?;
            shared
                .mlp
                .forward_rows_into(x, rows, &mut b.expert_out, &mut b.gu, &mut b.act)?;
            timed(Op::Router, || {
                let rows_out = out.chunks_exact_mut(hidden);
                for ((dst, y), &g) in rows_out
                    .zip(b.expert_out.chunks_exact(hidden))
                    .zip(&b.shared_gate)
                {
                    let s = sigmoid(g);
                    for (d, v) in dst.iter_mut().zip(y) {
                        *d += s * v;
                    }
                }
            });
        }
        Ok(())
    }

    /// The same on a device: routing on the host (one logit row per token), each expert over
    /// its rows, added into the output in ascending expert order.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut logits = self.router.forward(x)?.to_dtype(DType::F32)?;
        if let Some(bias) = &self.router_bias {
            logits = logits.broadcast_add(&bias.to_device(logits.device())?)?;
        }
        let logits: Vec<f32> = logits.flatten_all()?.to_vec1()?;
        let (mut choices, mut members) = (Vec::new(), Vec::new());
        self.choose(&logits, &mut choices);
        self.group_by_expert(&choices, &mut members);
        let mut out = x.zeros_like()?;
        for (expert, members) in self.experts.iter().zip(members) {
            if members.is_empty() {
                continue;
            }
            let (rows, weights): (Vec<u32>, Vec<f32>) = members.into_iter().unzip();
            let n = rows.len();
            let idx = Tensor::from_vec(rows, n, x.device())?;
            let w = Tensor::from_vec(weights, (n, 1), x.device())?.to_dtype(x.dtype())?;
            let y = expert
                .forward(&x.index_select(&idx, 0)?)?
                .broadcast_mul(&w)?;
            out = out.index_add(&idx, &y, 0)?;
        }
        if let Some(shared) = &self.shared {
            let g = shared.gate.forward(x)?.to_dtype(x.dtype())?;
            let s = (g.neg()?.exp()? + 1.0)?.recip()?;
            out = (out + shared.mlp.forward(x)?.broadcast_mul(&s)?)?;
        }
        Ok(out)
    }
}

/// A layer's feed-forward.
pub(crate) enum Ffn {
    Dense(GatedMlp),
    Routed(RoutedFfn),
}

impl Ffn {
    /// The feed-forward on `rows` host rows of `x` (already normed) into `out`.
    pub fn forward_rows_into(
        &self,
        x: &[f32],
        rows: usize,
        out: &mut Vec<f32>,
        b: &mut FfnBuffers,
    ) -> Result<()> {
        match self {
            Self::Dense(mlp) => mlp.forward_rows_into(x, rows, out, &mut b.gu, &mut b.act),
            Self::Routed(moe) => moe.forward_rows_into(x, rows, out, b),
        }
    }

    /// The feed-forward on a tensor of rows, on whatever device it is.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense(mlp) => mlp.forward(x),
            Self::Routed(moe) => moe.forward(x),
        }
    }

    /// Every linear weight of the feed-forward (router first, then each expert's).
    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            Self::Dense(m) => vec![&m.gate_up, &m.down],
            Self::Routed(moe) => std::iter::once(&moe.router)
                .chain(moe.experts.iter().flat_map(|m| [&m.gate_up, &m.down]))
                .chain(
                    moe.shared
                        .iter()
                        .flat_map(|s| [&s.gate, &s.mlp.gate_up, &s.mlp.down]),
                )
                .collect(),
        }
    }

    /// Bytes one token reads: the dense MLP's, or the router's and `used` experts'.
    pub fn bytes_per_token(&self) -> usize {
        match self {
            Self::Dense(m) => m.gate_up.weight_bytes() + m.down.weight_bytes(),
            Self::Routed(moe) => {
                let expert = moe
                    .experts
                    .first()
                    .map_or(0, |m| m.gate_up.weight_bytes() + m.down.weight_bytes());
                let shared = moe.shared.as_ref().map_or(0, |s| {
                    s.gate.weight_bytes() + s.mlp.gate_up.weight_bytes() + s.mlp.down.weight_bytes()
                });
                moe.router.weight_bytes() + moe.used * expert + shared
            }
        }
    }

    /// Multiply-adds per token of one kind of the feed-forward's matmuls (gate|up, down,
    /// the router), a routed layer's over the `used` experts a token reads.
    pub fn macs_per_token(&self, op: Op) -> usize {
        let macs = |l: &Linear| l.in_features() * l.out_features();
        let (mlp, times, router, shared) = match self {
            Self::Dense(m) => (Some(m), 1, None, None),
            Self::Routed(moe) => (
                moe.experts.first(),
                moe.used,
                Some(&moe.router),
                moe.shared.as_ref(),
            ),
        };
        match op {
            Op::GateUpMatmul => {
                times * mlp.map_or(0, |m| macs(&m.gate_up))
                    + shared.map_or(0, |s| macs(&s.mlp.gate_up))
            }
            Op::DownMatmul => {
                times * mlp.map_or(0, |m| macs(&m.down)) + shared.map_or(0, |s| macs(&s.mlp.down))
            }
            Op::Router => router.map_or(0, macs) + shared.map_or(0, |s| macs(&s.gate)),
            _ => 0,
        }
    }
}
