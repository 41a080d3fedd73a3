//! A chat completion's answer in the Responses API's shapes: the response object (its output
//! items: a model's `reasoning`, a message of `output_text`, `function_call`s), its usage, and
//! (in `stream`) the semantic events of a streamed response, made from the chat stream's chunks
//! as they come.
//!
//! Why it exists: the Responses API serves what chat completions generate; this is where the
//! answer and its stream are told in that API's words, and nothing else (pure: no I/O).

use serde_json::{json, Map, Value};

/// What every response object of one request repeats: its id, when, the model, and the
/// request's settings as the client sent them.
pub struct ResponseHead {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub request: Map<String, Value>,
    /// Whether the response is kept (`store`, or the server's default).
    pub stored: bool,
}

impl ResponseHead {
    /// The response object with this status, output and usage.
    pub fn response(&self, status: &str, output: Vec<Value>, usage: Value, error: Value) -> Value {
        let r = &self.request;
        // A field sent as null is a field left out.
        let setting = |k: &str, default: Value| {
            r.get(k)
                .filter(|v| !v.is_null())
                .cloned()
                .unwrap_or(default)
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": if status == "incomplete" {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
            "instructions": setting("instructions", Value::Null),
            "max_output_tokens": setting("max_output_tokens", Value::Null),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": setting("parallel_tool_calls", json!(true)),
            "previous_response_id": setting("previous_response_id", Value::Null),
            "store": self.stored,
            "temperature": setting("temperature", json!(1.0)),
            "top_p": setting("top_p", json!(1.0)),
            "text": setting("text", json!({"format": {"type": "text"}})),
            "tool_choice": setting("tool_choice", json!("auto")),
            "tools": setting("tools", json!([])),
            "truncation": "disabled",
            "metadata": setting("metadata", json!({})),
            "usage": usage,
        })
    }

    /// An output item's id, by its output index (the SDK tells items apart by id).
    fn message_id(&self, index: usize) -> String {
        format!("msg_{}_{index}", self.id)
    }

    fn call_item_id(&self, index: usize) -> String {
        format!("fc_{}_{index}", self.id)
    }

    fn reasoning_id(&self, index: usize) -> String {
        format!("rs_{}_{index}", self.id)
    }
}

/// A response's status from the chat choice's finish reason.
pub fn status_of(finish: &str) -> &'static str {
    match finish {
        "length" => "incomplete",
        // The server ended it (shutdown), not the answer.
        "abort" => "failed",
        _ => "completed",
    }
}

/// The Responses API's usage from a chat completion's (tandem's speculation figures kept).
pub fn usage_of(chat: &Value) -> Value {
    let input = chat["prompt_tokens"].as_u64().unwrap_or(0);
    let output = chat["completion_tokens"].as_u64().unwrap_or(0);
    json!({
        "input_tokens": input,
        "input_tokens_details": {
            "cached_tokens": chat["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
            "cache_write_tokens": 0,
        },
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
        "speculative": chat.get("speculative").cloned().unwrap_or(Value::Null),
    })
}

/// The output items of a chat completion's message: its reasoning (a model that answers in
/// harmony's channels) as a reasoning item, its text as one message item (when it has text, or
/// no calls) with its token source runs when asked for, then one item per tool call.
pub fn output_items(
    head: &ResponseHead,
    message: &Value,
    sources: Option<&Value>,
    status: &str,
) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(reasoning) = message["reasoning_content"]
        .as_str()
        .filter(|r| !r.is_empty())
    {
        items.push(reasoning_item(head, 0, reasoning));
    }
    let text = message["content"].as_str().unwrap_or("");
    let calls = message["tool_calls"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if !text.is_empty() || calls.is_empty() {
        items.push(message_item(head, items.len(), text, sources, status));
    }
    for call in calls {
        items.push(call_item(
            head,
            items.len(),
            call["id"].as_str().unwrap_or(""),
            call["function"]["name"].as_str().unwrap_or(""),
            call["function"]["arguments"].as_str().unwrap_or(""),
            "completed",
        ));
    }
    items
}

/// A reasoning item: the model's reasoning whole, as `reasoning_text` (no summary is made).
fn reasoning_item(head: &ResponseHead, index: usize, text: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": head.reasoning_id(index),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    })
}

fn message_item(
    head: &ResponseHead,
    index: usize,
    text: &str,
    sources: Option<&Value>,
    status: &str,
) -> Value {
    json!({
        "type": "message",
        "id": head.message_id(index),
        "status": status,
        "role": "assistant",
        "content": [text_part(text, sources)],
    })
}

/// An `output_text` part; `sources`: its token source runs (`speculative.token_sources`).
fn text_part(text: &str, sources: Option<&Value>) -> Value {
    let mut part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
    if let Some(runs) = sources {
        part["token_sources"] = runs.clone();
    }
    part
}

fn call_item(
    head: &ResponseHead,
    index: usize,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({
        "type": "function_call",
        "id": head.call_item_id(index),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// A response's output as the assistant's chat turn (its reasoning as `reasoning_content`):
/// what a later `previous_response_id` continues from.
pub fn chat_turn(output: &[Value]) -> Value {
    // The text of every content part of the items of one type, joined.
    let text_of = |kind: &str| -> String {
        output
            .iter()
            .filter(|i| i["type"] == kind)
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["text"].as_str().map(str::to_string))
            .collect()
    };
    let calls: Vec<Value> = output
        .iter()
        .filter(|i| i["type"] == "function_call")
        .map(|i| {
            json!({"id": i["call_id"], "type": "function",
                   "function": {"name": i["name"], "arguments": i["arguments"]}})
        })
        .collect();
    let mut turn = json!({"role": "assistant", "content": text_of("message")});
    if !calls.is_empty() {
        turn["tool_calls"] = Value::Array(calls);
    }
    let reasoning = text_of("reasoning");
    if !reasoning.is_empty() {
        turn["reasoning_content"] = json!(reasoning);
    }
    turn
}

mod stream;
pub use stream::EventTranslator;

#[cfg(test)]
mod tests;
