//! Running a benchmark: one engine per drafter/pipelining combination over the same target
//! weights, every mode on every prompt, interleaved so machine noise hits all modes alike.
//!
//! Why it exists: speed claims are only fair when plain and speculative decoding run in the
//! same process, on the same prompts, at the same time of day; this is that loop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;

use crate::engine::{
    DraftSource, Engine, EngineConfig, EngineEvent, EngineRequest, Gamma, GenerationRequest,
    RequestSpeculation, SpeculationSettings,
};
use crate::model::{ChatMessage, Llama, TextTokenizer};
use crate::sampling::SamplingParams;

use super::mode::{DrafterKind, Mode, Structured};
use super::prompts::BenchPrompt;
use super::report::{BatchRecord, RunRecord};
use super::structured::{Structures, JSON_INSTRUCTION};
use super::BenchError;
use crate::constraint::{ConstraintVocabulary, JsonWhitespace};

/// The models a benchmark runs on.
pub struct BenchModels {
    pub target: Arc<Llama>,
    pub tokenizer: Arc<TextTokenizer>,
    /// The draft model, for `draft` modes.
    pub draft: Option<DraftSource>,
    /// The draft head, for `head` modes.
    pub head: Option<DraftSource>,
    /// What structured modes compile their constraints against.
    pub constraints: Option<Arc<ConstraintVocabulary>>,
}

#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub modes: Vec<Mode>,
    /// How structured modes lay out JSON (`structured.json_whitespace`).
    pub json_whitespace: JsonWhitespace,
    pub max_tokens: usize,
    /// Temperature 0 = greedy (outputs are then compared with plain decoding's).
    pub sampling: SamplingParams,
    /// Base seed; each question, turn and repeat derives its own from it (the same in every
    /// mode).
    pub seed: u64,
    pub ignore_eos: bool,
    pub concurrency: usize,
    pub repeat: usize,
    pub warmup: usize,
    /// Compute threads in all.
    pub threads: usize,
    pub max_gamma: usize,
    pub prefill_chunk: usize,
    /// A system message before every question (a templated workload: every prompt opens the
    /// same way).
    pub system_prompt: Option<String>,
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

