//! Engine events into OpenAI responses: the whole JSON body of a finished request, and the
//! shapes of the chunks a streamed one sends (`stream.rs` sends them).

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::error::ApiError;
use super::logprobs_json::{chat_content, CompletionLogprobs};
use super::tool_fields::{call_id, call_json};
use crate::constraint::tools::{parse_calls, ToolStream};
use crate::engine::{Completion, FinishReason, SourceRun, Usage};
use crate::model::text::harmony::HarmonySplit;
use crate::model::TextTokenizer;
use crate::sampling::TokenLogprob;

/// Which endpoint a request came through: it decides the response's shape.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Endpoint {
    Completions,
    Chat,
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(super) struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    pub tokenizer: Arc<TextTokenizer>,
    pub report: Report,
}

/// What each choice reports besides its text.
pub(super) struct Report {
    /// Chat `logprobs: true`, or completions `logprobs: N`.
    pub logprobs: bool,
    /// Choices of each prompt (`n`); choice `i` answers prompt `i / n`.
    pub choices_per_prompt: usize,
    /// Completions `echo`: each prompt, put before the text of its choices (empty: no echo).
    pub echo: Vec<Echo>,
    /// The tokens that end the output; like their text, their logprobs are not reported.
    pub eos_ids: Vec<u32>,
    /// Chat with tools the model may call: an answer that is calls is reported as
    /// `tool_calls`.
    pub tools: bool,
    /// The field whose constraint the output follows (`tools` for tools): named by an error
    /// when the grammar becomes too complex to follow part-way.
    pub constraint_field: Option<&'static str>,
    /// `speculative.token_sources`: each choice carries runs of its text by who wrote them.
    pub token_sources: bool,
    /// Chat with a model answering in harmony's channels (gpt-oss): the analysis channel is
    /// `reasoning_content`, the rest `content`, the markup neither.
    pub harmony: bool,
}

impl Report {
    /// An engine failure as the client sees it: a grammar too complex to follow names the
    /// field that set it.
    pub(super) fn failure(&self, f: &crate::engine::Failure) -> ApiError {
        let message = format!("Generation failed: {}", f.message);
        match (f.code, f.by_request) {
            (Some(code), _) => {
                let mut e = match self.constraint_field {
                    Some(field) => ApiError::invalid_param(field, message),
                    None => ApiError::invalid(message),
                };
                e.code = Some(code);
                e
            }
            (None, true) => ApiError::invalid(message),
            (None, false) => ApiError::internal(message),
        }
    }
}

pub(super) struct Echo {
    pub text: String,
    pub tokens: Vec<u32>,
}

/// Every choice's usage together, in choice order: each prompt counted once (its choices share
/// its prefill), the completions and the speculation counters summed.
pub(super) fn total_usage(usages: &[Usage], choices_per_prompt: usize) -> Usage {
    let mut total = Usage {
        prompt_tokens: usages
            .iter()
            .step_by(choices_per_prompt.max(1))
            .map(|u| u.prompt_tokens)
            .sum(),
        cached_tokens: usages
            .iter()
            .step_by(choices_per_prompt.max(1))
            .map(|u| u.cached_tokens)
            .sum(),
        ..Usage::default()
    };
    for u in usages {
        total.completion_tokens += u.completion_tokens;
        total.speculative.rounds += u.speculative.rounds;
        total.speculative.draft_tokens += u.speculative.draft_tokens;
        total.speculative.accepted_tokens += u.speculative.accepted_tokens;
        total.speculative.tree_rounds += u.speculative.tree_rounds;
        total.speculative.tree_nodes += u.speculative.tree_nodes;
        total.speculative.tree_branch_accepts += u.speculative.tree_branch_accepts;
        total.speculative.forced_tokens += u.speculative.forced_tokens;
        total.speculative.forced_accepted += u.speculative.forced_accepted;
    }
    total
}

fn usage_json(u: &Usage) -> Value {
    let s = &u.speculative;
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "speculative": {
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate(),
            "mean_accepted_length": s.mean_accepted_length(),
            "rounds": s.rounds,
            "tree_rounds": s.tree_rounds,
            "tree_nodes": s.tree_nodes,
            "tree_branch_accepts": s.tree_branch_accepts,
            "forced_tokens": s.forced_tokens,
            "forced_accepted_tokens": s.forced_accepted,
        },
    })
}

