//! Three replicas behind a real router: smg (the Shepherd Model Gateway, pinned, installed by
//! `scripts/test` under `target/router-libs`). smg registers tandem as a generic
//! OpenAI-compatible engine and reads its load from `/loads`; this checks that it does, that
//! answers through it are the replicas' own, that its `cache_aware` policy keeps the fleet's
//! prefix-cache hit rate on interleaved multi-turn conversations within 5% of one replica's
//! (round robin measured beside it), and that a replica killed mid-run costs no request and
//! leaves the router's load view. The figures are printed (`-- --nocapture`);
//! `TANDEM_FLEET_CONVERSATIONS` sets the workload's size (default 24) and
//! `TANDEM_FLEET_ROUND_ROBIN` round robin's (default a third of it).

#[path = "router/fleet_workload.rs"]
mod fleet_workload;

use crate::common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::http::{self, post_json, Server};
use fleet_workload::{hit_tokens, Workload};

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

fn start_router(workers: &[&str], policy: &str, log: &std::path::Path) -> Router {
    let root = env!("CARGO_MANIFEST_DIR");
    let (port, metrics_port) = free_ports();
    let urls: Vec<String> = workers.iter().map(|w| format!("http://{w}")).collect();
    let child = Command::new("python3")
        .args(["-m", "smg.cli", "launch", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string(), "--policy", policy])
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

fn chat(model: &str, question: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 12,
        "temperature": 0,
    })
}

fn answer(addr: &str, body: &Value) -> String {
    let r = post_json(addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn env_count(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The fleet's token hit rate over a workload run: prefix-cache hits over prompt tokens looked
/// up, summed over the replicas, between two readings of their counters.
fn hit_rate(before: &[(f64, f64)], after: &[(f64, f64)]) -> f64 {
    let (mut queried, mut hit) = (0.0, 0.0);
    for ((q0, h0), (q1, h1)) in before.iter().zip(after) {
        queried += q1 - q0;
        hit += h1 - h0;
    }
    hit / queried.max(1.0)
}

#[test]
fn smg_keeps_the_fleets_hit_rate_routes_the_replicas_answers_and_drops_a_dead_one() {
    let dir = tempfile::tempdir().unwrap();
    let conversations = env_count("TANDEM_FLEET_CONVERSATIONS").unwrap_or(12);
    let replicas: Vec<Server> = (0..3)
        .map(|_| Server::start_with_threads(1, &["--draft-model", "prompt-lookup"], &[]))
        .collect();
    let addrs: Vec<&str> = replicas.iter().map(|r| r.addr.as_str()).collect();
    let log = dir.path().join("smg.log");
    let router = start_router(&addrs, "cache_aware", &log);
    let rr_log = dir.path().join("smg-rr.log");
    let round_robin = start_router(&addrs, "round_robin", &rr_log);
    // smg routes by the model a request names, as the replicas list it.
    let model = http::get(addrs[0], "/v1/models").json()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut expected: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    expected.sort();

    // smg reads every replica's load report.
    wait_for("the router's load view holding every replica", &log, || {
        loaded_workers(&router.addr) == expected
    });
    // Answers through it are the replicas' own (greedy, the same on any replica).
    for q in ["Name a fruit.", "Name a river.", "Name a planet."] {
        let body = chat(&model, q);
        assert_eq!(answer(&router.addr, &body), answer(addrs[0], &body), "{q}");
    }

    // The interleaved multi-turn workload, new conversations each time: on one replica, then
    // through the router's cache_aware policy, then through round robin.
    let counters = || -> Vec<(f64, f64)> { replicas.iter().map(hit_tokens).collect() };
    let mut rates = Vec::new();
    for (i, (name, addr)) in [
        ("one replica", addrs[0]),
        ("cache_aware", router.addr.as_str()),
        ("round_robin", round_robin.addr.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        // Round robin's misses prefill whole conversations: a third of them shows the contrast.
        let n = if name == "round_robin" {
            env_count("TANDEM_FLEET_ROUND_ROBIN").unwrap_or((conversations / 3).max(3))
        } else {
            conversations
        };
        let before = counters();
        let started = std::time::Instant::now();
        let ttft = Workload::new(i * conversations, n).run(addr, &model, 3);
        let rate = hit_rate(&before, &counters());
        eprintln!(
            "fleet workload: {name:>12}: token hit rate {rate:.3}, follow-up time to first token \
             median {:.0} ms, p90 {:.0} ms ({n} conversations, {:.0} s)",
            ttft.median * 1e3,
            ttft.p90 * 1e3,
            started.elapsed().as_secs_f64()
        );
        rates.push(rate);
    }
    for r in &replicas {
        let used = r.metric("tandem_prefix_cache_bytes", "model=\"target\"");
        let budget = r.metric("tandem_prefix_cache_budget_bytes", "model=\"target\"");
        eprintln!("fleet workload: prefix cache {used:?} bytes of a {budget:?} budget");
        assert!(used.unwrap() <= budget.unwrap());
    }
    let (one, cache_aware, rr) = (rates[0], rates[1], rates[2]);
    assert!(
        one >= 0.6,
        "one replica keeps its conversations cached: {one:.3}"
    );
    assert!(
        cache_aware >= one * 0.95,
        "cache_aware {cache_aware:.3} against one replica's {one:.3}"
    );
    assert!(
        rr < cache_aware,
        "round robin {rr:.3} against cache_aware {cache_aware:.3}"
    );

    // A replica killed mid-run: requests keep succeeding, and the router's load view drops it.
    let mut replicas = replicas;
    let dead = replicas.pop().unwrap();
    let survivors: Vec<String> = {
        let mut s: Vec<String> = replicas
            .iter()
            .map(|r| format!("http://{}", r.addr))
            .collect();
        s.sort();
        s
    };
    drop(dead);
    for q in [
        "Name a tree.",
        "Name a bird.",
        "Name a city.",
        "Name a color.",
    ] {
        let body = chat(&model, q);
        assert_eq!(
            answer(&router.addr, &body),
            answer(&replicas[0].addr, &body),
            "after the kill: {q}"
        );
    }
    wait_for("the router dropping the dead replica's load", &log, || {
        loaded_workers(&router.addr) == survivors
    });
}
