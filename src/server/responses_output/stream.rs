//! The semantic events of a streamed response (`response.created`, items added, text and
//! reasoning deltas, items done, `response.completed`), made from a chat stream's chunks in
//! order: one item open at a time, as the API finishes an item before it adds the next.

use serde_json::{json, Value};

use super::{
    call_item, message_item, reasoning_item, status_of, text_part, usage_of, ResponseHead,
};

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
