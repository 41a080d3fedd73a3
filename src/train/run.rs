//! The training run: features for every answer, then epochs of AdamW steps in a seeded order
//! under a warm-up and cosine schedule, each epoch ending with a held-out evaluation, a
//! checkpoint (the head in EAGLE's or EAGLE-3's layout) and a line of the training curve. A run whose folder
//! holds a checkpoint resumes after its last epoch (the weights, the curve and the schedule's
//! place; the optimizer's moments start afresh, so the rate warms up again).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::data::{token_rank, Answer, FeatureRunner};
use super::TrainError;
use crate::model::head::train::{
    random_eagle3_head, random_head, HeadTrainer, Losses, TrainSample, TrainSettings,
};
use crate::model::head::{load_head, save_head, HeadTensors};
use crate::model::{Decoder, FeatureTaps, Hparams};

fn layout_name(eagle3: bool) -> &'static str {
    if eagle3 {
        "an EAGLE-3 head"
    } else {
        "an EAGLE head"
    }
}

/// What `tandem train-head` trains.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The head's folder: checkpoints, `train_state.json`, `training_curve.tsv`.
    pub out: PathBuf,
    pub epochs: usize,
    /// Tokens of the draft vocabulary the token loss runs over (0: all).
    pub draft_vocab: usize,
    /// The head's MLP width (0: the target's).
    pub intermediate: usize,
    /// Every `holdout`-th answer is held out for evaluation (0: none).
    pub holdout: usize,
    /// A head folder whose weights a new run starts from instead of random ones (its draft
    /// vocabulary ranked again over these answers); a resumed run ignores it.
    pub init: Option<PathBuf>,
    /// Train an EAGLE-3 head (three taps, its own norms and output head over the draft
    /// vocabulary) instead of an EAGLE one.
    pub eagle3: bool,
    pub settings: TrainSettings,
}

/// One epoch's mean losses on the training and the held-out answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochPoint {
    pub epoch: usize,
    pub train_loss: f32,
    pub eval_loss: f32,
    pub eval_feature: f32,
    pub eval_token: f32,
    /// How often the head's top token is the target's, one step ahead, held out.
    pub eval_top1: f32,
    /// The same two steps ahead, the head fed its own first step's feature.
    #[serde(default)]
    pub eval_top1_second: f32,
    pub seconds: f64,
}

pub struct TrainReport {
    pub curve: Vec<EpochPoint>,
    pub head: HeadTensors,
}

/// What a checkpoint folder says of the run that wrote it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TrainState {
    epochs_done: usize,
    seed: u64,
    curve: Vec<EpochPoint>,
}

const STATE_FILE: &str = "train_state.json";

