//! The Responses API's request (`POST /v1/responses`) as a chat completion's: its input items as
//! chat messages, its function tools and text format in chat's shapes, its limit under chat's
//! name, and every field tandem does not do refused by name.
//!
//! Why it exists: one generation path serves both APIs (the chat template, tools, constraints,
//! speculation); this is the one place a Responses request becomes a chat request.

use serde_json::{json, Map, Value};

use super::error::ApiError;

mod reasoning;
use reasoning::{misplaced_reasoning, reasoning_effort, reasoning_text};

/// Fields of the Responses API that tandem does not do, and chat's names for its own, each
/// refused with why (`null` asks for nothing and passes).
const REFUSED: &[(&str, &str)] = &[
    (
        "background",
        "Background responses are not supported; wait for the response or stream it.",
    ),
    (
        "include",
        "`include` asks for output tandem does not produce (tool sources, reasoning, images).",
    ),
    (
        "prompt",
        "Stored prompt templates are not supported; send the input itself.",
    ),
    (
        "conversation",
        "Conversations are not stored; continue a response with `previous_response_id`.",
    ),
    (
        "max_tool_calls",
        "`max_tool_calls` limits built-in tools, which tandem does not run.",
    ),
    (
        "top_logprobs",
        "Logprobs are served by /v1/chat/completions (`logprobs`, `top_logprobs`).",
    ),
    (
        "messages",
        "The Responses API takes `input` (and `instructions`).",
    ),
    (
        "max_tokens",
        "The Responses API's limit is `max_output_tokens`.",
    ),
    (
        "max_completion_tokens",
        "The Responses API's limit is `max_output_tokens`.",
    ),
    (
        "response_format",
        "The Responses API's output format is `text.format`.",
    ),
    ("functions", "Send functions as `tools` of type `function`."),
    ("function_call", "Send `tool_choice`."),
    (
        "n",
        "A response has one output; send several requests for several answers.",
    ),
    (
        "context_management",
        "Context management (server-side compaction) is not supported: an input longer than \
         the context is refused.",
    ),
    (
        "moderation",
        "Moderation is not run by tandem; leave `moderation` out.",
    ),
];

/// Fields passed to the chat request as they are: the sampling extensions both endpoints take
/// (tandem's and vLLM's), and `stream`.
const PASSED: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "stream",
    "parallel_tool_calls",
    "seed",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "logit_bias",
    "speculative",
];

/// The Responses API's own fields this module reads (besides [`PASSED`]), and those that ask
/// nothing of the answer (who the user is, caching and billing hints, stream padding): any
/// other field is refused by name rather than ignored.
const KNOWN: &[&str] = &[
    "input",
    "reasoning",
    "instructions",
    "max_output_tokens",
    "tools",
    "tool_choice",
    "text",
    "store",
    "previous_response_id",
    "metadata",
    "truncation",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "prompt_cache_options",
    "service_tier",
    "stream_options",
];

/// A Responses request as a chat request.
#[derive(Debug)]
pub struct ChatForm {
    /// The chat completion's body.
    pub body: Map<String, Value>,
    /// What this request adds to the conversation (its input items, not its instructions), as
    /// chat messages: with the answer, what a later `previous_response_id` continues.
    pub added: Vec<Value>,
}

