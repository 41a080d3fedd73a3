use serde_json::{json, Map, Value};

use super::*;

fn req(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("an object"),
    }
}

#[test]
fn a_string_input_with_instructions_and_limits_becomes_a_chat_request() {
    let earlier = [json!({"role": "user", "content": "before"})];
    let f = chat_form(
        &req(
            json!({"model": "m", "input": "hi", "instructions": "be brief",
                    "max_output_tokens": 9, "temperature": 0, "stream": true,
                    "metadata": {"k": "v"}, "store": false, "speculative": {"gamma": 2}}),
        ),
        &earlier,
    )
    .unwrap();
    assert_eq!(
        Value::Object(f.body.clone()),
        json!({"model": "m", "max_tokens": 9, "temperature": 0, "stream": true,
               "stream_options": {"include_usage": true}, "speculative": {"gamma": 2},
               "messages": [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": "before"},
                            {"role": "user", "content": "hi"}]})
    );
    assert_eq!(f.added, vec![json!({"role": "user", "content": "hi"})]);
}

#[test]
fn items_become_turns_and_calls_made_together_one_assistant_turn() {
    let f = chat_form(
        &req(json!({"input": [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "two"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
        ]})),
        &[],
    )
    .unwrap();
    assert_eq!(
        f.body["messages"],
        json!([
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "ab"},
            {"role": "assistant", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
            {"role": "assistant", "content": "done"},
        ])
    );
    assert_eq!(f.added.len(), 6);
}

#[test]
fn function_tools_choices_and_text_formats_take_chat_shapes() {
    let f = chat_form(
        &req(json!({"input": "x",
            "tools": [{"type": "function", "name": "f", "description": "d",
                       "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"},
            "parallel_tool_calls": false,
            "text": {"format": {"type": "json_schema", "name": "s",
                                "schema": {"type": "object"}, "strict": true}}})),
        &[],
    )
    .unwrap();
    assert_eq!(
        f.body["tools"],
        json!([{"type": "function", "function": {"name": "f", "description": "d",
                "parameters": {"type": "object"}, "strict": true}}])
    );
    assert_eq!(
        f.body["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(f.body["parallel_tool_calls"], json!(false));
    assert_eq!(
        f.body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "s",
               "schema": {"type": "object"}, "strict": true}})
    );
    for (text, want) in [
        (json!({"format": {"type": "text"}}), None),
        (
            json!({"format": {"type": "json_object"}}),
            Some(json!({"type": "json_object"})),
        ),
    ] {
        let f = chat_form(&req(json!({"input": "x", "text": text})), &[]).unwrap();
        assert_eq!(f.body.get("response_format").cloned(), want);
    }
    let f = chat_form(&req(json!({"input": "x", "tool_choice": "required"})), &[]).unwrap();
    assert_eq!(f.body["tool_choice"], json!("required"));
}

#[test]
fn what_tandem_does_not_do_is_refused_by_name() {
    for (body, param) in [
        (json!({}), "input"),
        (json!({"input": 3}), "input"),
        (
            json!({"input": "x", "reasoning": {"summary": "auto"}}),
            "reasoning.summary",
        ),
        (
            json!({"input": "x", "reasoning": {"depth": 2}}),
            "reasoning.depth",
        ),
        (json!({"input": "x", "reasoning": "high"}), "reasoning"),
        (
            json!({"input": [{"type": "reasoning", "content": []},
                             {"role": "user", "content": "x"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"role": "user", "content": "x"},
                             {"type": "reasoning", "content": []}]}),
            "input[1]",
        ),
        (
            json!({"input": [{"type": "reasoning", "content": [{"type": "summary_text"}]},
                             {"role": "assistant", "content": "x"}]}),
            "input[0].content[0]",
        ),
        (json!({"input": "x", "background": true}), "background"),
        (
            json!({"input": "x", "include": ["reasoning.encrypted_content"]}),
            "include",
        ),
        (json!({"input": "x", "truncation": "auto"}), "truncation"),
        (json!({"input": "x", "max_tokens": 5}), "max_tokens"),
        (json!({"input": "x", "messages": []}), "messages"),
        (
            json!({"input": "x", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"input": "x", "instructions": 5}), "instructions"),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "tool_choice": {"type": "web_search"}}),
            "tool_choice",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "grammar"}}}),
            "text.format.type",
        ),
        (
            json!({"input": "x", "text": {"verbosity": "low"}}),
            "text.verbosity",
        ),
        (json!({"input": "x", "temprature": 0.5}), "temprature"),
        (
            json!({"input": "x", "context_management": [{"type": "compaction"}]}),
            "context_management",
        ),
        (
            json!({"input": "x", "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (json!({"input": [{"id": "msg_1"}]}), "input[0].type"),
        (
            json!({"input": [{"type": "reasoning", "summary": []}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            "input[0].role",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0].call_id",
        ),
    ] {
        let e = chat_form(&req(body.clone()), &[]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        assert_eq!(e.status.as_u16(), 400);
    }
    // Values that ask for nothing pass.
    chat_form(
        &req(
            json!({"input": "x", "background": false, "include": [], "truncation": "disabled",
                    "reasoning": null, "not_a_field": null, "prompt_cache_options": {}}),
        ),
        &[],
    )
    .unwrap();
}

#[test]
fn chat_field_names_in_errors_are_told_in_the_responses_api_s_words() {
    assert_eq!(responses_param("messages[2].content"), "input");
    assert_eq!(responses_param("max_tokens"), "max_output_tokens");
    assert_eq!(responses_param("response_format"), "text.format");
    assert_eq!(
        responses_param("tools[1].function.parameters"),
        "tools[1].parameters"
    );
    assert_eq!(responses_param("temperature"), "temperature");
}

/// A model's reasoning, as the Responses API returns it (a `reasoning` item before the answer),
/// goes back to the assistant turn it came with as `reasoning_content`; `reasoning.effort` is
/// chat's `reasoning_effort`.
#[test]
fn reasoning_items_join_their_assistant_turn_and_effort_is_chats() {
    let think = |t: &str| {
        json!({"type": "reasoning", "id": "rs_1", "summary": [],
                                 "content": [{"type": "reasoning_text", "text": t}]})
    };
    let f = chat_form(
        &req(
            json!({"reasoning": {"effort": "high", "summary": null}, "input": [
                {"role": "user", "content": "q"},
                think("Think"),
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Go!"}]},
                {"role": "user", "content": "again"},
                think("Call"),
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
            ]}),
        ),
        &[],
    )
    .unwrap();
    assert_eq!(f.body["reasoning_effort"], "high");
    assert_eq!(
        f.body["messages"],
        json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "Go!", "reasoning_content": "Think"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "reasoning_content": "Call", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
        ])
    );
    assert_eq!(responses_param("reasoning_effort"), "reasoning.effort");
}