/// Trains (or resumes training) a head for `target` on `answers`; `progress(done, total,
/// what)` as it goes.
pub fn train_head(
    target: &Decoder,
    answers: &[Answer],
    opts: &TrainOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<TrainReport, TrainError> {
    if answers.is_empty() {
        return Err(TrainError::Options("no answers to train on".into()));
    }
    let hp = target.hparams();
    let state_path = opts.out.join(STATE_FILE);
    let mut state: TrainState = read_state(&state_path)?.unwrap_or_default();
    let init = starting_head(target, answers, opts, &state)?;
    if init.eagle3.is_some() != opts.eagle3 {
        return Err(TrainError::Options(format!(
            "the head to continue is {}, the run asks for {}",
            layout_name(init.eagle3.is_some()),
            layout_name(opts.eagle3)
        )));
    }
    state.seed = opts.settings.seed;
    let taps = feature_taps(&init, hp);
    let samples = training_samples(target, answers, taps, opts, progress)?;
    let held = |i: usize| opts.holdout > 0 && i % opts.holdout == opts.holdout - 1;
    let train: Vec<usize> = (0..samples.len()).filter(|&i| !held(i)).collect();
    let eval: Vec<usize> = (0..samples.len()).filter(|&i| held(i)).collect();
    let trainer = HeadTrainer::new(init, target, opts.draft_vocab, opts.settings.clone())?;
    let mut epochs = Epochs {
        target,
        opts,
        trainer,
        samples,
        train,
        eval,
        run_steps: 0,
    };
    for epoch in state.epochs_done..opts.epochs {
        let point = epochs.run(epoch, progress)?;
        state.curve.push(point);
        state.epochs_done = epoch + 1;
        save_head(&opts.out, &epochs.trainer.tensors(), hp)?;
        write_state(&opts.out, &state)?;
    }
    Ok(TrainReport {
        curve: state.curve,
        head: epochs.trainer.tensors(),
    })
}

/// The head training starts from: the folder's own checkpoint when resuming (with the seed it
/// was trained with), `--init`'s head, or random weights.
fn starting_head(
    target: &Decoder,
    answers: &[Answer],
    opts: &TrainOptions,
    state: &TrainState,
) -> Result<HeadTensors, TrainError> {
    if state.epochs_done > 0 {
        if state.seed != opts.settings.seed {
            return Err(TrainError::Options(format!(
                "{} was trained with seed {}; resume it with that seed or use another folder",
                opts.out.display(),
                state.seed
            )));
        }
        Ok(load_head(&opts.out)?)
    } else if let Some(from) = &opts.init {
        let mut head = load_head(from)?;
        if head.eagle3.is_none() {
            head.token_rank = token_rank(answers, target.hparams().vocab_size);
        }
        Ok(head)
    } else {
        random_start(target, answers, opts)
    }
}

/// A head of random weights in the run's layout, its draft vocabulary the answers' most
/// frequent tokens.
fn random_start(
    target: &Decoder,
    answers: &[Answer],
    opts: &TrainOptions,
) -> Result<HeadTensors, TrainError> {
    let hp = target.hparams();
    let inter = if opts.intermediate == 0 {
        hp.intermediate_size
    } else {
        opts.intermediate
    };
    let rank = token_rank(answers, hp.vocab_size);
    if opts.eagle3 {
        // Its own vocabulary, in ascending ids as published heads order it.
        let k = if opts.draft_vocab == 0 {
            rank.len()
        } else {
            opts.draft_vocab.min(rank.len())
        };
        let mut ids = rank[..k].to_vec();
        ids.sort_unstable();
        Ok(random_eagle3_head(target, inter, opts.settings.seed, ids)?)
    } else {
        let mut head = random_head(hp, inter, opts.settings.seed)?;
        head.token_rank = rank;
        Ok(head)
    }
}

/// The target's states the head trains on.
fn feature_taps(init: &HeadTensors, hp: &Hparams) -> FeatureTaps {
    // EAGLE-3 trains on its taps and the target's last state (for the target's distribution).
    match &init.eagle3 {
        Some(p) => {
            let mut layers = p.taps.clone();
            if layers.is_empty() {
                layers = crate::model::head::eagle3::default_taps(hp.num_layers);
            }
            layers.push(hp.num_layers);
            FeatureTaps::LayerInputs(layers)
        }
        None => FeatureTaps::LastNormed,
    }
}

/// Every answer's tokens and the target's features over them, in the answers' order.
fn training_samples(
    target: &Decoder,
    answers: &[Answer],
    taps: FeatureTaps,
    opts: &TrainOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Vec<TrainSample>, TrainError> {
    let hp = target.hparams();
    // Texts in sorted order, so that those sharing a prompt (or a first turn) come together
    // and the shared part's features are computed once.
    let mut by_text: Vec<usize> = (0..answers.len()).collect();
    by_text.sort_by(|&a, &b| answers[a].tokens.cmp(&answers[b].tokens));
    let h = match &taps {
        FeatureTaps::LastNormed => hp.hidden_size,
        FeatureTaps::LayerInputs(layers) => layers.len() * hp.hidden_size,
    };
    let mut runner = FeatureRunner::new(target, taps)?;
    let mut samples: Vec<Option<TrainSample>> = (0..answers.len()).map(|_| None).collect();
    for (done, &i) in by_text.iter().enumerate() {
        // The features over the whole text; a long one is trained on its last positions.
        let a = &answers[i];
        let len = a.tokens.len().min(target.context_len());
        let start = len.saturating_sub(opts.settings.max_positions);
        let all = runner.features(&a.tokens[..len])?;
        samples[i] = Some(TrainSample {
            start,
            tokens: a.tokens[start..len].to_vec(),
            features: all[start * h..].to_vec(),
        });
        progress(done + 1, answers.len(), "target features");
    }
    drop(runner);
    Ok(samples.into_iter().flatten().collect())
}

/// The training loop's state from epoch to epoch: the trainer, the samples split into
/// training and held-out ones, and the steps this run has taken (the warm-up's clock).
struct Epochs<'a> {
    target: &'a Decoder,
    opts: &'a TrainOptions,
    trainer: HeadTrainer,
    samples: Vec<TrainSample>,
    train: Vec<usize>,
    eval: Vec<usize>,
    run_steps: usize,
}

impl Epochs<'_> {
    /// One pass over the training samples in the epoch's seeded order, then the held-out
    /// evaluation: the epoch's line of the curve.
    fn run(
        &mut self,
        epoch: usize,
        progress: &mut dyn FnMut(usize, usize, &str),
    ) -> Result<EpochPoint, TrainError> {
        let opts = self.opts;
        let start = Instant::now();
        let total_steps = opts.epochs * self.train.len();
        let order = shuffled(&self.train, opts.settings.seed.wrapping_add(epoch as u64));
        let mut sum = 0.0f64;
        for (n, &i) in order.iter().enumerate() {
            let lr = learning_rate_at(
                &opts.settings,
                epoch * self.train.len() + n,
                total_steps,
                self.run_steps,
            );
            self.run_steps += 1;
            let l = self.trainer.step(self.target, &self.samples[i], lr)?;
            sum += f64::from(l.total);
            let what = format!(
                "epoch {}/{} loss {:.4}",
                epoch + 1,
                opts.epochs,
                sum / (n + 1) as f64
            );
            progress(n + 1, order.len(), &what);
        }
        let eval_losses = mean_losses(&mut self.trainer, self.target, &self.samples, &self.eval)?;
        Ok(EpochPoint {
            epoch: epoch + 1,
            train_loss: (sum / order.len().max(1) as f64) as f32,
            eval_loss: eval_losses.total,
            eval_feature: eval_losses.feature,
            eval_token: eval_losses.token,
            eval_top1: eval_losses.top1,
            eval_top1_second: eval_losses.top1_second,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

/// The learning rate of global step `step` of `total`, `run_step` steps after this run
/// started: the peak, decayed along a cosine to a tenth by the last step, and ramped up
/// linearly over the run's first `warmup_steps` (a resumed run warms up again, its optimizer's
/// moments starting afresh).
fn learning_rate_at(settings: &TrainSettings, step: usize, total: usize, run_step: usize) -> f64 {
    let progress = step as f64 / total.max(1) as f64;
    let decay = 0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos());
    let warm = if settings.warmup_steps == 0 {
        1.0
    } else {
        ((run_step + 1) as f64 / settings.warmup_steps as f64).min(1.0)
    };
    settings.learning_rate * decay * warm
}

/// The mean losses over `which` samples (position-weighted).
fn mean_losses(
    trainer: &mut HeadTrainer,
    target: &Decoder,
    samples: &[TrainSample],
    which: &[usize],
) -> Result<Losses, TrainError> {
    let mut acc = Losses::default();
    for &i in which {
        let l = trainer.evaluate(target, &samples[i])?;
        let w = l.positions as f32;
        acc.total += l.total * w;
        acc.feature += l.feature * w;
        acc.token += l.token * w;
        acc.top1 += l.top1 * w;
        acc.top1_second += l.top1_second * w;
        acc.positions += l.positions;
    }
    let n = acc.positions.max(1) as f32;
    Ok(Losses {
        total: acc.total / n,
        feature: acc.feature / n,
        token: acc.token / n,
        top1: acc.top1 / n,
        top1_second: acc.top1_second / n,
        positions: acc.positions,
    })
}

/// `items` in an order fixed by `seed` (Fisher–Yates over splitmix64).
fn shuffled(items: &[usize], seed: u64) -> Vec<usize> {
    let mut v = items.to_vec();
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

fn read_state(path: &Path) -> Result<Option<TrainState>, TrainError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| TrainError::File {
                path: path.to_owned(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TrainError::File {
            path: path.to_owned(),
            reason: e.to_string(),
        }),
    }
}

/// `train_state.json` and `training_curve.tsv` (one line an epoch).
fn write_state(dir: &Path, state: &TrainState) -> Result<(), TrainError> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| TrainError::File {
            path,
            reason: e.to_string(),
        })
    };
    let json = serde_json::to_string_pretty(state).expect("the state prints as JSON");
    write(STATE_FILE, json)?;
    let mut tsv = String::from(
        "epoch\ttrain_loss\teval_loss\teval_feature\teval_token\teval_top1\teval_top1_second\tseconds\n",
    );
    for p in &state.curve {
        tsv.push_str(&format!(
            "{}\t{:.5}\t{:.5}\t{:.5}\t{:.5}\t{:.4}\t{:.4}\t{:.1}\n",
            p.epoch,
            p.train_loss,
            p.eval_loss,
            p.eval_feature,
            p.eval_token,
            p.eval_top1,
            p.eval_top1_second,
            p.seconds
        ));
    }
    write("training_curve.tsv", tsv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_learning_rate_warms_up_then_decays_to_a_tenth() {
        let s = TrainSettings {
            learning_rate: 1.0,
            warmup_steps: 10,
            ..TrainSettings::default()
        };
        assert!((learning_rate_at(&s, 0, 100, 0) - 0.1).abs() < 1e-3);
        assert!((learning_rate_at(&s, 9, 100, 9) - 0.98).abs() < 0.02);
        let mid = learning_rate_at(&s, 50, 100, 50);
        assert!((mid - 0.55).abs() < 1e-9, "{mid}");
        assert!((learning_rate_at(&s, 100, 100, 100) - 0.1).abs() < 1e-9);
        // A resumed run ramps up again from where the schedule stands.
        let resumed = learning_rate_at(&s, 50, 100, 0);
        assert!((resumed - mid / 10.0).abs() < 1e-9);
        let rates: Vec<f64> = (10..100).map(|i| learning_rate_at(&s, i, 100, i)).collect();
        assert!(rates.windows(2).all(|w| w[1] <= w[0]));
    }
}
