//! Tool calls (function calling) as the model sees them: the tools described in a system
//! prompt, the answer held by a grammar to free text or to calls whose arguments validate
//! against each function's `parameters`, and the calls parsed back out of the text, whole or
//! as they stream.
//!
//! The format is the Hermes one many open models are trained on (Qwen, Hermes, SmolLM3): the
//! tools as JSON inside `<tools></tools>`, each call as `<tool_call>\n{"name": …, "arguments":
//! …}\n</tool_call>`, a tool's result as `<tool_response>` in a user turn. It is written into
//! the conversation itself, so it works with every chat template.

use serde_json::{json, Value};

use super::ConstraintSpec;

/// How a call opens and closes in the answer's text.
pub const CALL_OPEN: &str = "<tool_call>\n";
pub const CALL_CLOSE: &str = "\n</tool_call>";

/// A call of an earlier turn, written as the model writes calls.
pub fn call_text(name: &str, arguments: &Value) -> String {
    let body = json!({"name": name, "arguments": arguments});
    format!("{CALL_OPEN}{body}{CALL_CLOSE}")
}

/// A tool's result, written as the model reads results (inside a user turn).
pub fn response_text(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// What the model may do with the tools (OpenAI's `tool_choice`).
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A function the model may call.
#[derive(Clone, Debug)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON schema.
    pub parameters: Value,
}

/// The tools offered to the model, and how it may use them.
#[derive(Clone, Debug)]
pub struct Tools {
    tools: Vec<Tool>,
    pub choice: ToolChoice,
    parallel: bool,
}

impl Tools {
    /// `tools` offered under `choice`; `parallel`: the answer may hold several calls.
    pub fn new(tools: Vec<Tool>, choice: ToolChoice, parallel: bool) -> Self {
        Self {
            tools,
            choice,
            parallel,
        }
    }

    /// Whether the model may call tools at all.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The system prompt that describes the tools and the call format.
    pub fn system_prompt(&self) -> String {
        let mut s = String::from(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
        );
        for t in &self.tools {
            let mut f = json!({"name": t.name});
            if let Some(d) = &t.description {
                f["description"] = json!(d);
            }
            f["parameters"] = t.parameters.clone();
            s.push('\n');
            s.push_str(&json!({"type": "function", "function": f}).to_string());
        }
        s.push_str(
            "\n</tools>\n\nFor each function call, return a json object with function name and \
             arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
             <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        s
    }

    /// The grammar of the answer: calls of the allowed tools (their arguments valid against
    /// their schemas), one or several, or (`auto`) free text that does not start a call.
    pub fn constraint(&self) -> Option<ConstraintSpec> {
        let allowed: Vec<&Tool> = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        };
        let calls: Vec<Value> = allowed
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = super::with_json_layout(&if calls.len() == 1 {
            calls[0].clone()
        } else {
            json!({"anyOf": calls})
        });
        let call = format!(
            "call: {} %json {} {}",
            super::lark_string(CALL_OPEN),
            schema,
            super::lark_string(CALL_CLOSE)
        );
        let calls = if self.parallel {
            "calls: call (\"\\n\" call)*"
        } else {
            "calls: call"
        };
        let start = match self.choice {
            // Free text may not begin like a call, so every call is one the grammar checked.
            ToolChoice::Auto => "start: calls | TEXT\nTEXT: /[^<][\\s\\S]*/",
            _ => "start: calls",
        };
        Some(ConstraintSpec::Lark(format!("{start}\n{calls}\n{call}\n")))
    }
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments object, as OpenAI sends it: a JSON string.
    pub arguments: String,
}

/// The call in one `<tool_call>` block's body.
fn parse_call(body: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    Some(ParsedCall {
        name: v.get("name")?.as_str()?.to_string(),
        arguments: v.get("arguments")?.to_string(),
    })
}

/// The calls in a whole answer, when it is calls (it starts with one); `None` for text.
pub fn parse_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = text.trim_start();
    if !rest.starts_with(CALL_OPEN.trim_end()) {
        return None;
    }
    let mut calls = Vec::new();
    while let Some(start) = rest.find("<tool_call>") {
        let body_start = start + "<tool_call>".len();
        let end = rest[body_start..].find("</tool_call>")? + body_start;
        calls.push(parse_call(&rest[body_start..end])?);
        rest = &rest[end + "</tool_call>".len()..];
    }
    Some(calls)
}

/// What a streamed answer releases as its text comes: text as it is, or each call once its
/// block is complete.
#[derive(Debug, PartialEq)]
pub enum StreamPiece {
    Text(String),
    Call(ParsedCall),
}

/// Splits a streamed answer into text and calls: it holds text back until it can tell which
/// the answer is (its first character), then releases text at once, or each call whole.
#[derive(Default, Debug)]
pub struct ToolStream {
    held: String,
    /// `None` until decided; `Some(true)` for calls.
    calls: Option<bool>,
    /// Calls released so far.
    pub released: usize,
}

impl ToolStream {
    pub fn push(&mut self, text: &str) -> Vec<StreamPiece> {
        self.held.push_str(text);
        if self.calls.is_none() {
            let start = self.held.trim_start();
            if start.is_empty() {
                return Vec::new();
            }
            self.calls = Some(start.starts_with('<'));
        }
        if self.calls == Some(false) {
            return vec![StreamPiece::Text(std::mem::take(&mut self.held))];
        }
        let mut out = Vec::new();
        while let Some(end) = self.held.find("</tool_call>") {
            let block_end = end + "</tool_call>".len();
            let block: String = self.held.drain(..block_end).collect();
            let body = block
                .find("<tool_call>")
                .map(|s| &block[s + "<tool_call>".len()..end]);
            match body.and_then(parse_call) {
                Some(call) => {
                    self.released += 1;
                    out.push(StreamPiece::Call(call));
                }
                None => out.push(StreamPiece::Text(block)),
            }
        }
        out
    }

    /// What is left at the end: held text that never became a call.
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.held);
        (!rest.trim().is_empty()).then_some(rest)
    }

    /// Whether the answer turned out to be calls.
    pub fn is_calls(&self) -> bool {
        self.calls == Some(true) && self.released > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_parse_whole_and_streamed() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let calls = parse_calls(text).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, r#"{"city":"Rome"}"#);
        assert!(parse_calls("It is sunny.").is_none());
        let mut s = ToolStream::default();
        let mut got = Vec::new();
        for piece in text.as_bytes().chunks(7) {
            got.extend(s.push(std::str::from_utf8(piece).unwrap()));
        }
        assert_eq!(
            got,
            calls.into_iter().map(StreamPiece::Call).collect::<Vec<_>>()
        );
        assert!(s.is_calls());
        assert_eq!(s.finish(), None);
        let mut s = ToolStream::default();
        assert_eq!(s.push(" "), vec![]);
        assert_eq!(s.push("Hi"), vec![StreamPiece::Text(" Hi".into())]);
        assert!(!s.is_calls());
    }
}
