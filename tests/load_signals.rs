//! What routers read from a replica, on the default model over HTTP: smg's load report
//! (`/v1/loads`, `/loads`), vllm-router's `/get_load`, vLLM's gauges on `/metrics`, and vLLM's
//! render endpoints, in the shapes the routers' sources parse.

use crate::common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::http::{self, metric_value, open_stream, post_json, Server};

/// A rank's integer fields must be JSON integers: smg's parser refuses `3.0` and then never
/// asks the route again.
fn check_report(r: &Value) -> &Value {
    assert_eq!(r["dp_rank_count"], 1, "{r}");
    assert!(
        r["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{r}"
    );
    let loads = r["loads"].as_array().expect("loads");
    assert_eq!(loads.len(), 1, "{r}");
    let rank = &loads[0];
    for key in [
        "dp_rank",
        "num_running_reqs",
        "num_waiting_reqs",
        "num_waiting_uncached_tokens",
        "num_total_reqs",
        "num_used_tokens",
        "max_total_num_tokens",
        "max_running_requests",
    ] {
        assert!(rank[key].is_u64(), "{key} is not an integer: {rank}");
    }
    let usage = rank["token_usage"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&usage), "{rank}");
    rank
}

#[test]
fn routers_read_load_and_rendered_prompts_in_their_own_shapes() {
    let server = Server::start(&["--draft-model", "prompt-lookup"], &[]);
    let addr = server.addr.as_str();

    // Idle.
    let r = http::get(addr, "/get_load");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"load": 0}));
    for path in [
        "/v1/loads?include=core,disagg,queues,memory",
        "/loads?model=x",
    ] {
        let r = http::get(addr, path);
        assert_eq!(r.status, 200, "{path}");
        let report = r.json();
        let rank = check_report(&report);
        assert_eq!(rank["num_running_reqs"], 0);
        assert_eq!(rank["max_running_requests"], 8);
    }

    // Busy: a long streamed answer is running while the routers ask.
    let long = json!({"messages": [{"role": "user", "content": "Count from one to two hundred in words."}],
                      "max_tokens": 400, "temperature": 0, "ignore_eos": true, "stream": true});
    let mut stream = open_stream(addr, "/v1/chat/completions", &long);
    assert_eq!(stream.status, 200);
    stream.next_data().expect("a first chunk");
    let deadline = Instant::now() + Duration::from_secs(30);
    let rank = loop {
        let report = http::get(addr, "/v1/loads").json();
        let rank = check_report(&report).clone();
        if rank["num_running_reqs"] == 1 || Instant::now() > deadline {
            break rank;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(rank["num_running_reqs"], 1, "{rank}");
    assert!(rank["num_used_tokens"].as_u64().unwrap() > 0, "{rank}");
    assert!(rank["token_usage"].as_f64().unwrap() > 0.0, "{rank}");
    assert_eq!(http::get(addr, "/get_load").json()["load"], 1);
    let metrics = http::get(addr, "/metrics").text();
    let label = r#"model_name="SmolLM2-135M-Instruct.Q4_1.gguf""#;
    assert_eq!(
        metric_value(&metrics, "vllm:num_requests_running", label),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "vllm:num_requests_waiting", label),
        Some(0.0)
    );
    let kv = metric_value(&metrics, "vllm:kv_cache_usage_perc", label).unwrap();
    assert!(kv > 0.0 && kv <= 1.0, "{kv}");
    assert_eq!(
        Some(kv),
        metric_value(&metrics, "tandem_kv_cache_usage_ratio", r#"model="target""#)
    );
    while stream.next_data().is_some_and(|d| d != "[DONE]") {}
    drop(stream);
    // Throughput is measured between two reports a second apart, once tokens were generated.
    std::thread::sleep(Duration::from_millis(1100));
    let rank = check_report(&http::get(addr, "/v1/loads").json()).clone();
    assert_eq!(rank["num_running_reqs"], 0, "{rank}");
    assert!(rank["gen_throughput"].as_f64().unwrap() >= 0.0);

    // The prefix cache's hit rate, by tokens: the same conversation twice.
    let chat = json!({"messages": [{"role": "system", "content": "You are terse."},
                                   {"role": "user", "content": "Name a colour."}],
                      "max_tokens": 4, "temperature": 0});
    for _ in 0..2 {
        assert_eq!(post_json(addr, "/v1/chat/completions", &chat).status, 200);
    }
    let metrics = http::get(addr, "/metrics").text();
    let hits = metric_value(&metrics, "vllm:prefix_cache_hits_total", label).unwrap();
    let queries = metric_value(&metrics, "vllm:prefix_cache_queries_total", label).unwrap();
    assert!(hits > 0.0 && queries >= hits, "{hits} of {queries}");
    let rank = check_report(&http::get(addr, "/v1/loads").json()).clone();
    let rate = rank["cache_hit_rate"].as_f64().unwrap();
    assert!(
        (rate - hits / queries).abs() < 1e-9,
        "{rate} vs {hits}/{queries}"
    );

    // Render: exactly the ids generation prefills, as /tokenize gives them.
    let r = post_json(addr, "/v1/chat/completions/render", &chat);
    assert_eq!(r.status, 200, "{}", r.text());
    let rendered = r.json();
    let ids = post_json(
        addr,
        "/tokenize",
        &json!({"messages": chat["messages"], "add_generation_prompt": true}),
    )
    .json();
    assert_eq!(rendered["token_ids"], ids["tokens"], "{rendered}");
    assert!(rendered["features"].is_null());
    assert_eq!(rendered["sampling_params"]["max_tokens"], 4);
    assert!(rendered["request_id"]
        .as_str()
        .is_some_and(|id| id.starts_with("chatcmpl-")));
    let usage = post_json(addr, "/v1/chat/completions", &chat).json()["usage"].clone();
    assert_eq!(
        rendered["token_ids"].as_array().unwrap().len() as u64,
        usage["prompt_tokens"].as_u64().unwrap()
    );
    let r = post_json(
        addr,
        "/v1/completions/render",
        &json!({"prompt": ["The sea", "A tree"], "max_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let items = r.json();
    let items = items.as_array().unwrap();
    assert_eq!(items.len(), 2);
    for (item, text) in items.iter().zip(["The sea", "A tree"]) {
        let ids = post_json(addr, "/tokenize", &json!({"prompt": text})).json();
        assert_eq!(item["token_ids"], ids["tokens"]);
    }
    // Refused as chat and completions refuse, naming the field.
    let r = post_json(
        addr,
        "/v1/chat/completions/render",
        &json!({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "temperature");
    let r = post_json(addr, "/v1/completions/render", &json!({"max_tokens": 3}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "prompt");
}

#[test]
fn load_reports_follow_the_metrics_keys_and_render_needs_an_api_key() {
    let key = "load-test-key";
    let server = Server::start(&["--draft-model", "none"], &[("TANDEM_API_KEY", key)]);
    let addr = server.addr.as_str();
    // Open, as /metrics is by default: a router polls without the clients' keys.
    assert_eq!(http::get(addr, "/get_load").status, 200);
    assert_eq!(http::get(addr, "/v1/loads").status, 200);
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post_json(addr, "/v1/chat/completions/render", &body).status,
        401
    );
    let r = http::request(
        addr,
        "POST",
        "/v1/chat/completions/render",
        &[
            ("Authorization", &format!("Bearer {key}")),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    drop(server);

    // With `metrics_require_key`, the load reports need a key too.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tandem.toml");
    std::fs::write(&config, "[server]\nmetrics_require_key = true\n").unwrap();
    let server = Server::start(
        &[
            "--draft-model",
            "none",
            "--config",
            config.to_str().unwrap(),
        ],
        &[("TANDEM_API_KEY", key)],
    );
    for path in ["/get_load", "/v1/loads", "/loads", "/metrics"] {
        assert_eq!(http::get(&server.addr, path).status, 401, "{path}");
    }
}
