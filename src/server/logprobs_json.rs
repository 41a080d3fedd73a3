//! Log-probabilities in OpenAI's two shapes: chat's `logprobs.content` list of objects, and the
//! completions API's parallel arrays (`tokens`, `token_logprobs`, `top_logprobs`,
//! `text_offset`).
//!
//! Why it exists: both endpoints, streamed and not, report the same numbers from the engine
//! ([`crate::sampling::token_logprob`]); only the JSON differs, and that is kept here. A
//! log-probability of minus infinity (a token masked out) is written as -9999, as OpenAI does,
//! since JSON has no infinity.

use serde_json::{json, Map, Value};

use crate::model::TextTokenizer;
use crate::sampling::TokenLogprob;

/// What JSON can hold for a log-probability.
fn number(logprob: f32) -> f64 {
    if logprob.is_finite() {
        f64::from(logprob)
    } else {
        -9999.0
    }
}

/// A token's text (lossy where it is part of a character) and its bytes.
pub(super) fn token_text(tok: &TextTokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat: one `logprobs.content` entry per token.
pub(super) fn chat_content(tok: &TextTokenizer, entries: &[TokenLogprob]) -> Vec<Value> {
    entries
        .iter()
        .map(|e| {
            let (text, bytes) = token_text(tok, e.token);
            let top: Vec<Value> = e
                .top
                .iter()
                .map(|&(id, lp)| {
                    let (text, bytes) = token_text(tok, id);
                    json!({"token": text, "logprob": number(lp), "bytes": bytes})
                })
                .collect();
            json!({
                "token": text, "logprob": number(e.logprob), "bytes": bytes, "top_logprobs": top,
            })
        })
        .collect()
}

/// Completions: the parallel arrays, filled token by token; `text_offset` counts characters
/// of the choice's text from its start (the echoed prompt included).
#[derive(Default)]
pub(super) struct CompletionLogprobs {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
    offset: usize,
}

impl CompletionLogprobs {
    /// A token without a log-probability (the prompt's first when echoed).
    pub fn push_unscored(&mut self, tok: &TextTokenizer, id: u32) {
        let (text, _) = token_text(tok, id);
        self.push_text(text, Value::Null, Value::Null);
    }

    /// A scored token: its top alternatives, and itself (OpenAI: "the API will always return
    /// the logprob of the sampled token").
    pub fn push(&mut self, tok: &TextTokenizer, e: &TokenLogprob) {
        let mut top = Map::new();
        for &(id, lp) in &e.top {
            top.insert(token_text(tok, id).0, json!(number(lp)));
        }
        let (text, _) = token_text(tok, e.token);
        top.insert(text.clone(), json!(number(e.logprob)));
        self.push_text(text, json!(number(e.logprob)), Value::Object(top));
    }

    fn push_text(&mut self, text: String, logprob: Value, top: Value) {
        self.text_offset.push(json!(self.offset));
        self.offset += text.chars().count();
        self.tokens.push(Value::String(text));
        self.token_logprobs.push(logprob);
        self.top_logprobs.push(top);
    }

    /// The entries so far as a `logprobs` object; they are taken (a stream sends each once),
    /// the offset carries on.
    pub fn take(&mut self) -> Value {
        json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top_logprobs),
            "text_offset": std::mem::take(&mut self.text_offset),
        })
    }
}
