//! One question under one mode: its turns asked in order, each after the target's answers to
//! the ones before it, every turn timed and recorded.
//!
//! Why it exists: a multi-turn question is a conversation, and its later turns reuse what the
//! earlier ones cached; how one turn is asked, awaited and recorded is the same for every mode.

use std::sync::Arc;
use std::time::Instant;

use crate::constraint::CompiledConstraint;
use crate::engine::{
    Engine, EngineEvent, EngineRequest, EventStream, FinishReason, GenerationRequest,
    RequestSpeculation, Usage,
};
use crate::model::{ChatMessage, TextTokenizer};
use crate::sampling::SamplingParams;

use super::mode::{Mode, Structured};
use super::options::BenchOptions;
use super::prompts::BenchPrompt;
use super::report::RunRecord;
use super::structured_workloads::{Structures, JSON_INSTRUCTION};
use super::BenchError;

/// What one request of a question needs besides its messages.
#[derive(Clone)]
pub(super) struct Job {
    pub(super) mode: Mode,
    pub(super) prompt: BenchPrompt,
    pub(super) repeat: usize,
}

/// One turn's answer as the engine streamed it, and its timing.
struct TurnAnswer {
    tokens: Vec<u32>,
    /// Seconds to the first token (`None`: no token came).
    ttft: Option<f64>,
    seconds: f64,
    finish: FinishReason,
    usage: Usage,
}

/// Runs all turns of one question under one mode.
pub(super) async fn run_question(
    engine: Arc<Engine>,
    tokenizer: Arc<TextTokenizer>,
    (opts, structures): (Arc<BenchOptions>, Arc<Structures>),
    job: Job,
) -> Result<Vec<RunRecord>, BenchError> {
    let template = tokenizer
        .chat_template()
        .ok_or_else(|| BenchError::Options("the model has no chat template".into()))?;
    let (constraint, tools_prompt) = structures.of(job.mode.structured);
    let mut messages = opening_messages(&opts, tools_prompt);
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
        let request = engine_request(&opts, &job, &tokenizer, turn, prompt, constraint.clone());
        let started = Instant::now();
        let mut events = engine.submit(request).await.map_err(|e| {
            BenchError::Options(format!(
                "question {} turn {}: {e}",
                job.prompt.question_id,
                turn + 1
            ))
        })?;
        let answer = collect_answer(&mut events, started).await?;
        let text = tokenizer
            .decode(&answer.tokens)
            .map_err(|e| BenchError::Options(format!("tokenizer: {e}")))?;
        messages.push(ChatMessage::new("assistant", text));
        records.push(run_record(&job, turn, prompt_tokens, answer));
    }
    Ok(records)
}

/// The system message every turn follows: the run's system prompt and a structure's tools
/// prompt, either or both (none: no system message).
fn opening_messages(opts: &BenchOptions, tools_prompt: Option<&str>) -> Vec<ChatMessage> {
    let system: Vec<&str> = opts
        .system_prompt
        .iter()
        .map(String::as_str)
        .chain(tools_prompt)
        .collect();
    if system.is_empty() {
        Vec::new()
    } else {
        vec![ChatMessage::new("system", system.join("\n\n"))]
    }
}

/// One turn's request: the run's sampling with a seed of its own (the same in every mode, so
/// sampled modes are compared on the same draws), and the mode's speculation.
fn engine_request(
    opts: &BenchOptions,
    job: &Job,
    tokenizer: &TextTokenizer,
    turn: usize,
    prompt: Vec<u32>,
    constraint: Option<CompiledConstraint>,
) -> EngineRequest {
    let seed = opts
        .seed
        .wrapping_add(job.prompt.question_id as u64 * 1_000_003)
        .wrapping_add(turn as u64 * 7919)
        .wrapping_add(job.repeat as u64 * 104_729);
    EngineRequest {
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
            cache_scope: 0,
        },
        speculative: RequestSpeculation {
            gamma: job.mode.gamma,
            lenience: job.mode.lenience,
            gate: job.mode.gate,
            confidence_pricing: job.mode.confidence_pricing,
            tree_nodes: job.mode.tree_nodes,
            sampled_drafts: job.mode.sampled_drafts,
            token_sources: false,
        },
        logprobs: None,
        prompt_logprobs: None,
        constraint,
    }
}

/// The turn's tokens as they stream in, until the engine says it is done.
async fn collect_answer(
    events: &mut EventStream,
    started: Instant,
) -> Result<TurnAnswer, BenchError> {
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
    Ok(TurnAnswer {
        tokens,
        ttft,
        seconds,
        finish,
        usage,
    })
}

fn run_record(job: &Job, turn: usize, prompt_tokens: usize, answer: TurnAnswer) -> RunRecord {
    let TurnAnswer {
        tokens,
        ttft,
        seconds,
        finish,
        usage,
    } = answer;
    RunRecord {
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
    }
}
