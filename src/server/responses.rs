//! The OpenAI Responses API: `POST /v1/responses` (plain and streamed), `GET` and `DELETE
//! /v1/responses/{id}`.
//!
//! Why it exists: it is the official client's newer interface and the default of agent
//! frameworks. A request is translated into a chat completion (`responses_input`), served by
//! the chat handler (one generation path: the chat template, tools, constraints,
//! speculation), and its answer or stream told back in the Responses API's shapes
//! (`responses_output`); stored responses (`responses_store`) let a later request continue
//! with `previous_response_id`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::api_keys::Tenant;
use super::completion_body::now_secs;
use super::error::ApiError;
use super::openai::chat_completion;
use super::responses_input::{chat_form, responses_param};
use super::responses_output::{
    chat_turn, output_items, status_of, usage_of, EventTranslator, ResponseHead,
};
use super::responses_store::Stored;
use super::{read_body, AppState};

pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Body,
) -> Response {
    // `resp_`: clients continue only from ids of this shape (LangChain, LiteLLM).
    let id = state.new_request_id("resp").replacen('-', "_", 1);
    let mut response = match create_inner(&state, tenant, body, &id).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

async fn create_inner(
    state: &Arc<AppState>,
    tenant: Tenant,
    body: Body,
    id: &str,
) -> Result<Response, ApiError> {
    let bytes = read_body(state, body).await?;
    let req = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(ApiError::invalid("The request body must be a JSON object.")),
        Err(e) => {
            return Err(ApiError::invalid(format!(
                "The request body is not valid JSON: {e}"
            )))
        }
    };
    let created_at = now_secs();
    // Left out, `store` is the server's default: kept, unless this server keeps none.
    let store = match req.get("store") {
        None | Some(Value::Null) => state.responses.is_on(),
        Some(Value::Bool(true)) if !state.responses.is_on() => {
            return Err(ApiError::invalid_param(
                "store",
                "This server keeps no responses (server.responses_stored = 0): send \
                 `store: false` or leave it out.",
            ))
        }
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "store",
                "`store` must be a boolean.",
            ))
        }
    };
    let earlier = match req.get("previous_response_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(id)) => {
            state
                .responses
                .get(id, tenant)
                .ok_or_else(|| unknown_response(id, "previous_response_id"))?
                .conversation
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "previous_response_id",
                "`previous_response_id` must be a string.",
            ))
        }
    };
    let form = chat_form(&req, &earlier)?;
    let mut conversation = earlier;
    conversation.extend(form.added);
    let chat_body = Body::from(Value::Object(form.body).to_string());
    // Reserved before it runs, so a DELETE while it is generated is kept to.
    let saver = store.then(|| Saver::reserve(state, id, tenant, conversation));
    let answer = chat_completion(state, tenant, chat_body, id.to_string()).await;
    if answer.status() != StatusCode::OK {
        return Ok(in_responses_words(answer).await);
    }
    let head = ResponseHead {
        id: id.to_string(),
        created_at,
        model: state.ready()?.model_name.clone(),
        request: req,
        stored: store,
    };
    if head.request.get("stream") == Some(&Value::Bool(true)) {
        return Ok(streamed(head, answer, saver));
    }
    let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .map_err(|e| ApiError::internal(format!("reading the answer: {e}")))?;
    let chat: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::internal(format!("reading the answer: {e}")))?;
    let choice = &chat["choices"][0];
    let status = status_of(choice["finish_reason"].as_str().unwrap_or("stop"));
    let output = output_items(
        &head,
        &choice["message"],
        choice.get("token_sources"),
        status,
    );
    let response = head.response(status, output, usage_of(&chat["usage"]), Value::Null);
    if let Some(s) = saver {
        s.save(&response);
    }
    Ok(Json(response).into_response())
}

/// Keeps a finished response for `GET` and `previous_response_id`; its id is reserved in the
/// store from the start, and released if it is dropped unsaved (the response failed or its
/// client left).
struct Saver {
    state: Arc<AppState>,
    id: String,
    conversation: Vec<Value>,
}

