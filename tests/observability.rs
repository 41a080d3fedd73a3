//! The observability bundle against the real thing: a live `tandem serve` on the default model,
//! a real Prometheus (Debian's `prometheus` package, installed by `.ci/run`) scraping it while a
//! workload runs, then every dashboard query and every alert rule evaluated through Prometheus's
//! HTTP API. Also: `promtool` accepts the config and the rules (and the rules' unit tests), every
//! metric docs/operations.md's metrics table names is exported, and the speculation counters agree with the `usage`
//! figures the clients got.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::http::{self, get, post_json, Server};
use serde_json::{json, Value};

fn dashboards() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards")
}

/// Every metric docs/operations.md lists, plus the speedup estimate the alerts use.
const DESIGN_METRICS: &[&str] = &[
    "tandem_spec_decode_num_drafts_total",
    "tandem_spec_decode_num_draft_tokens_total",
    "tandem_spec_decode_num_accepted_tokens_total",
    "tandem_spec_decode_num_accepted_tokens_per_pos_total",
    "tandem_requests_total",
    "tandem_prompt_tokens_total",
    "tandem_generation_tokens_total",
    "tandem_request_acceptance_rate",
    "tandem_spec_decode_accepted_length",
    "tandem_draft_step_seconds",
    "tandem_verify_step_seconds",
    "tandem_round_seconds",
    "tandem_time_to_first_token_seconds",
    "tandem_inter_token_seconds",
    "tandem_request_duration_seconds",
    "tandem_prefill_seconds",
    "tandem_requests_running",
    "tandem_requests_waiting",
    "tandem_kv_cache_usage_ratio",
    "tandem_spec_lenience",
    "tandem_spec_gamma",
    "tandem_pipeline_overlap_ratio",
    "tandem_spec_speedup_estimate",
    "tandem_spec_drafting_net_seconds",
    "tandem_prefix_cache_lookups_total",
    "tandem_prefix_cache_hits_total",
    "tandem_prefix_cache_hit_tokens_total",
    "tandem_prefix_cache_evictions_total",
    "tandem_prefix_cache_runs",
    "tandem_prefix_cache_tokens",
    "tandem_prefix_cache_bytes",
    "tandem_prefix_cache_budget_bytes",
    "tandem_constrained_requests_total",
    "tandem_spec_forced_tokens_total",
    "tandem_constraint_mask_seconds",
];

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool is installed (Debian package `prometheus`; .ci/run installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A Prometheus process scraping one target every second; killed when dropped.
struct Prometheus {
    addr: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        // Our own scrape config and rules, pointed at the test's server and sped up.
        let config = std::fs::read_to_string(dashboards().join("prometheus.yml"))
            .unwrap()
            .replace("127.0.0.1:8080", target)
            .replace("scrape_interval: 5s", "scrape_interval: 1s")
            .replace("evaluation_interval: 5s", "evaluation_interval: 1s");
        assert!(
            config.contains(target),
            "the scrape config names 127.0.0.1:8080"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        std::fs::copy(
            dashboards().join("alerts.yml"),
            dir.path().join("alerts.yml"),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is installed (Debian package `prometheus`; .ci/run installs it)");
        let p = Prometheus {
            addr,
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(&p.addr).is_err()
            || get(&p.addr, "/-/ready").status != 200
        {
            assert!(Instant::now() < deadline, "prometheus never became ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn api(&self, path: &str) -> Value {
        let r = get(&self.addr, path);
        let v = r.json();
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", percent_encode(expr)));
        data["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the clients were told, summed.
#[derive(Default, Debug)]
struct Totals {
    requests: u64,
    prompt: u64,
    completion: u64,
    drafted: u64,
    accepted: u64,
    rounds: u64,
    /// Requests that drafted at all (each gives one acceptance-rate sample).
    speculative_requests: u64,
    /// Prompt tokens taken from the prefix cache.
    cached: u64,
    /// Drafts a constraint's grammar forced.
    forced: u64,
}

fn add_usage(t: &mut Totals, usage: &Value) {
    t.requests += 1;
    t.prompt += usage["prompt_tokens"].as_u64().unwrap();
    t.completion += usage["completion_tokens"].as_u64().unwrap();
    t.cached += usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let s = &usage["speculative"];
    t.drafted += s["draft_tokens"].as_u64().unwrap();
    t.accepted += s["accepted_tokens"].as_u64().unwrap();
    t.rounds += s["rounds"].as_u64().unwrap();
    t.forced += s["forced_tokens"].as_u64().unwrap();
    t.speculative_requests += u64::from(s["draft_tokens"].as_u64().unwrap() > 0);
}

/// Concurrent chat requests, some greedy, some sampled, one streamed with usage; adds what
/// the clients were told to `t`.
fn workload(addr: &str, t: &mut Totals) {
    let topics = [
        "the sea",
        "mountains",
        "a library",
        "rain",
        "a train journey",
        "bread",
    ];
    let handles: Vec<_> = topics
        .iter()
        .enumerate()
        .map(|(i, topic)| {
            let addr = addr.to_string();
            let mut body = json!({
                "messages": [{"role": "user", "content": format!("Write two sentences about {topic}.")}],
                "max_tokens": 40, "ignore_eos": true,
                "temperature": if i % 2 == 0 { 0.0 } else { 0.8 }, "seed": i,
                "stream": i == 3, "stream_options": {"include_usage": true},
                // The governor may well find this pair not worth speculating with on the
                // machine at hand; most requests draft a fixed γ so drafting metrics exist.
                "speculative": if i % 3 == 0 { json!({}) } else { json!({"gamma": 3}) },
            });
            if i == 4 {
                // A constrained request: its grammar's forced tokens are drafted.
                body["ignore_eos"] = json!(false);
                body["response_format"] = json!({"type": "json_schema", "json_schema": {
                    "name": "topic", "schema": {"type": "object", "required": ["topic", "mood"],
                    "properties": {"topic": {"type": "string", "maxLength": 20},
                                   "mood": {"enum": ["calm", "busy"]}}}}});
            }
            std::thread::spawn(move || {
                let r = post_json(&addr, "/v1/chat/completions", &body);
                assert_eq!(r.status, 200, "{}", r.text());
                if i == 3 {
                    let data = r.sse_data();
                    let usage = data
                        .iter()
                        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
                        .expect("the stream's usage chunk");
                    usage
                } else {
                    r.json()["usage"].clone()
                }
            })
        })
        .collect();
    for h in handles {
        add_usage(t, &h.join().unwrap());
    }
}

fn metric(text: &str, name: &str) -> f64 {
    http::metric_value(text, name, "").unwrap_or_else(|| panic!("{name} is not in /metrics"))
}

#[test]
fn prometheus_scrapes_tandem_and_every_dashboard_query_and_alert_evaluates() {
    let dir = dashboards();
    promtool(&[
        "check",
        "config",
        dir.join("prometheus.yml").to_str().unwrap(),
    ]);
    promtool(&["check", "rules", dir.join("alerts.yml").to_str().unwrap()]);
    promtool(&[
        "test",
        "rules",
        dir.join("alerts.test.yml").to_str().unwrap(),
    ]);

    // A draft model (so both KV caches and the drafter's step times exist) with pipelining on.
    let server = Server::start(
        &[
            "--context-length",
            "512",
            "--draft-model",
            "default",
            "--draft-weights-dtype",
            "q4_0",
            "--pipeline",
            "true",
            "--max-seqs",
            "4",
        ],
        &[],
    );
    let prom = Prometheus::start(&server.addr);
    // Wait for the first scrape so the counters' starting points are recorded.
    let deadline = Instant::now() + Duration::from_secs(60);
    while prom.query("up{job=\"tandem\"} == 1").is_empty() {
        assert!(Instant::now() < deadline, "prometheus never scraped tandem");
        std::thread::sleep(Duration::from_millis(200));
    }

    let mut totals = Totals::default();
    workload(&server.addr, &mut totals);
    // One more round of load, so rates have two points with activity between them.
    workload(&server.addr, &mut totals);
    assert!(totals.drafted > 0, "the workload speculated: {totals:?}");
    assert!(
        totals.forced > 0,
        "the constrained request drafted forced tokens: {totals:?}"
    );

    // The counters agree with what the clients were told.
    let text = get(&server.addr, "/metrics").text();
    // (The per-position counts add up to the accepted total.)
    for (name, want) in [
        (
            "tandem_spec_decode_num_accepted_tokens_total",
            totals.accepted,
        ),
        ("tandem_spec_decode_num_draft_tokens_total", totals.drafted),
        ("tandem_spec_decode_num_drafts_total", totals.rounds),
        ("tandem_spec_forced_tokens_total", totals.forced),
        (
            "tandem_spec_decode_num_accepted_tokens_per_pos_total",
            totals.accepted,
        ),
        ("tandem_generation_tokens_total", totals.completion),
        ("tandem_prompt_tokens_total", totals.prompt),
        ("tandem_requests_total", totals.requests),
    ] {
        assert_eq!(metric(&text, name), want as f64, "{name}");
    }
    // Every request looked for a cached prefix; the hits add up to what the clients were told.
    let target = "model=\"target\"";
    for (name, want) in [
        ("tandem_prefix_cache_lookups_total", totals.requests),
        ("tandem_prefix_cache_hit_tokens_total", totals.cached),
    ] {
        assert_eq!(
            http::metric_value(&text, name, target),
            Some(want as f64),
            "{name}"
        );
    }
    assert!(
        totals.cached > 0,
        "the chats share their template's opening"
    );
    assert_eq!(
        http::metric_value(&text, "tandem_request_acceptance_rate_count", "").unwrap(),
        totals.speculative_requests as f64,
        "one acceptance sample per finished speculative request"
    );
    for name in DESIGN_METRICS {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# TYPE {name} "))),
            "{name} is missing from /metrics"
        );
    }
    for model in ["target", "draft"] {
        assert!(
            http::metric_value(
                &text,
                "tandem_kv_cache_usage_ratio",
                &format!("model=\"{model}\"")
            )
            .is_some(),
            "kv usage for {model}"
        );
    }

    // Prometheus has scraped the final values.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = prom.query("sum(tandem_generation_tokens_total)");
        let v: Option<f64> = r
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|s| s.parse().ok());
        if v == Some(totals.completion as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never saw the final counters ({v:?})"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // Every dashboard query returns data; every metric it names exists.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tandem.json")).unwrap())
            .expect("the dashboard is JSON");
    let exported: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    // Importable with a data-source picker: one Prometheus input, which the data-source
    // variable starts at, and every panel reads that variable.
    assert_eq!(
        dashboard["__inputs"][0]["pluginId"], "prometheus",
        "{}",
        dashboard["__inputs"]
    );
    let input = format!(
        "${{{}}}",
        dashboard["__inputs"][0]["name"].as_str().unwrap()
    );
    let variable = &dashboard["templating"]["list"][0];
    assert_eq!(variable["type"], "datasource");
    assert_eq!(variable["current"]["value"], input.as_str());
    let uses = format!("${{{}}}", variable["name"].as_str().unwrap());
    let ids: BTreeSet<u64> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids.len(),
        dashboard["panels"].as_array().unwrap().len(),
        "panel ids are unique"
    );
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"],
                uses.as_str(),
                "panel {:?} reads another data source",
                panel["title"]
            );
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a PromQL expr");
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("tandem_"))
            {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|b| exported.contains(b))
                    .unwrap_or(name);
                assert!(
                    exported.contains(base),
                    "panel {:?} uses {name}, which tandem does not export",
                    panel["title"]
                );
            }
            let expr = expr.replace("$__rate_interval", "5m");
            assert!(
                !expr.contains('$'),
                "only $__rate_interval is substituted: {expr}"
            );
            let result = prom.query(&expr);
            assert!(
                !result.is_empty(),
                "panel {:?}: `{expr}` returned no data",
                panel["title"]
            );
            queries += 1;
        }
    }
    assert!(
        queries >= 20,
        "the dashboard has its panels ({queries} queries)"
    );

    // Every alert rule is loaded and evaluates without error, and its expression, run through
    // the query API, gives what the rule's state says: series exactly when it is pending or
    // firing. Rules are read once an evaluation newer than the first look has happened, so
    // they saw the final counters (checked above).
    let rules = |groups: &Value| -> Vec<Value> {
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect()
    };
    let evaluated_at = |r: &Value| r["lastEvaluation"].as_str().unwrap_or("").to_string();
    let first_look: BTreeMap<String, String> = rules(&prom.api("/api/v1/rules"))
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), evaluated_at(r)))
        .collect();
    assert!(first_look.len() >= 5, "{first_look:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let rules = loop {
        let groups = prom.api("/api/v1/rules");
        let rules = rules(&groups);
        let fresh = rules.iter().all(|r| {
            let at = evaluated_at(r);
            !at.starts_with("0001") && first_look.get(r["name"].as_str().unwrap()) != Some(&at)
        });
        if fresh {
            break rules;
        }
        assert!(
            Instant::now() < deadline,
            "the rules were never evaluated again: {groups}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(rules.len(), first_look.len());
    let acceptance = totals.accepted as f64 / totals.drafted as f64;
    for r in &rules {
        let name = r["name"].as_str().unwrap();
        assert_eq!(r["health"], "ok", "rule {name} failed: {}", r["lastError"]);
        assert!(
            r["lastError"].as_str().unwrap_or("").is_empty(),
            "rule {name}: {}",
            r["lastError"]
        );
        let query = r["query"].as_str().unwrap();
        let result = prom.query(query);
        let state = r["state"].as_str().unwrap();
        let alerts = r["alerts"].as_array().map_or(0, Vec::len);
        assert_eq!(
            state != "inactive",
            !result.is_empty(),
            "rule {name} is {state}, its query returned {result:?}"
        );
        assert_eq!(alerts, result.len(), "rule {name} ({state}): {r}");
        for series in &result {
            assert_eq!(series["metric"]["job"], "tandem", "rule {name}: {series}");
        }
        // The rules whose conditions the workload decides, and their thresholds turned round
        // so that each shows it measures what it names.
        match name {
            "TandemDown" => {
                assert_eq!(state, "inactive", "tandem is up");
                assert!(query.contains("== 0"), "{query}");
                assert_eq!(
                    prom.query(&query.replace("== 0", "== 1")).len(),
                    1,
                    "{query}"
                );
            }
            "TandemQueueGrowing" => assert_eq!(state, "inactive", "nothing waits now"),
            "TandemAcceptanceCollapse" => {
                assert_eq!(
                    state == "inactive",
                    acceptance >= 0.2,
                    "the clients saw acceptance {acceptance}"
                );
                // Without the threshold the left side is the acceptance rate the clients saw:
                // the two counters' rates over one window that holds the whole workload.
                // rate() extrapolates each series towards the window's ends by its own first
                // and last samples, so the two rates' ratio differs from the clients' by up to
                // a few tenths of a percent (0.17% seen); 2% still tells this ratio from any
                // other (rejected over drafted would be ~0.59 here).
                assert!(query.contains("< 0.2"), "{query}");
                let rate = prom.query(&query.replace("< 0.2", ">= 0"));
                assert_eq!(rate.len(), 1, "{rate:?}");
                let got: f64 = rate[0]["value"][1].as_str().unwrap().parse().unwrap();
                assert!(
                    (got - acceptance).abs() <= 0.02 * acceptance,
                    "the rule's acceptance rate {got} vs the clients' {acceptance}"
                );
            }
            _ => {}
        }
    }
}
