//! A chat completion's answer in the Responses API's shapes: the response object (its output
//! items: a model's `reasoning`, a message of `output_text`, `function_call`s), its usage, and the semantic events of
//! a streamed response, made from the chat stream's chunks as they come.
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

/// The one output item being streamed (the API finishes an item before it adds the next).
enum Open {
    Reasoning {
        index: usize,
        text: String,
    },
    Message {
        index: usize,
        text: String,
        /// Its token source runs so far, when the request asked for them.
        sources: Option<Vec<Value>>,
    },
    Call {
        index: usize,
        /// The chat stream's index of this call.
        k: usize,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// The events of a streamed response, made from the chat stream's chunks in order.
pub struct EventTranslator {
    head: ResponseHead,
    sequence: u64,
    /// Items already done, by output index.
    output: Vec<Value>,
    open: Option<Open>,
    finish: Option<String>,
    usage: Value,
}

impl EventTranslator {
    pub fn new(head: ResponseHead) -> Self {
        Self {
            head,
            sequence: 0,
            output: Vec::new(),
            open: None,
            finish: None,
            usage: Value::Null,
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        body
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Value> {
        let r = self
            .head
            .response("in_progress", Vec::new(), Value::Null, Value::Null);
        vec![
            self.event("response.created", json!({"response": r.clone()})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    /// The events one chat chunk makes.
    pub fn chunk(&mut self, chunk: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        if chunk["usage"].is_object() {
            self.usage = usage_of(&chunk["usage"]);
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return out;
        };
        let delta = &choice["delta"];
        let runs = choice["token_sources"].as_array();
        if let Some(text) = delta["reasoning_content"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            out.extend(self.reasoning_delta(text));
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            if !matches!(self.open, Some(Open::Message { .. })) {
                out.extend(self.close_open("completed"));
                out.extend(self.open_message());
            }
            let index = self.output.len();
            let id = self.head.message_id(index);
            if let Some(Open::Message { text: all, .. }) = self.open.as_mut() {
                all.push_str(text);
            }
            let mut event = json!({"item_id": id, "output_index": index, "content_index": 0,
                                   "delta": text, "logprobs": []});
            if let Some(runs) = runs {
                event["token_sources"] = Value::Array(runs.clone());
            }
            out.push(self.event("response.output_text.delta", event));
        }
        // Runs of tokens whose text is still held back come with an empty delta.
        if let (Some(runs), Some(Open::Message { sources, .. })) = (runs, self.open.as_mut()) {
            sources
                .get_or_insert_with(Vec::new)
                .extend(runs.iter().cloned());
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            out.extend(self.call_delta(call));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_string());
        }
        out
    }

    fn open_message(&mut self) -> Vec<Value> {
        let index = self.output.len();
        let id = self.head.message_id(index);
        let item = json!({"type": "message", "id": id, "status": "in_progress",
                          "role": "assistant", "content": []});
        let out = vec![
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ),
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": text_part("", None)}),
            ),
        ];
        self.open = Some(Open::Message {
            index,
            text: String::new(),
            sources: None,
        });
        out
    }

    /// A piece of the model's reasoning: the reasoning item opened first if it is not.
    fn reasoning_delta(&mut self, piece: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let index = self.output.len();
        let id = self.head.reasoning_id(index);
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            out.extend(self.close_open("completed"));
            let item = json!({"type": "reasoning", "id": id, "summary": [], "content": []});
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            self.open = Some(Open::Reasoning {
                index,
                text: String::new(),
            });
        }
        if let Some(Open::Reasoning { text, .. }) = self.open.as_mut() {
            text.push_str(piece);
        }
        out.push(self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": piece}),
        ));
        out
    }

    fn call_delta(&mut self, call: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        let k = call["index"].as_u64().unwrap_or(0) as usize;
        if !matches!(self.open, Some(Open::Call { k: open, .. }) if open == k) {
            out.extend(self.close_open("completed"));
            let index = self.output.len();
            let call_id = call["id"].as_str().unwrap_or("").to_string();
            let name = call["function"]["name"].as_str().unwrap_or("").to_string();
            let item = call_item(&self.head, index, &call_id, &name, "", "in_progress");
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            self.open = Some(Open::Call {
                index,
                k,
                call_id,
                name,
                arguments: String::new(),
            });
        }
        let piece = call["function"]["arguments"].as_str().unwrap_or("");
        if piece.is_empty() {
            return out;
        }
        let index = self.output.len();
        if let Some(Open::Call { arguments, .. }) = self.open.as_mut() {
            arguments.push_str(piece);
        }
        let item_id = self.head.call_item_id(index);
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": index, "delta": piece}),
        ));
        out
    }

