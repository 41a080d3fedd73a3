//! Every check an OpenAI request passes before the engine sees it, and its translation into
//! an engine request.
//!
//! Why it exists: a bad request must get a 400 naming its parameter before any work is done,
//! and each knob is checked where it enters: lenience and γ become their checked types here,
//! with the parameter's name in the error.

use std::sync::Arc;

use super::error::{escaped_for_message, ApiError};
use serde_json::Value;

use super::chat_render::RenderFailure;
use super::schema::{ChatMessageIn, CommonParams, StopInput, ToolCallIn};
use super::startup::Loaded;
use super::AppState;
use crate::config::GenerationDefaults;
use crate::constraint::tools::{call_text, response_text, Tools};
use crate::engine::{EngineRequest, GenerationRequest};
use crate::model::text::chat_template::TemplateOptions;
use crate::model::{literal_marker, ChatMessage, ChatTemplateError};
use crate::sampling::SamplingParams;

pub(super) fn tokenize(loaded: &Loaded, text: &str) -> Result<Vec<u32>, ApiError> {
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

pub(super) fn check_token_ids(loaded: &Loaded, ids: Vec<u32>) -> Result<Vec<u32>, ApiError> {
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

/// The chat messages as the chat template takes them, with roles checked. Tool turns and
/// an assistant's tool calls are written in the tools' format (`tools.rs`), and the tools'
/// description joins the system prompt when the model may call them.
pub(super) fn chat_turns(
    messages: Option<Vec<ChatMessageIn>>,
    tools: Option<&Tools>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(messages) = messages else {
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
    let mut turns = Vec::with_capacity(messages.len() + 1);
    // The ids of the calls earlier assistant turns made: a tool turn answers one of them.
    let mut call_ids: Vec<String> = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            // A tool's result goes back to the model as a user turn in the tools' format.
            "tool" => "user",
            other => {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].role"),
                    format!(
                        "Unknown role `{}`: use system, user, assistant or tool.",
                        escaped_for_message(other)
                    ),
                ))
            }
        };
        let mut content = match m.content {
            Some(c) => c.into_text(i)?,
            None => String::new(),
        };
        if m.role == "tool" {
            check_answers_a_call(i, m.tool_call_id.as_deref(), &call_ids)?;
            content = response_text(&content);
        } else if m.tool_calls.is_some() && m.role != "assistant" {
            return Err(ApiError::invalid_param(
                &format!("messages[{i}].tool_calls"),
                "Only assistant messages carry tool_calls.",
            ));
        }
        for (k, call) in m.tool_calls.into_iter().flatten().enumerate() {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&earlier_call_text(i, k, &call)?);
            call_ids.extend(call.id);
        }
        if m.reasoning_content.is_some() && m.role != "assistant" {
            return Err(ApiError::invalid_param(
                &format!("messages[{i}].reasoning_content"),
                "Only assistant messages carry reasoning_content.",
            ));
        }
        let mut turn = ChatMessage::new(role, content);
        turn.name = m.name;
        turn.thinking = m.reasoning_content;
        turns.push(turn);
    }
    if turns.iter().all(|t| t.content.trim().is_empty()) {
        return Err(ApiError::invalid_param(
            "messages",
            "Every message is empty.",
        ));
    }
    if let Some(tools) = tools.filter(|t| t.active()) {
        let prompt = tools.system_prompt();
        match turns.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{prompt}", first.content);
            }
            _ => turns.insert(0, ChatMessage::new("system", prompt)),
        }
    }
    Ok(turns)
}

