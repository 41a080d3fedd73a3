//! Token provenance (`"speculative": {"token_sources": true}`) over HTTP on the default model,
//! and the page at `/` in a real browser: headless Chromium (Debian's package) driven by
//! Playwright (`scripts/test` installs both; `tests/browser/page_check.py` says what the page
//! must do).

use crate::common;

use std::process::Command;

use serde_json::{json, Value};

use common::http::{self, post_json, Server};

const COPYING: &str = "Copy this text exactly: The quick brown fox jumps over the lazy dog. \
                       The quick brown fox jumps over the lazy dog.";

/// The runs' texts joined, their token total, and the tokens of runs of each `source`.
fn read_runs(runs: &Value) -> (String, usize, Vec<(String, usize)>) {
    let runs = runs.as_array().expect("token_sources is an array");
    let mut text = String::new();
    let mut by_source: Vec<(String, usize)> = Vec::new();
    for r in runs {
        let source = r["source"].as_str().expect("a run names its source");
        assert!(
            ["target", "draft", "forced", "correction", "prompt"].contains(&source),
            "{r}"
        );
        // Only a draft names its drafter, and the names are the API's.
        match source {
            "draft" => assert!(
                ["prompt-lookup", "suffix", "draft-model", "self", "head"]
                    .contains(&r["drafter"].as_str().unwrap_or("")),
                "{r}"
            ),
            _ => assert!(r.get("drafter").is_none(), "{r}"),
        }
        text.push_str(r["text"].as_str().expect("a run has text"));
        let n = r["tokens"].as_u64().expect("a run counts its tokens") as usize;
        match by_source.iter_mut().find(|(s, _)| s == source) {
            Some((_, total)) => *total += n,
            None => by_source.push((source.to_string(), n)),
        }
    }
    let tokens = by_source.iter().map(|(_, n)| n).sum();
    (text, tokens, by_source)
}

fn tokens_of(by_source: &[(String, usize)], source: &str) -> usize {
    by_source
        .iter()
        .find(|(s, _)| s == source)
        .map_or(0, |(_, n)| *n)
}

fn chat_body(content: &str, sources: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 40,
        "speculative": {"gamma": 4, "token_sources": sources},
    })
}

