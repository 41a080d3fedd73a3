//! `/v1/completions`' own body fields: the prompt.
//!
//! Why it exists: a completion's prompt takes shapes a chat's messages do not (token ids,
//! batches), so its fields live apart from the chat's.

use serde::Deserialize;

use super::parse::EndpointFields;

/// `prompt`: one string, one string in an array, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Option<PromptInput>,
}

impl EndpointFields for CompletionRequest {
    const FIELDS: &'static [&'static str] = &["prompt"];
}
