//! The forward on the own CPU kernels: linear layers and the MLP run on all new tokens of all
//! sequences flattened into one matrix, attention runs per sequence on the host cache (see
//! `attention`). Every step is row-independent, so a token's logits are the same bits whether
//! it is decoded alone, verified with γ drafts, or batched with other sequences. Between the
//! embedding and the output head the residual stream stays host rows that each layer updates
//! in place: a tensor per operation cost more than the operation at a decode step's one row.

use candle_core::{Device, Tensor};

use crate::model::cache::kv_cache::{KvCache, LayerKv};
use crate::model::decoder::attention_plan::{plan, SpanWork, Unit};
use crate::model::decoder::batch::{logits_rows, BatchLogits, SeqInput, TreeLayout};
use crate::model::decoder::layer::{Layer, MlpBuffers};
use crate::model::decoder::op_profile::{timed, Op};
use crate::model::decoder::rope::{RopeTable, Ropes};
use crate::model::decoder::weights::DecoderWeights;
use crate::model::kernels::attention::KvRows;
use crate::model::kernels::attention::{
    causal_attention, prefetch_cache, tree_attention, AttnShape,
};
use crate::model::kernels::elementwise::add_bias_rows;
use crate::model::kernels::parallel::for_each_unit_inline;
use crate::model::kernels::rms_norm::norm_in_place;
use crate::model::spec::hparams::Hparams;
use crate::model::Result;

/// The whole model: embeddings, every layer, then the output head over the rows `batch` asks
/// for. Also returns the last layer's output for every row (before the final norm), and the
/// input of each layer in `taps` (a draft head's features).
pub(crate) fn forward(
    w: &DecoderWeights,
    hp: &Hparams,
    rope: &Ropes,
    cache: &mut KvCache,
    batch: &[SeqInput],
    taps: &[usize],
) -> Result<(BatchLogits, Tensor, Vec<Tensor>)> {
    let ids: Vec<u32> = batch
        .iter()
        .flat_map(|s| s.tokens.iter().copied())
        .collect();
    let x = timed(Op::Embed, || w.input_rows(hp, &ids, &Device::Cpu))?;
    let (x, tapped) = run_layers(
        &w.layers,
        hp,
        rope,
        cache,
        batch,
        x,
        LayerIo { prefix: None, taps },
    )?;
    let (rows, ranges) = logits_rows(batch);
    let logits = BatchLogits::new(w.output_logits(&x, rows, hp.rms_norm_eps as f32)?, ranges)?;
    Ok((logits, x, tapped))
}

/// What a stack of layers reads besides its input rows and hands back besides its output.
#[derive(Clone, Copy, Default)]
pub(crate) struct LayerIo<'a> {
    /// Columns put before the first layer's (normed) attention input, row by row: an EAGLE-3
    /// head's normed token embeddings beside its hidden input.
    pub prefix: Option<&'a Tensor>,
    /// Layers whose input (the residual stream before them) is returned, in this order; the
    /// number of layers names the last one's output.
    pub taps: &'a [usize],
}

