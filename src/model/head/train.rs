//! Training a draft head on the CPU with candle's autograd (EAGLE's recipe): on sequences the
//! target wrote, with its features at every position, the head at position `t` reads the
//! token after `t` and the (noised) feature at `t` and is trained to give the feature at
//! `t + 1` (mean squared error) and the target's next-token distribution at `t + 1` over the
//! draft vocabulary (cross-entropy against the target's own probabilities), AdamW on both.
//! Optionally the same losses one step further (EAGLE-3's training-time test, one step deep):
//! the head fed its own output as the next position's feature, as a chain's second draft is.
//! An EAGLE-3 head trains the same way on its three taps (`fc` inside the graph), with its own
//! norms and output head, on the token loss alone.
//!
//! The forward here is the inference forward ([`super::DraftHead::forward`]) written in
//! differentiable tensor operations over a whole sequence at once: the same fc, the same
//! unnormed-input layer, the same half-split rotary embedding, causal attention over the
//! sequence, the output head's rows frozen.

use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};

use super::init::unit;
pub use super::init::{random_eagle3_head, random_head};
use super::{head_hparams, Eagle3Parts, HeadTensors};
use crate::model::llama::rope::angle_tables;
use crate::model::load::hparams::LlamaHparams;
use crate::model::{Llama, ModelError, Result};

/// One training sequence: tokens the target read or wrote, from position `start` of their
/// text on, and the target's features (computed over the whole text) at each of them, a row
/// of [`HeadTrainer::feature_width`] each: its last hidden state after the final norm (EAGLE),
/// or its three taps and its last layer's output (EAGLE-3).
pub struct TrainSample {
    pub start: usize,
    pub tokens: Vec<u32>,
    pub features: Vec<f32>,
}

/// How the head is trained.
#[derive(Clone, Debug)]
pub struct TrainSettings {
    /// The peak learning rate: a run warms up to it over `warmup_steps` steps, then decays it
    /// along a cosine to a tenth by its last step.
    pub learning_rate: f64,
    pub warmup_steps: usize,
    pub weight_decay: f64,
    /// Gradients are scaled down to this global norm when longer (0: never); without it a
    /// rare long, surprising sequence can throw a trained head off.
    pub clip_norm: f64,
    /// Weight of the feature regression and of the token loss (EAGLE: 1.0 and 0.1).
    pub feature_weight: f64,
    pub token_weight: f64,
    /// Weight of the same two losses one step further (EAGLE-3's training-time test): the
    /// head fed its own first step's feature, as a chain's second draft is (0: not trained).
    pub second_step_weight: f64,
    /// Uniform noise of this width added to the input features (EAGLE: 0.2).
    pub noise: f32,
    /// Positions of a sequence trained on: a longer one is trained on its last ones (its
    /// answer and what precedes it), at their own positions.
    pub max_positions: usize,
    pub seed: u64,
}

impl Default for TrainSettings {
    fn default() -> Self {
        Self {
            learning_rate: 1e-3,
            warmup_steps: 200,
            weight_decay: 0.0,
            clip_norm: 0.5,
            feature_weight: 1.0,
            token_weight: 0.1,
            second_step_weight: 0.0,
            noise: 0.2,
            max_positions: 640,
            seed: 0,
        }
    }
}

/// Losses of one sequence: the weighted total, its two parts, and how often the head's top
/// token is the target's (teacher-forced, one step ahead).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Losses {
    pub total: f32,
    pub feature: f32,
    pub token: f32,
    pub top1: f32,
    /// The same two steps ahead, the head fed its own first step (evaluation only, or when
    /// the second step is trained).
    pub top1_second: f32,
    pub positions: usize,
}

/// A head's weights as trainable variables, in the order [`HeadTensors`] lists them.
struct HeadVars {
    fc: Var,
    fc_bias: Option<Var>,
    q: Var,
    k: Var,
    v: Var,
    o: Var,
    ffn_norm: Var,
    gate: Var,
    up: Var,
    down: Var,
    eagle3: Option<Eagle3Vars>,
}

/// An EAGLE-3 head's own trainable parts.
struct Eagle3Vars {
    input_norm: Var,
    hidden_norm: Var,
    final_norm: Var,
    lm_head: Var,
}

