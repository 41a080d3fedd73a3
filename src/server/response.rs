//! Engine events into OpenAI responses: one JSON body, or SSE chunks ending in
//! `data: [DONE]`. The streamed body owns the request's event stream, so a client that
//! disconnects drops it and the engine frees the slot within a round.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use crate::engine::{EngineEvent, EventStream, FinishReason, Usage};

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
}

fn usage_json(u: &Usage) -> Value {
    let s = &u.speculative;
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "speculative": {
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate(),
            "mean_accepted_length": s.mean_accepted_length(),
            "rounds": s.rounds,
        },
    })
}

impl ResponseMeta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    pub(super) fn full(&self, text: &str, finish: FinishReason, usage: &Usage) -> Value {
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_openai(),
            }),
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish.as_openai(),
            }),
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created,
            "model": self.model, "choices": [choice], "usage": usage_json(usage),
        })
    }

    /// A streamed chunk: `delta` text, `first` (chat: announces the role), or the end.
    fn chunk(&self, delta: Option<&str>, first: bool, finish: Option<FinishReason>) -> Value {
        let finish = finish.map(FinishReason::as_openai);
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": delta.unwrap_or(""), "logprobs": null, "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let mut d = serde_json::Map::new();
                if first {
                    d.insert("role".into(), "assistant".into());
                }
                if let Some(t) = delta {
                    d.insert("content".into(), t.into());
                }
                json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
            }
        };
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [choice],
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
    /// `None` once the request ended.
    events: Option<EventStream>,
    out: VecDeque<Event>,
    include_usage: bool,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        if self.events.is_some() {
            // The body was dropped before the request ended: the client went away, and
            // dropping the event stream cancels the request.
            self.span
                .in_scope(|| tracing::info!("client disconnected; request cancelled"));
        }
    }
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

pub(super) fn stream_response(
    meta: ResponseMeta,
    events: EventStream,
    include_usage: bool,
) -> Response {
    let mut out = VecDeque::new();
    if meta.endpoint == Endpoint::Chat {
        out.push_back(data(&meta.chunk(Some(""), true, None)));
    }
    let state = StreamState {
        meta,
        span: tracing::Span::current(),
        started: Instant::now(),
        events: Some(events),
        out,
        include_usage,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(ev), st));
            }
            let events = st.events.as_mut()?;
            match events.next().await {
                Some(EngineEvent::Output { text, .. }) => {
                    if !text.is_empty() {
                        let c = st.meta.chunk(Some(&text), false, None);
                        st.out.push_back(data(&c));
                    }
                }
                Some(EngineEvent::Done { finish, usage }) => {
                    st.span
                        .in_scope(|| log_finished(finish, &usage, st.started));
                    let c = st.meta.chunk(None, false, Some(finish));
                    st.out.push_back(data(&c));
                    if st.include_usage {
                        st.out.push_back(data(&st.meta.usage_chunk(&usage)));
                    }
                    st.out.push_back(Event::default().data("[DONE]"));
                    st.events = None;
                }
                Some(EngineEvent::Failed(msg)) => {
                    st.span
                        .in_scope(|| tracing::warn!(error = %msg, "generation failed"));
                    let e = ApiError::internal(format!("Generation failed: {msg}"));
                    st.out.push_back(data(&e.body()));
                    st.out.push_back(Event::default().data("[DONE]"));
                    st.events = None;
                }
                None => {
                    let e = ApiError::internal("The engine stopped.");
                    st.out.push_back(data(&e.body()));
                    st.out.push_back(Event::default().data("[DONE]"));
                    st.events = None;
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
