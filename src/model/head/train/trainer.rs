//! The trainer: a head's variables under AdamW, its losses over one sequence (teacher-forced
//! first step, optionally the second step a chain drafts), and one optimizer step.
//!
//! Why it exists: this is the part of training that owns state (the optimizer's moments, the
//! noise's seed); the differentiable forward it calls is in `forward.rs`.

use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};

use super::sample::{Losses, TrainSample};
use super::settings::TrainSettings;
use super::vars::HeadVars;
use crate::model::decoder::rope::angle_tables;
use crate::model::head::checkpoint::check_shapes;
use crate::model::head::init::unit;
use crate::model::head::{head_hparams, Eagle3Parts, HeadTensors};
use crate::model::spec::hparams::Hparams;
use crate::model::{Decoder, ModelError, Result};

/// A head under training: its variables, the optimizer, and what its losses read.
pub struct HeadTrainer {
    pub(super) hp: Hparams,
    pub(super) vars: HeadVars,
    /// An EAGLE-3 head's parts that are not trained (its vocabulary, taps, RoPE).
    eagle3: Option<Eagle3Parts>,
    opt: AdamW,
    /// The output head's rows of the draft vocabulary (or all of them), frozen.
    vocab_rows: Tensor,
    token_rank: Vec<u32>,
    /// Rotary angles' cosines and sines, `(positions, head_dim / 2)`.
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    settings: TrainSettings,
    noise_state: u64,
}

impl HeadTrainer {
    /// Trains `init` for `target`; the token loss runs over the first `draft_vocab` tokens of
    /// `init.token_rank` (0 or more than it holds: the whole vocabulary).
    pub fn new(
        init: HeadTensors,
        target: &Decoder,
        draft_vocab: usize,
        settings: TrainSettings,
    ) -> Result<Self> {
        let mut hp = head_hparams(target.hparams());
        hp.intermediate_size = init.gate.dim(0)?;
        if let Some(p) = &init.eagle3 {
            hp.rope_theta = p.rope_theta;
            hp.rope_scaling = p.rope_scaling.clone();
        }
        check_shapes(&init, &hp)?;
        let vars = HeadVars::new(&init)?;
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
        self.vars
            .tensors(self.token_rank.clone(), self.eagle3.as_ref())
    }

    /// The head's output states over `sample` (no noise), first step and second step, as
    /// `(rows, hidden)` vectors: row `t` of the first is the state after reading position
    /// `start + t`'s feature and the token after it; row `r` of the second is the state after
    /// reading the first's row `r` and the token after position `start + r + 1` there.
    pub fn drafting_states(
        &self,
        target: &Decoder,
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
        target: &Decoder,
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
    pub fn evaluate(&mut self, target: &Decoder, sample: &TrainSample) -> Result<Losses> {
        Ok(self.losses(target, sample, false)?.1)
    }

    fn losses(
        &mut self,
        target: &Decoder,
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
    fn target_states(&self, target: &Decoder, features: &Tensor) -> Result<Tensor> {
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
}