impl Saver {
    fn reserve(state: &Arc<AppState>, id: &str, tenant: Tenant, conversation: Vec<Value>) -> Self {
        state.responses.reserve(id, tenant);
        Self {
            state: Arc::clone(state),
            id: id.to_string(),
            conversation,
        }
    }

    fn save(mut self, response: &Value) {
        let output = response["output"].as_array().map_or(&[][..], Vec::as_slice);
        let mut conversation = std::mem::take(&mut self.conversation);
        conversation.push(chat_turn(output));
        self.state.responses.put(
            &self.id,
            Stored {
                response: response.clone(),
                conversation,
            },
        );
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        // After a save this finds nothing left to release.
        self.state.responses.release(&self.id);
    }
}

/// A chat refusal as the Responses API's client knows its fields.
async fn in_responses_words(answer: Response) -> Response {
    let (mut parts, body) = answer.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if let Some(p) = v["error"]["param"].as_str() {
        v["error"]["param"] = json!(responses_param(p));
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(v.to_string()))
}

/// The chat stream's chunks, read as they come, told as the Responses API's events.
fn streamed(head: ResponseHead, answer: Response, saver: Option<Saver>) -> Response {
    struct St {
        chunks: axum::body::BodyDataStream,
        pending: Vec<u8>,
        translator: EventTranslator,
        out: std::collections::VecDeque<Value>,
        saver: Option<Saver>,
        done: bool,
    }
    let mut translator = EventTranslator::new(head);
    let st = St {
        chunks: answer.into_body().into_data_stream(),
        pending: Vec::new(),
        out: translator.start().into(),
        translator,
        saver,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(v) = st.out.pop_front() {
                let kind = v["type"].as_str().unwrap_or("message").to_string();
                let ev = Event::default().event(kind).data(v.to_string());
                return Some((Ok::<_, Infallible>(ev), st));
            }
            if st.done {
                return None;
            }
            match st.chunks.next().await {
                Some(Ok(bytes)) => {
                    st.pending.extend_from_slice(&bytes);
                    while let Some(end) = find_event_end(&st.pending) {
                        let event: Vec<u8> = st.pending.drain(..end).collect();
                        take_sse_event(&mut st, &event);
                    }
                }
                // The chat stream ended (or broke) without `[DONE]`.
                Some(Err(_)) | None => {
                    let failed = st.translator.failed(&json!({
                        "message": "the answer's stream ended early", "code": "server_error"}));
                    st.out.push_back(failed);
                    st.done = true;
                }
            }
        }
    });
    fn take_sse_event(st: &mut St, event: &[u8]) {
        if st.done {
            return;
        }
        for line in String::from_utf8_lossy(event).lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                let (events, response) = st.translator.finish();
                st.out.extend(events);
                if let Some(s) = st.saver.take() {
                    if response["status"] != "failed" {
                        s.save(&response);
                    }
                }
                st.done = true;
                return;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if chunk["error"].is_object() {
                let failed = st.translator.failed(&chunk["error"]);
                st.out.push_back(failed);
                st.done = true;
                return;
            }
            let events = st.translator.chunk(&chunk);
            st.out.extend(events);
        }
    }
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Where the first whole SSE event in `buf` ends (past its blank line).
fn find_event_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

fn unknown_response(id: &str, param: &str) -> ApiError {
    let mut e = ApiError::not_found(format!(
        "No response `{id}` is stored on this server: it was never stored, was deleted, or \
         expired (responses are kept per replica, for server.responses_ttl_seconds)."
    ));
    e.param = Some(param.to_string());
    e
}

/// `GET /v1/responses/{id}`.
pub async fn get(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state
        .responses
        .get(&id, tenant)
        .map(|s| Json(s.response))
        .ok_or_else(|| unknown_response(&id, "response_id"))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.responses.delete(&id, tenant) {
        return Err(unknown_response(&id, "response_id"));
    }
    Ok(Json(
        json!({"id": id, "object": "response.deleted", "deleted": true}),
    ))
}
