//! A Responses request's reasoning: `reasoning.effort` (chat's `reasoning_effort`), and the
//! `reasoning` items a client sends back, whose text goes with the assistant turn they precede.

use serde_json::{Map, Value};

use crate::server::error::ApiError;

/// `reasoning`'s effort, for chat's `reasoning_effort` (which a chat template that reads it
/// takes, and which is refused by name elsewhere). Summaries are not made: the reasoning comes
/// whole, as a `reasoning` output item.
pub(super) fn reasoning_effort(reasoning: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let r = match reasoning {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(r)) => r,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "reasoning",
                "`reasoning` must be an object.",
            ))
        }
    };
    for (key, value) in r {
        match key.as_str() {
            "effort" => {}
            "summary" | "generate_summary" if !value.is_null() => {
                return Err(ApiError::invalid_param(
                    &format!("reasoning.{key}"),
                    "Reasoning summaries are not made: a model's reasoning comes whole, as a \
                     `reasoning` output item.",
                ))
            }
            "summary" | "generate_summary" => {}
            other => {
                return Err(ApiError::invalid_param(
                    &format!("reasoning.{other}"),
                    format!("Unknown field `reasoning.{other}`."),
                ))
            }
        }
    }
    Ok(r.get("effort").filter(|v| !v.is_null()).cloned())
}

/// A `reasoning` input item's text: its `reasoning_text` parts, joined.
pub(super) fn reasoning_text(item: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    let parts = match item.get("content") {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(ApiError::invalid_param(
                &format!("{at}.content"),
                format!("`{at}.content` must be a list of reasoning_text parts."),
            ))
        }
    };
    let mut text = String::new();
    for (k, part) in parts.iter().enumerate() {
        match (part["type"].as_str(), part["text"].as_str()) {
            (Some("reasoning_text"), Some(t)) => text.push_str(t),
            _ => {
                return Err(ApiError::invalid_param(
                    &format!("{at}.content[{k}]"),
                    format!("`{at}.content[{k}]` must be a reasoning_text part with its text."),
                ))
            }
        }
    }
    Ok(text)
}

/// A reasoning item not followed by the assistant turn it belongs to.
pub(super) fn misplaced_reasoning(at: &str) -> ApiError {
    ApiError::invalid_param(
        at,
        format!(
            "`{at}` is a reasoning item: it must come right before the assistant message or \
             function_call it belongs to."
        ),
    )
}
