//! Engine events into OpenAI responses: one JSON body, or SSE chunks ending in
//! `data: [DONE]`. The streamed body owns the request's event stream, so a client that
//! disconnects drops it and the engine frees the slot within a round.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use super::logprobs::{chat_content, CompletionLogprobs};
use super::tools::{call_id, call_json};
use crate::constraint::tools::{parse_calls, StreamPiece, ToolStream};
use crate::engine::{Completion, EngineEvent, EventStream, FinishReason, Usage};
use crate::model::TextTokenizer;
use crate::sampling::TokenLogprob;

/// The finish reason of a choice the server ended (shutdown), as vLLM spells it.
const ABORTED: &str = "abort";

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
}

pub(super) struct Echo {
    pub text: String,
    pub tokens: Vec<u32>,
}

/// Every choice's usage together, in choice order: each prompt counted once (its choices share
/// its prefill), the completions and the speculation counters summed.
fn total_usage(usages: &[Usage], choices_per_prompt: usize) -> Usage {
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

/// One choice's output as its events come: the echoed prompt before its first text, and its
/// logprobs entries until they are sent.
#[derive(Default)]
struct ChoiceOut {
    started: bool,
    chat_logprobs: Vec<Value>,
    completion_logprobs: CompletionLogprobs,
    /// With tools: the answer's text split into text and calls as it streams.
    tool_stream: ToolStream,
}

impl ChoiceOut {
    /// Takes one output event's share; returns the text to send.
    fn absorb(
        &mut self,
        meta: &ResponseMeta,
        index: usize,
        text: &str,
        tokens: &[u32],
        logprobs: &[TokenLogprob],
        prompt_logprobs: &[TokenLogprob],
    ) -> String {
        let tok = &meta.tokenizer;
        let r = &meta.report;
        let mut delta = String::new();
        if !self.started {
            self.started = true;
            if let Some(echo) = r.echo.get(index / r.choices_per_prompt.max(1)) {
                delta.push_str(&echo.text);
                if let (true, Some(&first)) = (r.logprobs, echo.tokens.first()) {
                    self.completion_logprobs.push_unscored(tok, first);
                    for e in prompt_logprobs {
                        self.completion_logprobs.push(tok, e);
                    }
                }
            }
        }
        delta.push_str(text);
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

    /// The entries gathered since the last call, in the endpoint's shape (null when the
    /// request did not ask for logprobs).
    fn take_logprobs(&mut self, meta: &ResponseMeta) -> Value {
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
                    &c.text,
                    &c.tokens,
                    &c.logprobs,
                    &c.prompt_logprobs,
                );
                let logprobs = out.take_logprobs(self);
                let finish = c.finish.as_openai();
                let calls = match (self.report.tools, c.finish) {
                    (true, FinishReason::Stop) => parse_calls(&text),
                    _ => None,
                };
                match self.endpoint {
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
                        json!({
                            "index": index,
                            "message": {"role": "assistant", "content": null, "tool_calls": calls},
                            "logprobs": logprobs,
                            "finish_reason": "tool_calls",
                        })
                    }
                    Endpoint::Chat => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }),
                }
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
    fn chunk(
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

    /// A streamed chat chunk of choice `index` carrying one whole tool call (OpenAI's clients
    /// assemble calls from such deltas by their `index`).
    fn tool_chunk(&self, index: usize, call: Value, logprobs: Value) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model,
            "choices": [{
                "index": index, "delta": {"tool_calls": [call]}, "logprobs": logprobs,
                "finish_reason": null,
            }],
        })
    }

    fn usage_chunk(&self, usage: &Usage) -> Value {
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

struct StreamState {
    meta: ResponseMeta,
    span: tracing::Span,
    started: Instant,
    /// Each choice's events; `None` once that choice ended.
    events: Vec<Option<EventStream>>,
    choices: Vec<ChoiceOut>,
    /// Each choice's usage once it ended, by index.
    usages: Vec<Option<Usage>>,
    /// The choice polled first next time, so no choice waits behind another.
    next_poll: usize,
    out: VecDeque<Event>,
    include_usage: bool,
    finished: bool,
    /// Resolves when the shutdown grace period ends.
    cutoff: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        if !self.finished {
            // The body was dropped before the request ended: the client went away, and
            // dropping the event streams cancels the request.
            self.span
                .in_scope(|| tracing::info!("client disconnected; request cancelled"));
        }
    }
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

impl StreamState {
    /// The next event of any running choice, or `None` when every choice has ended.
    async fn next_event(&mut self) -> Option<(usize, Option<EngineEvent>)> {
        let n = self.events.len();
        std::future::poll_fn(|cx| {
            let mut any = false;
            for k in 0..n {
                let i = (self.next_poll + k) % n;
                let Some(stream) = self.events[i].as_mut() else {
                    continue;
                };
                any = true;
                if let Poll::Ready(ev) = stream.poll_next(cx) {
                    self.next_poll = (i + 1) % n;
                    return Poll::Ready(Some((i, ev)));
                }
            }
            if any {
                Poll::Pending
            } else {
                Poll::Ready(None)
            }
        })
        .await
    }

    /// The shutdown grace period ended: every running choice gets a last chunk with
    /// finish reason `abort`, then one error event and `[DONE]`, so the client can tell a
    /// server shutdown from a broken connection. Dropping the streams cancels the choices.
    fn cut(&mut self) {
        for index in 0..self.events.len() {
            if self.events[index].take().is_some() {
                let c = self
                    .meta
                    .chunk(index, None, false, Value::Null, Some(ABORTED));
                self.out.push_back(data(&c));
            }
        }
        self.span
            .in_scope(|| tracing::warn!("ended by the shutdown grace period"));
        self.out.push_back(data(&ApiError::shutting_down().body()));
        self.out.push_back(Event::default().data("[DONE]"));
        self.finished = true;
    }

    /// Ends the response with an error chunk: one failed choice fails the request.
    fn fail(&mut self, e: ApiError) {
        self.out.push_back(data(&e.body()));
        self.out.push_back(Event::default().data("[DONE]"));
        self.events.clear();
        self.finished = true;
    }

    fn take(&mut self, index: usize, ev: Option<EngineEvent>) {
        match ev {
            Some(EngineEvent::Output {
                tokens,
                text,
                logprobs,
                prompt_logprobs,
            }) => {
                let choice = &mut self.choices[index];
                let delta = choice.absorb(
                    &self.meta,
                    index,
                    &text,
                    &tokens,
                    &logprobs,
                    &prompt_logprobs,
                );
                let mut lp = choice.take_logprobs(&self.meta);
                let has_logprobs = self.meta.report.logprobs
                    && (!logprobs.is_empty() || !prompt_logprobs.is_empty());
                if self.meta.report.tools {
                    let mut sent = false;
                    for piece in choice.tool_stream.push(&delta) {
                        let c = match piece {
                            StreamPiece::Text(t) => {
                                self.meta.chunk(index, Some(&t), false, lp.take(), None)
                            }
                            StreamPiece::Call(call) => {
                                let k = choice.tool_stream.released - 1;
                                let id = call_id(&self.meta.id, index, k);
                                self.meta.tool_chunk(
                                    index,
                                    call_json(&call, &id, Some(k)),
                                    lp.take(),
                                )
                            }
                        };
                        self.out.push_back(data(&c));
                        sent = true;
                    }
                    if !sent && has_logprobs {
                        let c = self.meta.chunk(index, None, false, lp, None);
                        self.out.push_back(data(&c));
                    }
                } else if !delta.is_empty() || has_logprobs {
                    let c = self.meta.chunk(index, Some(&delta), false, lp, None);
                    self.out.push_back(data(&c));
                }
            }
            Some(EngineEvent::Done { finish, usage }) => {
                self.span
                    .in_scope(|| log_finished(finish, &usage, self.started));
                let mut reason = finish.as_openai();
                if self.meta.report.tools {
                    let stream = &mut self.choices[index].tool_stream;
                    if let Some(rest) = stream.finish() {
                        let c = self
                            .meta
                            .chunk(index, Some(&rest), false, Value::Null, None);
                        self.out.push_back(data(&c));
                    }
                    if stream.is_calls() && finish == FinishReason::Stop {
                        reason = "tool_calls";
                    }
                }
                let c = self
                    .meta
                    .chunk(index, None, false, Value::Null, Some(reason));
                self.out.push_back(data(&c));
                self.usages[index] = Some(usage);
                self.events[index] = None;
                if self.events.iter().all(Option::is_none) {
                    if self.include_usage {
                        let usages: Vec<Usage> = self.usages.iter().flatten().cloned().collect();
                        let usage = total_usage(&usages, self.meta.report.choices_per_prompt);
                        self.out.push_back(data(&self.meta.usage_chunk(&usage)));
                    }
                    self.out.push_back(Event::default().data("[DONE]"));
                    self.finished = true;
                }
            }
            Some(EngineEvent::Failed(f)) => {
                self.span
                    .in_scope(|| tracing::warn!(error = %f.message, "generation failed"));
                let e = if f.by_request {
                    ApiError::invalid(format!("Generation failed: {}", f.message))
                } else {
                    ApiError::internal(format!("Generation failed: {}", f.message))
                };
                self.fail(e);
            }
            None => self.fail(ApiError::internal("The engine stopped.")),
        }
    }
}

/// Streams every choice's chunks as they come, each tagged with its index, then the usage
/// (when asked) and `[DONE]` after the last choice ends.
pub(super) fn stream_response(
    meta: ResponseMeta,
    events: Vec<EventStream>,
    include_usage: bool,
    cutoff: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    let mut out = VecDeque::new();
    if meta.endpoint == Endpoint::Chat {
        for index in 0..events.len() {
            out.push_back(data(&meta.chunk(index, Some(""), true, Value::Null, None)));
        }
    }
    let state = StreamState {
        meta,
        span: tracing::Span::current(),
        started: Instant::now(),
        choices: events.iter().map(|_| ChoiceOut::default()).collect(),
        usages: vec![None; events.len()],
        events: events.into_iter().map(Some).collect(),
        next_poll: 0,
        out,
        include_usage,
        finished: false,
        cutoff: Box::pin(cutoff),
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(ev), st));
            }
            if st.finished {
                return None;
            }
            let mut cutoff = std::mem::replace(&mut st.cutoff, Box::pin(std::future::pending()));
            tokio::select! {
                next = st.next_event() => {
                    st.cutoff = cutoff;
                    let (index, ev) = next?;
                    st.take(index, ev);
                }
                _ = &mut cutoff => st.cut(),
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
