//! Who may use the server, as a hostile client would test it, on the default model: API keys in
//! front of the inference API, stored responses visible only to the key that made them, ids
//! that tell nothing of each other, bounded `metadata`, and the admin API's token checked before
//! anything else is said.

use crate::common;

use common::http::{get, open_stream, request, Response, Server};
use serde_json::{json, Value};

const KEY_A: &str = "sk-tenant-a-0123456789";
const KEY_B: &str = "sk-tenant-b-9876543210";

fn with_key(addr: &str, method: &str, path: &str, key: Option<&str>, body: &Value) -> Response {
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    request(addr, method, path, &headers, &body)
}

fn assert_unauthorized(r: &Response, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["code"], "invalid_api_key", "{what}: {v}");
    assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{what}");
    assert!(!r.text().contains(KEY_A) && !r.text().contains(KEY_B));
}

#[test]
fn keys_guard_the_api_and_stored_responses_are_private_to_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("keys");
    std::fs::write(&keys_file, format!("# tenants\n{KEY_B}\n")).unwrap();
    let mut server = Server::start(
        &[
            "--draft-model",
            "prompt-lookup",
            "--api-key",
            KEY_A,
            "--api-keys-file",
            keys_file.to_str().unwrap(),
        ],
        &[("TANDEM_ADMIN_TOKEN", "admin-secret")],
    );
    let addr = server.addr.clone();
    let log = server.drain_log().join("\n");
    assert!(log.contains("needs an API key"), "{log}");
    assert!(
        !log.contains(KEY_A) && !log.contains(KEY_B),
        "keys never logged"
    );

    // Every inference route needs a key; /health and /metrics stay open.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    for (method, path, body) in [
        ("POST", "/v1/chat/completions", chat.clone()),
        (
            "POST",
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 2}),
        ),
        ("GET", "/v1/models", Value::Null),
        ("POST", "/v1/responses", json!({"input": "Hi"})),
        ("GET", "/v1/responses/resp_0", Value::Null),
        ("POST", "/tokenize", json!({"content": "Hi"})),
        ("POST", "/detokenize", json!({"tokens": [1]})),
    ] {
        assert_unauthorized(&with_key(&addr, method, path, None, &body), path);
        assert_unauthorized(
            &with_key(&addr, method, path, Some("sk-wrong"), &body),
            path,
        );
        assert_unauthorized(
            &with_key(&addr, method, path, Some(&KEY_A[..KEY_A.len() - 1]), &body),
            path,
        );
    }
    assert_eq!(get(&addr, "/health").status, 200);
    assert_eq!(get(&addr, "/metrics").status, 200);
    let r = with_key(&addr, "POST", "/v1/chat/completions", Some(KEY_A), &chat);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        with_key(&addr, "GET", "/v1/models", Some(KEY_B), &Value::Null).status,
        200,
        "the file's key works too"
    );

    // A victim stores a response under key A.
    let secret = json!({"input": "My password is hunter2, remember it",
                        "instructions": "victim system prompt", "max_output_tokens": 4,
                        "temperature": 0});
    let r = with_key(&addr, "POST", "/v1/responses", Some(KEY_A), &secret);
    assert_eq!(r.status, 200, "{}", r.text());
    let victim = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(r.header("x-request-id"), Some(victim.as_str()));
    // Key B cannot read, continue or delete it: 404, as for an id never made.
    let path = format!("/v1/responses/{victim}");
    for method in ["GET", "DELETE"] {
        let r = with_key(&addr, method, &path, Some(KEY_B), &Value::Null);
        assert_eq!(r.status, 404, "{method}: {}", r.text());
        assert!(!r.text().contains("hunter2"));
    }
    let r = with_key(
        &addr,
        "POST",
        "/v1/responses",
        Some(KEY_B),
        &json!({"input": "What is my password?", "previous_response_id": victim,
                "max_output_tokens": 4}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "previous_response_id");
    // Key A still has it.
    let r = with_key(&addr, "GET", &path, Some(KEY_A), &Value::Null);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["instructions"], "victim system prompt");

    // Consecutive ids share no counter: no common run of hex digits after the kind.
    let mut ids = vec![victim.clone()];
    for _ in 0..3 {
        let r = with_key(
            &addr,
            "POST",
            "/v1/responses",
            Some(KEY_A),
            &json!({"input": "Hi", "max_output_tokens": 1, "store": false}),
        );
        ids.push(r.json()["id"].as_str().unwrap().to_string());
    }
    for c in 0..2 {
        let r = with_key(&addr, "POST", "/v1/chat/completions", Some(KEY_A), &chat);
        ids.push(r.json()["id"].as_str().unwrap().to_string());
        assert_eq!(r.header("x-request-id"), r.json()["id"].as_str(), "{c}");
    }
    let hex: Vec<&str> = ids
        .iter()
        .map(|id| id.rsplit(['_', '-']).next().unwrap())
        .collect();
    for pair in hex.windows(2) {
        assert!(pair[0].len() >= 24, "{pair:?}: at least 96 bits");
        assert_ne!(pair[0][..8], pair[1][..8], "{pair:?}");
        assert_ne!(
            pair[0][pair[0].len() - 8..],
            pair[1][pair[1].len() - 8..],
            "{pair:?}"
        );
    }

    // metadata at OpenAI's limits: 16 pairs pass, 17 are a 400 naming it.
    let pairs = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
    };
    let body = |m: Value| json!({"input": "Hi", "max_output_tokens": 1, "metadata": m});
    let r = with_key(
        &addr,
        "POST",
        "/v1/responses",
        Some(KEY_A),
        &body(pairs(16)),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for bad in [
        pairs(17),
        json!({ "k".repeat(65): "v" }),
        json!({"k": "v".repeat(513)}),
        json!({"k": 1}),
    ] {
        let r = with_key(&addr, "POST", "/v1/responses", Some(KEY_A), &body(bad));
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], "metadata");
    }
    let r = with_key(
        &addr,
        "POST",
        "/v1/chat/completions",
        Some(KEY_A),
        &json!({"messages": [{"role": "user", "content": "Hi"}], "metadata": pairs(17)}),
    );
    assert_eq!(r.status, 400, "chat bounds metadata too: {}", r.text());
    let r = with_key(
        &addr,
        "POST",
        "/v1/completions",
        Some(KEY_A),
        &json!({"prompt": "Hi", "user": "u".repeat(300)}),
    );
    assert_eq!(r.json()["error"]["param"], "user", "{}", r.text());

    // The admin API checks its token before it says anything of methods.
    for method in ["POST", "PATCH", "PUT", "GET"] {
        let r = with_key(
            &addr,
            method,
            "/admin/speculation",
            Some("wrong"),
            &json!({}),
        );
        assert_eq!(r.status, 401, "{method}: {}", r.text());
        // API keys are not admin tokens.
        let r = with_key(&addr, method, "/admin/speculation", Some(KEY_A), &json!({}));
        assert_eq!(r.status, 401, "{method}: {}", r.text());
    }
    let r = with_key(
        &addr,
        "POST",
        "/admin/speculation",
        Some("admin-secret"),
        &json!({}),
    );
    assert_eq!(
        r.status,
        405,
        "with the token the method is judged: {}",
        r.text()
    );

    // The prefix cache is per key: what one tenant sent is never another's cached prefix, so
    // `cached_tokens` (and the time to the first token) tells nothing of other tenants.
    let chat = json!({
        "messages": [{"role": "user", "content": "A secret plan: meet at the old mill at noon."}],
        "max_tokens": 4,
        "temperature": 0,
    });
    let cached = |key: &str| -> (u64, Value) {
        let r = with_key(&addr, "POST", "/v1/chat/completions", Some(key), &chat);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let n = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        (n, v["choices"][0]["message"]["content"].clone())
    };
    let (first, answer) = cached(KEY_A);
    let (again, same) = cached(KEY_A);
    assert!(
        again > first,
        "A's own text is cached for A: {first} then {again}"
    );
    assert_eq!(same, answer);
    let (other, theirs) = cached(KEY_B);
    assert!(
        other < again,
        "B starts from nothing A stored: {other} of {again}"
    );
    assert_eq!(theirs, answer, "the same answer either way");
    assert_eq!(cached(KEY_B).0, again, "B's own text is cached for B");
    // The scope is the key's alone: a body naming A's (the first key's) reaches nothing of A's.
    let mut text = chat.clone();
    text["messages"][0]["content"] = json!("Another secret: the code is 4-8-15-16.");
    with_key(&addr, "POST", "/v1/chat/completions", Some(KEY_A), &text);
    text["cache_scope"] = json!(1);
    let r = with_key(&addr, "POST", "/v1/chat/completions", Some(KEY_B), &text);
    let n = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(n.unwrap() < again, "{}", r.text());
}

