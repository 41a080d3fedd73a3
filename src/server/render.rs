//! `POST /v1/chat/completions/render` and `POST /v1/completions/render`: the prompt a request
//! would run, as token ids, without running it (vLLM's render endpoints).
//!
//! Why it exists: vllm-router's `cache_aware` policy asks every replica to render each request
//! so it can send it where the longest prefix of its tokens is cached; a replica without these
//! routes costs a failed call and a `/tokenize` fallback per replica per request. The body is
//! the one chat or completions takes, checked as they check it (a request they would refuse is
//! refused here with the same 400); the answer is vLLM's shape: per prompt, an object whose
//! `token_ids` are exactly the ids generation would prefill (one object for chat, a list for
//! completions).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::openai::{chat_request_prompt, completion_prompts};
use super::schema::{parse_request, ChatRequest, CommonParams, CompletionRequest};
use super::startup::Loaded;
use super::validation::engine_request;
use super::{read_body, AppState};
use crate::engine::EngineRequest;

/// `POST /v1/chat/completions/render`: the chat request's prompt through the model's template.
pub(super) async fn chat(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = read_body(&state, body).await?;
    let (req, common): (ChatRequest, _) = parse_request(&bytes)?;
    let loaded = state.ready()?;
    let (prompt, _) = chat_request_prompt(loaded, req).await?;
    let request = engine_request(&state, loaded, prompt, &common)?;
    let id = state.new_request_id("chatcmpl");
    Ok(Json(rendered(&id, &request, loaded, &common)))
}

/// `POST /v1/completions/render`: each prompt of the request, in order.
pub(super) async fn completions(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = read_body(&state, body).await?;
    let (req, common): (CompletionRequest, _) = parse_request(&bytes)?;
    let loaded = state.ready()?;
    let mut out = Vec::new();
    for (prompt, _) in completion_prompts(loaded, req.prompt)? {
        let request = engine_request(&state, loaded, prompt, &common)?;
        let id = state.new_request_id("cmpl");
        out.push(rendered(&id, &request, loaded, &common));
    }
    Ok(Json(Value::Array(out)))
}

/// One rendered prompt as vLLM's `GenerateRequest`: its token ids and the sampling settings it
/// would run with (the server's defaults filled in).
fn rendered(id: &str, r: &EngineRequest, loaded: &Loaded, common: &CommonParams) -> Value {
    let g = &r.generation;
    let s = &g.sampling;
    json!({
        "request_id": id,
        "token_ids": g.prompt,
        "features": null,
        "sampling_params": {
            "n": common.n.unwrap_or(1),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "seed": s.seed,
            "max_tokens": g.max_tokens,
            "stop": g.stop_strings,
            "repetition_penalty": s.repetition_penalty,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "ignore_eos": g.eos_ids.is_empty(),
        },
        "model": loaded.model_name,
        "stream": common.stream.unwrap_or(false),
        "stream_options": common.stream_options.as_ref().map(|o| json!({
            "include_usage": o.include_usage,
        })),
        "cache_salt": null,
        "priority": 0,
        "kv_transfer_params": null,
    })
}
