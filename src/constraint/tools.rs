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

use super::{with_json_layout, ConstraintSpec, JsonWhitespace};

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
    /// their schemas, laid out as `whitespace` says), or (`auto`) free text that does not
    /// start a call. A named tool is called exactly once; `auto` and `required` may call
    /// several tools in a row where parallel calls are allowed.
    pub fn constraint(&self, whitespace: &JsonWhitespace) -> Option<ConstraintSpec> {
        let allowed: Vec<&Tool> = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            ToolChoice::Auto | ToolChoice::Required => self.tools.iter().collect(),
        };
        let mut defs = serde_json::Map::new();
        let calls: Vec<Value> = allowed
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let arguments = if has_local_ref(&t.parameters) {
                    // The schema sits under the call's wrapper, so its own refs (`#/$defs/X`,
                    // `#`) would resolve against the wrong root: it moves to the top's
                    // `$defs` with every local ref rewritten to point into it.
                    let name = format!("tool_{i}");
                    let at = format!("#/$defs/{name}");
                    defs.insert(name, rebased_refs(&t.parameters, &at));
                    json!({"$ref": at})
                } else {
                    t.parameters.clone()
                };
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": arguments},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut schema = if calls.len() == 1 {
            calls[0].clone()
        } else {
            json!({"anyOf": calls})
        };
        if !defs.is_empty() {
            schema["$defs"] = Value::Object(defs);
        }
        let schema = with_json_layout(&schema, whitespace);
        let call = format!(
            "call: {} %json {} {}",
            super::lark_string(CALL_OPEN),
            schema,
            super::lark_string(CALL_CLOSE)
        );
        let several = self.parallel && !matches!(self.choice, ToolChoice::Named(_));
        let calls = if several {
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

/// Keys whose values are data, not schemas: a `$ref` there is not a reference.
const DATA_KEYS: [&str; 4] = ["const", "enum", "default", "examples"];

/// Whether a schema holds a local `$ref` (`#...`).
fn has_local_ref(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => map.iter().any(|(k, v)| match (k.as_str(), v) {
            ("$ref", Value::String(r)) => r.starts_with('#'),
            (k, _) if DATA_KEYS.contains(&k) => false,
            _ => has_local_ref(v),
        }),
        Value::Array(items) => items.iter().any(has_local_ref),
        _ => false,
    }
}

/// `schema` with every local ref rebased onto `at` (`#/$defs/A` becomes `{at}/$defs/A`,
/// `#` becomes `at`), for the schema moved to `at`.
fn rebased_refs(schema: &Value, at: &str) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("$ref", Value::String(r)) if r.starts_with('#') => {
                            Value::String(format!("{at}{}", &r[1..]))
                        }
                        (k, v) if DATA_KEYS.contains(&k) => v.clone(),
                        (_, v) => rebased_refs(v, at),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| rebased_refs(v, at)).collect()),
        other => other.clone(),
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

/// The calls in a whole answer, when it is calls (it starts with one); `None` for text. A
/// call the answer did not finish (its token limit came first) is left out: every complete
/// call is returned, and none of the markup.
pub fn parse_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let mut rest = text.trim_start();
    if !rest.starts_with(CALL_OPEN.trim_end()) {
        return None;
    }
    let mut calls = Vec::new();
    while let Some(start) = rest.find("<tool_call>") {
        let body_start = start + "<tool_call>".len();
        let Some(end) = rest[body_start..].find("</tool_call>") else {
            break;
        };
        let end = end + body_start;
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

    /// What is left at the end: held text that never became a call. An answer of calls
    /// leaves nothing: what it holds back is a call its token limit cut, which is no call and
    /// no text.
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.held);
        (self.calls != Some(true) && !rest.trim().is_empty()).then_some(rest)
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

    #[test]
    fn an_answer_cut_by_its_limit_keeps_every_complete_call_and_no_markup() {
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"argu";
        let calls = parse_calls(text).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "a");
        let mut s = ToolStream::default();
        let got = s.push(text);
        assert_eq!(got, vec![StreamPiece::Call(calls[0].clone())]);
        assert_eq!(s.finish(), None, "the cut call is no text");
        assert!(s.is_calls());
        // Cut inside the first call: no call, still no markup.
        assert_eq!(parse_calls("<tool_call>\n{\"na").unwrap(), vec![]);
    }

    fn tool(name: &str, parameters: Value) -> Tool {
        Tool {
            name: name.into(),
            description: None,
            parameters,
        }
    }

    /// The Lark rule `name` of a grammar, and its `%json` schema when it has one.
    fn call_schema(spec: &ConstraintSpec) -> Value {
        let ConstraintSpec::Lark(g) = spec else {
            panic!("tools compile to Lark")
        };
        let at = g.find("%json ").expect("a call schema") + "%json ".len();
        let mut values = serde_json::Deserializer::from_str(&g[at..]).into_iter::<Value>();
        values.next().unwrap().unwrap()
    }

    #[test]
    fn parameters_with_their_own_definitions_are_hoisted_with_refs_rebased() {
        let params = json!({
            "$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string"},
                                "next": {"$ref": "#/$defs/Addr"}}},
                      "Kind": {"enum": ["home", "work"]}},
            "type": "object",
            "properties": {"addr": {"$ref": "#/$defs/Addr"}, "kind": {"$ref": "#/$defs/Kind"},
                           "self": {"$ref": "#"}, "note": {"const": {"$ref": "#/data"}}},
        });
        let tools = Tools::new(
            vec![
                tool("a", params.clone()),
                tool("b", json!({"type": "object"})),
            ],
            ToolChoice::Required,
            true,
        );
        let schema = call_schema(&tools.constraint(&JsonWhitespace::Compact).unwrap());
        let hoisted = &schema["$defs"]["tool_0"];
        assert_eq!(
            hoisted["properties"]["addr"]["$ref"],
            "#/$defs/tool_0/$defs/Addr"
        );
        assert_eq!(
            hoisted["$defs"]["Addr"]["properties"]["next"]["$ref"],
            "#/$defs/tool_0/$defs/Addr"
        );
        assert_eq!(hoisted["properties"]["self"]["$ref"], "#/$defs/tool_0");
        assert_eq!(
            hoisted["properties"]["note"]["const"]["$ref"], "#/data",
            "data stays"
        );
        assert_eq!(
            schema["anyOf"][0]["properties"]["arguments"]["$ref"],
            "#/$defs/tool_0"
        );
        // A tool without refs keeps its schema in place.
        assert_eq!(
            schema["anyOf"][1]["properties"]["arguments"],
            json!({"type": "object"})
        );
        assert!(schema["$defs"].get("tool_1").is_none());
    }

    #[test]
    fn a_named_choice_is_one_call_even_where_parallel_calls_are_allowed() {
        let tools = || vec![tool("a", json!({"type": "object"}))];
        let grammar = |choice, parallel| match Tools::new(tools(), choice, parallel)
            .constraint(&JsonWhitespace::Flexible)
            .unwrap()
        {
            ConstraintSpec::Lark(g) => g,
            _ => unreachable!(),
        };
        assert!(grammar(ToolChoice::Named("a".into()), true).contains("calls: call\n"));
        assert!(grammar(ToolChoice::Required, true).contains("calls: call (\"\\n\" call)*"));
        assert!(grammar(ToolChoice::Required, false).contains("calls: call\n"));
        assert!(grammar(ToolChoice::Auto, true).contains("TEXT"));
    }
}
