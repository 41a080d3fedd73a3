//! Tool calls over the API: a request's `tools` and `tool_choice` read and checked into
//! [`Tools`] (whose prompt, grammar and parsing are `constraint::tools`), and the ids of the
//! calls an answer holds.

use serde_json::{json, Value};

use super::error::ApiError;
use super::schema::ToolIn;
use crate::constraint::tools::{ParsedCall, Tool, ToolChoice, Tools};

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
    Ok(Some(Tools::new(checked, choice, parallel.unwrap_or(true))))
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

/// A call's id: unique within the server's responses.
pub(super) fn call_id(request_id: &str, choice: usize, call: usize) -> String {
    let tail = request_id.rsplit('-').next().unwrap_or(request_id);
    format!("call_{tail}_{choice}_{call}")
}

/// A call as OpenAI's API writes it (`index` in streamed deltas).
pub(super) fn call_json(call: &ParsedCall, id: &str, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
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
}
