//! Running a benchmark: one engine per drafter/pipelining combination over the same target
//! weights, every mode on every prompt, interleaved so machine noise hits all modes alike.
//!
//! Why it exists: speed claims are only fair when plain and speculative decoding run in the
//! same process, on the same prompts, at the same time of day; this is that loop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;

use crate::constraint::ConstraintVocabulary;
use crate::draft::{DraftSpec, LoadedDrafter};
use crate::engine::{Engine, EngineConfig, Gamma, SpeculationSettings};
use crate::model::{Decoder, TextTokenizer};

use super::mode::{EngineKey, Mode};
use super::options::BenchOptions;
use super::prompts::BenchPrompt;
use super::question::{run_question, Job};
use super::report::{BatchRecord, RunRecord};
use super::structured_workloads::Structures;
use super::BenchError;

/// The models a benchmark runs on.
pub struct BenchModels {
    pub target: Arc<Decoder>,
    pub tokenizer: Arc<TextTokenizer>,
    /// The draft model, for `draft` modes.
    pub draft: Option<LoadedDrafter>,
    /// The draft head, for `head` modes.
    pub head: Option<LoadedDrafter>,
    /// What structured modes compile their constraints against.
    pub constraints: Option<Arc<ConstraintVocabulary>>,
}

/// Progress as the loop reports it: `done` of `total` requests, and what just finished.
pub struct Progress<'a> {
    pub done: usize,
    pub total: usize,
    pub what: &'a str,
}

pub struct BenchRun {
    pub runs: Vec<RunRecord>,
    pub batches: Vec<BatchRecord>,
    pub categories: Vec<String>,
    pub engines: Vec<EngineReport>,
}

/// One engine of the run: its modes, and how much of its busy time the drafter and the
/// verifier ran at once (non-zero only with pipelining).
#[derive(Clone, Debug, serde::Serialize)]
pub struct EngineReport {
    pub modes: Vec<String>,
    pub pipeline: bool,
    pub rounds: u64,
    pub overlap_ratio: f64,
    /// Next rounds drafted during a verification within a request, and how many were used.
    pub drafted_ahead: u64,
    pub ahead_used: u64,
}

/// The loaded drafter `spec` names, from the models loaded once for every mode.
fn loaded_drafter(
    spec: &DraftSpec,
    mode: &Mode,
    models: &BenchModels,
) -> Result<LoadedDrafter, BenchError> {
    let missing = |what: &str| BenchError::Options(format!("mode `{}` needs {what}", mode.label));
    let mut drafter = match spec {
        DraftSpec::PromptLookup(p) => return Ok(LoadedDrafter::PromptLookup(*p)),
        DraftSpec::LookupThen(first, model) => {
            return Ok(loaded_drafter(model, mode, models)?.with_lookup_first(*first))
        }
        DraftSpec::Head { lookup, .. } => {
            let head = models.head.clone().ok_or_else(|| missing("a draft head"))?;
            return Ok(match lookup {
                Some(first) => head.with_lookup_first(*first),
                None => head,
            });
        }
        DraftSpec::None | DraftSpec::Model(_) | DraftSpec::SelfLayers(_) => models
            .draft
            .clone()
            .ok_or_else(|| missing("a draft model"))?,
    };
    if let Some(g) = mode.cross_vocabulary {
        match &mut drafter {
            LoadedDrafter::Model {
                translation: Some(t),
                ..
            } => *t = Arc::new((**t).clone().with_greedy(g)),
            _ => {
                return Err(BenchError::Options(format!(
                    "mode `{}`: cross_vocabulary is for a draft model of another vocabulary \
                     than the target's",
                    mode.label
                )))
            }
        }
    }
    Ok(drafter)
}

/// The run's engines, one per drafter and pipelining combination (a mode's `engine_key`).
type Engines = BTreeMap<EngineKey, Arc<Engine>>;

async fn start_engines(models: &BenchModels, opts: &BenchOptions) -> Result<Engines, BenchError> {
    let mut engines = BTreeMap::new();
    for mode in &opts.modes {
        let key = mode.engine_key();
        if engines.contains_key(&key) {
            continue;
        }
        let draft = match &mode.drafter {
            Some(spec) => Some(loaded_drafter(spec, mode, models)?),
            None => None,
        };
        // Pipelined, the drafter and the verifier run at once: split the threads between
        // them. Otherwise they take turns, each with all of them.
        let (target_threads, draft_threads) = if mode.pipeline {
            let t = (opts.threads / 2).max(1);
            (opts.threads.saturating_sub(t).max(1), t)
        } else {
            (opts.threads, opts.threads)
        };
        let cfg = EngineConfig {
            max_seqs: opts.concurrency,
            max_queue: opts.concurrency * 2,
            prefill_chunk: opts.prefill_chunk,
            pipeline: mode.pipeline,
            target_threads,
            draft_threads,
            gamma_limit: opts.max_gamma,
            prefix_cache: mode.prefix_cache,
            speculation: SpeculationSettings {
                gamma: bench_gamma(4.min(opts.max_gamma))?,
                gamma_max: bench_gamma(opts.max_gamma)?,
                ..SpeculationSettings::default()
            },
            ..EngineConfig::default()
        };
        let engine = Engine::start(Arc::clone(&models.target), draft, cfg).await?;
        engines.insert(key, Arc::new(engine));
    }
    Ok(engines)
}

