//! `tandem serve` against hostile structured-output requests, on the default model: deep
//! `$ref` chains, wide objects, long Lark rule chains, huge choice lists, nested repetition,
//! left recursion, tool schemas of the same shapes. Every case is refused with a 400 naming
//! its field or served; none gives a 500, the process stays up, `/health` answers within a
//! second while the largest compiles run, and a plain request beside them is unharmed.
//! Before the compile threads and the input limits, the first of these cases aborted the
//! whole process (a worker's stack overflowed) and the choice lists stalled `/health`.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::http::{get, post_json, Response, Server};
use serde_json::{json, Map, Value};

fn ref_chain(n: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        defs.insert(
            format!("D{i}"),
            json!({"type": "object", "properties": {"next": {"$ref": format!("#/$defs/D{}", i + 1)}}}),
        );
    }
    defs.insert(format!("D{n}"), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/D0"})
}

fn any_of_chain(n: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        defs.insert(
            format!("D{i}"),
            json!({"anyOf": [{"$ref": format!("#/$defs/D{}", i + 1)}, {"type": "null"}]}),
        );
    }
    defs.insert(format!("D{n}"), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/D0"})
}

/// An object of `n` string properties, all of them required or none.
fn wide_object(n: usize, required: bool) -> Value {
    let props: Map<String, Value> = (0..n)
        .map(|i| (format!("field_{i}"), json!({"type": "string"})))
        .collect();
    let names: Vec<&String> = if required {
        props.keys().collect()
    } else {
        Vec::new()
    };
    json!({"type": "object", "properties": props, "required": names})
}

fn lark_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        g += &format!("r{i}: \"a\" r{}\n", i + 1);
    }
    g + &format!("r{n}: \"b\"\n")
}

fn schema_format(schema: Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": 8,
        "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"prompt": "Answer:", "max_tokens": 8, "temperature": 0});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn weather_tool(parameters: Value) -> Value {
    json!([{"type": "function", "function": {"name": "f", "parameters": parameters}}])
}

