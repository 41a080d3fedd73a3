//! One turn of a conversation, as a chat template reads it.
//!
//! Why it exists: the server builds messages and the template renders them; the type sits
//! apart from both.

use serde::{Deserialize, Serialize};

/// One turn of a conversation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The speaker's name (OpenAI's `name`), for templates that write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, as the client sent it back (chat's `reasoning_content`,
    /// a Responses `reasoning` item), for templates that write it (gpt-oss's `thinking`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            name: None,
            thinking: None,
        }
    }
}