/// Message `i`, a tool's result, must answer a call an earlier assistant message made.
fn check_answers_a_call(i: usize, id: Option<&str>, calls: &[String]) -> Result<(), ApiError> {
    let id = id.unwrap_or_default();
    if id.is_empty() {
        return Err(ApiError::invalid_param(
            &format!("messages[{i}].tool_call_id"),
            "A tool message needs the `tool_call_id` of the call it answers.",
        ));
    }
    if !calls.iter().any(|c| c == id) {
        return Err(ApiError::invalid_param(
            &format!("messages[{i}].tool_call_id"),
            format!(
                "A tool message answers a call of an earlier assistant message; no earlier \
                 message made a call with id `{}`.",
                escaped_for_message(id)
            ),
        ));
    }
    Ok(())
}

/// Call `k` of assistant message `i`, written as the model writes calls.
fn earlier_call_text(i: usize, k: usize, call: &ToolCallIn) -> Result<String, ApiError> {
    if call.kind.as_deref().is_some_and(|k| k != "function") {
        return Err(ApiError::invalid_param(
            &format!("messages[{i}].tool_calls[{k}].type"),
            "Only `function` tool calls exist.",
        ));
    }
    let arguments: Value = match &call.function.arguments {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid_param(
                &format!("messages[{i}].tool_calls[{k}].function.arguments"),
                format!("The arguments are not valid JSON: {e}"),
            )
        })?,
        other => other.clone(),
    };
    Ok(call_text(&call.function.name, &arguments))
}

/// The prompt of a chat: the turns rendered with the model's chat template (off the async
/// runtime, bounded: `chat_render`), every message's text (contents, names, tool calls and
/// results, the tools' descriptions) tokenized as text, so only the template's own markup
/// becomes control tokens.
pub(super) async fn chat_prompt(
    loaded: &Loaded,
    turns: &[ChatMessage],
    (add_generation_prompt, add_bos): (bool, bool),
    options: TemplateOptions,
) -> Result<Vec<u32>, ApiError> {
    let tok = &loaded.tokenizer;
    if tok.chat_template().is_none() {
        return Err(ApiError::invalid_param(
            "messages",
            "This model has no chat template; use /v1/completions (or start the server with \
             --chat-template FILE).",
        ));
    }
    let literals = turns.iter().flat_map(|t| {
        std::iter::once(t.content.as_str())
            .chain(t.name.as_deref())
            .chain(t.thinking.as_deref())
    });
    let marker = literal_marker(literals);
    let escaped: Vec<ChatMessage> = turns
        .iter()
        .map(|t| ChatMessage {
            role: t.role.clone(),
            content: tok.escape_control_text(&t.content, marker),
            name: t
                .name
                .as_deref()
                .map(|n| tok.escape_control_text(n, marker)),
            thinking: t
                .thinking
                .as_deref()
                .map(|r| tok.escape_control_text(r, marker)),
        })
        .collect();
    let text = loaded
        .templates
        .render(&loaded.tokenizer, escaped, add_generation_prompt, options)
        .await
        .map_err(|e| match e {
            RenderFailure::Template(ChatTemplateError::Render(_)) => {
                ApiError::invalid_param("messages", format!("Chat template: {e}"))
            }
            // The template's own fault (it ran away), not the conversation's.
            other => ApiError::internal(format!("The model's chat template: {other}")),
        })?;
    if text.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "The chat template rendered an empty prompt.",
        ));
    }
    tok.encode_templated(&text, marker, add_bos)
        .map_err(|e| ApiError::invalid_param("messages", format!("Cannot tokenize: {e}")))
}

/// A request's `model` must name the served model (or `default`), if it names one.
pub(super) fn check_model(model: Option<&str>, loaded: &Loaded) -> Result<(), ApiError> {
    match model {
        Some(m) if m != loaded.model_name && m != "default" => {
            Err(ApiError::model_not_found(m, &loaded.model_name))
        }
        _ => Ok(()),
    }
}

