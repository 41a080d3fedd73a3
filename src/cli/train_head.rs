//! `tandem train-head`: trains a draft head for the loaded target on this machine's CPU, from
//! the target's own answers to the turns of a Spec-Bench-format prompt file.
//!
//! Why it exists: a head must match its target's hidden states, so a target without a
//! published head gets one here, with nothing but the target and a prompt file (the
//! development half in `data/`, never the held-out prompts the benchmarks report on).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;

use tandem::bench::progress::ProgressBar;
use tandem::bench::BenchPrompt;
use tandem::config::Config;
use tandem::model::head::train::TrainSettings;
use tandem::model::{ChatMessage, ChatTemplate, Decoder, TextTokenizer};
use tandem::train::{
    answer_jobs, answer_prompts, finished_turn, train_head, user_turn_opening, Answer, AnswerJob,
    TrainOptions, TrainReport,
};

use super::model_args::{load_model, ModelArgs};
use super::CliError;

#[derive(Args)]
pub struct TrainHeadArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The head's folder (required): checkpoints in the head's layout, `answers.json` (the
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
    /// Prompts the target writes itself besides the prompt file's: it continues the chat
    /// template's opening of a user turn (sampled, seeded), and each turn it finishes is asked
    /// afresh and answered once, greedy and sampled in turn (`self_answers.json`, reused by a
    /// later run).
    #[arg(long, default_value_t = 0)]
    self_prompts: usize,
    /// Tokens of a prompt the target writes; one it has not finished by then is dropped.
    #[arg(long, default_value_t = 128)]
    self_prompt_tokens: usize,
    /// Temperature the target writes its prompts at.
    #[arg(long, default_value_t = 1.0)]
    self_prompt_temperature: f32,
    /// Start from this head folder's weights instead of random ones (fine-tuning it on this
    /// run's answers; its draft vocabulary is ranked again over them). A resumed run ignores it
    /// [default: none, random weights].
    #[arg(long)]
    init: Option<PathBuf>,
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
    /// Tokens of the draft vocabulary the token loss covers (0 = the whole vocabulary); an
    /// EAGLE-3 head's own vocabulary is these tokens.
    #[arg(long, default_value_t = 8192)]
    draft_vocab: usize,
    /// The head's layout: `eagle` (fc over the embedding and the target's last state) or
    /// `eagle3` (fc over three layers' inputs, its own norms and output head over the draft
    /// vocabulary, trained on the token loss alone).
    #[arg(long, default_value = "eagle", value_parser = ["eagle", "eagle3"])]
    layout: String,
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
    let template = tok.chat_template().ok_or(CliError::NoChatTemplate)?;
    let target = Arc::new(loaded.model);
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    let answerer = Answerer {
        rt: super::async_runtime()?,
        target: &target,
        tok,
        template,
        threads,
    };
    let dev_path = args.out.join("answers.json");
    let mut answers = match read_answers(&dev_path)? {
        Some(answers) => answers,
        None => {
            let answers = answerer.answer_prompt_file(&args)?;
            write_answers(&args.out, &dev_path, &answers)?;
            answers
        }
    };
    if args.self_prompts > 0 {
        let self_path = args.out.join("self_answers.json");
        let written = match read_answers(&self_path)? {
            Some(answers) => answers,
            None => {
                let answers = answerer.answer_self_prompts(&args)?;
                write_answers(&args.out, &self_path, &answers)?;
                answers
            }
        };
        println!(
            "{} prompts the target wrote itself, answered",
            written.len()
        );
        answers.extend(written);
    }
    let opts = train_options(&args);
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
    print_curve(&report);
    println!("head written to {}", args.out.display());
    Ok(())
}

fn flag(flag: &'static str, reason: String) -> CliError {
    CliError::Flag { flag, reason }
}

/// The target answering prompts on this machine: what every stage of generating the training
/// data shares.
struct Answerer<'a> {
    rt: tokio::runtime::Runtime,
    target: &'a Arc<Decoder>,
    tok: &'a TextTokenizer,
    template: &'a ChatTemplate,
    threads: usize,
}

