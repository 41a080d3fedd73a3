//! One turn of a conversation, as a chat template reads it.
//!
//! Why it exists: the server builds messages and the template renders them; the type sits
//! apart from both.

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

/// One turn of a conversation.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The speaker's name (OpenAI's `name`), for templates that write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, as the client sent it back (chat's `reasoning_content`,
    /// a Responses `reasoning` item), for templates that write it.
    #[serde(default)]
    pub thinking: Option<String>,
}

/// A template reads a turn's reasoning by one of two names: `thinking` (gpt-oss's) or
/// `reasoning_content` (Qwen 3's, DeepSeek's); it is given under both.
impl Serialize for ChatMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", &self.role)?;
        map.serialize_entry("content", &self.content)?;
        if let Some(name) = &self.name {
            map.serialize_entry("name", name)?;
        }
        if let Some(thinking) = &self.thinking {
            map.serialize_entry("thinking", thinking)?;
            map.serialize_entry("reasoning_content", thinking)?;
        }
        map.end()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_reasoning_reaches_templates_under_both_names() {
        let mut turn = ChatMessage::new("assistant", "4.");
        assert_eq!(
            serde_json::to_value(&turn).unwrap(),
            serde_json::json!({"role": "assistant", "content": "4."})
        );
        turn.thinking = Some("Add.".into());
        turn.name = Some("bot".into());
        assert_eq!(
            serde_json::to_value(&turn).unwrap(),
            serde_json::json!({"role": "assistant", "content": "4.", "name": "bot",
                               "thinking": "Add.", "reasoning_content": "Add."})
        );
    }
}
