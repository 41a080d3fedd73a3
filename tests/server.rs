//! `tandem serve` over real HTTP on the default model: the OpenAI routes (streaming and not),
//! greedy output identical to `tandem generate`, the official `openai` Python client, every bad
//! input the server must refuse (while a good request runs beside them), client disconnects,
//! the admin API, and graceful shutdown.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::http::{self, get, post_json, request, Server};
use serde_json::{json, Value};

const CONTEXT: &str = "512";

/// `tandem generate --json` on the same model: the plain (non-speculative) greedy reference.
fn generate_reference(prompt: &str, raw: bool, max_tokens: usize, ignore_eos: bool) -> Value {
    common::default_model();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
    cmd.args([
        "generate",
        "--json",
        "--threads",
        "2",
        "--context-length",
        CONTEXT,
    ])
    .args([
        "--temperature",
        "0",
        "--max-tokens",
        &max_tokens.to_string(),
    ])
    .args(["--prompt", prompt]);
    if raw {
        cmd.arg("--raw");
    }
    if ignore_eos {
        cmd.arg("--ignore-eos");
    }
    let out = cmd.output().expect("tandem generate runs");
    assert!(
        out.status.success(),
        "generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("generate --json prints JSON")
}

/// The request drafted at its fixed γ and the target kept some drafts, so its output came from
/// speculative decoding, not plain.
fn assert_speculated(usage: &Value) {
    let s = &usage["speculative"];
    assert!(
        s["draft_tokens"].as_u64().unwrap() > 0,
        "nothing drafted: {usage}"
    );
    assert!(
        s["accepted_tokens"].as_u64().unwrap() > 0,
        "nothing accepted: {usage}"
    );
}

fn usage_is_consistent(usage: &Value) {
    let p = usage["prompt_tokens"].as_u64().unwrap();
    let c = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), p + c, "{usage}");
    let s = &usage["speculative"];
    let drafted = s["draft_tokens"].as_u64().unwrap();
    let accepted = s["accepted_tokens"].as_u64().unwrap();
    let rounds = s["rounds"].as_u64().unwrap();
    assert!(accepted <= drafted, "{usage}");
    // Every round emits its accepted drafts plus one token, and only rounds emit tokens.
    assert!(accepted + rounds <= c, "{usage}");
    if drafted > 0 {
        let rate = s["acceptance_rate"].as_f64().unwrap();
        assert!(
            (rate - accepted as f64 / drafted as f64).abs() < 1e-9,
            "{usage}"
        );
        let mean = s["mean_accepted_length"].as_f64().unwrap();
        assert!(
            (mean - (1.0 + accepted as f64 / rounds as f64)).abs() < 1e-9,
            "{usage}"
        );
    }
}

/// The status, the OpenAI error shape, and (where given) the parameter it names.
fn assert_error(r: &http::Response, status: u16, param: Option<&str>) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    // Plain words for a client, not Rust's: no type or enum names.
    let message = e["message"].as_str().unwrap();
    for rust in [
        "untagged", "enum ", "usize", "u32", "u64", "f32", "f64", "struct ",
    ] {
        assert!(!message.contains(rust), "{rust} in {message:?}");
    }
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"].as_str(), Some(p), "{v}");
    }
}

/// Concatenates the text of SSE chunks; returns (text, chunks, finish reason, usage).
fn read_sse(data: &[String], chat: bool) -> (String, usize, Option<String>, Option<Value>) {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let (mut text, mut finish, mut usage) = (String::new(), None, None);
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            assert_eq!(v["choices"].as_array().unwrap().len(), 0, "{v}");
            usage = Some(u.clone());
            continue;
        }
        let c = &v["choices"][0];
        let piece = if chat {
            assert_eq!(v["object"], "chat.completion.chunk");
            c["delta"]["content"].as_str()
        } else {
            assert_eq!(v["object"], "text_completion");
            c["text"].as_str()
        };
        text.push_str(piece.unwrap_or(""));
        if let Some(f) = c["finish_reason"].as_str() {
            assert!(finish.is_none(), "two finish reasons");
            finish = Some(f.to_string());
        }
    }
    (text, data.len() - 1, finish, usage)
}

