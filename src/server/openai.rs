//! `/v1/completions`, `/v1/chat/completions` and `/v1/models`: the handlers.
//!
//! Why it exists: each handler reads its endpoint's own fields (the prompt, or the chat
//! messages through the model's chat template), has `validation` check the rest and build the
//! engine request, submits it, and hands the event stream to `response`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde_json::{json, Value};
use tracing::Instrument;

use super::api_keys::Tenant;
use super::completion_body::{log_finished, now_secs, Echo, Endpoint, Report, ResponseMeta};
use super::error::ApiError;
use super::reasoning_fields::{read_reasoning_effort, refuse_with_harmony};
use super::schema::{parse_request, ChatRequest, CommonParams, CompletionRequest, PromptInput};
use super::startup::Loaded;
use super::stream::stream_response;
use super::structured::{compile, json_whitespace, requested_constraint};
use super::tool_fields::read_tools;
use super::validation::{chat_prompt, chat_turns, check_token_ids, engine_request, tokenize};
use super::{read_body, AppState};
use crate::constraint::tools::Tools;
use crate::constraint::{CompiledConstraint, ConstraintSpec};
use crate::engine::{EngineRequest, EventStream};
use crate::model::text::chat_template::TemplateOptions;

pub async fn models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let loaded = state.ready()?;
    Ok(Json(json!({
        "object": "list",
        "data": [model_card(loaded)],
    })))
}

/// The served model as `/v1/models` lists it.
fn model_card(loaded: &Loaded) -> Value {
    json!({
        "id": loaded.model_name,
        "object": "model",
        "created": loaded.created,
        "owned_by": "tandem",
        "max_model_len": loaded.engine.context_len(),
    })
}

/// `GET /v1/models/{id}`: the served model, or a 404 naming the id asked for.
pub async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let loaded = state.ready()?;
    if id != loaded.model_name {
        return Err(ApiError::model_not_found(&id, &loaded.model_name));
    }
    Ok(Json(model_card(loaded)))
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Body,
) -> Response {
    let rid = state.new_request_id("cmpl");
    let span = tracing::info_span!("request", id = %rid, endpoint = "completions");
    let result = async {
        let bytes = read_body(&state, body).await?;
        let (req, mut common): (CompletionRequest, _) = parse_request(&bytes)?;
        common.cache_scope = tenant.cache_scope();
        let loaded = state.ready()?;
        let prompts = completion_prompts(loaded, req.prompt)?;
        let logprobs = common.completion_logprobs()?;
        let echo = if common.echo == Some(true) {
            prompts
                .iter()
                .map(|(tokens, text)| {
                    Ok(Echo {
                        text: match text {
                            Some(t) => t.clone(),
                            None => loaded.tokenizer.decode(tokens).map_err(|e| {
                                ApiError::invalid_param("prompt", format!("Cannot decode: {e}"))
                            })?,
                        },
                        tokens: tokens.clone(),
                    })
                })
                .collect::<Result<_, ApiError>>()?
        } else {
            Vec::new()
        };
        respond(
            &state,
            loaded,
            Endpoint::Completions,
            prompts.into_iter().map(|(tokens, _)| tokens).collect(),
            common,
            Reporting {
                logprobs,
                echo,
                tools: None,
            },
            &rid,
        )
        .await
    }
    .instrument(span.clone())
    .await;
    finish_response(result, &rid, &span)
}

/// A prompt as token ids, with its text when it was sent as text.
pub(super) type PromptTokens = (Vec<u32>, Option<String>);

/// A completion request's prompts: one, or a batch (each gets `n` choices, in order).
pub(super) fn completion_prompts(
    loaded: &Loaded,
    prompt: Option<PromptInput>,
) -> Result<Vec<PromptTokens>, ApiError> {
    let prompts: Vec<PromptTokens> = match prompt {
        None => return Err(ApiError::invalid_param("prompt", "`prompt` is required.")),
        Some(PromptInput::Text(s)) => vec![(tokenize(loaded, &s)?, Some(s))],
        Some(PromptInput::Texts(v)) => v
            .into_iter()
            .map(|s| Ok((tokenize(loaded, &s)?, Some(s))))
            .collect::<Result<_, ApiError>>()?,
        Some(PromptInput::Tokens(t)) => vec![(check_token_ids(loaded, t)?, None)],
        Some(PromptInput::TokenBatches(b)) => b
            .into_iter()
            .map(|t| Ok((check_token_ids(loaded, t)?, None)))
            .collect::<Result<_, ApiError>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid_param(
            "prompt",
            "The prompt list must not be empty.",
        ));
    }
    Ok(prompts)
}