impl HeadVars {
    fn all(&self) -> Vec<Var> {
        let mut v = vec![
            self.fc.clone(),
            self.q.clone(),
            self.k.clone(),
            self.v.clone(),
            self.o.clone(),
            self.ffn_norm.clone(),
            self.gate.clone(),
            self.up.clone(),
            self.down.clone(),
        ];
        v.extend(self.fc_bias.clone());
        if let Some(e) = &self.eagle3 {
            v.extend([
                e.input_norm.clone(),
                e.hidden_norm.clone(),
                e.final_norm.clone(),
                e.lm_head.clone(),
            ]);
        }
        v
    }
}

pub struct HeadTrainer {
    hp: LlamaHparams,
    vars: HeadVars,
    /// An EAGLE-3 head's parts that are not trained (its vocabulary, taps, RoPE).
    eagle3: Option<Eagle3Parts>,
    opt: AdamW,
    /// The output head's rows of the draft vocabulary (or all of them), frozen.
    vocab_rows: Tensor,
    token_rank: Vec<u32>,
    cos: Tensor,
    sin: Tensor,
    settings: TrainSettings,
    noise_state: u64,
}

/// One step's output over a sequence and the keys and values it attended with.
struct Pass {
    out: Tensor,
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
    /// Trains `init` for `target`; the token loss runs over the first `draft_vocab` tokens of
    /// `init.token_rank` (0 or more than it holds: the whole vocabulary).
    pub fn new(
        init: HeadTensors,
        target: &Llama,
        draft_vocab: usize,
        settings: TrainSettings,
    ) -> Result<Self> {
        let mut hp = head_hparams(target.hparams());
        hp.intermediate_size = init.gate.dim(0)?;
        if let Some(p) = &init.eagle3 {
            hp.rope_theta = p.rope_theta;
            hp.rope_scaling = p.rope_scaling.clone();
        }
        super::checkpoint::check_shapes(&init, &hp)?;
        let var = |t: &Tensor| Var::from_tensor(t);
        let vars = HeadVars {
            fc: var(&init.fc)?,
            fc_bias: init.fc_bias.as_ref().map(var).transpose()?,
            q: var(&init.q)?,
            k: var(&init.k)?,
            v: var(&init.v)?,
            o: var(&init.o)?,
            ffn_norm: var(&init.ffn_norm)?,
            gate: var(&init.gate)?,
            up: var(&init.up)?,
            down: var(&init.down)?,
            eagle3: match &init.eagle3 {
                Some(p) => Some(Eagle3Vars {
                    input_norm: var(&p.input_norm)?,
                    hidden_norm: var(&p.hidden_norm)?,
                    final_norm: var(&p.final_norm)?,
                    lm_head: var(&p.lm_head)?,
                }),
                None => None,
            },
        };
        let ranked = init.token_rank.len();
        let vocab_rows = if let Some(p) = &init.eagle3 {
            // The target's distribution over the head's own vocabulary.
            target.output_rows(&p.draft_ids)?
        } else if draft_vocab > 0 && ranked > 0 && ranked < hp.vocab_size {
            target.output_rows(&init.token_rank[..draft_vocab.min(ranked)])?
        } else {
            let all: Vec<u32> = (0..hp.vocab_size as u32).collect();
            target.output_rows(&all)?
        };
        let params = ParamsAdamW {
            lr: settings.learning_rate,
            weight_decay: settings.weight_decay,
            ..Default::default()
        };
        let opt = AdamW::new(vars.all(), params)?;
        let (half, cos, sin) = angle_tables(&hp, target.context_len().max(2));
        let n = cos.len() / half;
        Ok(Self {
            cos: Tensor::from_vec(cos, (n, half), &Device::Cpu)?,
            sin: Tensor::from_vec(sin, (n, half), &Device::Cpu)?,
            noise_state: settings.seed,
            hp,
            vars,
            eagle3: init.eagle3,
            opt,
            vocab_rows,
            token_rank: init.token_rank,
            settings,
        })
    }