async fn start_engines(
    models: &BenchModels,
    opts: &BenchOptions,
) -> Result<BTreeMap<(DrafterKind, bool, bool), Arc<Engine>>, BenchError> {
    let mut engines = BTreeMap::new();
    for mode in &opts.modes {
        let key = mode.engine_key();
        if engines.contains_key(&key) {
            continue;
        }
        let draft = match mode.drafter {
            DrafterKind::None => None,
            DrafterKind::PromptLookup(p) => Some(DraftSource::PromptLookup(p)),
            DrafterKind::Model => Some(models.draft.clone().ok_or_else(|| {
                BenchError::Options(format!("mode `{}` needs a draft model", mode.label))
            })?),
            DrafterKind::Head { lookup } => {
                let mut head = models.head.clone().ok_or_else(|| {
                    BenchError::Options(format!("mode `{}` needs a draft head", mode.label))
                })?;
                if let DraftSource::Head { lookup: first, .. } = &mut head {
                    *first = lookup;
                }
                Some(head)
            }
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

/// What one request of a question needs besides its messages.
#[derive(Clone)]
struct Job {
    mode: Mode,
    prompt: BenchPrompt,
    repeat: usize,
}

/// Runs all turns of one question under one mode.
async fn run_question(
    engine: Arc<Engine>,
    tokenizer: Arc<TextTokenizer>,
    (opts, structures): (Arc<BenchOptions>, Arc<Structures>),
    job: Job,
) -> Result<Vec<RunRecord>, BenchError> {
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| BenchError::Options("the model has no chat template".into()))?;
    let (constraint, tools_prompt) = structures.of(job.mode.structured);
    let system: Vec<&str> = opts
        .system_prompt
        .iter()
        .map(String::as_str)
        .chain(tools_prompt)
        .collect();
    let mut messages: Vec<ChatMessage> = if system.is_empty() {
        Vec::new()
    } else {
        vec![ChatMessage::new("system", system.join("\n\n"))]
    };
    let mut records = Vec::new();
    for (turn, text) in job.prompt.turns.iter().enumerate() {
        let text = match job.mode.structured {
            Structured::Json => format!("{text}\n\n{JSON_INSTRUCTION}"),
            _ => text.clone(),
        };
        messages.push(ChatMessage::new("user", text));
        let rendered = template
            .render(&messages, true)
            .map_err(|e| BenchError::Options(format!("chat template: {e}")))?;
        let prompt = tokenizer
            .encode(&rendered, true)
            .map_err(|e| BenchError::Options(format!("tokenizer: {e}")))?;
        let prompt_tokens = prompt.len();
        let seed = opts
            .seed
            .wrapping_add(job.prompt.question_id as u64 * 1_000_003)
            .wrapping_add(turn as u64 * 7919)
            .wrapping_add(job.repeat as u64 * 104_729);
        let request = EngineRequest {
            generation: GenerationRequest {
                prompt,
                max_tokens: opts.max_tokens,
                sampling: SamplingParams {
                    seed: Some(seed),
                    ..opts.sampling.clone()
                },
                eos_ids: if opts.ignore_eos {
                    Vec::new()
                } else {
                    tokenizer.eos_ids().to_vec()
                },
                stop_strings: Vec::new(),
                detokenizer: None,
            },
            speculation: RequestSpeculation {
                gamma: job.mode.gamma,
                lenience: job.mode.lenience,
                gate: job.mode.gate,
                confidence_pricing: job.mode.confidence_pricing,
                tree_nodes: job.mode.tree_nodes,
            },
            logprobs: None,
            prompt_logprobs: None,
            constraint: constraint.clone(),
        };
        let started = Instant::now();
        let mut events = engine.submit(request).await.map_err(|e| {
            BenchError::Options(format!(
                "question {} turn {}: {e}",
                job.prompt.question_id,
                turn + 1
            ))
        })?;
        let (mut tokens, mut ttft) = (Vec::new(), None);
        let (finish, usage) = loop {
            match events.next().await {
                Some(EngineEvent::Output { tokens: t, .. }) => {
                    if ttft.is_none() && !t.is_empty() {
                        ttft = Some(started.elapsed().as_secs_f64());
                    }
                    tokens.extend(t);
                }
                Some(EngineEvent::Done { finish, usage }) => break (finish, usage),
                Some(EngineEvent::Failed(f)) => return Err(BenchError::Generation(f.message)),
                None => return Err(BenchError::Generation("the engine stopped".into())),
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        let answer = tokenizer
            .decode(&tokens)
            .map_err(|e| BenchError::Options(format!("tokenizer: {e}")))?;
        messages.push(ChatMessage::new("assistant", answer));
        records.push(RunRecord {
            mode: job.mode.label.clone(),
            question_id: job.prompt.question_id,
            category: job.prompt.category.clone(),
            repeat: job.repeat,
            turn,
            prompt_tokens,
            cached_tokens: usage.cached_tokens,
            completion_tokens: usage.completion_tokens,
            seconds,
            ttft_s: ttft.unwrap_or(seconds),
            draft_tokens: usage.speculative.draft_tokens,
            accepted_tokens: usage.speculative.accepted_tokens,
            rounds: usage.speculative.rounds,
            tree_rounds: usage.speculative.tree_rounds,
            tree_nodes: usage.speculative.tree_nodes,
            tree_branch_accepts: usage.speculative.tree_branch_accepts,
            forced_tokens: usage.speculative.forced_tokens,
            forced_accepted: usage.speculative.forced_accepted,
            finish: finish.as_openai().to_string(),
            outputs_match: None,
            output_digest: super::report::token_digest(&tokens),
            tokens,
        });
    }
    Ok(records)
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
    let structures = Arc::new(Structures::compile(
        models.constraints.as_deref(),
        &opts.modes,
        &opts.json_whitespace,
    )?);
    let engines = start_engines(models, &opts).await?;
    let opts = Arc::new(opts);
    let mut categories: Vec<String> = Vec::new();
    for p in prompts {
        if !categories.contains(&p.category) {
            categories.push(p.category.clone());
        }
    }
    // Batches never mix categories, so each batch's wall time belongs to one category.
    let mut batches_of_prompts: Vec<Vec<BenchPrompt>> = Vec::new();
    for c in &categories {
        let of_c: Vec<BenchPrompt> = prompts
            .iter()
            .filter(|p| &p.category == c)
            .cloned()
            .collect();
        for chunk in of_c.chunks(opts.concurrency) {
            batches_of_prompts.push(chunk.to_vec());
        }
    }
    let modes = opts.modes.clone();
    let engine_of = |m: &Mode| Arc::clone(&engines[&m.engine_key()]);

    for (w, p) in prompts.iter().take(opts.warmup).enumerate() {
        for m in &modes {
            let job = Job {
                mode: m.clone(),
                prompt: p.clone(),
                repeat: w,
            };
            run_batch(
                &engine_of(m),
                &models.tokenizer,
                (&opts, &structures),
                vec![job],
            )
            .await?;
        }
    }

    let total = opts.repeat * modes.len() * prompts.len();
    let mut done = 0;
    let (mut runs, mut batches) = (Vec::new(), Vec::new());
    for repeat in 0..opts.repeat {
        for (bi, batch) in batches_of_prompts.iter().enumerate() {
            // Rotate the order of modes from batch to batch so none always runs first.
            for k in 0..modes.len() {
                let mode = &modes[(bi + repeat + k) % modes.len()];
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
                if opts.system_prompt.is_none() {
                    engine_of(mode).clear_prefix_cache().await?;
                }
                let (records, wall) = run_batch(
                    &engine_of(mode),
                    &models.tokenizer,
                    (&opts, &structures),
                    jobs,
                )
                .await?;
                batches.push(BatchRecord {
                    mode: mode.label.clone(),
                    category: batch[0].category.clone(),
                    repeat,
                    requests: batch.len(),
                    tokens: records.iter().map(|r| r.completion_tokens).sum(),
                    seconds: wall,
                });
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
    if opts.sampling.temperature == 0.0 {
        mark_matches(&mut runs, &modes);
    }
    let mut reports = Vec::new();
    for (key, engine) in &engines {
        let stats = engine.stats().await?;
        reports.push(EngineReport {
            modes: modes
                .iter()
                .filter(|m| &m.engine_key() == key)
                .map(|m| m.label.clone())
                .collect(),
            pipeline: key.1,
            rounds: stats.rounds,
            overlap_ratio: stats.overlap_ratio,
            drafted_ahead: stats.drafted_ahead,
            ahead_used: stats.ahead_used,
        });
    }
    Ok(BenchRun {
        runs,
        batches,
        categories,
        engines: reports,
    })
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