/// What one output event (or a whole finished choice) brings a choice.
#[derive(Clone, Copy)]
pub(super) struct OutputShare<'a> {
    pub text: &'a str,
    pub tokens: &'a [u32],
    pub logprobs: &'a [TokenLogprob],
    pub prompt_logprobs: &'a [TokenLogprob],
    pub sources: &'a [SourceRun],
}

/// A token source run as the API reports it: `source`, `drafter` (drafts only), `text`,
/// `tokens`.
fn source_run_json(run: &SourceRun) -> Value {
    let mut v = json!({"source": run.source.as_str(), "text": run.text, "tokens": run.tokens});
    if let Some(d) = run.source.drafter() {
        v["drafter"] = json!(d.as_str());
    }
    v
}

/// One choice's output as its events come: the echoed prompt before its first text, and its
/// logprobs entries until they are sent.
#[derive(Default)]
pub(super) struct ChoiceOut {
    started: bool,
    chat_logprobs: Vec<Value>,
    completion_logprobs: CompletionLogprobs,
    /// Token source runs gathered since they were last sent, in the API's shape.
    sources: Vec<Value>,
    /// With tools: the answer's text split into text and calls as it streams.
    pub tool_stream: ToolStream,
    /// With a harmony model: the answer's text split into reasoning and content.
    pub harmony: HarmonySplit,
}

impl ChoiceOut {
    /// Takes one output event's share; returns the text to send.
    pub(super) fn absorb(
        &mut self,
        meta: &ResponseMeta,
        index: usize,
        out: OutputShare<'_>,
    ) -> String {
        let OutputShare {
            text,
            tokens,
            logprobs,
            prompt_logprobs,
            sources,
        } = out;
        let tok = &meta.tokenizer;
        let r = &meta.report;
        let mut delta = String::new();
        if !self.started {
            self.started = true;
            if let Some(echo) = r.echo.get(index / r.choices_per_prompt.max(1)) {
                delta.push_str(&echo.text);
                if r.token_sources {
                    self.sources.push(json!({
                        "source": "prompt", "text": echo.text, "tokens": echo.tokens.len(),
                    }));
                }
                if let (true, Some(&first)) = (r.logprobs, echo.tokens.first()) {
                    self.completion_logprobs.push_unscored(tok, first);
                    for e in prompt_logprobs {
                        self.completion_logprobs.push(tok, e);
                    }
                }
            }
        }
        delta.push_str(text);
        if r.token_sources {
            self.sources.extend(sources.iter().map(source_run_json));
        }
        if r.logprobs {
            let reported = logprobs
                .iter()
                .zip(tokens)
                .filter(|(_, t)| !r.eos_ids.contains(t))
                .map(|(e, _)| e);
            for e in reported {
                match meta.endpoint {
                    Endpoint::Chat => self
                        .chat_logprobs
                        .extend(chat_content(tok, std::slice::from_ref(e))),
                    Endpoint::Completions => self.completion_logprobs.push(tok, e),
                }
            }
        }
        delta
    }

    /// The token source runs gathered since the last call (`None` when the request did not
    /// ask for them).
    pub(super) fn take_sources(&mut self, meta: &ResponseMeta) -> Option<Value> {
        meta.report
            .token_sources
            .then(|| Value::Array(std::mem::take(&mut self.sources)))
    }

    /// The entries gathered since the last call, in the endpoint's shape (null when the
    /// request did not ask for logprobs).
    pub(super) fn take_logprobs(&mut self, meta: &ResponseMeta) -> Value {
        if !meta.report.logprobs {
            return Value::Null;
        }
        match meta.endpoint {
            Endpoint::Chat => json!({
                "content": std::mem::take(&mut self.chat_logprobs), "refusal": null,
            }),
            Endpoint::Completions => self.completion_logprobs.take(),
        }
    }
}