/// Translates a Responses request; `earlier` is the conversation of its
/// `previous_response_id` (chat messages), empty when it has none.
pub fn chat_form(req: &Map<String, Value>, earlier: &[Value]) -> Result<ChatForm, ApiError> {
    refuse_unsupported(req)?;
    super::schema::check_free_form(req)?;
    let mut body = Map::new();
    for key in PASSED {
        if let Some(v) = req.get(*key).filter(|v| !v.is_null()) {
            body.insert((*key).to_string(), v.clone());
        }
    }
    if let Some(v) = req.get("max_output_tokens").filter(|v| !v.is_null()) {
        body.insert("max_tokens".into(), v.clone());
    }
    if req.get("stream") == Some(&Value::Bool(true)) {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let added = match req.get("input") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param("input", "`input` is required."))
        }
        Some(input) => input_messages(input)?,
    };
    let mut messages = Vec::with_capacity(earlier.len() + added.len() + 1);
    match req.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "instructions",
                "`instructions` must be a string.",
            ))
        }
    }
    messages.extend_from_slice(earlier);
    messages.extend(added.iter().cloned());
    body.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = req.get("tools").filter(|v| !v.is_null()) {
        body.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = req.get("tool_choice").filter(|v| !v.is_null()) {
        body.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(effort) = reasoning_effort(req.get("reasoning"))? {
        body.insert("reasoning_effort".into(), effort);
    }
    if let Some(text) = req.get("text").filter(|v| !v.is_null()) {
        if let Some(format) = response_format(text)? {
            body.insert("response_format".into(), format);
        }
    }
    Ok(ChatForm { body, added })
}

fn refuse_unsupported(req: &Map<String, Value>) -> Result<(), ApiError> {
    // `background: false` and `include: []` ask for nothing.
    let asks = |f: &str, v: &Value| match v {
        Value::Null => false,
        Value::Bool(false) => f != "background",
        Value::Array(a) if a.is_empty() => f != "include",
        _ => true,
    };
    if let Some((field, why)) = REFUSED
        .iter()
        .find(|(f, _)| req.get(*f).is_some_and(|v| asks(f, v)))
    {
        return Err(ApiError::invalid_param(field, *why));
    }
    if let Some((field, _)) = req.iter().find(|(k, v)| {
        let k = k.as_str();
        !v.is_null()
            && !KNOWN.contains(&k)
            && !PASSED.contains(&k)
            && !REFUSED.iter().any(|(f, _)| *f == k)
    }) {
        return Err(ApiError::invalid_param(
            field,
            format!("Unknown field `{field}` for /v1/responses."),
        ));
    }
    match req.get("truncation") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s == "disabled" => Ok(()),
        Some(_) => Err(ApiError::invalid_param(
            "truncation",
            "Only `truncation: \"disabled\"` is supported: an input longer than the context is \
             refused, never cut.",
        )),
    }
}

/// The input (a string, or a list of items) as chat messages.
fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid_param(
                "input",
                "`input` must be a string or a list of items.",
            ))
        }
    };
    let mut out: Vec<Value> = Vec::with_capacity(items.len());
    // A reasoning item's text, for the assistant turn that follows it.
    let mut reasoning: Option<(String, String)> = None;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Value::Object(item) = item else {
            return Err(ApiError::invalid_param(
                &at,
                format!("`{at}` must be an object."),
            ));
        };
        // An item of no type is a message, or (with an `id` and no role) a reference.
        let untyped = if item.contains_key("role") || !item.contains_key("id") {
            "message"
        } else {
            "item_reference"
        };
        let kind = item.get("type").and_then(Value::as_str).unwrap_or(untyped);
        let pending = reasoning.take();
        if let Some((from, _)) = &pending {
            let assistant = kind == "function_call"
                || (kind == "message" && item.get("role") == Some(&json!("assistant")));
            if !assistant {
                return Err(misplaced_reasoning(from));
            }
        }
        match kind {
            "message" => {
                let mut m = message(item, &at)?;
                if let Some((_, text)) = pending {
                    m["reasoning_content"] = json!(text);
                }
                out.push(m);
            }
            "reasoning" => reasoning = Some((at.clone(), reasoning_text(item, &at)?)),
            "function_call" => {
                let call = json!({
                    "id": string_field(item, "call_id", &at)?,
                    "type": "function",
                    "function": {
                        "name": string_field(item, "name", &at)?,
                        "arguments": string_field(item, "arguments", &at)?,
                    },
                });
                // Calls made together are one assistant turn, after any text it had.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        let calls = last
                            .as_object_mut()
                            .expect("messages are objects")
                            .entry("tool_calls")
                            .or_insert_with(|| Value::Array(Vec::new()));
                        calls
                            .as_array_mut()
                            .expect("tool_calls is a list")
                            .push(call);
                    }
                    _ => out.push(json!({"role": "assistant", "tool_calls": [call]})),
                }
                if let (Some((_, text)), Some(turn)) = (pending, out.last_mut()) {
                    let had = turn["reasoning_content"].as_str().unwrap_or("").to_string();
                    turn["reasoning_content"] = json!(had + &text);
                }
            }
            "function_call_output" => out.push(json!({
                "role": "tool",
                "tool_call_id": string_field(item, "call_id", &at)?,
                "content": text_of(item.get("output"), &format!("{at}.output"))?,
            })),
            other => {
                return Err(ApiError::invalid_param(
                    &format!("{at}.type"),
                    format!(
                        "Input items of type `{other}` are not supported: send messages, \
                         reasoning, function_call and function_call_output items."
                    ),
                ))
            }
        }
    }
    if let Some((from, _)) = reasoning {
        return Err(misplaced_reasoning(&from));
    }
    Ok(out)
}

