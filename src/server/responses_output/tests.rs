use serde_json::{json, Value};

use super::*;

fn head() -> ResponseHead {
    let request = match json!({"instructions": "be brief", "max_output_tokens": 20,
                               "tools": [{"type": "function", "name": "f"}]})
    {
        Value::Object(m) => m,
        _ => unreachable!(),
    };
    ResponseHead {
        id: "resp-1".into(),
        created_at: 7,
        model: "m".into(),
        request,
        stored: true,
    }
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// Every event of a stream of `chunks`, from `response.created` to its end, and the response.
fn stream(chunks: &[Value]) -> (Vec<Value>, Value) {
    let mut t = EventTranslator::new(head());
    let mut events = t.start();
    for c in chunks {
        events.extend(t.chunk(c));
    }
    let (end, response) = t.finish();
    events.extend(end);
    (events, response)
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_chat_answer_becomes_output_items_usage_and_a_status() {
    let h = head();
    let message = json!({"role": "assistant", "content": "hi",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": "{\"a\":1}"}}]});
    let items = output_items(&h, &message, None, "completed");
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["type"], "message");
    assert_eq!(items[0]["content"][0]["text"], "hi");
    assert_eq!(items[1]["type"], "function_call");
    assert_eq!(items[1]["call_id"], "c1");
    assert_eq!(items[1]["arguments"], "{\"a\":1}");
    // No text and calls: only the calls; no text and no calls: one empty message.
    let calls_only = json!({"role": "assistant", "content": null,
        "tool_calls": message["tool_calls"].clone()});
    assert_eq!(output_items(&h, &calls_only, None, "completed").len(), 1);
    let empty = output_items(&h, &json!({"content": ""}), None, "completed");
    assert_eq!(empty[0]["type"], "message");
    // Back into the conversation as the assistant's turn.
    assert_eq!(
        chat_turn(&items),
        json!({"role": "assistant", "content": "hi", "tool_calls": [{"id": "c1",
               "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]})
    );
    let usage = usage_of(&json!({"prompt_tokens": 5, "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 2}, "speculative": {"rounds": 1}}));
    assert_eq!(usage["input_tokens"], 5);
    assert_eq!(usage["output_tokens"], 3);
    assert_eq!(usage["total_tokens"], 8);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 2);
    assert_eq!(usage["input_tokens_details"]["cache_write_tokens"], 0);
    assert_eq!(usage["speculative"]["rounds"], 1);
    assert_eq!(status_of("length"), "incomplete");
    assert_eq!(status_of("tool_calls"), "completed");
    assert_eq!(status_of("abort"), "failed");
    assert_ne!(items[0]["id"], items[1]["id"]);
    let r = h.response("incomplete", items, usage, Value::Null);
    assert_eq!(r["object"], "response");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["instructions"], "be brief");
    assert_eq!(r["max_output_tokens"], 20);
    assert_eq!(r["store"], true);
}

#[test]
fn a_streamed_answer_gives_the_semantic_events_in_order() {
    let (events, response) = stream(&[
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": "Hel"}), None),
        chunk(json!({"content": "lo"}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                   "function": {"name": "f", "arguments": ""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        json!({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6}}),
    ]);
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            // Each item is finished before the next is added.
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    assert_eq!(events[6]["text"], "Hello");
    assert_eq!(events[12]["arguments"], "{\"a\":1}");
    assert_eq!(events[9]["output_index"], 1);
    assert_eq!(events[9]["item"]["id"], "fc_resp-1_1");
    assert_eq!(events[2]["item"]["id"], "msg_resp-1_0");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(response["output"][1]["arguments"], "{\"a\":1}");
    assert_eq!(response["usage"]["total_tokens"], 10);
    assert_eq!(events.last().unwrap()["response"], response);
}

#[test]
fn a_cut_stream_is_incomplete_an_empty_one_one_message_and_a_failure_failed() {
    let mut t = EventTranslator::new(head());
    t.start();
    t.chunk(&chunk(json!({"content": "abc"}), Some("length")));
    let (end, response) = t.finish();
    assert_eq!(end.last().unwrap()["type"], "response.incomplete");
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["output"][0]["status"], "incomplete");

    let mut t = EventTranslator::new(head());
    t.start();
    t.chunk(&chunk(json!({}), Some("stop")));
    let (end, response) = t.finish();
    assert_eq!(kinds(&end)[0], "response.output_item.added");
    assert_eq!(response["output"][0]["content"][0]["text"], "");

    let mut t = EventTranslator::new(head());
    t.start();
    let failed = t.failed(&json!({"message": "too complex", "code": "grammar_too_complex"}));
    assert_eq!(failed["type"], "response.failed");
    assert_eq!(failed["response"]["status"], "failed");
    // Only the Responses API's own codes pass; others are told in the message.
    assert_eq!(failed["response"]["error"]["code"], "server_error");
    assert_eq!(
        failed["response"]["error"]["message"],
        "grammar_too_complex: too complex"
    );
}

/// A model's reasoning (chat's `reasoning_content`) is a `reasoning` item before the message,
/// whole and streamed, with the same ids; a later turn continues with it as the assistant's.
#[test]
fn reasoning_is_an_item_before_the_answer_whole_and_streamed() {
    let h = head();
    let message = json!({"role": "assistant", "reasoning_content": "Think", "content": "Go!"});
    let items = output_items(&h, &message, None, "completed");
    assert_eq!(
        items[0],
        json!({"type": "reasoning", "id": "rs_resp-1_0", "summary": [],
               "content": [{"type": "reasoning_text", "text": "Think"}]})
    );
    assert_eq!(items[1]["id"], "msg_resp-1_1");
    assert_eq!(items[1]["content"][0]["text"], "Go!");
    assert_eq!(
        chat_turn(&items),
        json!({"role": "assistant", "content": "Go!", "reasoning_content": "Think"})
    );

    let (events, response) = stream(&[
        chunk(json!({"reasoning_content": "Th"}), None),
        chunk(json!({"reasoning_content": "ink"}), None),
        chunk(json!({"content": "Go!"}), Some("stop")),
    ]);
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(events[5]["text"], "Think");
    assert_eq!(events[5]["item_id"], "rs_resp-1_0");
    assert_eq!(response["output"], json!(items));

    // Reasoning alone still answers with one (empty) message after it, as unstreamed.
    let mut t = EventTranslator::new(head());
    t.chunk(&chunk(json!({"reasoning_content": "Hmm"}), Some("length")));
    let (_, response) = t.finish();
    let unstreamed = output_items(
        &head(),
        &json!({"reasoning_content": "Hmm", "content": ""}),
        None,
        "incomplete",
    );
    assert_eq!(response["output"], json!(unstreamed));
    assert_eq!(response["output"][1]["type"], "message");
}
