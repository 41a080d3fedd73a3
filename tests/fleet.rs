//! A fleet on one machine: three `tandem serve` replicas on loopback ports behind a real load
//! balancer (HAProxy, Debian's package) that health-checks `/health`, all reading one config
//! file as a Kubernetes ConfigMap would give them.
//!
//! Under a bounded concurrent load it checks what running several replicas must keep: requests
//! spread over the replicas; one replica sent SIGTERM mid-load drains (its `/health` turns 503,
//! the balancer stops sending it work, its in-flight streams finish) and no request fails; a
//! lenience change in the shared file reaches every replica's gauge; every greedy answer
//! equals the single-process answer (`tandem generate`, plain decoding).

use crate::common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::{self, get, post_json, Server};
use serde_json::{json, Value};

const CONTEXT: &str = "512";
const MAX_TOKENS: usize = 40;
/// Seconds a replica keeps serving after SIGTERM while `/health` says "draining".
const DRAIN_SECONDS: u64 = 2;

const PROMPTS: [&str; 4] = [
    "The three primary colors are",
    "A short story about a lighthouse keeper begins:",
    "Here is a list of tips for learning a new language:\n1.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
];

fn config(lenience: &str) -> String {
    format!(
        "[server]\ndrain_seconds = {DRAIN_SECONDS}\nshutdown_grace_seconds = 60\n\n\
         [speculation]\nenabled = true\ndraft_model = \"prompt-lookup\"\nlenience = {lenience}\n"
    )
}

/// The single-process answer: `tandem generate`, plain greedy decoding of the raw prompt.
fn single_process_answer(prompt: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["generate", "--json", "--raw", "--threads", "2"])
        .args(["--context-length", CONTEXT, "--temperature", "0"])
        .args(["--max-tokens", &MAX_TOKENS.to_string(), "--prompt", prompt])
        .stderr(Stdio::null())
        .output()
        .expect("tandem generate runs");
    assert!(out.status.success(), "tandem generate failed");
    let v: Value = serde_json::from_slice(&out.stdout).expect("generate --json prints JSON");
    v["text"].as_str().expect("text").to_string()
}