/// A chat request's prompt through the model's chat template (with its tools' descriptions),
/// and the tools the model may call.
pub(super) async fn chat_request_prompt(
    loaded: &Loaded,
    req: ChatRequest,
) -> Result<(Vec<u32>, Option<Tools>), ApiError> {
    let tools = read_tools(req.tools, req.tool_choice.as_ref(), req.parallel_tool_calls)?;
    let turns = chat_turns(req.messages, tools.as_ref())?;
    let options = TemplateOptions {
        reasoning_effort: read_reasoning_effort(loaded, req.reasoning_effort)?,
    };
    let prompt = chat_prompt(loaded, &turns, (true, true), options).await?;
    Ok((prompt, tools))
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    body: Body,
) -> Response {
    let rid = state.new_request_id("chatcmpl");
    chat_completion(&state, tenant, body, rid).await
}

/// A chat completion of `tenant` under the request id `rid` (the Responses API serves its
/// requests through this under the response's own id, so logs and `x-request-id` name one id).
pub(super) async fn chat_completion(
    state: &Arc<AppState>,
    tenant: Tenant,
    body: Body,
    rid: String,
) -> Response {
    let span = tracing::info_span!("request", id = %rid, endpoint = "chat.completions");
    let result = async {
        let bytes = read_body(state, body).await?;
        let (req, mut common): (ChatRequest, _) = parse_request(&bytes)?;
        common.cache_scope = tenant.cache_scope();
        let loaded = state.ready()?;
        let (prompt, tools) = chat_request_prompt(loaded, req).await?;
        if common.echo == Some(true) {
            return Err(ApiError::invalid_param(
                "echo",
                "echo belongs to /v1/completions; a chat response holds the answer only.",
            ));
        }
        let logprobs = common.chat_logprobs()?;
        respond(
            state,
            loaded,
            Endpoint::Chat,
            vec![prompt],
            common,
            Reporting {
                logprobs,
                echo: Vec::new(),
                tools,
            },
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
            crate::telemetry::record_refused(match e.status.as_u16() {
                429 => "overloaded",
                503 => "unavailable",
                400..=499 => "invalid",
                _ => "error",
            });
            e.into_response()
        }
    };
    if let Ok(v) = HeaderValue::from_str(rid) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}

/// What a request asked to see besides the text.
struct Reporting {
    /// Logprobs with this many alternatives.
    logprobs: Option<usize>,
    /// Completions' `echo`: each prompt before its choices' text (with its logprobs when
    /// asked); empty without echo.
    echo: Vec<Echo>,
    /// Chat's tools: the answer may be calls, parsed out of its text.
    tools: Option<Tools>,
}

#[allow(clippy::too_many_arguments)]
async fn respond(
    state: &AppState,
    loaded: &Loaded,
    endpoint: Endpoint,
    prompts: Vec<Vec<u32>>,
    params: CommonParams,
    reporting: Reporting,
    rid: &str,
) -> Result<Response, ApiError> {
    let n = params.choices(loaded.engine.max_seqs())?;
    check_capacity(loaded, prompts.len(), n)?;
    let constraint = request_constraint(loaded, &params, reporting.tools.as_ref()).await?;
    let constraint_field = constraint.as_ref().map(|c| c.field);
    let requests = engine_requests(
        state,
        loaded,
        prompts,
        &params,
        &reporting,
        constraint.as_ref(),
    )?;
    if let Some(c) = &constraint {
        for _ in 0..requests.len() * n {
            crate::telemetry::record_constrained_request(c.kind);
        }
    }
    let token_sources = requests[0].speculative.token_sources;
    let harmony = endpoint == Endpoint::Chat && loaded.tokenizer.answers_in_harmony();
    if harmony {
        refuse_with_harmony(constraint_field, token_sources)?;
    }
    if token_sources && reporting.tools.as_ref().is_some_and(Tools::active) {
        return Err(ApiError::invalid_param(
            "speculative.token_sources",
            "speculative.token_sources cannot go with tools the model may call (an answer of \
             calls has no text to mark); leave out one of them."
                .to_string(),
        ));
    }
    let prompt_tokens: usize = requests.iter().map(|r| r.generation.prompt.len()).sum();
    let max_tokens = requests[0].generation.max_tokens;
    let eos_ids = requests[0].generation.eos_ids.clone();
    // Every prompt's choices are queued together before any answer is read, or none is.
    let events = loaded.engine.submit_batch(requests, n).await?;
    tracing::debug!(
        prompt_tokens,
        max_tokens,
        n,
        stream = params.stream == Some(true),
        "admitted to the queue"
    );
    let meta = ResponseMeta {
        id: rid.to_string(),
        created: now_secs(),
        model: loaded.model_name.clone(),
        endpoint,
        tokenizer: Arc::clone(&loaded.tokenizer),
        report: Report {
            logprobs: reporting.logprobs.is_some(),
            choices_per_prompt: n,
            echo: reporting.echo,
            eos_ids,
            tools: reporting.tools.as_ref().is_some_and(Tools::active),
            constraint_field,
            token_sources,
            harmony,
        },
    };
    if params.stream == Some(true) {
        let include_usage = params
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return Ok(stream_response(meta, events, include_usage, state.cutoff()));
    }
    answer_in_full(state, meta, events, constraint_field).await
}