    /// The head as it stands, to save or to draft with.
    pub fn tensors(&self) -> HeadTensors {
        let v = &self.vars;
        let t = |x: &Var| x.as_tensor().detach();
        HeadTensors {
            fc: t(&v.fc),
            fc_bias: v.fc_bias.as_ref().map(t),
            q: t(&v.q),
            k: t(&v.k),
            v: t(&v.v),
            o: t(&v.o),
            ffn_norm: t(&v.ffn_norm),
            gate: t(&v.gate),
            up: t(&v.up),
            down: t(&v.down),
            token_rank: self.token_rank.clone(),
            eagle3: self
                .eagle3
                .as_ref()
                .zip(v.eagle3.as_ref())
                .map(|(p, e)| Eagle3Parts {
                    input_norm: t(&e.input_norm),
                    hidden_norm: t(&e.hidden_norm),
                    final_norm: t(&e.final_norm),
                    lm_head: t(&e.lm_head),
                    ..p.clone()
                }),
        }
    }

    /// The head's output states over `sample` (no noise), first step and second step, as
    /// `(rows, hidden)` vectors: row `t` of the first is the state after reading position
    /// `start + t`'s feature and the token after it; row `r` of the second is the state after
    /// reading the first's row `r` and the token after position `start + r + 1` there.
    pub fn drafting_states(
        &self,
        target: &Llama,
        sample: &TrainSample,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let w = self.feature_width();
        let len = sample.tokens.len();
        let n = len - 1;
        let feats = Tensor::from_slice(&sample.features[..n * w], (n, w), &Device::Cpu)?;
        let embeds = target.embed(&sample.tokens[1..len])?;
        let first = self.first_step(&embeds, &self.input_state(&feats)?, sample.start)?;
        let second = self.second_step(&embeds.narrow(0, 1, n - 1)?, &first, sample.start)?;
        Ok((
            first.out.flatten_all()?.to_vec1()?,
            second.flatten_all()?.to_vec1()?,
        ))
    }

    /// One optimizer step on one sequence at `learning_rate`; returns its losses before the
    /// step.
    pub fn step(
        &mut self,
        target: &Llama,
        sample: &TrainSample,
        learning_rate: f64,
    ) -> Result<Losses> {
        let (loss, losses) = self.losses(target, sample, true)?;
        let mut grads = loss.backward()?;
        if self.settings.clip_norm > 0.0 {
            let vars = self.vars.all();
            let mut sum = 0.0f64;
            for v in &vars {
                if let Some(g) = grads.get(v.as_tensor()) {
                    sum += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
                }
            }
            let norm = sum.sqrt();
            if norm > self.settings.clip_norm {
                let scale = self.settings.clip_norm / norm;
                for v in &vars {
                    if let Some(g) = grads.remove(v.as_tensor()) {
                        grads.insert(v.as_tensor(), (g * scale)?);
                    }
                }
            }
        }
        self.opt.set_learning_rate(learning_rate);
        self.opt.step(&grads)?;
        Ok(losses)
    }

    /// The losses of one sequence without noise or a step (held-out evaluation).
    pub fn evaluate(&mut self, target: &Llama, sample: &TrainSample) -> Result<Losses> {
        Ok(self.losses(target, sample, false)?.1)
    }

    fn losses(
        &mut self,
        target: &Llama,
        sample: &TrainSample,
        noised: bool,
    ) -> Result<(Tensor, Losses)> {
        let w = self.feature_width();
        let len = sample.tokens.len().min(self.settings.max_positions);
        if len < 4 || sample.features.len() < len * w {
            return Err(ModelError::BadInput(format!(
                "a training sequence needs 4 tokens and their features, got {} and {} values",
                sample.tokens.len(),
                sample.features.len()
            )));
        }
        let n = len - 1;
        let feats = Tensor::from_slice(&sample.features[..len * w], (len, w), &Device::Cpu)?;
        let mut input = feats.narrow(0, 0, n)?;
        if noised && self.settings.noise > 0.0 {
            let width = self.settings.noise;
            let noise: Vec<f32> = (0..n * w)
                .map(|_| (unit(&mut self.noise_state) - 0.5) * width)
                .collect();
            input = (input + Tensor::from_vec(noise, (n, w), &Device::Cpu)?)?;
        }
        let embeds = target.embed(&sample.tokens[1..len])?;
        let want = self.target_states(target, &feats)?.narrow(0, 1, n)?;
        let first = self.first_step(&embeds, &self.input_state(&input)?, sample.start)?;
        let (feature, token, top1) = self.step_losses(&first.out, &want)?;
        let mut total = self.weighted(&feature, &token)?;
        // The second step of a chain, as drafting runs it: fed the head's own feature, it
        // attends to the first step's keys before it and to itself.
        let second_weight = self.settings.second_step_weight;
        let top1_second = if second_weight > 0.0 || !noised {
            let m = n - 1;
            let out = self.second_step(&embeds.narrow(0, 1, m)?, &first, sample.start)?;
            let (f2, t2, top1) = self.step_losses(&out, &want.narrow(0, 1, m)?)?;
            if noised {
                total = (total + (self.weighted(&f2, &t2)? * second_weight)?)?;
            }
            top1.to_scalar::<f32>()?
        } else {
            0.0
        };
        let losses = Losses {
            total: total.to_scalar::<f32>()?,
            feature: feature.to_scalar::<f32>()?,
            token: token.to_scalar::<f32>()?,
            top1: top1.to_scalar::<f32>()?,
            top1_second,
            positions: n,
        };
        Ok((total, losses))
    }

