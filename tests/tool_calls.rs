//! Tool calls over the API as OpenAI defines them, on the default model: tool schemas as
//! clients write them (`$defs` and `$ref`, as every nested Pydantic model or Enum generates),
//! a named `tool_choice` giving exactly one call, an answer cut by `max_tokens` returning its
//! complete calls and no markup, and streamed calls equal to the whole answer's, call for call.

use crate::common;

use common::http::{post_json, Response, Server};
use serde_json::{json, Value};

/// `openai.pydantic_function_tool(Forecast)`'s shape: a nested model and an Enum under `$defs`.
fn forecast_tool() -> Value {
    json!({"type": "function", "function": {"name": "forecast", "strict": true, "parameters": {
        "$defs": {
            "Place": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 20},
                "country": {"type": "string", "maxLength": 20}},
                "required": ["city", "country"], "additionalProperties": false},
            "Unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/Place"}, "unit": {"$ref": "#/$defs/Unit"},
                       "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["place", "unit", "days"],
        "additionalProperties": false,
    }}})
}

fn clock_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_time"}})
}

fn ask(tools: Value, choice: Value, max_tokens: usize) -> Value {
    json!({
        "messages": [{"role": "user", "content": "What will the weather be in Paris this week?"}],
        "tools": tools, "tool_choice": choice, "max_tokens": max_tokens, "temperature": 0,
    })
}

/// The calls of a whole answer: name and parsed arguments.
fn whole_calls(r: &Response) -> (Vec<(String, Value)>, Value) {
    assert_eq!(r.status, 200, "{}", r.text());
    let choice = r.json()["choices"][0].clone();
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let args = c["function"]["arguments"].as_str().unwrap();
            (
                c["function"]["name"].as_str().unwrap().to_string(),
                serde_json::from_str(args).expect("arguments are JSON"),
            )
        })
        .collect();
    (calls, choice)
}

/// The calls of a streamed answer, assembled from their deltas by index, and the text it
/// streamed as content.
fn streamed_calls(r: &Response) -> (Vec<(String, Value)>, String, String) {
    assert_eq!(r.status, 200, "{}", r.text());
    let mut calls: Vec<(String, String)> = Vec::new();
    let (mut content, mut finish) = (String::new(), String::new());
    for data in r.sse_data() {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
        content += choice["delta"]["content"].as_str().unwrap_or_default();
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                calls.resize(i + 1, Default::default());
            }
            calls[i].0 += d["function"]["name"].as_str().unwrap_or_default();
            calls[i].1 += d["function"]["arguments"].as_str().unwrap_or_default();
        }
    }
    let calls = calls
        .into_iter()
        .map(|(name, args)| {
            (
                name,
                serde_json::from_str(&args).expect("arguments are JSON"),
            )
        })
        .collect();
    (calls, content, finish)
}

fn assert_forecast(args: &Value) {
    let place = &args["place"];
    assert!(
        place["city"].is_string() && place["country"].is_string(),
        "{args}"
    );
    assert!(
        ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
        "{args}"
    );
    assert!((1..=9).contains(&args["days"].as_i64().unwrap()), "{args}");
}

#[test]
fn tool_schemas_with_definitions_work_under_every_choice() {
    let server = Server::start(&["--context-length", "1024"], &[]);
    let named = json!({"type": "function", "function": {"name": "forecast"}});
    for choice in [json!("required"), named, json!("auto")] {
        let body = ask(json!([forecast_tool(), clock_tool()]), choice.clone(), 120);
        let (calls, whole) = whole_calls(&post_json(&server.addr, "/v1/chat/completions", &body));
        for (name, args) in &calls {
            if name == "forecast" {
                assert_forecast(args);
            }
        }
        if choice != json!("auto") {
            assert!(!calls.is_empty(), "{choice}: {whole}");
        }
    }
}

#[test]
fn a_named_choice_is_one_call_and_a_cut_answer_keeps_its_complete_calls() {
    let server = Server::start(&["--context-length", "1024"], &[]);
    let tools = json!([forecast_tool(), clock_tool()]);
    // Named, with parallel calls allowed (the default) and room for many: exactly one.
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let body = ask(tools.clone(), named, 200);
    let (calls, whole) = whole_calls(&post_json(&server.addr, "/v1/chat/completions", &body));
    assert_eq!(calls, vec![("get_time".to_string(), json!({}))], "{whole}");
    assert_eq!(whole["finish_reason"], "tool_calls");
    // Required, parallel: the model calls again and again until max_tokens cuts a call. Every
    // complete call comes back, and none of the markup; streamed, the same calls.
    let mut cut_after_a_call = 0;
    for max_tokens in [40, 70, 100] {
        let mut body = ask(tools.clone(), json!("required"), max_tokens);
        let (calls, whole) = whole_calls(&post_json(&server.addr, "/v1/chat/completions", &body));
        assert!(whole["message"]["content"].is_null(), "{whole}");
        body["stream"] = json!(true);
        let (streamed, content, finish) =
            streamed_calls(&post_json(&server.addr, "/v1/chat/completions", &body));
        assert_eq!(streamed, calls, "max_tokens {max_tokens}");
        assert!(
            !content.contains("tool_call"),
            "markup streamed as content: {content:?}"
        );
        assert_eq!(finish, whole["finish_reason"].as_str().unwrap());
        if finish == "length" {
            cut_after_a_call += usize::from(!calls.is_empty());
        } else {
            assert_eq!(finish, "tool_calls");
        }
    }
    assert!(
        cut_after_a_call > 0,
        "no answer was cut after a complete call"
    );
}