impl ResponseMeta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// The whole response to a request whose choices all finished.
    pub(super) fn full(&self, done: &[Completion]) -> Value {
        let choices: Vec<Value> = done
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let mut out = ChoiceOut::default();
                let text = out.absorb(
                    self,
                    index,
                    OutputShare {
                        text: &c.text,
                        tokens: &c.tokens,
                        logprobs: &c.logprobs,
                        prompt_logprobs: &c.prompt_logprobs,
                        sources: &c.sources,
                    },
                );
                let logprobs = out.take_logprobs(self);
                let sources = out.take_sources(self);
                let finish = c.finish.as_openai();
                // An answer of calls cut by its token limit still returns every complete call
                // (and its finish reason says it was cut), as a stream releases them.
                let calls = self.report.tools.then(|| parse_calls(&text)).flatten();
                let mut choice = match self.endpoint {
                    Endpoint::Completions => json!({
                        "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
                    }),
                    Endpoint::Chat if calls.is_some() => {
                        let calls: Vec<Value> = calls
                            .into_iter()
                            .flatten()
                            .enumerate()
                            .map(|(k, call)| call_json(&call, &call_id(&self.id, index, k), None))
                            .collect();
                        let finish = match c.finish {
                            FinishReason::Stop => "tool_calls",
                            other => other.as_openai(),
                        };
                        let mut message = json!({"role": "assistant", "content": null});
                        if !calls.is_empty() {
                            message["tool_calls"] = Value::Array(calls);
                        }
                        json!({
                            "index": index,
                            "message": message,
                            "logprobs": logprobs,
                            "finish_reason": finish,
                        })
                    }
                    Endpoint::Chat if self.report.harmony => {
                        let (reasoning, content) = HarmonySplit::split(&text);
                        let mut message = json!({"role": "assistant", "content": content});
                        if !reasoning.is_empty() {
                            message["reasoning_content"] = reasoning.into();
                        }
                        json!({
                            "index": index,
                            "message": message,
                            "logprobs": logprobs,
                            "finish_reason": finish,
                        })
                    }
                    Endpoint::Chat => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }),
                };
                if let Some(runs) = sources {
                    choice["token_sources"] = runs;
                }
                choice
            })
            .collect();
        let usages: Vec<Usage> = done.iter().map(|c| c.usage.clone()).collect();
        json!({
            "id": self.id, "object": self.object(false), "created": self.created,
            "model": self.model, "choices": choices,
            "usage": usage_json(&total_usage(&usages, self.report.choices_per_prompt)),
        })
    }

    /// A streamed chunk of choice `index`: `delta` text, `first` (chat: announces the role),
    /// logprobs, or the end.
    pub(super) fn chunk(
        &self,
        index: usize,
        delta: Option<&str>,
        first: bool,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": delta.unwrap_or(""), "logprobs": logprobs,
                "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let mut d = serde_json::Map::new();
                if first {
                    d.insert("role".into(), "assistant".into());
                }
                if let Some(t) = delta {
                    d.insert("content".into(), t.into());
                }
                json!({"index": index, "delta": d, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [choice],
        })
    }

    /// A streamed chunk of choice `index`'s reasoning (a harmony model's analysis channel).
    pub(super) fn reasoning_chunk(&self, index: usize, text: &str, logprobs: Value) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [{
                "index": index, "delta": {"reasoning_content": text}, "logprobs": logprobs,
                "finish_reason": null,
            }],
        })
    }

    /// `chunk` (of one choice) with the token source runs of its text, when asked for.
    pub(super) fn with_sources(mut chunk: Value, runs: Option<Value>) -> Value {
        if let (Some(runs), Some(choice)) = (runs, chunk["choices"].get_mut(0)) {
            choice["token_sources"] = runs;
        }
        chunk
    }

    /// A streamed chat chunk of choice `index` carrying one whole tool call (OpenAI's clients
    /// assemble calls from such deltas by their `index`).
    pub(super) fn tool_chunk(&self, index: usize, call: Value, logprobs: Value) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model,
            "choices": [{
                "index": index, "delta": {"tool_calls": [call]}, "logprobs": logprobs,
                "finish_reason": null,
            }],
        })
    }

    pub(super) fn usage_chunk(&self, usage: &Usage) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [], "usage": usage_json(usage),
        })
    }
}

/// The one log line every finished request gets.
pub(super) fn log_finished(finish: FinishReason, u: &Usage, started: Instant) {
    tracing::info!(
        finish = finish.as_openai(),
        prompt_tokens = u.prompt_tokens,
        completion_tokens = u.completion_tokens,
        draft_tokens = u.speculative.draft_tokens,
        accepted_tokens = u.speculative.accepted_tokens,
        seconds = started.elapsed().as_secs_f64(),
        "request finished"
    );
}