    /// A step's loss: its feature regression and token cross-entropy, weighted (EAGLE-3: the
    /// token loss alone, its output standing for no target state).
    fn weighted(&self, feature: &Tensor, token: &Tensor) -> Result<Tensor> {
        if self.vars.eagle3.is_some() {
            return Ok(token.clone());
        }
        let s = &self.settings;
        Ok(((feature * s.feature_weight)? + (token * s.token_weight)?)?)
    }

    /// Values a sample's feature row holds: the target's normed state (EAGLE), or its three
    /// taps and its last layer's output (EAGLE-3).
    pub fn feature_width(&self) -> usize {
        let h = self.hp.hidden_size;
        if self.vars.eagle3.is_some() {
            4 * h
        } else {
            h
        }
    }

    /// The head's input state over rows of features: the features (EAGLE), `fc` of the taps
    /// (EAGLE-3).
    fn input_state(&self, features: &Tensor) -> Result<Tensor> {
        let h = self.hp.hidden_size;
        Ok(match &self.vars.eagle3 {
            None => features.clone(),
            Some(_) => features
                .narrow(1, 0, 3 * h)?
                .matmul(&self.vars.fc.as_tensor().t()?)?,
        })
    }

    /// The target's normed last state over rows of features (what its output head reads).
    fn target_states(&self, target: &Llama, features: &Tensor) -> Result<Tensor> {
        let h = self.hp.hidden_size;
        match &self.vars.eagle3 {
            None => Ok(features.clone()),
            Some(_) => target.final_norm(&features.narrow(1, 3 * h, h)?.contiguous()?),
        }
    }

    /// The feature regression, the token cross-entropy against the target's distribution over
    /// the draft vocabulary, and how often the top tokens agree, of `out` against `want`.
    fn step_losses(&self, out: &Tensor, want: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let feature = (out - want)?.sqr()?.mean_all()?;
        let rows = self.vocab_rows.t()?;
        let target_p = candle_nn::ops::softmax_last_dim(&want.matmul(&rows)?)?;
        let logits = match &self.vars.eagle3 {
            None => out.matmul(&rows)?,
            Some(e) => {
                let eps = self.hp.rms_norm_eps as f32;
                candle_nn::ops::rms_norm_slow(out, e.final_norm.as_tensor(), eps)?
                    .matmul(&e.lm_head.as_tensor().t()?)?
            }
        };
        let log_q = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let token = (target_p.clone() * log_q)?
            .sum(D::Minus1)?
            .neg()?
            .mean_all()?;
        let agree = logits
            .argmax(D::Minus1)?
            .eq(&target_p.argmax(D::Minus1)?)?
            .to_dtype(DType::F32)?
            .mean_all()?;
        Ok((feature, token, agree))
    }

    /// The head over a whole sequence: `embeds` and `features` are `(n, hidden)`, row `t` the
    /// token after position `start + t` and the feature there; causal attention over the rows.
    fn first_step(&self, embeds: &Tensor, features: &Tensor, start: usize) -> Result<Pass> {
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
    fn second_step(&self, embeds: &Tensor, first: &Pass, start: usize) -> Result<Tensor> {
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