/// `layers` over the input rows `x` (one per token of `batch`, in order), each layer's keys and
/// values appended to the cache: the decoder stack a model and a draft head share. Returns the
/// last layer's output and the inputs of the layers `io.taps` names.
pub(crate) fn run_layers(
    layers: &[Layer],
    hp: &Hparams,
    ropes: &Ropes,
    cache: &mut KvCache,
    batch: &[SeqInput],
    x: Tensor,
    io: LayerIo,
) -> Result<(Tensor, Vec<Tensor>)> {
    let shape = AttnShape {
        num_heads: hp.num_heads,
        num_kv_heads: hp.num_kv_heads,
        head_dim: hp.head_dim,
    };
    let q_dim = shape.q_dim();
    let eps = hp.rms_norm_eps as f32;
    let (total, hidden) = x.dims2()?;
    // The residual stream as host rows; each layer's work reads and writes them in place.
    let mut xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
    let prefix: Option<Vec<f32>> = io.prefix.map(|p| p.flatten_all()?.to_vec1()).transpose()?;
    let row_tensor = |xs: &[f32]| Tensor::from_slice(xs, (total, hidden), &Device::Cpu);
    let mut h = vec![0f32; total * hidden];
    let mut attn_out = vec![0f32; total * q_dim];
    let (mut qkv, mut q, mut mlp) = (Vec::new(), Vec::new(), MlpBuffers::default());
    let mut head_norms = Vec::new();
    // Tree inputs: each token's depth (its position past start_pos) and its path.
    let trees: Vec<Option<TreeLayout>> = batch.iter().map(SeqInput::tree_layout).collect();
    // The kernels scale scores by 1/√head_dim; another scale is folded into the queries.
    let q_scale = hp
        .attn_scale
        .map(|s| s * (hp.head_dim as f32).sqrt())
        .filter(|&s| s != 1.0);
    let rows = QkvRows {
        batch,
        trees: &trees,
        shape,
        q_scale,
    };

    let mut tapped: Vec<Option<Tensor>> = vec![None; io.taps.len()];
    for (l, layer) in layers.iter().enumerate() {
        for (i, _) in io.taps.iter().enumerate().filter(|(_, &t)| t == l) {
            tapped[i] = Some(row_tensor(&xs)?);
        }
        for s in batch {
            match cache.layer(s.slot, l)? {
                LayerKv::F32 { keys, values } => prefetch_cache(keys, values),
                LayerKv::F16 { keys, values } => prefetch_cache(keys, values),
                LayerKv::Bf16 { keys, values } => prefetch_cache(keys, values),
                LayerKv::Q8 { keys, values } => prefetch_cache(keys, values),
            }
        }
        timed(Op::Norm, || layer.attn_input_rows(&xs, eps, &mut h))?;
        let joined;
        let attn_in: &[f32] = match (&prefix, l) {
            (Some(prefix), 0) => {
                // [prefix row, normed row] side by side, row by row.
                let pw = prefix.len() / total.max(1);
                joined = prefix
                    .chunks_exact(pw)
                    .zip(h.chunks_exact(hidden))
                    .flat_map(|(p, r)| p.iter().chain(r).copied())
                    .collect::<Vec<f32>>();
                &joined
            }
            _ => &h,
        };
        timed(Op::QkvMatmul, || {
            layer.qkv.forward_rows_into(attn_in, total, &mut qkv)
        })?;
        timed(Op::Norm, || {
            rows.bias_and_norm(&mut qkv, layer, eps, &mut head_norms)
        })?;
        timed(Op::Rope, || rows.rotate(&mut qkv, ropes.for_layer(hp, l)));
        timed(Op::CacheWrite, || rows.append(&qkv, cache, l))?;
        timed(Op::Attention, || {
            let sinks = layer.extras.sinks.as_deref();
            rows.attend(&qkv, &mut q, cache, (l, hp.window(l), sinks), &mut attn_out)
        })?;
        layer.after_attention_rows(&mut xs, &attn_out, eps, &mut h, &mut mlp)?;
    }
    for (i, _) in io
        .taps
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == layers.len())
    {
        tapped[i] = Some(row_tensor(&xs)?);
    }
    let tapped = every_tap(tapped, io.taps, layers.len())?;
    Ok((Tensor::from_vec(xs, (total, hidden), &Device::Cpu)?, tapped))
}

/// The taps taken, or which one names a layer past the last.
fn every_tap(tapped: Vec<Option<Tensor>>, taps: &[usize], layers: usize) -> Result<Vec<Tensor>> {
    tapped
        .into_iter()
        .zip(taps)
        .map(|(t, l)| {
            t.ok_or_else(|| {
                crate::model::ModelError::BadInput(format!(
                    "layer {l} is tapped, but the model has {layers} layers"
                ))
            })
        })
        .collect()
}

/// A layer's fused q|k|v rows, one per token of `batch` in order, and what they go through
/// between the projection and the output projection: rope at each token's position, its keys
/// and values into the cache, attention per sequence (causal, or over a tree's paths).
struct QkvRows<'a, 'b> {
    batch: &'a [SeqInput<'b>],
    trees: &'a [Option<TreeLayout>],
    shape: AttnShape,
    /// Queries are multiplied by this before attention (a family's own score scale).
    q_scale: Option<f32>,
}

impl QkvRows<'_, '_> {
    fn row(&self) -> usize {
        self.shape.q_dim() + 2 * self.shape.kv_dim()
    }

    /// The projection's biases added, and each query and key head RMS-normed, where the
    /// layer's block has them.
    /// `scratch` is kept across a forward's layers.
    fn bias_and_norm(
        &self,
        qkv: &mut [f32],
        layer: &Layer,
        eps: f32,
        scratch: &mut Vec<f32>,
    ) -> Result<()> {
        let (q_dim, kv_dim) = (self.shape.q_dim(), self.shape.kv_dim());
        let row = self.row();
        if let Some(bias) = &layer.extras.qkv_bias {
            add_bias_rows(qkv, bias)?;
        }
        if let Some((qn, kn)) = &layer.extras.qk_norm {
            scratch.resize(q_dim.max(kv_dim), 0.0);
            for r in qkv.chunks_exact_mut(row) {
                let (q, kv) = r.split_at_mut(q_dim);
                norm_in_place(qn, q, eps, scratch)?;
                norm_in_place(kn, &mut kv[..kv_dim], eps, scratch)?;
            }
        }
        Ok(())
    }

