//! A streamed response: SSE chunks as the engine's events come, ending in `data: [DONE]`.
//! The streamed body owns the request's event streams, so a client that disconnects drops
//! them and the engine frees the slots within a round.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::Poll;
use std::time::Instant;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::completion_body::{
    log_finished, total_usage, ChoiceOut, Endpoint, OutputShare, ResponseMeta,
};
use super::error::ApiError;
use super::tool_fields::{call_id, call_json};
use crate::constraint::tools::StreamPiece;
use crate::engine::{EngineEvent, EventStream, FinishReason, Usage};
use crate::model::text::harmony::Piece;

/// The finish reason of a choice the server ended (shutdown), as vLLM spells it.
const ABORTED: &str = "abort";

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

    /// A harmony model's pieces of choice `index` as chunks: reasoning as
    /// `reasoning_content`, the rest as `content`; the logprobs go with the first (alone when
    /// the pieces are only markup).
    fn send_harmony(&mut self, index: usize, pieces: Vec<Piece>, logprobs: Value) {
        let mut lp = Some(logprobs).filter(|v| !v.is_null());
        for piece in pieces {
            let logprobs = lp.take().unwrap_or(Value::Null);
            let c = match piece {
                Piece::Reasoning(t) => self.meta.reasoning_chunk(index, &t, logprobs),
                Piece::Content(t) => self.meta.chunk(index, Some(&t), false, logprobs, None),
            };
            self.out.push_back(data(&c));
        }
        if let Some(logprobs) = lp {
            let c = self.meta.chunk(index, None, false, logprobs, None);
            self.out.push_back(data(&c));
        }
    }

    fn take(&mut self, index: usize, ev: Option<EngineEvent>) {
        match ev {
            Some(EngineEvent::Output {
                tokens,
                text,
                logprobs,
                prompt_logprobs,
                sources,
            }) => {
                let share = OutputShare {
                    text: &text,
                    tokens: &tokens,
                    logprobs: &logprobs,
                    prompt_logprobs: &prompt_logprobs,
                    sources: &sources,
                };
                self.take_output(index, share);
            }
            Some(EngineEvent::Done { finish, usage }) => self.take_done(index, finish, usage),
            Some(EngineEvent::Failed(f)) => {
                self.span
                    .in_scope(|| tracing::warn!(error = %f.message, "generation failed"));
                let e = self.meta.report.failure(&f);
                self.fail(e);
            }
            None => self.fail(ApiError::internal("The engine stopped.")),
        }
    }

    /// One output event of choice `index` as chunks: text, tool calls or a harmony model's
    /// reasoning and content, with their logprobs and token sources.
    fn take_output(&mut self, index: usize, share: OutputShare<'_>) {
        let choice = &mut self.choices[index];
        let delta = choice.absorb(&self.meta, index, share);
        let mut lp = choice.take_logprobs(&self.meta);
        // Token sources are refused with tools: their runs go with the text chunk.
        let runs = choice.take_sources(&self.meta);
        let has_logprobs = self.meta.report.logprobs
            && (!share.logprobs.is_empty() || !share.prompt_logprobs.is_empty());
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
                        self.meta
                            .tool_chunk(index, call_json(&call, &id, Some(k)), lp.take())
                    }
                };
                self.out.push_back(data(&c));
                sent = true;
            }
            if !sent && has_logprobs {
                let c = self.meta.chunk(index, None, false, lp, None);
                self.out.push_back(data(&c));
            }
        } else if self.meta.report.harmony {
            let pieces = choice.harmony.push(&delta);
            self.send_harmony(index, pieces, lp);
        } else if !delta.is_empty() || has_logprobs || runs.is_some() {
            let c = self.meta.chunk(index, Some(&delta), false, lp, None);
            self.out
                .push_back(data(&ResponseMeta::with_sources(c, runs)));
        }
    }

    /// Choice `index` ended: what its splitters held back, its finish reason, and once every
    /// choice has ended the usage and `[DONE]`.
    fn take_done(&mut self, index: usize, finish: FinishReason, usage: Usage) {
        self.span
            .in_scope(|| log_finished(finish, &usage, self.started));
        let mut reason = finish.as_openai();
        if self.meta.report.harmony {
            let pieces = self.choices[index].harmony.finish();
            self.send_harmony(index, pieces, Value::Null);
        }
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
