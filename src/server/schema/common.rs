//! The sampling and control fields both completion endpoints take.
//!
//! Why it exists: the two endpoints share most of their fields, and each shared field is
//! declared and checked once.

use std::collections::HashMap;

use serde::Deserialize;

use crate::server::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

impl StopInput {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Sampling and control fields shared by both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct CommonParams {
    /// The prefix cache's scope: the request's tenant, set by the handler, never read from the
    /// body.
    #[serde(skip)]
    pub cache_scope: u64,
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    /// The newer name of `max_tokens` (both endpoints take it, as vLLM does).
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub seed: Option<u64>,
    pub stop: Option<StopInput>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<usize>,
    pub best_of: Option<usize>,
    pub echo: Option<bool>,
    /// Completions: how many alternatives (an integer); chat: whether to report (a boolean).
    pub logprobs: Option<serde_json::Value>,
    /// Chat: how many alternatives with `logprobs: true`.
    pub top_logprobs: Option<usize>,
    /// The `speculative` extension: the request's own speculation settings.
    pub speculative: Option<crate::engine::SpeculationKnobs>,
    /// vLLM's extension: keep going past end-of-sequence tokens (benchmarks).
    pub ignore_eos: Option<bool>,
    /// Structured outputs (`structured.rs`): OpenAI's field, then vLLM's and llama.cpp's.
    pub response_format: Option<serde_json::Value>,
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub json_schema: Option<serde_json::Value>,
    /// vLLM's: the whitespace JSON may hold between tokens, as a regex ("" for none).
    pub guided_whitespace_pattern: Option<String>,
    /// llama.cpp's GBNF grammar: refused with the field to use instead.
    pub grammar: Option<serde_json::Value>,
}

/// The most alternatives a token's logprobs may list (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl CommonParams {
    /// Chat's `logprobs` (a boolean) and `top_logprobs`.
    pub fn chat_logprobs(&self) -> Result<Option<usize>, ApiError> {
        let on = match &self.logprobs {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    "On chat completions `logprobs` is true or false; ask for alternatives \
                     with `top_logprobs`.",
                ))
            }
        };
        match self.top_logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => Err(ApiError::invalid_param(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}."),
            )),
            Some(n) if n > 0 && !on => Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs needs `logprobs: true`.",
            )),
            top => Ok(on.then_some(top.unwrap_or(0))),
        }
    }

    /// The completions API's `logprobs` (an integer, the number of alternatives).
    pub fn completion_logprobs(&self) -> Result<Option<usize>, ApiError> {
        if self.top_logprobs.is_some() {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs belongs to chat completions; here `logprobs` is the number of \
                 alternatives.",
            ));
        }
        let bad = || {
            ApiError::invalid_param(
                "logprobs",
                format!("logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}."),
            )
        };
        match &self.logprobs {
            None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => Ok(None),
            Some(serde_json::Value::Number(n)) => match n.as_u64() {
                Some(k) if k as usize <= MAX_TOP_LOGPROBS => Ok(Some(k as usize)),
                _ => Err(bad()),
            },
            Some(_) => Err(bad()),
        }
    }

    /// `n` and `best_of`: how many choices, at most `limit`.
    pub fn choices(&self, limit: usize) -> Result<usize, ApiError> {
        let n = self.n.unwrap_or(1);
        if n == 0 || n > limit {
            return Err(ApiError::invalid_param(
                "n",
                format!("n must be between 1 and {limit} (this server's engine.max_seqs)."),
            ));
        }
        if self.best_of.is_some_and(|b| b != n) {
            return Err(ApiError::invalid_param(
                "best_of",
                "best_of must equal n: every choice generated is returned.",
            ));
        }
        Ok(n)
    }
}
