//! `POST /tokenize` and `POST /detokenize`, in llama.cpp's shape (`content`, `tokens`) and
//! vLLM's (`prompt` or `messages`).
//!
//! Why it exists: clients count tokens before they send a prompt (to fit the context, to price
//! a request) and debug templates by looking at ids. By default the ids are the ones the
//! completion endpoints feed the model for the same input (the chat template applied to
//! `messages`), so `count` equals a request's `usage.prompt_tokens`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::logprobs_json::token_text;
use super::schema::{parse_body, ChatMessageIn};
use super::validation::{chat_prompt, chat_turns, check_model};
use super::{read_body, AppState};

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    /// llama.cpp's name for the text.
    content: Option<String>,
    /// vLLM's name for the text.
    prompt: Option<String>,
    /// vLLM: chat messages, rendered with the model's chat template first.
    messages: Option<Vec<ChatMessageIn>>,
    /// vLLM: end the rendered chat with the assistant's turn opening (default true).
    add_generation_prompt: Option<bool>,
    /// llama.cpp's and vLLM's names for adding the model's BOS token (default: as the
    /// completion endpoints do).
    add_special: Option<bool>,
    add_special_tokens: Option<bool>,
    /// llama.cpp: each token as `{"id", "piece"}`.
    with_pieces: Option<bool>,
    /// vLLM: the tokens' strings in `token_strs`.
    return_token_strs: Option<bool>,
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    tokens: Option<Vec<u32>>,
    model: Option<String>,
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = read_body(&state, body).await?;
    let req: TokenizeRequest = parse_body(&bytes)?;
    let loaded = state.ready()?;
    check_model(req.model.as_deref(), loaded)?;
    let tok = &loaded.tokenizer;
    let add_special = req.add_special.or(req.add_special_tokens).unwrap_or(true);
    let ids = match (req.content, req.prompt, req.messages) {
        (Some(t), None, None) | (None, Some(t), None) => tok
            .encode(&t, add_special)
            .map_err(|e| ApiError::invalid(format!("Cannot tokenize: {e}")))?,
        // As a chat request tokenizes them: the messages' text is text, not control tokens.
        (None, None, Some(messages)) => {
            let turns = chat_turns(Some(messages), None)?;
            let opening = req.add_generation_prompt.unwrap_or(true);
            chat_prompt(loaded, &turns, (opening, add_special), Default::default()).await?
        }
        (None, None, None) => {
            return Err(ApiError::invalid(
                "Send the text as `content` or `prompt`, or chat `messages`.",
            ))
        }
        _ => {
            return Err(ApiError::invalid(
                "Send only one of `content`, `prompt` and `messages`.",
            ))
        }
    };
    let piece = |id: u32| token_text(tok, id).0;
    let tokens: Value = if req.with_pieces == Some(true) {
        ids.iter()
            .map(|&id| json!({"id": id, "piece": piece(id)}))
            .collect()
    } else {
        json!(ids)
    };
    let token_strs: Value = if req.return_token_strs == Some(true) {
        ids.iter().map(|&id| json!(piece(id))).collect()
    } else {
        Value::Null
    };
    Ok(Json(json!({
        "tokens": tokens,
        "count": ids.len(),
        "max_model_len": loaded.engine.context_len(),
        "token_strs": token_strs,
    })))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let bytes = read_body(&state, body).await?;
    let req: DetokenizeRequest = parse_body(&bytes)?;
    let loaded = state.ready()?;
    check_model(req.model.as_deref(), loaded)?;
    let Some(tokens) = req.tokens else {
        return Err(ApiError::invalid_param("tokens", "`tokens` is required."));
    };
    let vocab = loaded.tokenizer.vocab_size();
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("Token id {bad} is outside the vocabulary (size {vocab})."),
        ));
    }
    let text = loaded
        .tokenizer
        .decode(&tokens)
        .map_err(|e| ApiError::invalid_param("tokens", format!("Cannot decode: {e}")))?;
    // llama.cpp answers `content`, vLLM `prompt`.
    Ok(Json(json!({"content": text, "prompt": text})))
}
