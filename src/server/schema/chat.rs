//! `/v1/chat/completions`' own body fields: the messages, with earlier tool calls, and the tools.
//!
//! Why it exists: the chat endpoint's messages and tools are its own wire format, read apart
//! from the fields it shares with completions.

use serde::Deserialize;

use super::parse::EndpointFields;
use crate::server::error::ApiError;

/// A message's content: a string or OpenAI's list of parts (text parts only).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    pub content: Option<MessageContent>,
    /// An assistant turn's tool calls.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A tool turn: the call it answers (results reach the model in the order of the calls).
    pub tool_call_id: Option<String>,
    /// The speaker's name, handed to the chat template as `name`.
    pub name: Option<String>,
    /// An assistant turn's reasoning (as answered in `reasoning_content`), handed to the chat
    /// template as `thinking`: gpt-oss's writes it where its format keeps it.
    pub reasoning_content: Option<String>,
}

/// A tool call of an earlier assistant turn, as the client sends it back.
#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    /// What a later tool turn's `tool_call_id` names.
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// The arguments as a JSON string (OpenAI's shape); an object is taken too.
    pub arguments: serde_json::Value,
}

/// One entry of `tools`.
#[derive(Debug, Deserialize)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Option<FunctionIn>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionIn {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<serde_json::Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Option<Vec<ChatMessageIn>>,
    pub tools: Option<Vec<ToolIn>>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's reasoning effort, handed to a chat template that reads it (gpt-oss's).
    pub reasoning_effort: Option<String>,
}

impl EndpointFields for ChatRequest {
    const FIELDS: &'static [&'static str] = &[
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
    ];
}

impl MessageContent {
    /// The text, or why the content cannot be used.
    pub fn into_text(self, index: usize) -> Result<String, ApiError> {
        match self {
            Self::Text(s) => Ok(s),
            Self::Parts(parts) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                &format!("messages[{index}].content"),
                                format!(
                                    "Content parts of type `{kind}` are not supported; only text."
                                ),
                            ))
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}
