//! `tandem train-head`: trains a draft head for the loaded target on this machine's CPU, from
//! the target's own answers to the turns of a Spec-Bench-format prompt file.
//!
//! Why it exists: a head must match its target's hidden states, so a target without a
//! published head gets one here, with nothing but the target and a prompt file (the
//! development half in `data/`, never the held-out prompts the benchmarks report on).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use tandem::bench::progress::ProgressBar;
use tandem::config::Config;
use tandem::model::head::train::TrainSettings;
use tandem::model::ChatMessage;
use tandem::train::{answer_jobs, answer_prompts, train_head, Answer, AnswerJob, TrainOptions};

use super::model_args::{load_model, ModelArgs};
use super::CliError;

#[derive(Args)]
pub struct TrainHeadArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The head's folder (required): checkpoints in EAGLE's layout, `answers.json` (the
    /// generated data, reused by a later run), `train_state.json` and `training_curve.tsv`.
    /// A folder with a checkpoint resumes after its last epoch.
    #[arg(long)]
    out: PathBuf,
    /// Spec-Bench-format prompts (JSON lines with `turns`); each first turn is asked (and each
    /// second one with `--turns 2`).
    #[arg(long, default_value = "data/spec_bench_dev.jsonl")]
    prompts: PathBuf,
    /// Use at most this many prompts (0 = all).
    #[arg(long, default_value_t = 0)]
    limit: usize,
    /// Leave every N-th question of the file out of training, so that `tandem bench
    /// --left-out N` measures the head on questions it never saw (0 = train on all).
    #[arg(long, default_value_t = 0)]
    leave_out: usize,
    /// Tokens of each answer.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampled answers per prompt besides the greedy one.
    #[arg(long, default_value_t = 1)]
    sampled: usize,
    /// Turns of each question answered: 1, or 2 (the second turn asked after the target's own
    /// answer to the first, once for each first answer, greedy after greedy, sampled after
    /// sampled).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    turns: u8,
    /// Temperature of the sampled answers.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Passes over the answers.
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    /// AdamW's peak learning rate (reached after --warmup-steps, decayed along a cosine to a
    /// tenth by the last epoch's end).
    #[arg(long, default_value_t = 1e-3)]
    learning_rate: f64,
    /// Steps of a run's linear warm-up to the learning rate (a resumed run warms up again).
    #[arg(long, default_value_t = 200)]
    warmup_steps: usize,
    /// Gradients longer than this global norm are scaled down to it (0 = no clipping).
    #[arg(long, default_value_t = 0.5)]
    clip_norm: f64,
    /// Weight of the token loss (cross-entropy against the target's distribution) beside the
    /// feature regression's 1.
    #[arg(long, default_value_t = 0.1)]
    token_weight: f64,
    /// Weight of the losses one drafting step further, the head fed its own first step's
    /// feature (EAGLE-3's training-time test; 0 = not trained, a step costs about half as
    /// much again when trained).
    #[arg(long, default_value_t = 0.0)]
    second_step_weight: f64,
    /// Tokens of the draft vocabulary the token loss covers (0 = the whole vocabulary).
    #[arg(long, default_value_t = 8192)]
    draft_vocab: usize,
    /// The head's MLP width (0 = the target's).
    #[arg(long, default_value_t = 0)]
    intermediate: usize,
    /// Every N-th answer is held out for the evaluation each epoch ends with (0 = none).
    #[arg(long, default_value_t = 20)]
    holdout: usize,
    /// Positions of an answer trained on: a longer text (prompt and answer) is trained on its
    /// last ones, at their own positions.
    #[arg(long, default_value_t = 640)]
    max_positions: usize,
    /// Seed of the initial weights, the noise, the order and the sampled answers.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(config: &Config, args: TrainHeadArgs) -> Result<(), CliError> {
    keep_freed_memory();
    let loaded = load_model(config)?;
    let tok = &loaded.tokenizer;
    let target = Arc::new(loaded.model);
    let flag = |flag: &'static str, reason: String| CliError::Flag { flag, reason };
    let answers_path = args.out.join("answers.json");
    let answers: Vec<Answer> = match std::fs::read_to_string(&answers_path) {
        Ok(text) => serde_json::from_str(&text)?,
        Err(_) => {
            let template = tok.chat_template().ok_or(CliError::NoChatTemplate)?;
            let all = tandem::bench::load_prompts(&args.prompts)?;
            let mut prompts = tandem::bench::every_nth(all, args.leave_out, false);
            if args.limit > 0 {
                prompts.truncate(args.limit);
            }
            let mut firsts = Vec::with_capacity(prompts.len());
            for p in &prompts {
                let Some(first) = p.turns.first() else {
                    continue;
                };
                let conversation = vec![ChatMessage::new("user", first.clone())];
                let rendered = template.render(&conversation, true)?;
                firsts.push((
                    conversation,
                    p.turns.get(1).cloned(),
                    tok.encode(&rendered, true)?,
                ));
            }
            let threads = tandem::runtime::init_threads(config.runtime.threads);
            let rt = super::async_runtime()?;
            let ask = |jobs: &[AnswerJob], what: &str| {
                let mut bar = ProgressBar::default();
                rt.block_on(answer_prompts(
                    Arc::clone(&target),
                    jobs,
                    (args.max_tokens, tok.eos_ids()),
                    args.temperature,
                    (8, threads),
                    &mut |done, total| bar.update(done, total, what),
                ))
                .map_err(|e| flag("--prompts", e.to_string()))
            };
            let prompt_tokens: Vec<Vec<u32>> = firsts.iter().map(|f| f.2.clone()).collect();
            let jobs = answer_jobs(&prompt_tokens, args.sampled, args.seed);
            let mut answers = ask(&jobs, "target answers")?;
            if args.turns == 2 {
                // Each first answer, in its conversation, before the question's second turn.
                let per = 1 + args.sampled;
                let mut seconds = Vec::new();
                for (n, (job, answer)) in jobs.iter().zip(&answers).enumerate() {
                    let (conversation, Some(second), _) = &firsts[n / per] else {
                        continue;
                    };
                    let written: Vec<u32> = answer.tokens[answer.answer_from..]
                        .iter()
                        .copied()
                        .filter(|t| !tok.eos_ids().contains(t))
                        .collect();
                    let mut turns = conversation.clone();
                    turns.push(ChatMessage::new("assistant", tok.decode(&written)?));
                    turns.push(ChatMessage::new("user", second.clone()));
                    let rendered = template.render(&turns, true)?;
                    seconds.push(AnswerJob {
                        prompt: tok.encode(&rendered, true)?,
                        seed: job.seed.map(|s| s ^ 0x5eed_0002),
                    });
                }
                answers.extend(ask(&seconds, "second turns")?);
            }
            std::fs::create_dir_all(&args.out).map_err(|e| CliError::WriteFile {
                path: args.out.clone(),
                source: e,
            })?;
            let json = serde_json::to_string(&answers)?;
            std::fs::write(&answers_path, json).map_err(|e| CliError::WriteFile {
                path: answers_path.clone(),
                source: e,
            })?;
            answers
        }
    };
    let opts = TrainOptions {
        out: args.out.clone(),
        epochs: args.epochs,
        draft_vocab: args.draft_vocab,
        intermediate: args.intermediate,
        holdout: args.holdout,
        settings: TrainSettings {
            learning_rate: args.learning_rate,
            warmup_steps: args.warmup_steps,
            clip_norm: args.clip_norm,
            token_weight: args.token_weight,
            second_step_weight: args.second_step_weight,
            max_positions: args.max_positions,
            seed: args.seed,
            ..TrainSettings::default()
        },
    };
    let mut bar = ProgressBar::default();
    let mut stage = String::new();
    let report = train_head(&target, &answers, &opts, &mut |done, total, what| {
        // A new stage starts a new bar.
        let name = what.split(" loss").next().unwrap_or(what);
        if name != stage {
            stage = name.to_string();
            bar = ProgressBar::default();
        }
        bar.update(done, total, what)
    })
    .map_err(|e| flag("--out", e.to_string()))?;
    println!(
        "| epoch | train loss | held-out loss | feature | token | top-1 agrees | second step | seconds |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for p in &report.curve {
        println!(
            "| {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.1}% | {:.1}% | {:.0} |",
            p.epoch,
            p.train_loss,
            p.eval_loss,
            p.eval_feature,
            p.eval_token,
            100.0 * p.eval_top1,
            100.0 * p.eval_top1_second,
            p.seconds
        );
    }
    println!("head written to {}", args.out.display());
    Ok(())
}

/// A training step allocates and frees tensors of megabytes dozens of times; glibc hands
/// such blocks back to the kernel on every free and the next step faults them in again, which
/// cost 30% of a step. Keeping them in the heap makes the frees reusable.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: mallopt only changes allocator thresholds; called before any training thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}