    fn rotate(&self, qkv: &mut [f32], rope: &RopeTable) {
        let (q_dim, kv_dim, hd) = (self.shape.q_dim(), self.shape.kv_dim(), self.shape.head_dim);
        let row = self.row();
        let mut offset = 0;
        for (s, tree) in self.batch.iter().zip(self.trees) {
            let n = s.tokens.len();
            for (i, r) in qkv[offset * row..(offset + n) * row]
                .chunks_exact_mut(row)
                .enumerate()
            {
                let pos = s.start_pos + tree.as_ref().map_or(i, |(d, _)| d[i]);
                let (q, kv) = r.split_at_mut(q_dim);
                rope.apply(q, pos, hd);
                rope.apply(&mut kv[..kv_dim], pos, hd);
            }
            offset += n;
        }
    }

    fn append(&self, qkv: &[f32], cache: &mut KvCache, l: usize) -> Result<()> {
        let (q_dim, kv_dim) = (self.shape.q_dim(), self.shape.kv_dim());
        let row = self.row();
        let mut offset = 0;
        for s in self.batch {
            let n = s.tokens.len();
            for r in qkv[offset * row..(offset + n) * row].chunks_exact(row) {
                cache.append_layer(s.slot, l, &r[q_dim..q_dim + kv_dim], &r[q_dim + kv_dim..])?;
            }
            offset += n;
        }
        Ok(())
    }

    fn attend(
        &self,
        qkv: &[f32],
        q: &mut Vec<f32>,
        cache: &KvCache,
        (l, window, sinks): (usize, Option<usize>, Option<&[f32]>),
        attn_out: &mut [f32],
    ) -> Result<()> {
        let (shape, q_dim) = (self.shape, self.shape.q_dim());
        // Queries are strided inside the fused rows; pack them once per layer.
        q.clear();
        for r in qkv.chunks_exact(self.row()) {
            match self.q_scale {
                Some(s) => q.extend(r[..q_dim].iter().map(|v| v * s)),
                None => q.extend_from_slice(&r[..q_dim]),
            }
        }
        let mut spans = Vec::with_capacity(self.batch.len());
        let mut work = Vec::with_capacity(self.batch.len());
        let mut offset = 0;
        for (s, tree) in self.batch.iter().zip(self.trees) {
            let n = s.tokens.len();
            let span = Span {
                shape,
                start: s.start_pos,
                tree: tree.as_ref(),
                window,
                sinks,
            };
            work.push(SpanWork {
                start: s.start_pos,
                tokens: n,
                one_by_one: window.filter(|_| span.windowed(n)),
            });
            spans.push((span, offset..offset + n, cache.layer(s.slot, l)?));
            offset += n;
        }
        // Attention that cannot split itself well goes over the threads as whole units: a
        // windowed layer's tokens, each attending alone, and in a batch of several sequences
        // each few-token span (`attention_plan`). A batch's sequences took turns, each call
        // leaving a thread idle or paying the pool's wake-up: Gemma-3-270M decoding 8
        // sequences at depth 1024 took 0.83-0.87x the time a step, SmolLM2 at depth 256
        // 0.91-0.98x, at depth 1024 0.75x.
        let plan = plan(&work, crate::model::kernels::parallel::threads());
        let out_at = attn_out.as_mut_ptr() as usize;
        let q = &q[..];
        let attend = |Unit { span: k, token }: Unit| {
            let (span, rows, kv) = &spans[k];
            let rows = match token {
                Some(i) => rows.start + i..rows.start + i + 1,
                None => rows.clone(),
            };
            // SAFETY: each unit (and each span that splits itself) writes only its own rows of
            // `attn_out`, which outlives the call.
            let out = unsafe {
                std::slice::from_raw_parts_mut(
                    (out_at as *mut f32).add(rows.start * q_dim),
                    rows.len() * q_dim,
                )
            };
            let q = &q[rows.start * q_dim..rows.end * q_dim];
            match token {
                Some(i) => kv.attend_token(span, i, q, out),
                None => kv.attend(span, q, out),
            }
        };
        for &span in &plan.split {
            attend(Unit { span, token: None });
        }
        for_each_unit_inline(plan.units.len(), |u| attend(plan.units[u]));
        Ok(())
    }
}