/// A message item: its role (`developer` is the system's) and its text.
fn message(item: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some("developer" | "system") => "system",
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(ApiError::invalid_param(
                &format!("{at}.role"),
                format!("`{at}.role` must be user, assistant, system or developer."),
            ))
        }
    };
    let content = text_of(item.get("content"), &format!("{at}.content"))?;
    Ok(json!({"role": role, "content": content}))
}

/// Text content: a string, or text parts (`input_text`, `output_text`) joined.
fn text_of(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, part.get("text")) {
                    ("input_text" | "output_text", Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(ApiError::invalid_param(
                            &format!("{at}[{j}].type"),
                            format!(
                                "Only text parts (input_text, output_text) are supported; \
                                 `{at}[{j}]` is `{kind}`."
                            ),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid_param(
            at,
            format!("`{at}` must be a string or a list of text parts."),
        )),
    }
}

fn string_field(item: &Map<String, Value>, key: &str, at: &str) -> Result<String, ApiError> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(ApiError::invalid_param(
            &format!("{at}.{key}"),
            format!("`{at}.{key}` must be a string."),
        )),
    }
}

/// Function tools in chat's shape (`{"type": "function", "function": {...}}`); other tool types
/// are refused.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(ApiError::invalid_param("tools", "`tools` must be a list."));
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}].type"),
                format!(
                    "Tools of type `{kind}` are not supported: tandem runs no built-in tools; \
                     declare functions (type function) and run them yourself."
                ),
            ));
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` in chat's shape: the same words, a named function as chat names it.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => {
            Ok(choice.clone())
        }
        Value::Object(o) if o.get("type") == Some(&json!("function")) => match o.get("name") {
            Some(Value::String(name)) => Ok(json!({"type": "function", "function": {"name": name}})),
            _ => Err(ApiError::invalid_param(
                "tool_choice.name",
                "A function tool_choice names the function: {\"type\": \"function\", \"name\": ...}.",
            )),
        },
        _ => Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}.",
        )),
    }
}

/// `text.format` as chat's `response_format` (`None` for plain text).
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Value::Object(text) = text else {
        return Err(ApiError::invalid_param("text", "`text` must be an object."));
    };
    if text.get("verbosity").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid_param(
            "text.verbosity",
            "`text.verbosity` is not supported: the model's answers are as long as it writes \
             them, up to max_output_tokens.",
        ));
    }
    let Some(format) = text.get("format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(ApiError::invalid_param(
            "text.format.type",
            "text.format.type must be text, json_object or json_schema.",
        )),
    }
}

/// The name a Responses client knows a chat request's field by, for errors.
pub fn responses_param(chat_param: &str) -> String {
    let (head, rest) = chat_param
        .find(['.', '['])
        .map_or((chat_param, ""), |i| chat_param.split_at(i));
    match head {
        "messages" => "input".into(),
        "max_tokens" => "max_output_tokens".into(),
        "response_format" => "text.format".into(),
        "reasoning_effort" => "reasoning.effort".into(),
        _ => format!("{head}{}", rest.replacen(".function.", ".", 1)),
    }
}

#[cfg(test)]
mod tests;
