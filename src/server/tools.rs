//! Tool calls (function calling): a request's `tools` and `tool_choice` read and checked, the
//! tools described to the model in a system prompt, the model's answer held by a grammar to
//! free text or to calls whose arguments validate against each function's `parameters`, and
//! the calls parsed back out of the text, whole or as they stream.
//!
//! The format is the Hermes one many open models are trained on (Qwen, Hermes, SmolLM3): the
//! tools as JSON inside `<tools></tools>`, each call as `<tool_call>\n{"name": …, "arguments":
//! …}\n</tool_call>`, a tool's result as `<tool_response>` in a user turn. It is written into
//! the conversation itself, so it works with every chat template.

use serde_json::{json, Value};

use super::error::ApiError;
use super::schema::ToolIn;
use crate::constraint::ConstraintSpec;

const CALL_OPEN: &str = "<tool_call>\n";
const CALL_CLOSE: &str = "\n</tool_call>";

#[derive(Clone, Debug, PartialEq)]
pub(super) enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

#[derive(Clone, Debug)]
struct Tool {
    name: String,
    description: Option<String>,
    parameters: Value,
}

/// A request's tools, checked.
#[derive(Clone, Debug)]
pub(super) struct Tools {
    tools: Vec<Tool>,
    pub choice: ToolChoice,
    parallel: bool,
}

/// OpenAI's rule for a function's name.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` when the request has no
/// tools.
pub(super) fn read_tools(
    tools: Option<Vec<ToolIn>>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, ApiError> {
    let tools = tools.unwrap_or_default();
    let choice = read_choice(choice)?;
    if tools.is_empty() {
        return match choice {
            None | Some(ToolChoice::None) => Ok(None),
            Some(_) => Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice needs `tools` to choose from.",
            )),
        };
    }
    let mut checked: Vec<Tool> = Vec::with_capacity(tools.len());
    for (i, t) in tools.into_iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}].type"),
                format!(
                    "Unknown tool type `{}`: only `function` tools exist.",
                    t.kind
                ),
            ));
        }
        let Some(f) = t.function else {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}].function"),
                "A function tool needs its `function`.",
            ));
        };
        if !valid_name(&f.name) {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}].function.name"),
                "A function's name is 1 to 64 letters, digits, underscores or dashes.",
            ));
        }
        if checked.iter().any(|c| c.name == f.name) {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}].function.name"),
                format!("Two tools are named `{}`.", f.name),
            ));
        }
        let parameters = match f.parameters {
            // OpenAI: a function without parameters takes none.
            None | Some(Value::Null) => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            Some(p) if p.is_object() => p,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    &format!("tools[{i}].function.parameters"),
                    "A function's parameters are a JSON schema (an object).",
                ))
            }
        };
        let _ = f.strict; // Arguments always validate against the schema: strict or not.
        checked.push(Tool {
            name: f.name,
            description: f.description,
            parameters,
        });
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Named(name) = &choice {
        if !checked.iter().any(|t| &t.name == name) {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!("tool_choice names `{name}`, which is not one of the tools."),
            ));
        }
    }
    Ok(Some(Tools {
        tools: checked,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

fn read_choice(choice: Option<&Value>) -> Result<Option<ToolChoice>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "tool_choice",
            "tool_choice is none, auto, required, or {\"type\": \"function\", \"function\": \
             {\"name\": ...}}.",
        )
    };
    Ok(match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(bad()),
        }),
        Some(v) => {
            if v.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad());
            }
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            Some(ToolChoice::Named(name.to_string()))
        }
    })
}

impl Tools {
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
        let schema = crate::constraint::with_json_layout(&if calls.len() == 1 {
            calls[0].clone()
        } else {
            json!({"anyOf": calls})
        });
        let call = format!(
            "call: {} %json {} {}",
            crate::constraint::lark_string(CALL_OPEN),
            schema,
            crate::constraint::lark_string(CALL_CLOSE)
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
pub(super) struct ParsedCall {
    pub name: String,
    /// The arguments object, as OpenAI sends it: a JSON string.
    pub arguments: String,
}

impl ParsedCall {
    pub fn to_json(&self, id: &str, index: Option<usize>) -> Value {
        let mut v = json!({
            "id": id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }
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
pub(super) fn parse_calls(text: &str) -> Option<Vec<ParsedCall>> {
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

/// A call's id: unique within the server's responses.
pub(super) fn call_id(request_id: &str, choice: usize, call: usize) -> String {
    let tail = request_id.rsplit('-').next().unwrap_or(request_id);
    format!("call_{tail}_{choice}_{call}")
}

/// What a streamed answer releases as its text comes: text as it is, or each call once its
/// block is complete.
#[derive(Debug, PartialEq)]
pub(super) enum StreamPiece {
    Text(String),
    Call(ParsedCall),
}

/// Splits a streamed answer into text and calls: it holds text back until it can tell which
/// the answer is (its first character), then releases text at once, or each call whole.
#[derive(Default, Debug)]
pub(super) struct ToolStream {
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

    fn weather() -> Vec<ToolIn> {
        serde_json::from_value(json!([{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]},
            },
        }]))
        .unwrap()
    }

    #[test]
    fn tool_choice_and_tools_are_checked_with_their_parameter() {
        let named = json!({"type": "function", "function": {"name": "nope"}});
        let e = read_tools(Some(weather()), Some(&named), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = read_tools(None, Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = read_tools(Some(weather()), Some(&json!("sometimes")), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let bad: Vec<ToolIn> = serde_json::from_value(json!([{"type": "retrieval"}])).unwrap();
        let e = read_tools(Some(bad), None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let bad: Vec<ToolIn> =
            serde_json::from_value(json!([{"type": "function", "function": {"name": "a b"}}]))
                .unwrap();
        let e = read_tools(Some(bad), None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].function.name"));
        let t = read_tools(Some(weather()), None, None).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert!(t.system_prompt().contains("\"get_weather\""));
        assert!(read_tools(None, Some(&json!("none")), None)
            .unwrap()
            .is_none());
    }

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