enum Expect {
    /// A 400 naming this field, with the code of a constraint too complex.
    TooComplex(&'static str),
    /// A 400 naming this field (a grammar llguidance refuses as wrong).
    Invalid(&'static str),
    Served,
}

fn check(case: &str, r: &Response, expect: &Expect) {
    assert_ne!(r.status, 500, "{case}: {}", r.text());
    match expect {
        Expect::Served => assert_eq!(r.status, 200, "{case}: {}", r.text()),
        Expect::TooComplex(field) | Expect::Invalid(field) => {
            assert_eq!(r.status, 400, "{case}: {}", r.text());
            let e = &r.json()["error"];
            assert_eq!(e["param"], *field, "{case}: {e}");
            if matches!(expect, Expect::TooComplex(_)) {
                assert_eq!(e["code"], "grammar_too_complex", "{case}: {e}");
            }
        }
    }
}

fn assert_alive(server: &Server) {
    let started = Instant::now();
    let r = get(&server.addr, "/health");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn hostile_grammars_are_refused_or_served_and_never_hurt_the_server() {
    let server = Server::start(&["--context-length", "512"], &[]);
    // The structured-output series exist before the first constrained request, at zero, so
    // the dashboard's panels show zeros rather than no data.
    for (name, labels) in [
        ("tandem_constrained_requests_total", "kind=\"json_schema\""),
        (
            "tandem_constraint_too_complex_total",
            "stage=\"generation\"",
        ),
        ("tandem_constraint_mask_seconds_count", ""),
    ] {
        assert_eq!(server.metric(name, labels), Some(0.0), "{name}");
    }
    let left_recursive = "start: list\nlist: list \",\" ITEM | ITEM\nITEM: /[a-z]+/\n";
    let nested_brackets = format!("start: {}\"a\"{}\n", "(".repeat(100), ")".repeat(100));
    let cases: Vec<(&str, &str, Value, Expect)> = vec![
        (
            "a $ref chain 300 deep",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(ref_chain(300))})),
            Expect::TooComplex("response_format"),
        ),
        (
            "the same as guided_json",
            "/v1/completions",
            completion(json!({"guided_json": ref_chain(300)})),
            Expect::TooComplex("guided_json"),
        ),
        (
            "a chain of anyOf [$ref next, null]",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(any_of_chain(300))})),
            Expect::TooComplex("response_format"),
        ),
        (
            "a $ref chain 20 deep",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(ref_chain(20))})),
            Expect::Served,
        ),
        (
            "8,000 required string properties",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(wide_object(8000, true))})),
            Expect::TooComplex("response_format"),
        ),
        (
            "3,000 required string properties",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(wide_object(3000, true))})),
            Expect::Served,
        ),
        (
            "1,000 optional properties",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(wide_object(1000, false))})),
            Expect::TooComplex("response_format"),
        ),
        (
            "300 optional properties",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(wide_object(300, false))})),
            Expect::Served,
        ),
        (
            "a Lark grammar of 700 chained rules",
            "/v1/completions",
            completion(json!({"guided_grammar": lark_chain(700)})),
            Expect::Served,
        ),
        (
            "a Lark grammar of 1,500 chained rules",
            "/v1/completions",
            completion(json!({"guided_grammar": lark_chain(1500)})),
            Expect::TooComplex("guided_grammar"),
        ),
        (
            "100 nested brackets in Lark",
            "/v1/completions",
            completion(json!({"guided_grammar": nested_brackets})),
            Expect::TooComplex("guided_grammar"),
        ),
        (
            "a left-recursive Lark grammar",
            "/v1/completions",
            completion(json!({"guided_grammar": left_recursive})),
            Expect::Served,
        ),
        (
            "a rule that only recurses",
            "/v1/completions",
            completion(json!({"guided_grammar": "start: a\na: \"x\" a\n"})),
            Expect::Invalid("guided_grammar"),
        ),
        (
            "nested repetition (\\w{1,50}){1,50}",
            "/v1/completions",
            completion(json!({"guided_regex": "(\\w{1,50}){1,50}"})),
            Expect::TooComplex("guided_regex"),
        ),
        (
            "nested repetition in a schema's pattern",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(
                json!({"type": "string", "pattern": "([a-z]{1,40}){1,40}"}))})),
            Expect::TooComplex("response_format"),
        ),
        (
            "a regex nesting 100 groups",
            "/v1/completions",
            completion(json!({"guided_regex": format!("{}a{}", "(".repeat(100), ")".repeat(100))})),
            Expect::TooComplex("guided_regex"),
        ),
        (
            "a tool whose parameters are a $ref chain 300 deep",
            "/v1/chat/completions",
            chat(json!({"tools": weather_tool(ref_chain(300)), "tool_choice": "required"})),
            Expect::TooComplex("tools"),
        ),
        (
            "a whitespace pattern of nested repetition",
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_object"},
                        "guided_whitespace_pattern": "( {1,30}){1,30}"})),
            Expect::TooComplex("guided_whitespace_pattern"),
        ),
        (
            "an enum of 100,001 values",
            "/v1/chat/completions",
            chat(json!({"response_format": schema_format(
                json!({"enum": (0..100_001).collect::<Vec<_>>()}))})),
            Expect::TooComplex("response_format"),
        ),
    ];
    // Fields that would be ignored are refused by name.
    let refused = [
        (
            completion(json!({"tools": weather_tool(json!({"type": "object"}))})),
            "tools",
        ),
        (
            completion(json!({"guided_regex": "a+", "guided_whitespace_pattern": " ?"})),
            "guided_whitespace_pattern",
        ),
        (
            chat(json!({"guided_whitespace_pattern": " ?"})),
            "guided_whitespace_pattern",
        ),
    ];
    for (body, field) in &refused {
        let path = if body.get("prompt").is_some() {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        check(
            field,
            &post_json(&server.addr, path, body),
            &Expect::Invalid(field),
        );
    }
    for (case, path, body, expect) in &cases {
        let r = post_json(&server.addr, path, body);
        check(case, &r, expect);
        assert_alive(&server);
    }

    // Two requests of 90,000 choices each compile together (off the async runtime): /health
    // answers within a second throughout and a plain request beside them is served.
    let choices: Vec<String> = (0..90_000).map(|i| format!("c{i}")).collect();
    let big = completion(json!({"guided_choice": choices}));
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (addr, body) = (server.addr.clone(), big.clone());
            std::thread::spawn(move || post_json(&addr, "/v1/completions", &body))
        })
        .collect();
    for _ in 0..5 {
        assert_alive(&server);
        std::thread::sleep(Duration::from_millis(50));
    }
    let plain = post_json(&server.addr, "/v1/completions", &completion(json!({})));
    assert_eq!(plain.status, 200, "{}", plain.text());
    for s in senders {
        let r = s.join().unwrap();
        check("90,000 choices", &r, &Expect::Served);
        let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        assert!(
            text.starts_with('c') && text[1..].parse::<u32>().is_ok_and(|n| n < 90_000),
            "{text:?}"
        );
    }
    let refused = server
        .metric("tandem_constraint_too_complex_total", "stage=\"limits\"")
        .unwrap();
    assert!(
        refused
            >= cases
                .iter()
                .filter(|c| matches!(c.3, Expect::TooComplex(_)))
                .count() as f64
    );
}