/// Runs one batch (up to `concurrency` questions) under one mode; returns its records and the
/// wall time.
async fn run_batch(
    engine: &Arc<Engine>,
    tokenizer: &Arc<TextTokenizer>,
    (opts, structures): (&Arc<BenchOptions>, &Arc<Structures>),
    jobs: Vec<Job>,
) -> Result<(Vec<RunRecord>, f64), BenchError> {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for (i, job) in jobs.into_iter().enumerate() {
        let fut = run_question(
            Arc::clone(engine),
            Arc::clone(tokenizer),
            (Arc::clone(opts), Arc::clone(structures)),
            job,
        );
        set.spawn(async move { (i, fut.await) });
    }
    let mut out: Vec<(usize, Vec<RunRecord>)> = Vec::new();
    while let Some(joined) = set.join_next().await {
        let (i, r) = joined.map_err(|e| BenchError::Generation(format!("task failed: {e}")))?;
        out.push((i, r?));
    }
    out.sort_by_key(|(i, _)| *i);
    let wall = started.elapsed().as_secs_f64();
    Ok((out.into_iter().flat_map(|(_, r)| r).collect(), wall))
}

/// Runs every mode on every prompt, `repeat` times, after `warmup` discarded questions.
pub async fn run_bench(
    models: &BenchModels,
    prompts: &[BenchPrompt],
    opts: BenchOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<BenchRun, BenchError> {
    check_options(&opts)?;
    let structures = Arc::new(Structures::compile(
        models.constraints.as_deref(),
        &opts.modes,
        &opts.json_whitespace,
    )?);
    let engines = start_engines(models, &opts).await?;
    let opts = Arc::new(opts);
    let categories = categories_of(prompts);
    let batches_of_prompts = batches_by_category(prompts, &categories, opts.concurrency);
    let bench = BenchLoop {
        engines: &engines,
        tokenizer: &models.tokenizer,
        opts: &opts,
        structures: &structures,
    };
    bench.warm_up(prompts).await?;
    let total = opts.repeat * opts.modes.len() * prompts.len();
    let (mut runs, batches) = bench
        .run_timed(&batches_of_prompts, total, progress)
        .await?;
    if opts.sampling.temperature == 0.0 {
        mark_matches(&mut runs, &opts.modes);
    }
    let engines = engine_reports(&engines, &opts.modes).await?;
    Ok(BenchRun {
        runs,
        batches,
        categories,
        engines,
    })
}

/// Refuses options no run can honour, before any engine starts.
fn check_options(opts: &BenchOptions) -> Result<(), BenchError> {
    if opts.concurrency == 0 || opts.repeat == 0 || opts.max_tokens == 0 {
        return Err(BenchError::Options(
            "--concurrency, --repeat and --max-tokens must be at least 1".into(),
        ));
    }
    if opts.ignore_eos && opts.modes.iter().any(|m| m.structured.is_constrained()) {
        return Err(BenchError::Options(
            "structured modes end their answers with the end-of-sequence token: drop \
             --ignore-eos"
                .into(),
        ));
    }
    Ok(())
}

/// The prompts' categories, in the order they first appear.
fn categories_of(prompts: &[BenchPrompt]) -> Vec<String> {
    let mut categories: Vec<String> = Vec::new();
    for p in prompts {
        if !categories.contains(&p.category) {
            categories.push(p.category.clone());
        }
    }
    categories
}

/// The prompts in batches of up to `concurrency`, category by category.
fn batches_by_category(
    prompts: &[BenchPrompt],
    categories: &[String],
    concurrency: usize,
) -> Vec<Vec<BenchPrompt>> {
    // Batches never mix categories, so each batch's wall time belongs to one category.
    let mut batches_of_prompts: Vec<Vec<BenchPrompt>> = Vec::new();
    for c in categories {
        let of_c: Vec<BenchPrompt> = prompts
            .iter()
            .filter(|p| &p.category == c)
            .cloned()
            .collect();
        for chunk in of_c.chunks(concurrency) {
            batches_of_prompts.push(chunk.to_vec());
        }
    }
    batches_of_prompts
}

/// What every batch of a run shares: the engines, the tokenizer, the options and the compiled
/// structures.
struct BenchLoop<'a> {
    engines: &'a Engines,
    tokenizer: &'a Arc<TextTokenizer>,
    opts: &'a Arc<BenchOptions>,
    structures: &'a Arc<Structures>,
}