/// A request may hold no more sequences (its prompts times `n`) than the engine has room for.
fn check_capacity(loaded: &Loaded, prompts: usize, n: usize) -> Result<(), ApiError> {
    let capacity = loaded.engine.capacity();
    if prompts * n > capacity {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "A request may hold at most {capacity} sequences (prompts times n); this one \
                 holds {} prompts of {n} choices.",
                prompts
            ),
        ));
    }
    Ok(())
}

/// One engine request per prompt, each checked, with what the request asked to see and its
/// constraint.
fn engine_requests(
    state: &AppState,
    loaded: &Loaded,
    prompts: Vec<Vec<u32>>,
    params: &CommonParams,
    reporting: &Reporting,
    constraint: Option<&RequestConstraint>,
) -> Result<Vec<EngineRequest>, ApiError> {
    let mut requests = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let mut request = engine_request(state, loaded, prompt, params)?;
        request.logprobs = reporting.logprobs;
        request.prompt_logprobs = reporting.logprobs.filter(|_| !reporting.echo.is_empty());
        request.constraint = constraint.map(|c| c.compiled.clone());
        requests.push(request);
    }
    Ok(requests)
}

/// The whole answer in one JSON body, once every choice has finished (or a 503 if the
/// shutdown grace period ends first).
async fn answer_in_full(
    state: &AppState,
    meta: ResponseMeta,
    events: Vec<EventStream>,
    constraint_field: Option<&'static str>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    // The choices run together in the engine; their events wait in their streams.
    let collect = async {
        let mut done = Vec::with_capacity(events.len());
        for e in events {
            let completion = e.collect().await.inspect_err(|e| {
                tracing::warn!(error = %e, "generation failed");
            });
            done.push(completion.map_err(|e| {
                let mut e = ApiError::from(e);
                if e.code == Some(crate::engine::GRAMMAR_TOO_COMPLEX) {
                    e.param = constraint_field.map(str::to_string);
                }
                e
            })?);
        }
        Ok::<_, ApiError>(done)
    };
    let done = tokio::select! {
        done = collect => done?,
        _ = state.cutoff() => {
            tracing::warn!("ended by the shutdown grace period");
            return Err(ApiError::shutting_down());
        }
    };
    for c in &done {
        log_finished(c.finish, &c.usage, started);
    }
    Ok(Json(meta.full(&done)).into_response())
}

/// A request's constraint, compiled.
struct RequestConstraint {
    compiled: CompiledConstraint,
    /// Its kind, for the metrics.
    kind: &'static str,
    /// The field that set it (`tools` for tools).
    field: &'static str,
}

/// The one constraint a request runs under: from its structured-output fields or from its
/// tools (which cannot be combined).
async fn request_constraint(
    loaded: &Loaded,
    params: &CommonParams,
    tools: Option<&Tools>,
) -> Result<Option<RequestConstraint>, ApiError> {
    let default_ws = loaded
        .compiler
        .as_ref()
        .map(|c| c.json_whitespace.clone())
        .unwrap_or_default();
    let whitespace = json_whitespace(params, &default_ws)?;
    let requested = requested_constraint(params, &whitespace)?;
    let from_tools = tools.and_then(|t| t.constraint(&whitespace));
    let lays_out_json = match (&requested, &from_tools) {
        (Some((_, spec)), _) => matches!(
            spec,
            ConstraintSpec::JsonObject(_) | ConstraintSpec::JsonSchema(..)
        ),
        (None, tools) => tools.is_some(),
    };
    if params.guided_whitespace_pattern.is_some() && !lays_out_json {
        return Err(ApiError::invalid_param(
            "guided_whitespace_pattern",
            "guided_whitespace_pattern lays out JSON: it needs a JSON constraint \
             (response_format json_object or json_schema, guided_json, json_schema) or tools \
             the model may call.",
        ));
    }
    let (field, spec, kind) = match (requested, from_tools) {
        (Some((field, _)), Some(_)) => {
            return Err(ApiError::invalid_param(
                field,
                format!(
                    "`{field}` cannot be combined with tools the model may call; set \
                     tool_choice to none to constrain the answer instead."
                ),
            ))
        }
        (Some((field, spec)), None) => {
            let kind = spec.kind();
            (field, spec, kind)
        }
        (None, Some(spec)) => ("tools", spec, "tools"),
        (None, None) => return Ok(None),
    };
    if params.ignore_eos == Some(true) {
        return Err(ApiError::invalid_param(
            "ignore_eos",
            "ignore_eos cannot go with a structured output or tools: the grammar ends the \
             output with the end-of-sequence token.",
        ));
    }
    let compiled = compile(loaded.compiler.as_ref(), field, spec).await?;
    Ok(Some(RequestConstraint {
        compiled,
        kind,
        field,
    }))
}