#[test]
fn a_response_deleted_while_it_streams_is_never_stored() {
    let server = Server::start(&["--draft-model", "prompt-lookup"], &[]);
    let addr = server.addr.clone();
    let mut stream = open_stream(
        &addr,
        "/v1/responses",
        &json!({"input": "Count from one to fifty in words.", "max_output_tokens": 48,
                "temperature": 0, "stream": true}),
    );
    assert_eq!(stream.status, 200);
    let first: Value = serde_json::from_str(&stream.next_data().unwrap()).unwrap();
    let id = first["response"]["id"].as_str().unwrap().to_string();
    let path = format!("/v1/responses/{id}");
    let r = request(&addr, "DELETE", &path, &[], b"");
    assert_eq!(
        r.status,
        200,
        "a response in flight can be deleted: {}",
        r.text()
    );
    assert_eq!(r.json()["deleted"], true);
    while stream.next_data().is_some_and(|d| d != "[DONE]") {}
    drop(stream);
    let r = get(&addr, &path);
    assert_eq!(r.status, 404, "stored after its deletion: {}", r.text());
    assert_eq!(request(&addr, "DELETE", &path, &[], b"").status, 404);
}

#[test]
fn metrics_can_need_a_key_and_health_never_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tandem.toml");
    std::fs::write(
        &config,
        "[server]\nmetrics_require_key = true\napi_keys = [\"sk-config-key\"]\n",
    )
    .unwrap();
    let server = Server::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--draft-model",
            "prompt-lookup",
        ],
        &[("TANDEM_API_KEY", "sk-env-key")],
    );
    let addr = server.addr.clone();
    assert_eq!(get(&addr, "/health").status, 200);
    assert_unauthorized(&get(&addr, "/metrics"), "/metrics");
    for key in ["sk-config-key", "sk-env-key"] {
        let r = with_key(&addr, "GET", "/metrics", Some(key), &Value::Null);
        assert_eq!(r.status, 200, "{key}");
        assert!(r.text().contains("tandem_non_finite_forwards_total"));
    }
}

#[test]
fn a_bad_key_stops_start_up_naming_where_it_came_from() {
    let out = common::tandem_command()
        .args(["serve", "--port", "0", "--api-key", "two words"])
        .env_remove("TANDEM_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server.api_keys[0]") && err.contains("white space"),
        "{err}"
    );
    let out = common::tandem_command()
        .args([
            "serve",
            "--port",
            "0",
            "--api-keys-file",
            "/nonexistent/keys",
        ])
        .env_remove("TANDEM_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.api_keys_file"), "{err}");
}