impl Answerer<'_> {
    /// The target's answers to `jobs`, `max_tokens` each at `temperature`, with a bar named
    /// `what`.
    fn ask(
        &self,
        jobs: &[AnswerJob],
        (max_tokens, temperature): (usize, f32),
        what: &str,
    ) -> Result<Vec<Answer>, CliError> {
        let mut bar = ProgressBar::default();
        self.rt
            .block_on(answer_prompts(
                Arc::clone(self.target),
                jobs,
                (max_tokens, self.tok.eos_ids()),
                temperature,
                (8, self.threads),
                &mut |done, total| bar.update(done, total, what),
            ))
            .map_err(|e| flag("--prompts", e.to_string()))
    }

    /// The answers to the prompt file's questions: each first turn, greedy and sampled, and
    /// with `--turns 2` each second turn after each first answer.
    fn answer_prompt_file(&self, args: &TrainHeadArgs) -> Result<Vec<Answer>, CliError> {
        let all = tandem::bench::load_prompts(&args.prompts)?;
        let mut prompts = tandem::bench::every_nth(all, args.leave_out, false);
        if args.limit > 0 {
            prompts.truncate(args.limit);
        }
        let firsts = self.first_turns(&prompts)?;
        let prompt_tokens: Vec<Vec<u32>> = firsts.iter().map(|f| f.2.clone()).collect();
        let jobs = answer_jobs(&prompt_tokens, args.sampled, args.seed);
        let answering = (args.max_tokens, args.temperature);
        let mut answers = self.ask(&jobs, answering, "target answers")?;
        if args.turns == 2 {
            let seconds = self.second_turns(&firsts, &jobs, &answers, 1 + args.sampled)?;
            answers.extend(self.ask(&seconds, answering, "second turns")?);
        }
        Ok(answers)
    }

    /// Each question's first turn as a conversation, its second turn if any, and the rendered
    /// first turn's tokens.
    fn first_turns(&self, prompts: &[BenchPrompt]) -> Result<Vec<FirstTurn>, CliError> {
        let mut firsts = Vec::with_capacity(prompts.len());
        for p in prompts {
            let Some(first) = p.turns.first() else {
                continue;
            };
            let conversation = vec![ChatMessage::new("user", first.clone())];
            let rendered = self.template.render(&conversation, true)?;
            firsts.push((
                conversation,
                p.turns.get(1).cloned(),
                self.tok.encode(&rendered, true)?,
            ));
        }
        Ok(firsts)
    }

    /// Each first answer, in its conversation, before the question's second turn; `per` jobs
    /// answered each question.
    fn second_turns(
        &self,
        firsts: &[FirstTurn],
        jobs: &[AnswerJob],
        answers: &[Answer],
        per: usize,
    ) -> Result<Vec<AnswerJob>, CliError> {
        let tok = self.tok;
        let mut seconds = Vec::new();
        for (n, (job, answer)) in jobs.iter().zip(answers).enumerate() {
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
            let rendered = self.template.render(&turns, true)?;
            seconds.push(AnswerJob {
                prompt: tok.encode(&rendered, true)?,
                seed: job.seed.map(|s| s ^ 0x5eed_0002),
            });
        }
        Ok(seconds)
    }

    /// The target writes user turns from the template's opening of one, sampled (seeded); each
    /// finished one, asked afresh, gets one answer, greedy and sampled in turn.
    fn answer_self_prompts(&self, args: &TrainHeadArgs) -> Result<Vec<Answer>, CliError> {
        let opening =
            user_turn_opening(self.template).map_err(|e| flag("--model", e.to_string()))?;
        let opening = self.tok.encode(&opening, true)?;
        let jobs: Vec<AnswerJob> = (0..args.self_prompts)
            .map(|i| AnswerJob {
                prompt: opening.clone(),
                seed: Some(args.seed ^ (0x5e1f_0000_0000 + i as u64)),
            })
            .collect();
        let turns = self.ask(
            &jobs,
            (args.self_prompt_tokens, args.self_prompt_temperature),
            "prompts the target writes",
        )?;
        let questions = self.written_questions(&turns)?;
        let jobs: Vec<AnswerJob> = questions
            .into_iter()
            .enumerate()
            .map(|(i, prompt)| AnswerJob {
                prompt,
                seed: (i % 2 == 1).then(|| args.seed ^ (0x5e1f_0001_0000 + i as u64)),
            })
            .collect();
        self.ask(
            &jobs,
            (args.max_tokens, args.temperature),
            "answers to them",
        )
    }

    /// The user turns the target finished, each once, rendered as a fresh question.
    fn written_questions(&self, turns: &[Answer]) -> Result<Vec<Vec<u32>>, CliError> {
        let mut seen = std::collections::HashSet::new();
        let mut questions = Vec::new();
        for turn in turns {
            let Some(words) = finished_turn(&turn.tokens[turn.answer_from..], self.tok.eos_ids())
            else {
                continue;
            };
            let text = self.tok.decode(words)?;
            if text.trim().is_empty() || !seen.insert(text.clone()) {
                continue;
            }
            let rendered = self
                .template
                .render(&[ChatMessage::new("user", text)], true)?;
            questions.push(self.tok.encode(&rendered, true)?);
        }
        Ok(questions)
    }
}

/// A question's first turn as a conversation, its second turn if any, and the rendered first
/// turn's tokens.
type FirstTurn = (Vec<ChatMessage>, Option<String>, Vec<u32>);

fn train_options(args: &TrainHeadArgs) -> TrainOptions {
    TrainOptions {
        out: args.out.clone(),
        epochs: args.epochs,
        draft_vocab: args.draft_vocab,
        intermediate: args.intermediate,
        holdout: args.holdout,
        init: args.init.clone(),
        eagle3: args.layout == "eagle3",
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
    }
}

/// The training curve as a Markdown table on stdout.
fn print_curve(report: &TrainReport) {
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
}

/// Answers a run wrote before (`None`: none yet).
fn read_answers(path: &Path) -> Result<Option<Vec<Answer>>, CliError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(serde_json::from_str(&text)?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CliError::ReadFile {
            path: path.to_owned(),
            source: e,
        }),
    }
}

fn write_answers(dir: &Path, path: &Path, answers: &[Answer]) -> Result<(), CliError> {
    let write = |p: &Path, e| CliError::WriteFile {
        path: p.to_owned(),
        source: e,
    };
    std::fs::create_dir_all(dir).map_err(|e| write(dir, e))?;
    std::fs::write(path, serde_json::to_string(answers)?).map_err(|e| write(path, e))
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
