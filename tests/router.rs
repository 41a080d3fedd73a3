//! Two replicas behind a real router: smg (the Shepherd Model Gateway, pinned, installed by
//! `scripts/test` under `target/router-libs`) with its `cache_aware` policy. smg registers
//! tandem as a generic OpenAI-compatible engine and reads its load from `/loads`; this checks
//! that it does, that answers through it are the replicas' own, and that a replica killed
//! mid-run costs no request and leaves the router's load view.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::http::{self, post_json, Server};

/// The router process; killed when dropped.
struct Router {
    addr: String,
    child: Child,
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two loopback ports free now (both held until both are known, so they differ).
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = |l: &TcpListener| l.local_addr().unwrap().port();
    (port(&a), port(&b))
}

fn start_router(workers: &[&str], log: &std::path::Path) -> Router {
    let root = env!("CARGO_MANIFEST_DIR");
    let (port, metrics_port) = free_ports();
    let urls: Vec<String> = workers.iter().map(|w| format!("http://{w}")).collect();
    let child = Command::new("python3")
        .args(["-m", "smg.cli", "launch", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string(), "--policy", "cache_aware"])
        // Its own metrics server would take 0.0.0.0:29000, whoever else holds it.
        .args(["--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &metrics_port.to_string()])
        .args([
            "--load-monitor-interval",
            "1",
            "--health-check-interval-secs",
            "1",
        ])
        .args(["--health-failure-threshold", "1", "--log-level", "info"])
        .arg("--worker-urls")
        .args(&urls)
        .env("PYTHONPATH", format!("{root}/target/router-libs"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .expect("python3 -m smg.cli starts");
    Router {
        addr: format!("127.0.0.1:{port}"),
        child,
    }
}

/// Polls until `ok` holds, or fails naming `what` with the router's log.
fn wait_for(what: &str, log: &std::path::Path, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !ok() {
        if Instant::now() > deadline {
            let out = std::fs::read_to_string(log).unwrap_or_default();
            let err = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
            panic!("{what} within 90 s; smg said:\n{out}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The workers whose load the router holds, from its own `/get_loads`.
fn loaded_workers(router: &str) -> Vec<String> {
    // Not listening yet while smg starts.
    if std::net::TcpStream::connect(router).is_err() {
        return Vec::new();
    }
    let r = http::get(router, "/get_loads");
    if r.status != 200 {
        return Vec::new();
    }
    let v = r.json();
    let mut workers: Vec<String> = v["loads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|rank| rank["max_running_requests"] == 8)
        .filter_map(|rank| rank["worker"].as_str().map(str::to_string))
        .collect();
    workers.sort();
    workers
}

fn chat(model: &str, turns: &[(&str, &str)], question: &str) -> Value {
    let mut messages: Vec<Value> = turns
        .iter()
        .flat_map(|(q, a)| {
            [
                json!({"role": "user", "content": q}),
                json!({"role": "assistant", "content": a}),
            ]
        })
        .collect();
    messages.push(json!({"role": "user", "content": question}));
    json!({"model": model, "messages": messages, "max_tokens": 12, "temperature": 0})
}

fn answer(addr: &str, body: &Value) -> String {
    let r = post_json(addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn smg_reads_the_replicas_load_routes_their_answers_and_drops_a_dead_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("smg.log");
    let r0 = Server::start_with_threads(1, &["--draft-model", "prompt-lookup"], &[]);
    let r1 = Server::start_with_threads(1, &["--draft-model", "prompt-lookup"], &[]);
    let router = start_router(&[&r0.addr, &r1.addr], &log);
    // smg routes by the model a request names, as the replicas list it.
    let model = http::get(&r0.addr, "/v1/models").json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut expected = vec![format!("http://{}", r0.addr), format!("http://{}", r1.addr)];
    expected.sort();

    // smg reads both replicas' load reports.
    wait_for("the router's load view holding both replicas", &log, || {
        loaded_workers(&router.addr) == expected
    });

    // Conversations through the router get the replicas' own answers (greedy, the same on
    // either replica), turn after turn.
    let questions = [
        "Name a fruit.",
        "Name a river.",
        "Name a planet.",
        "Name a tree.",
    ];
    let mut history: Vec<Vec<(String, String)>> = vec![Vec::new(); questions.len()];
    for turn in 0..2 {
        for (i, q) in questions.iter().enumerate() {
            let question = if turn == 0 { q } else { &"And another?" };
            let turns: Vec<(&str, &str)> = history[i]
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            let body = chat(&model, &turns, question);
            let through = answer(&router.addr, &body);
            assert_eq!(
                through,
                answer(&r0.addr, &body),
                "conversation {i}, turn {turn}"
            );
            history[i].push((question.to_string(), through));
        }
    }

    // A replica killed mid-run: requests keep succeeding, and the router's load view drops it.
    let survivor = format!("http://{}", r0.addr);
    drop(r1);
    for (i, q) in questions.iter().enumerate() {
        let body = chat(&model, &[], q);
        assert_eq!(
            answer(&router.addr, &body),
            answer(&r0.addr, &body),
            "after the kill, {i}"
        );
    }
    wait_for("the router dropping the dead replica's load", &log, || {
        loaded_workers(&router.addr) == [survivor.clone()]
    });
}