impl BenchLoop<'_> {
    fn engine_of(&self, m: &Mode) -> Arc<Engine> {
        Arc::clone(&self.engines[&m.engine_key()])
    }

    /// The first `warmup` questions under every mode, one at a time, their records dropped.
    async fn warm_up(&self, prompts: &[BenchPrompt]) -> Result<(), BenchError> {
        for (w, p) in prompts.iter().take(self.opts.warmup).enumerate() {
            for m in &self.opts.modes {
                let job = Job {
                    mode: m.clone(),
                    prompt: p.clone(),
                    repeat: w,
                };
                run_batch(
                    &self.engine_of(m),
                    self.tokenizer,
                    (self.opts, self.structures),
                    vec![job],
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Every batch under every mode, `repeat` times; `total` requests in all, for progress.
    async fn run_timed(
        &self,
        batches_of_prompts: &[Vec<BenchPrompt>],
        total: usize,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(Vec<RunRecord>, Vec<BatchRecord>), BenchError> {
        let modes = &self.opts.modes;
        let mut done = 0;
        let (mut runs, mut batches) = (Vec::new(), Vec::new());
        for repeat in 0..self.opts.repeat {
            for (bi, batch) in batches_of_prompts.iter().enumerate() {
                // Rotate the order of modes from batch to batch so none always runs first.
                for k in 0..modes.len() {
                    let mode = &modes[(bi + repeat + k) % modes.len()];
                    let (records, record) = self.run_timed_batch(mode, batch, repeat).await?;
                    batches.push(record);
                    runs.extend(records);
                    done += batch.len();
                    let what = format!(
                        "{} #{} {}",
                        batch[0].category, batch[0].question_id, mode.label
                    );
                    progress(Progress {
                        done,
                        total,
                        what: &what,
                    });
                }
            }
        }
        Ok((runs, batches))
    }

    /// One batch under one mode: its questions' records and the batch's own.
    async fn run_timed_batch(
        &self,
        mode: &Mode,
        batch: &[BenchPrompt],
        repeat: usize,
    ) -> Result<(Vec<RunRecord>, BatchRecord), BenchError> {
        let jobs: Vec<Job> = batch
            .iter()
            .map(|p| Job {
                mode: mode.clone(),
                prompt: p.clone(),
                repeat,
            })
            .collect();
        // Every mode's batch starts from the same cold cache (its conversations' later
        // turns still reuse their own earlier turns); a shared system prompt is a
        // workload meant to stay cached, so it keeps what earlier batches left.
        if self.opts.system_prompt.is_none() {
            self.engine_of(mode).clear_prefix_cache().await?;
        }
        let (records, wall) = run_batch(
            &self.engine_of(mode),
            self.tokenizer,
            (self.opts, self.structures),
            jobs,
        )
        .await?;
        let record = BatchRecord {
            mode: mode.label.clone(),
            category: batch[0].category.clone(),
            repeat,
            requests: batch.len(),
            tokens: records.iter().map(|r| r.completion_tokens).sum(),
            seconds: wall,
        };
        Ok((records, record))
    }
}

/// Each engine's modes and its pipelining figures.
async fn engine_reports(
    engines: &Engines,
    modes: &[Mode],
) -> Result<Vec<EngineReport>, BenchError> {
    let mut reports = Vec::new();
    for (key, engine) in engines {
        let stats = engine.stats().await?;
        reports.push(EngineReport {
            modes: modes
                .iter()
                .filter(|m| &m.engine_key() == key)
                .map(|m| m.label.clone())
                .collect(),
            pipeline: key.2,
            rounds: stats.rounds,
            overlap_ratio: stats.overlap_ratio,
            drafted_ahead: stats.drafted_ahead,
            ahead_used: stats.ahead_used,
        });
    }
    Ok(reports)
}

/// Greedy runs: each speculative mode's tokens against its baseline's (plain decoding under
/// the same structure) for the same question, repeat and turn (Spec-Bench's equality check).
/// A constrained plain mode's answers differ from free decoding's by design: not compared.
pub fn mark_matches(runs: &mut [RunRecord], modes: &[Mode]) {
    for mode in modes.iter().filter(|m| !m.is_plain()) {
        let Some(base) = mode.baseline(modes) else {
            continue;
        };
        let reference: BTreeMap<(i64, usize, usize), Vec<u32>> = runs
            .iter()
            .filter(|r| r.mode == base.label)
            .map(|r| ((r.question_id, r.repeat, r.turn), r.tokens.clone()))
            .collect();
        for r in runs.iter_mut().filter(|r| r.mode == mode.label) {
            r.outputs_match = reference
                .get(&(r.question_id, r.repeat, r.turn))
                .map(|t| t == &r.tokens);
        }
    }
}

fn bench_gamma(v: usize) -> Result<Gamma, BenchError> {
    Gamma::try_from(v).map_err(|e| BenchError::Options(format!("--max-gamma {e}")))
}