/// A layer's cached keys and values, whatever their element type, given to a span.
trait AttendRows {
    fn attend(&self, span: &Span<'_>, q: &[f32], out: &mut [f32]);
    fn attend_token(&self, span: &Span<'_>, i: usize, q: &[f32], out: &mut [f32]);
}

impl AttendRows for LayerKv<'_> {
    fn attend(&self, span: &Span<'_>, q: &[f32], out: &mut [f32]) {
        match *self {
            LayerKv::F32 { keys, values } => span.attend(q, keys, values, out),
            LayerKv::F16 { keys, values } => span.attend(q, keys, values, out),
            LayerKv::Bf16 { keys, values } => span.attend(q, keys, values, out),
            LayerKv::Q8 { keys, values } => span.attend(q, keys, values, out),
        }
    }

    fn attend_token(&self, span: &Span<'_>, i: usize, q: &[f32], out: &mut [f32]) {
        match *self {
            LayerKv::F32 { keys, values } => span.attend_token(i, q, keys, values, out),
            LayerKv::F16 { keys, values } => span.attend_token(i, q, keys, values, out),
            LayerKv::Bf16 { keys, values } => span.attend_token(i, q, keys, values, out),
            LayerKv::Q8 { keys, values } => span.attend_token(i, q, keys, values, out),
        }
    }
}

/// One sequence's new tokens in one layer's attention: where they start, whether they form a
/// tree, the window the layer attends within and its heads' sinks.
struct Span<'a> {
    shape: AttnShape,
    start: usize,
    tree: Option<&'a TreeLayout>,
    window: Option<usize>,
    sinks: Option<&'a [f32]>,
}

impl Span<'_> {
    /// Whether one of this span's `n` tokens sees past the layer's window: they then attend
    /// one by one ([`Span::attend_token`]).
    fn windowed(&self, n: usize) -> bool {
        let deepest = match self.tree {
            Some((depths, _)) => depths.iter().copied().max().unwrap_or(0),
            None => n - 1,
        };
        self.window.is_some_and(|w| self.start + deepest + 1 > w)
    }

    /// The span's tokens together; none sees past a window (those attend one by one).
    fn attend<K: KvRows>(&self, q: &[f32], keys: K, values: K, out: &mut [f32]) {
        let (shape, start) = (self.shape, self.start);
        debug_assert!(!self.windowed(q.len() / shape.q_dim()));
        match self.tree {
            None => causal_attention(shape, q, keys, values, (start, self.sinks), out),
            Some((_, paths)) => {
                tree_attention(shape, q, keys, values, (start, self.sinks), paths, out)
            }
        }
    }

    /// Token `i` alone over the keys of its window: positions `p + 1 - w ..= p`, presented
    /// from the window's first key, as a token decoded alone at `p` sees them (so the same
    /// bits however tokens are batched). A tree node sees the window's cache rows, then the
    /// part of its path inside the window. A window is one segment, which a call cannot split
    /// over the threads, so the layer's tokens are spread over them instead, each whole on one
    /// (Gemma-3's windowed layers are 15 of its 18).
    fn attend_token<K: KvRows>(&self, i: usize, qi: &[f32], keys: K, values: K, oi: &mut [f32]) {
        let (shape, start) = (self.shape, self.start);
        // Without a window, the whole context (not reached: such tokens attend together).
        let w = self.window.unwrap_or(usize::MAX);
        let kv_dim = shape.kv_dim();
        let depth = self.tree.map_or(i, |(d, _)| d[i]);
        let lo = (start + depth + 1).saturating_sub(w);
        match self.tree {
            None => causal_attention(
                shape,
                qi,
                keys.skip(lo * kv_dim),
                values.skip(lo * kv_dim),
                (start + i - lo, self.sinks),
                oi,
            ),
            Some((_, paths)) => {
                let first = lo.min(start);
                let path: Vec<usize> = paths[i]
                    .iter()
                    .enumerate()
                    .filter(|&(d, _)| start + d >= lo)
                    .map(|(_, &r)| r)
                    .collect();
                tree_attention(
                    shape,
                    qi,
                    keys.skip(first * kv_dim),
                    values.skip(first * kv_dim),
                    (start - first, self.sinks),
                    &[path],
                    oi,
                )
            }
        }
    }
}