    /// The events that close the response after the chat stream's `[DONE]`, and the final
    /// response object.
    pub fn finish(&mut self) -> (Vec<Value>, Value) {
        let status = status_of(self.finish.as_deref().unwrap_or("stop"));
        let mut out = Vec::new();
        if matches!(self.open, Some(Open::Reasoning { .. })) {
            out.extend(self.close_open("completed"));
        }
        // An answer of no text and no calls is still one (empty) message, as unstreamed.
        if self.open.is_none() && self.output.iter().all(|i| i["type"] == "reasoning") {
            out.extend(self.open_message());
        }
        out.extend(self.close_open(status));
        let response =
            self.head
                .response(status, self.output.clone(), self.usage.clone(), Value::Null);
        let kind = match status {
            "completed" => "response.completed",
            "failed" => "response.failed",
            _ => "response.incomplete",
        };
        out.push(self.event(kind, json!({"response": response.clone()})));
        (out, response)
    }

    /// The `.done` events of the item being streamed, if any.
    fn close_open(&mut self, status: &str) -> Vec<Value> {
        let Some(item) = self.open.take() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        match item {
            Open::Reasoning { index, text } => {
                let id = self.head.reasoning_id(index);
                out.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": text}),
                ));
                let item = reasoning_item(&self.head, index, &text);
                out.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item.clone()}),
                ));
                self.output.push(item);
            }
            Open::Message {
                index,
                text,
                sources,
            } => {
                let sources = sources.map(Value::Array);
                let id = self.head.message_id(index);
                out.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": text, "logprobs": []}),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": text_part(&text, sources.as_ref())}),
                ));
                let item = message_item(&self.head, index, &text, sources.as_ref(), status);
                out.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item.clone()}),
                ));
                self.output.push(item);
            }
            Open::Call {
                index,
                call_id,
                name,
                arguments,
                ..
            } => {
                let item = call_item(&self.head, index, &call_id, &name, &arguments, "completed");
                out.push(self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": item["id"], "output_index": index, "name": name,
                           "arguments": arguments}),
                ));
                out.push(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item.clone()}),
                ));
                self.output.push(item);
            }
        }
        out
    }

    /// `response.failed` with the chat stream's error: its code where the Responses API has
    /// it, else `server_error` with the code in the message.
    pub fn failed(&mut self, error: &Value) -> Value {
        let code = error["code"].as_str().unwrap_or("server_error");
        let message = error["message"].as_str().unwrap_or("generation failed");
        let error = if RESPONSE_ERROR_CODES.contains(&code) {
            json!({"code": code, "message": message})
        } else {
            json!({"code": "server_error", "message": format!("{code}: {message}")})
        };
        let response = self
            .head
            .response("failed", self.output.clone(), self.usage.clone(), error);
        self.event("response.failed", json!({"response": response}))
    }
}

/// The codes a Responses API error may carry (`ResponseError.code`) that tandem can give.
const RESPONSE_ERROR_CODES: &[&str] = &["server_error", "rate_limit_exceeded", "invalid_prompt"];

#[cfg(test)]
mod tests;