#[test]
fn openai_routes_match_plain_greedy_generation_and_shut_down_gracefully() {
    let server = Server::start(
        &[
            "--context-length",
            CONTEXT,
            "--draft-model",
            "prompt-lookup",
        ],
        &[],
    );
    let addr = server.addr.clone();

    let models = get(&addr, "/v1/models").json();
    let model_id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["max_model_len"], 512);
    // `created` is when the server began serving the model, not 0.
    let created = models["data"][0]["created"].as_u64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(created > now - 3600 && created <= now, "{models}");
    // One model by its id (`client.models.retrieve`); another id, slashes and all, is a 404
    // naming it.
    let one = get(&addr, &format!("/v1/models/{model_id}"));
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(one.json(), models["data"][0]);
    let other = get(&addr, "/v1/models/org/other-model");
    assert_eq!(other.status, 404);
    let e = &other.json()["error"];
    assert_eq!(e["code"], "model_not_found", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("`org/other-model`"),
        "{e}"
    );

    // Completions, greedy: identical to plain greedy `tandem generate` (speculation is on, with
    // the governor choosing γ; a repetitive prompt gives prompt lookup something to draft).
    let prompt = "The list goes: alpha beta gamma delta, alpha beta gamma delta, alpha beta";
    let reference = generate_reference(prompt, true, 40, true);
    let r = post_json(
        &addr,
        "/v1/completions",
        &json!({"model": model_id, "prompt": prompt, "max_tokens": 40, "temperature": 0,
                "ignore_eos": true, "speculative": {"gamma": 3}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], model_id.as_str());
    assert_eq!(
        v["choices"][0]["text"], reference["text"],
        "server vs generate"
    );
    let reference_text = reference["text"].as_str().unwrap().to_string();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let usage = &v["usage"];
    usage_is_consistent(usage);
    assert_eq!(usage["completion_tokens"], 40);
    assert_eq!(usage["prompt_tokens"], reference["prompt_tokens"]);
    // γ = 3 with prompt lookup drafts on a repetitive prompt.
    assert_speculated(usage);
    // Verified as token trees (alternatives from earlier matches that disagree: "alpha beta"
    // went on two ways): the same text as plain decoding, tree rounds counted in usage.
    let forked = "The list goes: alpha beta gamma delta, alpha beta kappa delta, alpha beta";
    let forked_reference = generate_reference(forked, true, 40, true);
    let v = post_json(
        &addr,
        "/v1/completions",
        &json!({"model": model_id, "prompt": forked, "max_tokens": 40, "temperature": 0,
                "ignore_eos": true, "speculative": {"gamma": 3, "tree_nodes": 4}}),
    )
    .json();
    assert_eq!(
        v["choices"][0]["text"], forked_reference["text"],
        "trees vs generate"
    );
    let tree_usage = &v["usage"]["speculative"];
    assert!(tree_usage["tree_rounds"].as_u64() > Some(0), "{v}");
    assert!(
        tree_usage["tree_nodes"].as_u64() > tree_usage["tree_rounds"].as_u64(),
        "{v}"
    );

    // Chat completions, greedy, through the model's chat template, speculating at a fixed γ
    // (prompt lookup finds the question's words in the answer): identical to plain decoding.
    let question = "Name three colours of the rainbow.";
    let reference = generate_reference(question, false, 48, false);
    // `modalities: ["text"]` (the official client's default) asks for what is done anyway.
    let body = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 48,
                      "temperature": 0, "speculative": {"gamma": 3}, "modalities": ["text"]});
    let v = post_json(&addr, "/v1/chat/completions", &body).json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(json!(text), reference["text"], "chat vs generate");
    assert_eq!(
        v["choices"][0]["finish_reason"], reference["finish_reason"],
        "{v}"
    );
    usage_is_consistent(&v["usage"]);
    assert_speculated(&v["usage"]);
    let mut audio = body.clone();
    audio["modalities"] = json!(["text", "audio"]);
    let r = post_json(&addr, "/v1/chat/completions", &audio);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "modalities");
    assert_eq!(
        v["usage"]["completion_tokens"],
        reference["generated_tokens"]
    );

    // The same chat streamed: the deltas add up to the same text, usage comes last.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let r = post_json(&addr, "/v1/chat/completions", &sbody);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let data = r.sse_data();
    let first: Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (streamed, chunks, finish, usage) = read_sse(&data, true);
    assert_eq!(streamed, text);
    assert!(chunks > 3, "streamed in pieces: {chunks}");
    assert_eq!(json!(finish), v["choices"][0]["finish_reason"]);
    let usage = usage.expect("include_usage sends a usage chunk");
    usage_is_consistent(&usage);
    assert_speculated(&usage);
    assert_eq!(usage["completion_tokens"], v["usage"]["completion_tokens"]);

    // A streamed completion without include_usage has no usage chunk; with speculation off
    // per request, nothing is drafted.
    let r = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 12, "stream": true,
                "speculative": {"enabled": false}}),
    );
    let (_, _, finish, usage) = read_sse(&r.sse_data(), false);
    assert!(usage.is_none());
    assert!(finish.is_some());
    let v = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 12, "speculative": {"enabled": false}}),
    )
    .json();
    assert_eq!(v["usage"]["speculative"]["draft_tokens"], 0, "{v}");

    // Stop strings end the text right before their first occurrence (in plain decoding's
    // text, while speculating).
    let full = reference_text.as_str();
    let stop: String = full.chars().skip(12).take(6).collect();
    let cut = full.find(&stop).unwrap();
    let v = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 40, "ignore_eos": true, "temperature": 0,
                "stop": ["never appears", stop], "speculative": {"gamma": 3}}),
    )
    .json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), &full[..cut]);
    assert_speculated(&v["usage"]);

    // The official `openai` Python package as a client.
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/openai_client.py"
        ))
        .arg(format!("http://{addr}/v1"))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "openai client script failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("openai client: ok"));

    // The admin API is off without a token, and says how to turn it on.
    let r = get(&addr, "/admin/speculation");
    assert_error(&r, 404, None);
    assert!(r.text().contains("TANDEM_ADMIN_TOKEN"));

    // SIGTERM with a stream in flight: the stream still ends properly, then the process exits 0.
    let mut stream = http::open_stream(
        &addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 120, "ignore_eos": true, "stream": true}),
    );
    assert_eq!(stream.status, 200);
    assert!(stream.next_data().is_some());
    let stopped = server.terminate_in_background();
    let mut rest = Vec::new();
    while let Some(d) = stream.next_data() {
        rest.push(d);
    }
    let (_, _, finish, _) = read_sse(&rest, false);
    assert_eq!(
        finish.as_deref(),
        Some("length"),
        "the in-flight stream finished"
    );
    assert!(
        stopped.join().unwrap(),
        "tandem serve exits cleanly on SIGTERM"
    );
}