/// Checks the request against the model and the server's defaults and builds the engine
/// request.
pub(super) fn engine_request(
    state: &AppState,
    loaded: &Loaded,
    prompt: Vec<u32>,
    p: &CommonParams,
) -> Result<EngineRequest, ApiError> {
    check_model(p.model.as_deref(), loaded)?;
    let d = &state.defaults;
    let max_tokens = max_tokens(loaded.engine.context_len(), prompt.len(), p, d)?;
    let sampling = sampling_params(p, d, loaded.tokenizer.vocab_size())?;
    let stop_strings = stop_strings(p)?;
    // Every speculation knob a request may set, checked once with its key named.
    let spec = p
        .speculative
        .clone()
        .unwrap_or_default()
        .for_request(loaded.engine.settings().gamma_limit())
        .map_err(|e| {
            ApiError::invalid_param(
                &format!("speculative.{}", e.key),
                format!("{} {}.", e.key, e.reason),
            )
        })?;
    Ok(EngineRequest {
        generation: GenerationRequest {
            cache_scope: p.cache_scope,
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
        speculative: spec,
        logprobs: None,
        prompt_logprobs: None,
        constraint: None,
    })
}

/// How many tokens to generate: the request's limit, which must fit beside the prompt in the
/// context, or the server's default, cut to the room left.
fn max_tokens(
    context: usize,
    prompt_len: usize,
    p: &CommonParams,
    d: &GenerationDefaults,
) -> Result<usize, ApiError> {
    if prompt_len >= context {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "This model's maximum context length is {context} tokens; the prompt has {} tokens.",
                prompt_len
            ),
        ));
    }
    let room = context - prompt_len;
    // The newer name wins where both are given, as OpenAI's own API does.
    let (limit_name, limit) = match (p.max_completion_tokens, p.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, n) => ("max_tokens", n),
    };
    match limit {
        Some(0) => Err(ApiError::invalid_param(
            limit_name,
            format!("{limit_name} must be at least 1."),
        )),
        Some(n) if n > room => Err(ApiError::invalid_param(
            limit_name,
            format!(
                "This model's maximum context length is {context} tokens; you asked for {} \
                 ({} in the prompt, {n} to generate).",
                prompt_len.saturating_add(n),
                prompt_len
            ),
        )),
        Some(n) => Ok(n),
        None => Ok(d.max_tokens.min(room)),
    }
}

/// The sampling settings: the request's, else the server's defaults, each checked.
fn sampling_params(
    p: &CommonParams,
    d: &GenerationDefaults,
    vocab: usize,
) -> Result<SamplingParams, ApiError> {
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
    let sampling = SamplingParams {
        temperature,
        top_k: p.top_k.unwrap_or(d.top_k),
        top_p,
        min_p: p.min_p.unwrap_or(d.min_p),
        repetition_penalty: p.repetition_penalty.unwrap_or(d.repetition_penalty),
        presence_penalty: p.presence_penalty.unwrap_or(0.0),
        frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
        logit_bias: logit_bias(p, vocab)?,
        seed: p.seed,
    };
    sampling.validate().map_err(|e| match e {
        crate::sampling::SamplingError::InvalidParam { name, .. } => {
            ApiError::invalid_param(name, e.to_string())
        }
        other => ApiError::invalid(other.to_string()),
    })?;
    Ok(sampling)
}

/// `logit_bias` as (token id, bias) pairs sorted by id; keys must be ids of the vocabulary.
fn logit_bias(p: &CommonParams, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
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
        if !crate::sampling::LOGIT_BIAS_RANGE.contains(&v) {
            return Err(ApiError::invalid_param(
                "logit_bias",
                format!("Bias values must be in [-100, 100], got {v}."),
            ));
        }
        logit_bias.push((id, v));
    }
    logit_bias.sort_by_key(|&(id, _)| id);
    Ok(logit_bias)
}

fn stop_strings(p: &CommonParams) -> Result<Vec<String>, ApiError> {
    let stop_strings = p.stop.as_ref().map(StopInput::to_vec).unwrap_or_default();
    if stop_strings.len() > 16 || stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param(
            "stop",
            "Give at most 16 stop strings, none of them empty.",
        ));
    }
    Ok(stop_strings)
}