/// A grammar that compiles and starts but branches past llguidance's per-token limits after
/// its first token: the sequence ends with a 400 naming the field (an error event, then
/// `[DONE]`, when streamed), counted; the next request is unharmed.
#[test]
fn a_grammar_too_complex_to_follow_ends_its_own_sequence_with_a_400() {
    let server = Server::start(&["--context-length", "512"], &[]);
    let wide: Vec<String> = (0..2500).map(|i| format!("\"a{i}\"")).collect();
    let grammar = format!("start: (\"x\" | \"y\") wide\nwide: {}\n", wide.join(" | "));
    let body = completion(json!({"guided_grammar": grammar}));
    let r = post_json(&server.addr, "/v1/completions", &body);
    check(
        "a row past max_items_in_row",
        &r,
        &Expect::TooComplex("guided_grammar"),
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post_json(&server.addr, "/v1/completions", &streamed);
    assert_eq!(r.status, 200);
    let events = r.sse_data();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "grammar_too_complex", "{error}");
    assert_eq!(error["error"]["param"], "guided_grammar", "{error}");
    let counted = server
        .metric(
            "tandem_constraint_too_complex_total",
            "stage=\"generation\"",
        )
        .unwrap();
    assert_eq!(counted, 2.0);
    let plain = post_json(&server.addr, "/v1/completions", &completion(json!({})));
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_alive(&server);
}

/// One compile thread and no queue: a compile past `structured.compile_timeout_ms` is a 400
/// naming the field, and a request that finds the thread still busy with it gets a 503 with
/// `Retry-After`, at once.
#[test]
fn a_compile_past_its_deadline_is_a_400_and_a_full_pool_a_503() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tandem.toml");
    std::fs::write(
        &config,
        "[structured]\ncompile_threads = 1\ncompile_queue = 0\ncompile_timeout_ms = 20\n",
    )
    .unwrap();
    let server = Server::start(&["--context-length", "512", "--config", path(&config)], &[]);
    // About half a second to compile (5,000 properties), far past 20 ms.
    let slow = chat(json!({"response_format": schema_format(wide_object(5000, true))}));
    let r = post_json(&server.addr, "/v1/chat/completions", &slow);
    check(
        "a compile past its deadline",
        &r,
        &Expect::TooComplex("response_format"),
    );
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("compile_timeout_ms"));
    let started = Instant::now();
    let r = post_json(&server.addr, "/v1/chat/completions", &slow);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_alive(&server);
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}
