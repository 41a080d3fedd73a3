//! The Responses API (`/v1/responses`) on the default model: each answer equal to the chat
//! completion of the same conversation (one generation path), streamed events in their order
//! adding up to the whole answer, continued by `previous_response_id`, stored, read back and
//! deleted, function tools and `text.format`, and every field tandem does not do refused by
//! name. (The official client against it: `tests/openai_client.py`.)

use crate::common;

use common::http::{get, post_json, request, Response, Server};
use serde_json::{json, Value};

fn chat_text(addr: &str, messages: Value, max_tokens: u64) -> String {
    let r = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn respond(addr: &str, body: Value) -> Value {
    let r = post_json(addr, "/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().clone())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

/// A streamed response's events: each `event:` name and its data.
fn events(r: &Response) -> Vec<(String, Value)> {
    let text = r.text();
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event:") {
            name = Some(n.trim().to_string());
        } else if let Some(d) = line.strip_prefix("data:") {
            let v: Value = serde_json::from_str(d.trim()).unwrap();
            let n = name.take().expect("every event is named");
            assert_eq!(v["type"], n.as_str(), "the event's name is its type");
            out.push((n, v));
        }
    }
    out
}

fn assert_refused(r: &Response, status: u16, param: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["param"], param, "{v}");
}

#[test]
fn responses_follow_the_chat_path_stream_continue_call_tools_and_refuse_by_name() {
    let server = Server::start(&["--draft-model", "prompt-lookup"], &[]);
    let addr = server.addr.clone();

    // Plain: the chat answer to the same turns, with its usage.
    let q1 = "Name three colours of the rainbow.";
    let r = respond(
        &addr,
        json!({"input": q1, "instructions": "Answer briefly.", "max_output_tokens": 32,
               "temperature": 0, "metadata": {"k": "v"}}),
    );
    let want = chat_text(
        &addr,
        json!([{"role": "system", "content": "Answer briefly."},
               {"role": "user", "content": q1}]),
        32,
    );
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["store"], true);
    assert_eq!(output_text(&r), want);
    assert!(
        r["status"] == "completed" || r["status"] == "incomplete",
        "{r}"
    );
    assert_eq!(r["output"][0]["role"], "assistant");
    assert_eq!(r["instructions"], "Answer briefly.");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    let u = &r["usage"];
    assert!(u["input_tokens"].as_u64().unwrap() > 5, "{u}");
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
    );
    assert!(u["speculative"].is_object(), "{u}");
    let id = r["id"].as_str().unwrap().to_string();

    // Stored: read back, continued (instructions do not carry over), deleted.
    let got = get(&addr, &format!("/v1/responses/{id}"));
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), r);
    let q2 = "Now name one more.";
    let r2 = respond(
        &addr,
        json!({"input": q2, "previous_response_id": id, "max_output_tokens": 24,
               "temperature": 0}),
    );
    let want2 = chat_text(
        &addr,
        json!([{"role": "user", "content": q1},
               {"role": "assistant", "content": want},
               {"role": "user", "content": q2}]),
        24,
    );
    assert_eq!(output_text(&r2), want2);
    assert_eq!(r2["previous_response_id"], id.as_str());
    let del = request(&addr, "DELETE", &format!("/v1/responses/{id}"), &[], b"");
    assert_eq!(del.status, 200);
    assert_eq!(del.json()["deleted"], true);
    assert_refused(
        &get(&addr, &format!("/v1/responses/{id}")),
        404,
        "response_id",
    );
    let gone = post_json(
        &addr,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": id}),
    );
    assert_refused(&gone, 404, "previous_response_id");
    assert!(gone.text().contains(&id));
    // `store: false` keeps nothing.
    let unstored = respond(
        &addr,
        json!({"input": "Hi", "max_output_tokens": 4, "store": false}),
    );
    let path = format!("/v1/responses/{}", unstored["id"].as_str().unwrap());
    assert_eq!(get(&addr, &path).status, 404);

    // Streamed: the semantic events in order, adding up to the same answer.
    let body = json!({"input": q1, "instructions": "Answer briefly.", "max_output_tokens": 32,
                      "temperature": 0, "stream": true});
    let s = post_json(&addr, "/v1/responses", &body);
    assert_eq!(s.status, 200, "{}", s.text());
    let ev = events(&s);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    let n = names.len();
    assert_eq!(
        &names[n - 4..n - 1],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done"
        ]
    );
    assert!(names[n - 1] == "response.completed" || names[n - 1] == "response.incomplete");
    for (i, (_, v)) in ev.iter().enumerate() {
        assert_eq!(v["sequence_number"], i);
    }
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, want);
    let last = &ev[n - 1].1["response"];
    assert_eq!(output_text(last), want);
    assert_eq!(last["usage"]["output_tokens"], r["usage"]["output_tokens"]);
    // A streamed response is stored too.
    let path = format!("/v1/responses/{}", last["id"].as_str().unwrap());
    assert_eq!(get(&addr, &path).json(), *last);

    // Per-request speculation settings work as on chat: off, the same answer with no drafts.
    let plain = respond(
        &addr,
        json!({"input": q1, "instructions": "Answer briefly.", "max_output_tokens": 32,
               "temperature": 0, "speculative": {"enabled": false}}),
    );
    assert_eq!(output_text(&plain), want);
    assert_eq!(plain["usage"]["speculative"]["draft_tokens"], 0, "{plain}");

    // A cut answer is incomplete, and says why.
    let cut = respond(
        &addr,
        json!({"input": q1, "max_output_tokens": 3, "temperature": 0}),
    );
    assert_eq!(cut["status"], "incomplete");
    assert_eq!(cut["incomplete_details"]["reason"], "max_output_tokens");

    // Function tools: a required call, its arguments valid JSON of the schema; streamed, the
    // same call; its output continues the conversation.
    let tools = json!([{"type": "function", "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string",
                       "maxLength": 20}}, "required": ["city"], "additionalProperties": false},
        "strict": true}]);
    let ask = json!({"input": "What is the weather in Paris?", "tools": tools,
                     "tool_choice": "required", "max_output_tokens": 64, "temperature": 0});
    let r = respond(&addr, ask.clone());
    let calls: Vec<Value> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .cloned()
        .collect();
    assert!(!calls.is_empty(), "no call: {r}");
    let call = calls[0].clone();
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{args}");
    assert_eq!(r["tools"], tools, "the request's tools, as sent");
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let ev = events(&post_json(&addr, "/v1/responses", &streamed));
    let done: Vec<&Value> = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.done")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(done.len(), calls.len(), "streamed calls, call for call");
    for (d, c) in done.iter().zip(&calls) {
        assert_eq!(d["arguments"], c["arguments"]);
        assert_eq!(d["name"], c["name"]);
    }
    let pieces: String = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap().to_string())
        .collect();
    let whole: String = calls
        .iter()
        .map(|c| c["arguments"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pieces, whole);
    let outputs: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({"type": "function_call_output", "call_id": c["call_id"],
                        "output": "{\"sky\": \"clear\", \"c\": 21}"})
        })
        .collect();
    let follow = respond(
        &addr,
        json!({"previous_response_id": r["id"], "tools": tools, "tool_choice": "none",
               "max_output_tokens": 24, "temperature": 0, "input": outputs}),
    );
    // The same turns sent to chat: the question, the calls, their outputs.
    let chat_calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({"id": c["call_id"], "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]}})
        })
        .collect();
    let mut turns = vec![
        json!({"role": "user", "content": "What is the weather in Paris?"}),
        json!({"role": "assistant", "content": "", "tool_calls": chat_calls}),
    ];
    for o in &outputs {
        turns.push(json!({"role": "tool", "tool_call_id": o["call_id"], "content": o["output"]}));
    }
    let chat_tools: Vec<Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {"name": t["name"],
            "description": t["description"], "parameters": t["parameters"], "strict": true}})
        })
        .collect();
    let chat = post_json(
        &addr,
        "/v1/chat/completions",
        &json!({"messages": turns, "tools": chat_tools, "tool_choice": "none",
                "max_tokens": 24, "temperature": 0}),
    )
    .json();
    assert_eq!(
        json!(output_text(&follow)),
        chat["choices"][0]["message"]["content"],
        "{follow}"
    );

    // text.format: a JSON schema the answer keeps to.
    let r = respond(
        &addr,
        json!({"input": "Describe Ann, 31, as JSON.", "max_output_tokens": 64, "temperature": 0,
               "text": {"format": {"type": "json_schema", "name": "person", "strict": true,
                 "schema": {"type": "object", "properties": {"name": {"type": "string",
                   "maxLength": 12}, "age": {"type": "integer"}}, "required": ["name", "age"],
                   "additionalProperties": false}}}}),
    );
    let person: Value = serde_json::from_str(&output_text(&r)).unwrap();
    assert!(
        person["name"].is_string() && person["age"].is_u64(),
        "{person}"
    );

    // Refused by name: what tandem does not do, chat's names, and chat's refusals told in
    // the Responses API's words.
    for (body, param) in [
        (
            json!({"input": "x", "reasoning": {"effort": "low"}}),
            "reasoning.effort",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (json!({"input": "x", "max_tokens": 5}), "max_tokens"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "temperature": -1}), "temperature"),
        (json!({"input": "x", "store": "yes"}), "store"),
    ] {
        let r = post_json(&addr, "/v1/responses", &body);
        assert_refused(&r, 400, param);
    }
    assert_eq!(
        request(&addr, "POST", "/v1/responses", &[], b"{not json").status,
        400
    );
    drop(server);

    // A server that keeps no responses says so when asked to store one, and stores none by
    // default.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tandem.toml");
    std::fs::write(&config, "[server]\nresponses_stored = 0\n").unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()], &[]);
    let r = post_json(
        &server.addr,
        "/v1/responses",
        &json!({"input": "x", "store": true}),
    );
    assert_refused(&r, 400, "store");
    let r = respond(&server.addr, json!({"input": "Hi", "max_output_tokens": 4}));
    assert_eq!(r["store"], false, "{r}");
}
