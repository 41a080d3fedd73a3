//! The training run: features for every answer, then epochs of AdamW steps in a seeded order,
//! each ending with a held-out evaluation, a checkpoint (the head in EAGLE's layout) and a
//! line of the training curve. A run whose folder holds a checkpoint resumes after its last
//! epoch (the weights and the curve; the optimizer's moments start afresh).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::data::{features, token_rank, Answer};
use super::TrainError;
use crate::model::head::train::{random_head, HeadTrainer, Losses, TrainSample, TrainSettings};
use crate::model::head::{load_head, save_head, HeadTensors};
use crate::model::Llama;

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
    target: &Llama,
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
    let init = if state.epochs_done > 0 {
        if state.seed != opts.settings.seed {
            return Err(TrainError::Options(format!(
                "{} was trained with seed {}; resume it with that seed or use another folder",
                opts.out.display(),
                state.seed
            )));
        }
        load_head(&opts.out)?
    } else {
        let inter = if opts.intermediate == 0 {
            hp.intermediate_size
        } else {
            opts.intermediate
        };
        let mut head = random_head(hp, inter, opts.settings.seed)?;
        head.token_rank = token_rank(answers, hp.vocab_size);
        head
    };
    state.seed = opts.settings.seed;
    let mut cache = target.new_cache(1);
    let mut samples = Vec::with_capacity(answers.len());
    let h = hp.hidden_size;
    for (i, a) in answers.iter().enumerate() {
        // The features over the whole text; a long one is trained on its last positions.
        let len = a.tokens.len().min(target.context_len());
        let start = len.saturating_sub(opts.settings.max_positions);
        let all = features(target, &mut cache, &a.tokens[..len])?;
        samples.push(TrainSample {
            start,
            tokens: a.tokens[start..len].to_vec(),
            features: all[start * h..].to_vec(),
        });
        progress(i + 1, answers.len(), "target features");
    }
    drop(cache);
    let held = |i: usize| opts.holdout > 0 && i % opts.holdout == opts.holdout - 1;
    let train: Vec<usize> = (0..samples.len()).filter(|&i| !held(i)).collect();
    let eval: Vec<usize> = (0..samples.len()).filter(|&i| held(i)).collect();
    let mut trainer = HeadTrainer::new(init, target, opts.draft_vocab, opts.settings.clone())?;
    for epoch in state.epochs_done..opts.epochs {
        let start = Instant::now();
        let order = shuffled(&train, opts.settings.seed.wrapping_add(epoch as u64));
        let mut sum = 0.0f64;
        for (n, &i) in order.iter().enumerate() {
            let l = trainer.step(target, &samples[i])?;
            sum += f64::from(l.total);
            let what = format!(
                "epoch {}/{} loss {:.4}",
                epoch + 1,
                opts.epochs,
                sum / (n + 1) as f64
            );
            progress(n + 1, order.len(), &what);
        }
        let eval_losses = mean_losses(&mut trainer, target, &samples, &eval)?;
        let point = EpochPoint {
            epoch: epoch + 1,
            train_loss: (sum / order.len().max(1) as f64) as f32,
            eval_loss: eval_losses.total,
            eval_feature: eval_losses.feature,
            eval_token: eval_losses.token,
            eval_top1: eval_losses.top1,
            seconds: start.elapsed().as_secs_f64(),
        };
        state.curve.push(point);
        state.epochs_done = epoch + 1;
        save_head(&opts.out, &trainer.tensors(), hp)?;
        write_state(&opts.out, &state)?;
    }
    Ok(TrainReport {
        curve: state.curve,
        head: trainer.tensors(),
    })
}

/// The mean losses over `which` samples (position-weighted).
fn mean_losses(
    trainer: &mut HeadTrainer,
    target: &Llama,
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
        acc.positions += l.positions;
    }
    let n = acc.positions.max(1) as f32;
    Ok(Losses {
        total: acc.total / n,
        feature: acc.feature / n,
        token: acc.token / n,
        top1: acc.top1 / n,
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
        "epoch\ttrain_loss\teval_loss\teval_feature\teval_token\teval_top1\tseconds\n",
    );
    for p in &state.curve {
        tsv.push_str(&format!(
            "{}\t{:.5}\t{:.5}\t{:.5}\t{:.5}\t{:.4}\t{:.1}\n",
            p.epoch,
            p.train_loss,
            p.eval_loss,
            p.eval_feature,
            p.eval_token,
            p.eval_top1,
            p.seconds
        ));
    }
    write("training_curve.tsv", tsv)
}
