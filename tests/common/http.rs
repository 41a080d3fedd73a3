//! A tiny blocking HTTP/1.1 client for the server tests, and a `tandem serve` process that the
//! tests start and stop.
//!
//! Why not reqwest: the tests need a few requests over loopback, raw control over the socket
//! (to disconnect mid-stream) and nothing else; hand-written, it adds no dependency to build on
//! 2 cores.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): status {} {}", self.status, self.text()))
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.trim_start().to_string())
            .collect()
    }
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s
}

fn write_request(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
}

fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').expect("header line");
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    (status, headers)
}

fn dechunk(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&rest[..nl]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size_text:?}"));
        rest = &rest[nl + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
    out
}

/// Sends one request and reads the whole response.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut s = connect(addr);
    write_request(&mut s, method, path, headers, body);
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let mut raw = Vec::new();
    r.read_to_end(&mut raw).unwrap();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked { dechunk(&raw) } else { raw };
    Response {
        status,
        headers,
        body,
    }
}

pub fn get(addr: &str, path: &str) -> Response {
    request(addr, "GET", path, &[], b"")
}

pub fn post_json(addr: &str, path: &str, body: &Value) -> Response {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

/// An open streaming response: the status is read, the body can be read line by line, and
/// dropping it closes the connection (a client going away).
pub struct OpenStream {
    pub status: u16,
    reader: BufReader<TcpStream>,
}

impl OpenStream {
    /// Reads raw body lines (chunk-size lines included) until one starts with `data:`.
    pub fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(d) = line.trim_end().strip_prefix("data:") {
                return Some(d.trim_start().to_string());
            }
        }
    }
}

pub fn open_stream(addr: &str, path: &str, body: &Value) -> OpenStream {
    let mut s = connect(addr);
    write_request(&mut s, "POST", path, &[], body.to_string().as_bytes());
    let mut reader = BufReader::new(s);
    let (status, _) = read_head(&mut reader);
    OpenStream { status, reader }
}

/// A `tandem serve` child process on a free loopback port; killed when dropped.
pub struct Server {
    pub addr: String,
    child: Child,
    log: mpsc::Receiver<String>,
}

impl Server {
    /// Starts `tandem serve --port 0 ARGS...` and waits until `/health` says ready.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_with_threads(2, args, env)
    }

    /// [`Server::start`] with `threads` compute threads.
    pub fn start_with_threads(threads: usize, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
        cmd.arg("serve")
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(["--threads", &threads.to_string()])
            .args(args)
            .env_remove("TANDEM_ADMIN_TOKEN")
            .env_remove("TANDEM_API_KEY")
            .env_remove("TANDEM_API_KEYS_FILE")
            // Each server measures its own prices and learns from no earlier test's drafts.
            .env("TANDEM_REMEMBER_PRICES", "false")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("tandem serve starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                if tx.send(line).is_err() {
                    // The test stopped listening; keep draining so the child never blocks.
                }
            }
        });
        let mut server = Server {
            addr: String::new(),
            child,
            log,
        };
        let line = server.wait_for_log("listening on http://", Duration::from_secs(60));
        let rest = line.split("http://").nth(1).unwrap();
        server.addr = rest.split_whitespace().next().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let r = get(&server.addr, "/health");
            if r.status == 200 {
                break;
            }
            assert_eq!(r.status, 503, "health while loading: {}", r.text());
            assert!(Instant::now() < deadline, "server never became ready");
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("server exited while loading: {status}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no server log line containing {needle:?} in {timeout:?}"),
            }
        }
    }

    /// Every stderr line received so far that no `wait_for_log` consumed.
    pub fn drain_log(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.log.try_recv().ok()).collect()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub fn terminate(self) -> bool {
        self.signal("TERM");
        self.wait_for_exit(Duration::from_secs(60))
    }

    /// Sends a signal by name (`HUP`, `TERM`) to the server process.
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Sends SIGTERM from another thread; the handle tells whether the process exited cleanly.
    pub fn terminate_in_background(self) -> std::thread::JoinHandle<bool> {
        std::thread::spawn(move || self.terminate())
    }

    /// Waits for the process to exit by itself; returns whether it exited cleanly.
    pub fn wait_for_exit(mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A metric's value from `/metrics` (the sum over label sets matching `labels`).
    pub fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        let text = get(&self.addr, "/metrics").text();
        metric_value(&text, name, labels)
    }
}

/// Sums the samples of `name` whose label set contains `labels` (e.g. `status="stop"`).
pub fn metric_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_part, value) = match rest.strip_prefix('{') {
            Some(r) => {
                let (l, v) = r.split_once('}').unwrap();
                (l, v)
            }
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        if !label_part.contains(labels) {
            continue;
        }
        let v: f64 = value.trim().parse().unwrap();
        *found.get_or_insert(0.0) += v;
    }
    found
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