#[test]
fn token_sources_mark_every_token_and_change_nothing_else() {
    let server = Server::start(
        &["--draft-model", "prompt-lookup", "--web-page", "false"],
        &[],
    );
    let addr = server.addr.as_str();
    // Turned off, the page's path is a 404 like any unknown path.
    let r = http::get(addr, "/");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].is_object());

    // Whole answers: the runs concatenate to the content, count every token, and their drafts
    // are exactly the accepted drafts (the output ends at max_tokens, so every accepted draft
    // is emitted).
    let with = post_json(addr, "/v1/chat/completions", &chat_body(COPYING, true));
    assert_eq!(with.status, 200, "{}", with.text());
    let with = with.json();
    let without = post_json(addr, "/v1/chat/completions", &chat_body(COPYING, false)).json();
    let content = with["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(
        content, without["choices"][0]["message"]["content"],
        "provenance changed the answer"
    );
    assert!(without["choices"][0].get("token_sources").is_none());
    assert_eq!(with["choices"][0]["finish_reason"], "length");
    let (text, tokens, by_source) = read_runs(&with["choices"][0]["token_sources"]);
    assert_eq!(text, content);
    let usage = &with["usage"];
    assert_eq!(tokens as u64, usage["completion_tokens"].as_u64().unwrap());
    let accepted = usage["speculative"]["accepted_tokens"].as_u64().unwrap() as usize;
    assert!(
        tokens_of(&by_source, "draft") > 0,
        "a copying prompt under prompt lookup has accepted drafts: {by_source:?}"
    );
    assert_eq!(
        tokens_of(&by_source, "draft") + tokens_of(&by_source, "forced"),
        accepted,
        "{by_source:?}"
    );
    assert!(
        tokens_of(&by_source, "correction")
            <= usage["speculative"]["rounds"].as_u64().unwrap() as usize
    );

    // Streamed: each chunk's runs are its own text, and together they are the whole answer's.
    let mut streamed = chat_body(COPYING, true);
    streamed["stream"] = json!(true);
    let data = post_json(addr, "/v1/chat/completions", &streamed).sse_data();
    let (mut text, mut tokens) = (String::new(), 0);
    for d in data.iter().filter(|d| d.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        let c = &v["choices"][0];
        let piece = c["delta"]["content"].as_str().unwrap_or("");
        match c.get("token_sources") {
            Some(runs) => {
                let (t, n, _) = read_runs(runs);
                assert_eq!(t, piece, "a chunk's runs are its text");
                tokens += n;
            }
            None => assert!(piece.is_empty(), "text without runs: {v}"),
        }
        text.push_str(piece);
    }
    assert_eq!(text, content);
    assert_eq!(tokens as u64, usage["completion_tokens"].as_u64().unwrap());

    // Completions with echo: the prompt comes first, as a run of its own.
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"prompt": "one two three one two three one two", "max_tokens": 12,
                "temperature": 0, "echo": true,
                "speculative": {"gamma": 3, "token_sources": true}}),
    )
    .json();
    let choice = &r["choices"][0];
    let (text, _, _) = read_runs(&choice["token_sources"]);
    assert_eq!(text, choice["text"].as_str().unwrap());
    assert_eq!(choice["token_sources"][0]["source"], "prompt");
    assert_eq!(
        choice["token_sources"][0]["text"],
        "one two three one two three one two"
    );

    // A grammar's forced tokens are marked as such.
    let mut schema = chat_body("Give a person as JSON.", true);
    schema["response_format"] = json!({"type": "json_schema", "json_schema": {
        "name": "person", "schema": {"type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false}}});
    let r = post_json(addr, "/v1/chat/completions", &schema).json();
    let (text, _, by_source) = read_runs(&r["choices"][0]["token_sources"]);
    assert_eq!(
        text,
        r["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let forced = tokens_of(&by_source, "forced");
    assert!(forced > 0, "{by_source:?}");
    assert_eq!(
        forced as u64,
        r["usage"]["speculative"]["forced_accepted_tokens"]
            .as_u64()
            .unwrap()
    );

    // The Responses API: on the output text part, and on each streamed text delta.
    let body = json!({"input": COPYING, "temperature": 0, "max_output_tokens": 24,
                      "speculative": {"gamma": 4, "token_sources": true}});
    let r = post_json(addr, "/v1/responses", &body).json();
    let part = &r["output"][0]["content"][0];
    let (text, tokens, _) = read_runs(&part["token_sources"]);
    assert_eq!(text, part["text"].as_str().unwrap());
    assert_eq!(tokens as u64, r["usage"]["output_tokens"].as_u64().unwrap());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let data = post_json(addr, "/v1/responses", &streamed).sse_data();
    let mut deltas = String::new();
    for d in &data {
        let v: Value = serde_json::from_str(d).unwrap();
        if v["type"] == "response.output_text.delta" {
            let (t, _, _) = read_runs(&v["token_sources"]);
            assert_eq!(t, v["delta"].as_str().unwrap());
            deltas.push_str(&t);
        }
    }
    assert_eq!(deltas, part["text"].as_str().unwrap());

    // Refused where it cannot hold, naming the field; a server setting it is not.
    let mut tools = chat_body("What is the weather?", true);
    tools["tools"] = json!([{"type": "function", "function": {"name": "weather",
        "parameters": {"type": "object", "properties": {}}}}]);
    let r = post_json(addr, "/v1/chat/completions", &tools);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "speculative.token_sources");
    let r = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}],
                "speculative": {"token_sources": "yes"}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn the_page_is_served_at_the_root_and_works_in_a_real_browser() {
    let token = "page-test-admin-token";
    // With an API key, as a shared server has: the page sends the one entered in it.
    let key = "page-test-api-key";
    let server = Server::start(
        &["--draft-model", "prompt-lookup"],
        &[("TANDEM_ADMIN_TOKEN", token), ("TANDEM_API_KEY", key)],
    );
    let r = http::get(&server.addr, "/");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = r.header("content-security-policy").expect("a CSP");
    assert!(csp.contains("connect-src 'self'") && csp.contains("default-src 'none'"));
    assert!(r.text().contains("<html"));
    // The API's unknown routes keep their JSON 404.
    assert_eq!(http::get(&server.addr, "/index.html").status, 404);

    let root = env!("CARGO_MANIFEST_DIR");
    let shots = format!("{root}/target/browser-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let libs = format!("{root}/target/browser-libs");
    let path = match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{libs}:{p}"),
        _ => libs,
    };
    let out = Command::new("python3")
        .arg(format!("{root}/tests/browser/page_check.py"))
        .arg(format!("http://{}", server.addr))
        .arg(token)
        .arg(&shots)
        .env("PYTHONPATH", path)
        .env("TANDEM_API_KEY", key)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the page check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ok   step 7") && stdout.contains("page check passed"));
    for shot in ["chat.png", "operator.png"] {
        let len = std::fs::metadata(format!("{shots}/{shot}")).map_or(0, |m| m.len());
        assert!(len > 10_000, "screenshot {shot}: {len} bytes");
    }
}
