//! `/v1/completions`, `/v1/chat/completions` and `/v1/models`.
//!
//! Why it exists: it turns OpenAI requests into engine requests (tokenizing, applying the chat
//! template and the server's defaults, checking every value before any work) and engine events
//! into OpenAI responses: one JSON body, or SSE chunks ending in `data: [DONE]`. The response
//! body owns the request's event stream, so a client that disconnects drops it and the engine
//! frees the slot within a round.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tracing::Instrument;

use super::error::ApiError;
use super::schema::{
    parse_request, ChatRequest, CommonParams, CompletionRequest, PromptInput, StopInput,
};
use super::startup::Loaded;
use super::{read_body, AppState};
use crate::engine::{
    EngineEvent, EngineRequest, EventStream, FinishReason, GammaPolicy, GenerationRequest, Usage,
};
use crate::model::ChatMessage;
use crate::sampling::SamplingParams;

/// Which endpoint a request came through: it decides the response's shape.
#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Completions,
    Chat,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let loaded = state.ready()?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": loaded.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "tandem",
            "max_model_len": loaded.engine.context_len(),
        }],
    })))
}

pub async fn completions(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let rid = state.new_request_id("cmpl");
    let span = tracing::info_span!("request", id = %rid, endpoint = "completions");
    let result = async {
        let bytes = read_body(&state, body).await?;
        let (req, common): (CompletionRequest, _) = parse_request(&bytes)?;
        let loaded = state.ready()?;
        let prompt = match req.prompt {
            None => return Err(ApiError::invalid_param("prompt", "`prompt` is required.")),
            Some(PromptInput::Text(s)) => tokenize(loaded, &s)?,
            Some(PromptInput::Texts(v)) if v.len() == 1 => tokenize(loaded, &v[0])?,
            Some(PromptInput::Tokens(t)) => check_token_ids(loaded, t)?,
            Some(PromptInput::TokenBatches(mut b)) if b.len() == 1 => {
                check_token_ids(loaded, b.pop().expect("one"))?
            }
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "prompt",
                    "Send one prompt per request (batched prompts are not supported).",
                ))
            }
        };
        respond(
            &state,
            loaded,
            Endpoint::Completions,
            prompt,
            common,
            None,
            &rid,
        )
        .await
    }
    .instrument(span.clone())
    .await;
    finish_response(result, &rid, &span)
}