/// HAProxy in the foreground on a free loopback port, health-checking every replica's
/// `/health` 5 times a second; connection failures are retried on another replica.
struct Balancer {
    addr: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Balancer {
    fn start(replicas: &[&str]) -> Balancer {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let servers: String = replicas
            .iter()
            .enumerate()
            .map(|(i, addr)| format!("  server r{i} {addr} check\n"))
            .collect();
        let cfg = format!(
            "global\n  maxconn 256\n\n\
             defaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  \
             timeout server 120s\n  retries 3\n  option redispatch 1\n  \
             retry-on conn-failure empty-response\n\n\
             frontend fleet\n  bind 127.0.0.1:{port}\n  default_backend tandem\n\n\
             backend tandem\n  balance roundrobin\n  option http-server-close\n  \
             option httpchk GET /health\n  http-check expect status 200\n  \
             default-server inter 200ms fall 1 rise 2\n{servers}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let haproxy = ["/usr/sbin/haproxy", "haproxy"]
            .into_iter()
            .find(|p| Command::new(p).arg("-v").output().is_ok())
            .expect("HAProxy is installed (scripts/test installs Debian's haproxy)");
        let check = Command::new(haproxy)
            .args(["-c", "-f", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "haproxy -c: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new(haproxy)
            .args(["-db", "-f", path.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy starts");
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while get_status(&addr, "/health") != Some(200) {
            assert!(Instant::now() < deadline, "HAProxy never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
        Balancer {
            addr,
            child,
            _dir: dir,
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of `GET path`, or `None` when nothing accepts the connection.
fn get_status(addr: &str, path: &str) -> Option<u16> {
    std::net::TcpStream::connect(addr).ok()?;
    Some(get(addr, path).status)
}

fn completion_body(prompt: &str, stream: bool) -> Value {
    json!({
        "model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS,
        "temperature": 0, "stream": stream,
    })
}

/// One completion through `addr`, streamed or not: its status and text. A stream counts only
/// when it ends with `[DONE]` after a finish reason.
fn complete(addr: &str, prompt: &str, stream: bool) -> (u16, String) {
    let r = post_json(addr, "/v1/completions", &completion_body(prompt, stream));
    if r.status != 200 {
        return (r.status, r.text());
    }
    if !stream {
        let v = r.json();
        return (200, v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let data = r.sse_data();
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "stream cut"
    );
    let mut text = String::new();
    let mut finished = false;
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        if let Some(c) = v["choices"].get(0) {
            text.push_str(c["text"].as_str().unwrap_or(""));
            finished |= c["finish_reason"].is_string();
        }
    }
    assert!(finished, "stream without a finish reason");
    (200, text)
}

fn requests_served(server: &Server) -> f64 {
    server
        .metric("tandem_requests_total", "")
        .unwrap_or_default()
}

/// `clients` threads each send `per_client` completions through the balancer, alternating
/// streamed and not, over the prompts; returns every (prompt index, status, text).
fn load(addr: &str, clients: usize, per_client: usize) -> Vec<(usize, u16, String)> {
    let results = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (addr, results) = (addr.to_string(), Arc::clone(&results));
            std::thread::spawn(move || {
                for i in 0..per_client {
                    let p = (c + i) % PROMPTS.len();
                    let (status, text) = complete(&addr, PROMPTS[p], (c + i) % 2 == 0);
                    results.lock().unwrap().push((p, status, text));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a load client panicked");
    }
    Arc::try_unwrap(results).unwrap().into_inner().unwrap()
}

fn assert_answers(results: &[(usize, u16, String)], answers: &[String]) {
    for (p, status, text) in results {
        assert_eq!(*status, 200, "a request failed: {text}");
        assert_eq!(
            text, &answers[*p],
            "prompt {p}: answer differs from the single process"
        );
    }
}

fn wait_for(what: &str, timeout: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn three_replicas_behind_haproxy_spread_drain_and_share_live_settings() {
    common::default_model();
    let answers: Vec<String> = PROMPTS.iter().map(|p| single_process_answer(p)).collect();

    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("tandem.toml");
    std::fs::write(&config_path, config("1.0")).unwrap();
    let path = config_path.to_str().unwrap();
    // One compute thread each: three replicas share this machine's cores.
    let mut replicas: Vec<Server> = (0..3)
        .map(|_| {
            Server::start_with_threads(1, &["--config", path, "--context-length", CONTEXT], &[])
        })
        .collect();
    let addrs: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
    let balancer = Balancer::start(&addrs.iter().map(String::as_str).collect::<Vec<_>>());

    // Spread, and the same answers as one process.
    let results = load(&balancer.addr, 3, 4);
    assert_eq!(results.len(), 12);
    assert_answers(&results, &answers);
    let served: Vec<f64> = replicas.iter().map(requests_served).collect();
    assert!(
        served.iter().all(|&n| n >= 1.0),
        "requests did not reach every replica: {served:?}"
    );
    assert_eq!(served.iter().sum::<f64>(), 12.0, "{served:?}");

    // A lenience change in the shared file reaches every replica, and so does putting it back.
    // (Values exact in binary: lenience is an f32.)
    for lenience in ["0.5", "1.0"] {
        std::fs::write(&config_path, config(lenience)).unwrap();
        let want: f64 = lenience.parse().unwrap();
        wait_for(
            &format!("lenience {lenience} on every replica"),
            Duration::from_secs(20),
            || {
                replicas
                    .iter()
                    .all(|r| r.metric("tandem_spec_lenience", "") == Some(want))
            },
        );
    }

    // SIGTERM to one replica while it streams and the fleet is under load.
    let leaving = replicas.remove(1);
    let mut stream = http::open_stream(
        &leaving.addr,
        "/v1/completions",
        &completion_body(PROMPTS[1], true),
    );
    assert_eq!(stream.status, 200);
    let first = stream.next_data().expect("the stream starts");
    assert!(first.starts_with('{'), "{first}");
    let load_thread = {
        let addr = balancer.addr.clone();
        std::thread::spawn(move || load(&addr, 3, 4))
    };
    std::thread::sleep(Duration::from_millis(300));
    leaving.signal("TERM");
    // Draining: still up, /health 503, so the balancer takes it out.
    wait_for("/health says draining", Duration::from_secs(5), || {
        get(&leaving.addr, "/health").status == 503
    });
    assert_eq!(get(&leaving.addr, "/health").json()["status"], "draining");
    // The stream it had open finishes whole.
    let mut text = String::new();
    let mut done = false;
    while let Some(d) = stream.next_data() {
        if d == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(&d).unwrap();
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
    }
    let first: Value = serde_json::from_str(&first).unwrap();
    let text = format!("{}{text}", first["choices"][0]["text"].as_str().unwrap());
    assert!(done, "the in-flight stream was cut by SIGTERM");
    assert_eq!(text, answers[1], "the drained stream's answer differs");
    assert!(
        leaving.wait_for_exit(Duration::from_secs(60)),
        "the replica did not exit cleanly after draining"
    );

    let results = load_thread.join().expect("load under SIGTERM");
    assert_eq!(results.len(), 12);
    assert_answers(&results, &answers);
    // New work after the drain goes to the two left.
    let before: Vec<f64> = replicas.iter().map(requests_served).collect();
    let results = load(&balancer.addr, 2, 2);
    assert_answers(&results, &answers);
    let after: Vec<f64> = replicas.iter().map(requests_served).collect();
    assert_eq!(
        after.iter().sum::<f64>() - before.iter().sum::<f64>(),
        4.0,
        "{before:?} -> {after:?}"
    );
    drop(balancer);
}