/// Every kind of bad request gets its 4xx and an OpenAI error body, while good requests running
/// at the same time (speculating) finish exactly as plain decoding alone would; a full queue
/// answers 429 with Retry-After; a client that disconnects mid-stream frees its slot.
#[test]
fn bad_requests_get_openai_errors_and_never_disturb_good_ones() {
    let server = Server::start(
        &[
            "--context-length",
            CONTEXT,
            "--draft-model",
            "prompt-lookup",
            "--max-seqs",
            "1",
            "--max-queue",
            "1",
            "--max-body-bytes",
            "4096",
        ],
        &[],
    );
    let addr = server.addr.clone();
    let prompt = "Write a short story about a lighthouse keeper.";
    // Speculating at a fixed γ: a 300-token greedy story repeats itself enough for prompt
    // lookup to draft.
    let long = json!({"prompt": prompt, "max_tokens": 300, "ignore_eos": true,
                      "temperature": 0, "stream": true, "speculative": {"gamma": 4},
                      "stream_options": {"include_usage": true}});

    // A runs (the only slot), B waits (the only queue place): the next request is one too many.
    let mut a = http::open_stream(&addr, "/v1/completions", &long);
    assert_eq!(a.status, 200);
    let first = a.next_data().expect("A produces output");
    let mut b = http::open_stream(&addr, "/v1/completions", &long);
    assert_eq!(b.status, 200);
    let r = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 4}),
    );
    assert_error(&r, 429, None);
    assert!(r.header("retry-after").is_some(), "429 carries Retry-After");

    let big = "word ".repeat(2000);
    let cases: Vec<(&str, &[u8], u16, Option<&str>)> = vec![
        ("/v1/completions", b"{\"prompt\": \"hi\", ", 400, None),
        ("/v1/completions", b"", 400, None),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "temperature": "hot"}"#,
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "max_tokens": -3}"#,
            400,
            Some("max_tokens"),
        ),
        ("/v1/completions", br#"{"prompt": ""}"#, 400, Some("prompt")),
        (
            "/v1/completions",
            br#"{"max_tokens": 5}"#,
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": [999999]}"#,
            400,
            Some("prompt"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": []}"#,
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": 5}]}"#,
            400,
            None,
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "max_tokens": 600}"#,
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "temperature": -1}"#,
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": {"text": "hi"}}"#,
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "max_tokens": "ten"}"#,
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "max_tokens": -5}"#,
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "stop": [1, 2]}"#,
            400,
            Some("stop"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": 5}]}"#,
            400,
            None,
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "frequency_penalty": 1e308}"#,
            400,
            Some("frequency_penalty"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "presence_penalty": -1e308}"#,
            400,
            Some("presence_penalty"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "top_p": 0}"#,
            400,
            Some("top_p"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "top_p": 1.5}"#,
            400,
            Some("top_p"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "speculative": {"lenience": 0}}"#,
            400,
            Some("speculative.lenience"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "speculative": {"lenience": 1.5}}"#,
            400,
            Some("speculative.lenience"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "speculative": {"gamma": 0}}"#,
            400,
            Some("speculative.gamma"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "speculative": {"use_egag": true, "egag_threshold": 0}}"#,
            400,
            Some("speculative.egag_threshold"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "speculative": {"egag_ema_beta": 1}}"#,
            400,
            Some("speculative.egag_ema_beta"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "speculative": {"draft_p_min": -0.5}}"#,
            400,
            Some("speculative.draft_p_min"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "speculative": {"tree_nodes": 99}}"#,
            400,
            Some("speculative.tree_nodes"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "n": 2}"#,
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "n": 0}"#,
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "best_of": 2}"#,
            400,
            Some("best_of"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "logprobs": 21}"#,
            400,
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "logprobs": true}"#,
            400,
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "logprobs": 2, "top_logprobs": 2}"#,
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}"#,
            400,
            Some("logprobs"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}"#,
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}"#,
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "hi"}], "echo": true}"#,
            400,
            Some("echo"),
        ),
        ("/tokenize", br#"{}"#, 400, None),
        ("/tokenize", br#"{"content": "a", "prompt": "b"}"#, 400, None),
        ("/tokenize", br#"{"content": 5}"#, 400, Some("content")),
        (
            "/detokenize",
            br#"{"tokens": [99999999]}"#,
            400,
            Some("tokens"),
        ),
        ("/detokenize", br#"{"tokens": "abc"}"#, 400, Some("tokens")),
        ("/detokenize", br#"{}"#, 400, Some("tokens")),
        (
            "/v1/completions",
            br#"{"prompt": "hi", "model": "gpt-9"}"#,
            404,
            Some("model"),
        ),
        ("/v1/completions", big.as_bytes(), 413, None),
        ("/v1/nothing", b"{}", 404, None),
        // Structured outputs and tools: refused with their parameter before any work.
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}}"#,
            400,
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}"#,
            400,
            Some("response_format.type"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#,
            400,
            Some("response_format.json_schema.schema"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "guided_regex": "[a-"}"#,
            400,
            Some("guided_regex"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "guided_choice": []}"#,
            400,
            Some("guided_choice"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "guided_regex": "a+", "guided_choice": ["a"]}"#,
            400,
            Some("guided_choice"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "grammar": "root ::= \"a\""}"#,
            400,
            Some("grammar"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "guided_grammar": "start: a\na: \"x\" a"}"#,
            400,
            Some("guided_grammar"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "response_format": {"type": "json_object"}, "ignore_eos": true}"#,
            400,
            Some("ignore_eos"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
            400,
            Some("tools[0].function"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": "none"}}]}"#,
            400,
            Some("tools[0].function.parameters"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}"#,
            400,
            Some("tool_choice"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}}"#,
            400,
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "5"}]}"#,
            400,
            Some("messages[1].tool_call_id"),
        ),
    ];
    for (path, body, status, param) in cases {
        let r = request(&addr, "POST", path, &[], body);
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        eprintln!("{path} {shown} -> {} {}", r.status, r.text());
        assert_error(&r, status, param);
    }
    // A schema keyword the constraint engine does not implement is named in the refusal.
    let r = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
                {"schema": {"type": "array", "uniqueItems": true}}}}),
    );
    assert_error(&r, 400, Some("response_format"));
    assert!(r.text().contains("uniqueItems"), "{}", r.text());
    // A prompt longer than the context is refused before any work.
    let long_prompt = "a ".repeat(600);
    let r = post_json(&addr, "/v1/completions", &json!({"prompt": long_prompt}));
    assert_error(&r, 400, Some("prompt"));

    // A and B, greedy on the same prompt and speculating, finish with the same 300 tokens,
    // equal to plain `tandem generate` alone.
    let mut a_data = vec![first];
    while let Some(d) = a.next_data() {
        a_data.push(d);
    }
    let mut b_data = Vec::new();
    while let Some(d) = b.next_data() {
        b_data.push(d);
    }
    let (a_text, _, a_finish, a_usage) = read_sse(&a_data, false);
    let (b_text, _, _, b_usage) = read_sse(&b_data, false);
    assert_eq!(a_finish.as_deref(), Some("length"));
    for usage in [a_usage, b_usage] {
        let usage = usage.expect("include_usage sends a usage chunk");
        usage_is_consistent(&usage);
        assert_speculated(&usage);
    }
    let reference = generate_reference(prompt, true, 300, true);
    assert_eq!(json!(a_text), reference["text"]);
    assert_eq!(a_text, b_text);

    // A client that goes away mid-stream frees its slot: the running gauge drops to 0, the
    // request counts as cancelled, and the single slot serves the next request.
    let cancelled_before = server
        .metric("tandem_requests_total", "status=\"cancelled\"")
        .unwrap_or(0.0);
    let mut c = http::open_stream(&addr, "/v1/completions", &long);
    assert!(c.next_data().is_some());
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.metric("tandem_requests_running", "") != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "the streaming request never showed as running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    while server.metric("tandem_requests_running", "") != Some(0.0) {
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cancelled = server
        .metric("tandem_requests_total", "status=\"cancelled\"")
        .unwrap();
    assert_eq!(cancelled, cancelled_before + 1.0);
    let r = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 4}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn admin(addr: &str, method: &str, token: Option<&str>, body: &str) -> http::Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("Authorization", a)])
        .unwrap_or_default();
    request(
        addr,
        method,
        "/admin/speculation",
        &headers,
        body.as_bytes(),
    )
}