pub async fn chat_completions(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let rid = state.new_request_id("chatcmpl");
    let span = tracing::info_span!("request", id = %rid, endpoint = "chat.completions");
    let result = async {
        let bytes = read_body(&state, body).await?;
        let (req, common): (ChatRequest, _) = parse_request(&bytes)?;
        let loaded = state.ready()?;
        let Some(messages) = req.messages else {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` is required.",
            ));
        };
        if messages.is_empty() {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must hold at least one message.",
            ));
        }
        let mut turns = Vec::with_capacity(messages.len());
        for (i, m) in messages.into_iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::invalid_param(
                        &format!("messages[{i}].role"),
                        format!("Unknown role `{other}`: use system, user or assistant."),
                    ))
                }
            };
            let content = match m.content {
                Some(c) => c.into_text(i)?,
                None => String::new(),
            };
            turns.push(ChatMessage::new(role, content));
        }
        if turns.iter().all(|t| t.content.trim().is_empty()) {
            return Err(ApiError::invalid_param(
                "messages",
                "Every message is empty.",
            ));
        }
        let template = loaded.tokenizer.chat_template().ok_or_else(|| {
            ApiError::invalid("This model has no chat template; use /v1/completions.")
        })?;
        let text = template
            .render(&turns, true)
            .map_err(|e| ApiError::invalid_param("messages", format!("Chat template: {e}")))?;
        let prompt = tokenize(loaded, &text)?;
        respond(
            &state,
            loaded,
            Endpoint::Chat,
            prompt,
            common,
            req.max_completion_tokens,
            &rid,
        )
        .await
    }
    .instrument(span.clone())
    .await;
    finish_response(result, &rid, &span)
}

/// Logs a refusal and tags every response with its request id.
fn finish_response(
    result: Result<Response, ApiError>,
    rid: &str,
    span: &tracing::Span,
) -> Response {
    let mut response = match result {
        Ok(r) => r,
        Err(e) => {
            span.in_scope(|| {
                tracing::info!(status = e.status.as_u16(), error = %e.message, "request refused")
            });
            e.into_response()
        }
    };
    if let Ok(v) = HeaderValue::from_str(rid) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

fn tokenize(loaded: &Loaded, text: &str) -> Result<Vec<u32>, ApiError> {
    if text.is_empty() {
        return Err(ApiError::invalid_param(
            "prompt",
            "The prompt must not be empty.",
        ));
    }
    loaded
        .tokenizer
        .encode(text, true)
        .map_err(|e| ApiError::invalid_param("prompt", format!("Cannot tokenize: {e}")))
}

fn check_token_ids(loaded: &Loaded, ids: Vec<u32>) -> Result<Vec<u32>, ApiError> {
    let vocab = loaded.tokenizer.vocab_size();
    if ids.is_empty() {
        return Err(ApiError::invalid_param(
            "prompt",
            "The prompt must not be empty.",
        ));
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("Token id {bad} is outside the vocabulary (size {vocab})."),
        ));
    }
    Ok(ids)
}

/// Checks the request against the model and the server's defaults and builds the engine
/// request.
fn engine_request(
    state: &AppState,
    loaded: &Loaded,
    prompt: Vec<u32>,
    p: &CommonParams,
    max_completion_tokens: Option<usize>,
) -> Result<EngineRequest, ApiError> {
    p.check_supported()?;
    if let Some(m) = &p.model {
        if m != &loaded.model_name && m != "default" {
            return Err(ApiError::model_not_found(m, &loaded.model_name));
        }
    }
    let d = &state.defaults;
    let context = loaded.engine.context_len();
    if prompt.len() >= context {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "This model's maximum context length is {context} tokens; the prompt has {} tokens.",
                prompt.len()
            ),
        ));
    }
    let room = context - prompt.len();
    let max_tokens = match max_completion_tokens.or(p.max_tokens) {
        Some(0) => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1.",
            ))
        }
        Some(n) if n > room => {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "This model's maximum context length is {context} tokens; you asked for {} \
                     ({} in the prompt, {n} to generate).",
                    prompt.len() + n,
                    prompt.len()
                ),
            ))
        }
        Some(n) => n,
        None => d.max_tokens.min(room),
    };
    let temperature = p.temperature.unwrap_or(d.temperature);
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return Err(ApiError::invalid_param(
            "temperature",
            format!("temperature must be >= 0, got {temperature}."),
        ));
    }
    let top_p = p.top_p.unwrap_or(d.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_param(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}."),
        ));
    }
    let vocab = loaded.tokenizer.vocab_size();
    let mut logit_bias = Vec::new();
    for (k, &v) in p.logit_bias.iter().flatten() {
        let id: u32 = k
            .parse()
            .ok()
            .filter(|&id: &u32| (id as usize) < vocab)
            .ok_or_else(|| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!("`{k}` is not a token id of this model's vocabulary."),
                )
            })?;
        if !(-100.0..=100.0).contains(&v) {
            return Err(ApiError::invalid_param(
                "logit_bias",
                format!("Bias values must be in [-100, 100], got {v}."),
            ));
        }
        logit_bias.push((id, v));
    }
    logit_bias.sort_by_key(|&(id, _)| id);
    let sampling = SamplingParams {
        temperature,
        top_k: p.top_k.unwrap_or(d.top_k),
        top_p,
        min_p: p.min_p.unwrap_or(d.min_p),
        repetition_penalty: p.repetition_penalty.unwrap_or(d.repetition_penalty),
        presence_penalty: p.presence_penalty.unwrap_or(0.0),
        frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
        logit_bias,
        seed: p.seed,
    };
    sampling.validate().map_err(|e| match e {
        crate::sampling::SamplingError::InvalidParam { name, .. } => {
            ApiError::invalid_param(name, e.to_string())
        }
        other => ApiError::invalid(other.to_string()),
    })?;
    let stop_strings = p.stop.as_ref().map(StopInput::to_vec).unwrap_or_default();
    if stop_strings.len() > 16 || stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param(
            "stop",
            "Give at most 16 stop strings, none of them empty.",
        ));
    }
    let spec = p.speculative.as_ref();
    let lenience = spec.and_then(|s| s.lenience);
    if let Some(l) = lenience {
        if !(l > 0.0 && l <= 1.0) {
            return Err(ApiError::invalid_param(
                "speculative.lenience",
                format!("lenience must be in (0, 1], got {l}."),
            ));
        }
    }
    let limit = loaded.engine.settings().gamma_limit();
    let gamma = match (spec.and_then(|s| s.enabled), spec.and_then(|s| s.gamma)) {
        (Some(false), _) => GammaPolicy::Off,
        (_, Some(g)) if g == 0 || g > limit => {
            return Err(ApiError::invalid_param(
                "speculative.gamma",
                format!("gamma must be in 1..={limit}, got {g}."),
            ))
        }
        (_, Some(g)) => GammaPolicy::Fixed(g),
        (Some(true), None) if !loaded.engine.settings().get().enabled => GammaPolicy::Adaptive,
        _ => GammaPolicy::Server,
    };
    Ok(EngineRequest {
        generation: GenerationRequest {
            prompt,
            max_tokens,
            sampling,
            eos_ids: if p.ignore_eos == Some(true) {
                Vec::new()
            } else {
                loaded.tokenizer.eos_ids().to_vec()
            },
            stop_strings,
            detokenizer: Some(Arc::clone(&loaded.tokenizer)),
        },
        gamma,
        lenience,
    })
}

async fn respond(
    state: &AppState,
    loaded: &Loaded,
    endpoint: Endpoint,
    prompt: Vec<u32>,
    params: CommonParams,
    max_completion_tokens: Option<usize>,
    rid: &str,
) -> Result<Response, ApiError> {
    let request = engine_request(state, loaded, prompt, &params, max_completion_tokens)?;
    let prompt_tokens = request.generation.prompt.len();
    let max_tokens = request.generation.max_tokens;
    let events = loaded.engine.submit(request).await?;
    tracing::debug!(
        prompt_tokens,
        max_tokens,
        stream = params.stream == Some(true),
        "admitted to the queue"
    );
    let meta = ResponseMeta {
        id: rid.to_string(),
        created: now_secs(),
        model: loaded.model_name.clone(),
        endpoint,
    };
    if params.stream == Some(true) {
        let include_usage = params
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return Ok(stream_response(meta, events, include_usage));
    }
    let started = Instant::now();
    let done = events.collect().await.inspect_err(|e| {
        tracing::warn!(error = %e, "generation failed");
    })?;
    log_finished(done.finish, &done.usage, started);
    Ok(Json(meta.full(&done.text, done.finish, &done.usage)).into_response())
}

struct ResponseMeta {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
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

    fn full(&self, text: &str, finish: FinishReason, usage: &Usage) -> Value {
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
fn log_finished(finish: FinishReason, u: &Usage, started: Instant) {
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

fn stream_response(meta: ResponseMeta, events: EventStream, include_usage: bool) -> Response {
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