/// Sampled workload with a fixed γ: acceptance rate over a few prompts.
fn sampled_acceptance(addr: &str) -> f64 {
    let (mut drafted, mut accepted) = (0u64, 0u64);
    for (i, topic) in ["the sea", "a city at night", "an old clock"]
        .iter()
        .enumerate()
    {
        let v = post_json(
            addr,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": format!("Write a poem about {topic}.")}],
                    "max_tokens": 48, "temperature": 1.0, "seed": 11 + i, "ignore_eos": true,
                    "speculative": {"gamma": 4}}),
        )
        .json();
        usage_is_consistent(&v["usage"]);
        let s = &v["usage"]["speculative"];
        drafted += s["draft_tokens"].as_u64().unwrap();
        accepted += s["accepted_tokens"].as_u64().unwrap();
    }
    assert!(drafted > 0);
    accepted as f64 / drafted as f64
}

#[test]
fn admin_api_changes_speculation_live() {
    // A draft model (the same file at q4_0) drafting for the default target (the file's own
    // Q4_1 weights): close but not equal.
    let server = Server::start(
        &[
            "--context-length",
            CONTEXT,
            "--draft-model",
            "default",
            "--draft-weights-dtype",
            "q4_0",
        ],
        &[("TANDEM_ADMIN_TOKEN", "s3cret")],
    );
    let addr = server.addr.clone();
    // Before any round: every position a round can draft (max_gamma 8) is exported at zero.
    for pos in 0..8 {
        assert_eq!(
            server.metric(
                "tandem_spec_decode_num_accepted_tokens_per_pos_total",
                &format!("position=\"{pos}\"")
            ),
            Some(0.0),
            "position {pos}"
        );
    }

    assert_error(&admin(&addr, "GET", None, ""), 401, None);
    assert_error(&admin(&addr, "GET", Some("wrong"), ""), 401, None);
    assert_error(
        &admin(&addr, "PUT", Some("wrong"), r#"{"lenience": 0.5}"#),
        401,
        None,
    );
    let v = admin(&addr, "GET", Some("s3cret"), "").json();
    assert_eq!(v["lenience"], 1.0, "{v}");
    assert_eq!(v["drafter_loaded"], true, "{v}");
    // Auth schemes are case-insensitive (RFC 7235): some clients send `bearer`.
    for scheme in ["bearer", "BEARER"] {
        let auth = format!("{scheme} s3cret");
        let r = request(
            &addr,
            "GET",
            "/admin/speculation",
            &[("Authorization", &auth)],
            b"",
        );
        assert_eq!(r.status, 200, "{scheme}: {}", r.text());
    }
    for (body, param) in [
        (r#"{"lenience": 0}"#, Some("lenience")),
        (r#"{"lenience": 1.01}"#, Some("lenience")),
        (r#"{"gamma": 99}"#, Some("gamma")),
        (r#"{"gamma_min": 5, "gamma_max": 2}"#, Some("gamma_min")),
        (
            r#"{"use_egag": true, "egag_threshold": 1.5}"#,
            Some("egag_threshold"),
        ),
        (r#"{"egag_ema_beta": -1}"#, Some("egag_ema_beta")),
        (r#"{"draft_p_min": 1}"#, Some("draft_p_min")),
        (r#"{"tree_nodes": 8}"#, Some("tree_nodes")),
        (r#"{"gamma": "four"}"#, Some("gamma")),
        (r#"{"lenence": 0.5}"#, None),
        ("not json", None),
    ] {
        assert_error(&admin(&addr, "PUT", Some("s3cret"), body), 400, param);
    }
    // A refusal quotes the number as it was sent, not what a 32-bit float makes of it.
    for (body, sent) in [
        (
            r#"{"lenience": 1e-300}"#,
            "got 1e-300 (0 as a 32-bit float)",
        ),
        (r#"{"lenience": 1.1}"#, "got 1.1"),
        (
            r#"{"egag_ema_beta": 0.99999999999}"#,
            "got 0.99999999999 (1 as a 32-bit float)",
        ),
    ] {
        let r = admin(&addr, "PUT", Some("s3cret"), body);
        assert_error(&r, 400, None);
        let v = r.json();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.ends_with(sent), "{body}: {message}");
    }
    // Nothing changed by the refused updates.
    assert_eq!(admin(&addr, "GET", Some("s3cret"), "").json(), v);

    let exact = sampled_acceptance(&addr);
    assert_eq!(server.metric("tandem_spec_lenience", ""), Some(1.0));
    let r = admin(&addr, "PUT", Some("s3cret"), r#"{"lenience": 0.1}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    // Read back as written (0.1, not the f32's 0.10000000149011612).
    assert_eq!(r.json()["lenience"], 0.1, "{}", r.text());
    let got = admin(&addr, "GET", Some("s3cret"), "").text();
    assert!(got.contains(r#""lenience":0.1,"#), "{got}");
    assert_eq!(server.metric("tandem_spec_lenience", ""), Some(0.1));
    let lenient = sampled_acceptance(&addr);
    assert!(
        lenient > exact + 0.05,
        "lenience 0.1 raises acceptance: {lenient:.3} vs {exact:.3} at 1.0"
    );

    // Switching speculation off server-wide: requests that follow the server draft nothing.
    let r = admin(&addr, "PUT", Some("s3cret"), r#"{"enabled": false}"#);
    assert_eq!(r.status, 200);
    assert_eq!(server.metric("tandem_spec_gamma", ""), Some(0.0));
    let v = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 16}),
    )
    .json();
    assert_eq!(v["usage"]["speculative"]["draft_tokens"], 0, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    let r = admin(&addr, "PUT", Some("s3cret"), r#"{"egag_threshold": 0.9}"#);
    assert!(
        r.text().contains(r#""egag_threshold":0.9,"#),
        "{}",
        r.text()
    );
}

/// Every `logprobs.content` entry of a chat response, and the text its tokens spell.
fn chat_entries(logprobs: &Value) -> (Vec<Value>, String) {
    let entries = logprobs["content"]
        .as_array()
        .expect("logprobs.content")
        .clone();
    let mut bytes = Vec::new();
    for e in &entries {
        let b: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u8)
            .collect();
        bytes.extend(b);
    }
    (entries, String::from_utf8(bytes).unwrap())
}

/// Choice `index`'s streamed chunks: its text, its logprobs entries gathered (chat: `content`
/// entries; completions: the parallel arrays concatenated) and its finish reason.
fn choice_stream(data: &[String], index: u64, chat: bool) -> (String, Value, Option<String>) {
    let (mut text, mut finish) = (String::new(), None);
    let mut entries = json!({"content": [], "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        let Some(c) = v["choices"].as_array().and_then(|c| c.first()) else {
            continue;
        };
        if c["index"] != index {
            continue;
        }
        text.push_str(if chat {
            c["delta"]["content"].as_str().unwrap_or("")
        } else {
            c["text"].as_str().unwrap()
        });
        if let Some(f) = c["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
        let lp = &c["logprobs"];
        if lp.is_null() {
            continue;
        }
        let keys: &[&str] = if chat {
            &["content"]
        } else {
            &["tokens", "token_logprobs", "top_logprobs", "text_offset"]
        };
        for k in keys {
            let more = lp[*k].as_array().unwrap().clone();
            entries[*k].as_array_mut().unwrap().extend(more);
        }
    }
    (text, entries, finish)
}

/// Logprobs (chat and completions, streamed and not, the same with speculation on and off),
/// echo, several choices of one request and the tokenizer routes, over HTTP.
#[test]
fn logprobs_choices_echo_and_tokenize_over_http() {
    let server = Server::start(
        &[
            "--context-length",
            CONTEXT,
            "--draft-model",
            "prompt-lookup",
            "--max-seqs",
            "4",
        ],
        &[],
    );
    let addr = server.addr.clone();
    let question = "List the days of the week, then list them again.";
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": question}],
                              "max_tokens": 40, "temperature": 0, "logprobs": true,
                              "top_logprobs": 3});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post_json(&addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r
    };

    // Chat: one entry a token, spelling the answer; three alternatives each, the greedy choice
    // first; the same numbers with speculation off and at γ = 1..3.
    let off = chat(json!({"speculative": {"enabled": false}})).json();
    let content = off["choices"][0]["message"]["content"].as_str().unwrap();
    let (entries, spelled) = chat_entries(&off["choices"][0]["logprobs"]);
    assert_eq!(spelled, content, "the entries spell the answer");
    assert_eq!(
        entries.len() as u64,
        off["usage"]["completion_tokens"].as_u64().unwrap()
            - u64::from(off["choices"][0]["finish_reason"] == "stop"),
        "one entry a token (an end-of-turn token is not reported)"
    );
    for e in &entries {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert_eq!(
            top[0]["token"], e["token"],
            "greedy takes the most likely: {e}"
        );
        assert_eq!(top[0]["logprob"], e["logprob"]);
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(e["bytes"], json!(e["token"].as_str().unwrap().as_bytes()));
    }
    for g in 1..=3 {
        let on = chat(json!({"speculative": {"gamma": g}})).json();
        assert_speculated(&on["usage"]);
        assert_eq!(
            on["choices"][0]["logprobs"], off["choices"][0]["logprobs"],
            "γ {g}"
        );
    }
    // Streamed: the chunks' entries are the same entries.
    let r = chat(json!({"stream": true, "speculative": {"gamma": 2}}));
    let (text, streamed, finish) = choice_stream(&r.sse_data(), 0, true);
    assert_eq!(text, content);
    assert_eq!(
        streamed["content"],
        off["choices"][0]["logprobs"]["content"]
    );
    assert_eq!(json!(finish), off["choices"][0]["finish_reason"]);

    // Completions with echo: the prompt's tokens first (the very first unscored), then the
    // output's; offsets count characters of the whole text; each top list holds the chosen token.
    let prompt = "Monday, Tuesday, Wednesday, Thursday,";
    let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 2,
                      "echo": true, "ignore_eos": true, "speculative": {"gamma": 3}});
    let v = post_json(&addr, "/v1/completions", &body).json();
    let c = &v["choices"][0];
    let text = c["text"].as_str().unwrap();
    assert!(text.starts_with(prompt), "{text}");
    let lp = &c["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let (p, n) = (
        v["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        v["usage"]["completion_tokens"].as_u64().unwrap() as usize,
    );
    assert_eq!(tokens.len(), p + n);
    assert_eq!(tokens.concat(), text);
    assert_eq!(tokens[..p].concat(), prompt);
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    let mut offset = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][i], offset, "{lp}");
        offset += t.chars().count();
        if i > 0 {
            let top = lp["top_logprobs"][i].as_object().unwrap();
            assert!((1..=3).contains(&top.len()), "{top:?}");
            assert_eq!(
                top[*t], lp["token_logprobs"][i],
                "the chosen token is listed"
            );
        }
    }
    // Scoring the prompt does not depend on generating: the same numbers with speculation off,
    // and streamed.
    let mut plain = body.clone();
    plain["speculative"] = json!({"enabled": false});
    let v2 = post_json(&addr, "/v1/completions", &plain).json();
    assert_eq!(v2["choices"][0]["logprobs"], *lp);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post_json(&addr, "/v1/completions", &streamed);
    let (stext, slp, _) = choice_stream(&r.sse_data(), 0, false);
    assert_eq!(stext, text);
    for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(slp[k], lp[k], "{k}");
    }

    // Several choices: greedy ones agree; usage counts the prompt once and every completion.
    let v = chat(json!({"n": 3, "logprobs": false, "top_logprobs": null})).json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], json!(content));
        assert!(c["logprobs"].is_null());
    }
    assert_eq!(v["usage"]["prompt_tokens"], off["usage"]["prompt_tokens"]);
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        3 * off["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // Seeded and sampled, streamed: each choice is the lone request seeded seed + i.
    let sampled = json!({"prompt": prompt, "max_tokens": 16, "temperature": 1.0, "seed": 5,
                         "ignore_eos": true, "speculative": {"gamma": 2}});
    let mut both = sampled.clone();
    both["n"] = json!(2);
    both["stream"] = json!(true);
    both["stream_options"] = json!({"include_usage": true});
    let data = post_json(&addr, "/v1/completions", &both).sse_data();
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["usage"]["completion_tokens"], 32, "{last}");
    for i in 0..2u64 {
        let (text, _, finish) = choice_stream(&data, i, false);
        assert_eq!(finish.as_deref(), Some("length"));
        let mut lone = sampled.clone();
        lone["seed"] = json!(5 + i);
        let v = post_json(&addr, "/v1/completions", &lone).json();
        assert_eq!(json!(text), v["choices"][0]["text"], "choice {i}");
    }

    // A batch of prompts (texts, or token ids) with n = 2: choice i answers prompt i / 2, each
    // echoing its own prompt; each equals the lone request; usage counts each prompt once.
    let other = "January, February, March,";
    let lone: Vec<Value> = [prompt, other]
        .iter()
        .map(|p| {
            post_json(
                &addr,
                "/v1/completions",
                &json!({"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": true}),
            )
            .json()
        })
        .collect();
    let ids: Vec<Value> = [prompt, other]
        .iter()
        .map(|p| post_json(&addr, "/tokenize", &json!({"prompt": p})).json()["tokens"].clone())
        .collect();
    for batch in [json!([prompt, other]), json!(ids)] {
        let v = post_json(
            &addr,
            "/v1/completions",
            &json!({"prompt": batch, "n": 2, "max_tokens": 6, "temperature": 0,
                    "ignore_eos": true, "echo": true}),
        )
        .json();
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 4, "{v}");
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i);
            let (p, want) = ([prompt, other][i / 2], &lone[i / 2]);
            let generated = want["choices"][0]["text"].as_str().unwrap();
            assert_eq!(c["text"], format!("{p}{generated}"), "choice {i}");
        }
        let prompts = lone[0]["usage"]["prompt_tokens"].as_u64().unwrap()
            + lone[1]["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(v["usage"]["prompt_tokens"], prompts);
        assert_eq!(v["usage"]["completion_tokens"], 24);
    }

    // Tokenizer routes, in llama.cpp's and vLLM's shapes: the counts are the requests' usage.
    let t = post_json(&addr, "/tokenize", &json!({"content": prompt})).json();
    assert_eq!(t["count"], p);
    assert_eq!(t["tokens"].as_array().unwrap().len(), p);
    let t2 = post_json(
        &addr,
        "/tokenize",
        &json!({"prompt": prompt, "with_pieces": true}),
    )
    .json();
    let pieces: String = t2["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["piece"].as_str().unwrap())
        .collect();
    assert_eq!(pieces, prompt);
    let m = post_json(
        &addr,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": question}], "return_token_strs": true}),
    )
    .json();
    assert_eq!(m["count"], off["usage"]["prompt_tokens"]);
    assert_eq!(
        m["token_strs"].as_array().unwrap().len() as u64,
        m["count"].as_u64().unwrap()
    );
    assert_eq!(m["max_model_len"], 512);
    let d = post_json(&addr, "/detokenize", &json!({"tokens": t["tokens"]})).json();
    assert_eq!(d["content"], prompt);
    assert_eq!(d["prompt"], prompt);
}

/// The config file's `[speculation]` table is live: a change to the file reaches the running
/// server, a bad file changes nothing and is counted, and SIGHUP rereads the file (and does
/// not stop the server).
#[test]
fn config_file_changes_and_sighup_reload_speculation_settings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tandem.toml");
    std::fs::write(&path, "[speculation]\nlenience = 1.0\ngamma = 4\n").unwrap();
    let server = Server::start(
        &[
            "--config",
            path.to_str().unwrap(),
            "--context-length",
            CONTEXT,
            "--draft-model",
            "prompt-lookup",
        ],
        &[("TANDEM_ADMIN_TOKEN", "t")],
    );
    let addr = server.addr.clone();
    let settings = || admin(&addr, "GET", Some("t"), "").json();
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "never happened: {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert_eq!(settings()["lenience"], 1.0);

    std::fs::write(&path, "[speculation]\nlenience = 0.5\ngamma = 3\n").unwrap();
    wait_for("the file's change applied", &|| {
        settings()["lenience"] == 0.5
    });
    assert_eq!(settings()["gamma"], 3);
    assert_eq!(server.metric("tandem_spec_lenience", ""), Some(0.5));
    assert_eq!(
        server.metric("tandem_config_reloads_total", "result=\"ok\""),
        Some(1.0)
    );

    for (i, bad) in ["[speculation]\nlenience = 7\n", "[speculation\n"]
        .into_iter()
        .enumerate()
    {
        std::fs::write(&path, bad).unwrap();
        wait_for("the bad file counted", &|| {
            server.metric("tandem_config_reloads_total", "result=\"error\"") == Some(i as f64 + 1.0)
        });
        assert_eq!(settings()["lenience"], 0.5, "{bad} changed the settings");
        assert_eq!(settings()["gamma"], 3);
    }

    // The admin API changes this process; SIGHUP puts the file's (good) settings back. (Values
    // exact in binary: lenience is an f32.)
    std::fs::write(&path, "[speculation]\nlenience = 0.75\ngamma = 2\n").unwrap();
    wait_for("the fixed file applied", &|| settings()["lenience"] == 0.75);
    let r = admin(&addr, "PUT", Some("t"), r#"{"lenience": 0.25}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(settings()["lenience"], 0.25);
    server.signal("HUP");
    wait_for("SIGHUP reread the file", &|| settings()["lenience"] == 0.75);
    assert_eq!(
        server.metric("tandem_config_reloads_total", "result=\"ok\""),
        Some(3.0)
    );
    // Still serving.
    let v = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": "One, two,", "max_tokens": 4}),
    );
    assert_eq!(v.status, 200, "{}", v.text());
}

/// `tandem health` is the container's health check; after SIGTERM with `--drain-seconds`, the
/// server says "draining" on /health (so balancers take it out) but still serves requests until
/// the drain ends, then stops accepting connections and exits cleanly.
#[test]
fn health_command_and_draining_after_sigterm() {
    // A drain long enough for the checks below on a loaded 2-core machine (a `tandem health`
    // process start included); with 3 s a busy CI run could see the drain end first.
    let server = Server::start(&["--context-length", CONTEXT, "--drain-seconds", "10"], &[]);
    let addr = server.addr.clone();
    let health = || {
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["health", "--url", &format!("http://{addr}/health")])
            .output()
            .expect("tandem health runs")
    };
    let ok = health();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The port comes from --port / TANDEM_PORT as with serve.
    let port = addr.rsplit(':').next().unwrap();
    let by_port = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["health", "--port", port])
        .output()
        .unwrap();
    assert!(by_port.status.success());

    server.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(2);
    while get(&addr, "/health").status != 503 {
        assert!(Instant::now() < deadline, "/health never said draining");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&addr, "/health").json()["status"], "draining");
    let unhealthy = health();
    assert!(!unhealthy.status.success());
    assert!(String::from_utf8_lossy(&unhealthy.stderr).contains("answered 503"));
    // Still serving while draining.
    let r = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        server.wait_for_exit(Duration::from_secs(30)),
        "tandem serve exits cleanly after the drain"
    );
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "still accepting"
    );
    let gone = health();
    assert!(!gone.status.success());
}
