//! `tandem bench` end to end on the default model: a short run over every Spec-Bench dev
//! category (2 prompts each, 16 tokens, both turns of the MT-bench questions) completes, writes
//! valid JSON and an SVG chart, and every greedy speculative mode matches plain decoding token
//! for token (by the output digests recorded for both). The summary is recomputed from the raw
//! figures beside it. Malformed prompt files stop it with the line named. `tandem forward-bench`
//! prints its cost table and the memory-bandwidth bound, of one sequence or a batch.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn spec_bench_dev() -> std::path::PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/spec_bench_dev.jsonl");
    assert!(
        p.is_file(),
        "Spec-Bench dev prompts missing at {}",
        p.display()
    );
    p
}

/// A `tandem bench` command on the development prompts (the default model must be there), and
/// a folder for its results.
fn bench_on_dev() -> (tempfile::TempDir, Command) {
    common::default_model();
    let mut c = common::tandem_command();
    c.arg("bench").arg("--prompts").arg(spec_bench_dev());
    (tempfile::tempdir().unwrap(), c)
}

#[test]
fn short_bench_run_writes_json_and_svg_and_greedy_outputs_match() {
    common::default_model();
    let dir = tempfile::tempdir().unwrap();
    let (out, chart) = (dir.path().join("r.json"), dir.path().join("s.svg"));
    let run = common::tandem_command()
        .arg("bench")
        .arg("--prompts")
        .arg(spec_bench_dev())
        .args([
            "--limit-per-category",
            "1",
            "--max-tokens",
            "16",
            "--warmup",
            "0",
        ])
        // The same weights drafting for themselves (the default target keeps the file's
        // weights as they are): a draft model that always agrees.
        .args([
            "--modes",
            "plain,pld:gamma=2,draft:gamma=3",
            "--draft-weights-dtype",
            "as-is",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--chart")
        .arg(&chart)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stdout.contains("### overall") && stdout.contains("| pld:gamma=2 |"),
        "{stdout}"
    );
    // Under the tables, each mode's drafter in words.
    for line in [
        "- plain: none (plain decoding, the baseline)",
        "- pld:gamma=2: prompt lookup in the request's own text, n-grams of 1-3 tokens",
        "- draft:gamma=3: the draft model default",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
    assert!(!stdout.contains("never drafted"), "{stdout}");
    assert!(
        stderr.contains("13/13") || stderr.contains("39/39"),
        "progress: {stderr}"
    );

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let categories = v["categories"].as_array().unwrap();
    assert_eq!(categories.len(), 13, "{:?}", v["categories"]);
    let runs = v["runs"].as_array().unwrap();
    // 8 MT-bench categories × 2 turns + 5 single-turn categories, one question each, per mode.
    assert_eq!(runs.len(), 3 * (8 * 2 + 5));
    let u = |r: &Value, key: &str| r[key].as_u64().unwrap_or_else(|| panic!("{key} in {r}"));
    let f = |r: &Value, key: &str| r[key].as_f64().unwrap_or_else(|| panic!("{key} in {r}"));
    let plain_run = |r: &Value| {
        runs.iter()
            .find(|p| {
                p["mode"] == "plain"
                    && p["question_id"] == r["question_id"]
                    && p["repeat"] == r["repeat"]
                    && p["turn"] == r["turn"]
            })
            .unwrap_or_else(|| panic!("no plain run beside {r}"))
    };
    for r in runs {
        let tokens = u(r, "completion_tokens");
        assert!((1..=16).contains(&tokens), "{r}");
        // A run ends at the token limit it was given, or earlier on an end token.
        match r["finish"].as_str() {
            Some("length") => assert_eq!(tokens, 16, "{r}"),
            Some("stop") => {}
            other => panic!("finish {other:?}: {r}"),
        }
        let (drafted, accepted, rounds) = (
            u(r, "draft_tokens"),
            u(r, "accepted_tokens"),
            u(r, "rounds"),
        );
        assert!(accepted <= drafted, "{r}");
        // Only rounds that drafted count, each with 1..=γ drafts. The first token comes from
        // the prompt and every round after it emits its accepted drafts plus one token, so
        // a run that reached its limit has more tokens than accepted drafts and rounds.
        let gamma = match r["mode"].as_str().unwrap() {
            "plain" => 0,
            "pld:gamma=2" => 2,
            "draft:gamma=3" => 3,
            other => panic!("unexpected mode {other}"),
        };
        assert!(rounds <= drafted && drafted <= gamma * rounds, "{r}");
        if r["finish"] == "length" {
            assert!(accepted + rounds < tokens, "{r}");
        }
        if r["mode"] == "plain" {
            assert!(r["outputs_match"].is_null(), "{r}");
            continue;
        }
        // Greedy speculative output is plain output: the digests recorded for both, the
        // token counts and the finish reasons agree, and so does the bench's own verdict.
        let plain = plain_run(r);
        assert_eq!(r["output_digest"], plain["output_digest"], "{r} vs {plain}");
        assert_eq!(r["completion_tokens"], plain["completion_tokens"], "{r}");
        assert_eq!(r["finish"], plain["finish"], "{r}");
        assert_eq!(
            r["outputs_match"], true,
            "greedy speculative output differs: {r}"
        );
        // The drafter at the target's own weights drafts at a fixed γ whenever it runs, so a
        // run that reached its 16 tokens drafted.
        if r["mode"] == "draft:gamma=3" && tokens == 16 {
            assert!(drafted > 0, "γ = 3 drafts: {r}");
        }
    }
    let digests: BTreeSet<&str> = runs
        .iter()
        .map(|r| r["output_digest"].as_str().unwrap())
        .collect();
    assert!(
        digests.len() > 15,
        "the digests tell outputs apart: {digests:?}"
    );
    assert!(
        runs.iter()
            .any(|r| r["turn"] == 1 && r["category"] == "writing"),
        "second turns ran"
    );

    // The summary is recomputed from the raw figures beside it: requests, tokens and drafting
    // from `runs`; throughput from `batches` (one repeat, so each spread is one value); the
    // speedup is the ratio of a mode's throughput to plain decoding's.
    let batches = v["batches"].as_array().unwrap();
    let summary = v["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 3 * 14, "3 modes × (13 categories + overall)");
    let in_scope = |row: &Value, r: &Value| {
        r["mode"] == row["mode"]
            && (row["category"] == "overall" || r["category"] == row["category"])
    };
    let throughput = |row: &Value, mode: &str| {
        let (tokens, seconds) = batches
            .iter()
            .filter(|b| {
                b["mode"] == mode
                    && (row["category"] == "overall" || b["category"] == row["category"])
            })
            .fold((0u64, 0f64), |(t, s), b| {
                (t + u(b, "tokens"), s + f(b, "seconds"))
            });
        tokens as f64 / seconds
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    for row in summary {
        let mine: Vec<&Value> = runs.iter().filter(|r| in_scope(row, r)).collect();
        assert_eq!(u(row, "requests"), mine.len() as u64, "{row}");
        let tokens: u64 = mine.iter().map(|r| u(r, "completion_tokens")).sum();
        assert_eq!(u(row, "tokens"), tokens, "{row}");
        let batch_tokens: u64 = batches
            .iter()
            .filter(|b| in_scope(row, b))
            .map(|b| u(b, "tokens"))
            .sum();
        assert_eq!(
            batch_tokens, tokens,
            "the batches hold the runs' tokens: {row}"
        );
        let mode = row["mode"].as_str().unwrap();
        let rate = throughput(row, mode);
        let spread = &row["tokens_per_s"];
        for key in ["median", "min", "max"] {
            assert!(close(f(spread, key), rate), "{key} of {row} vs {rate}");
        }
        let drafted: u64 = mine.iter().map(|r| u(r, "draft_tokens")).sum();
        let accepted: u64 = mine.iter().map(|r| u(r, "accepted_tokens")).sum();
        if drafted > 0 {
            assert!(
                close(f(row, "acceptance_rate"), accepted as f64 / drafted as f64),
                "{row}"
            );
        } else {
            assert!(row["acceptance_rate"].is_null(), "{row}");
        }
        if mode == "plain" {
            assert!(
                row["speedup"].is_null() && row["outputs_match"].is_null(),
                "{row}"
            );
            continue;
        }
        let speedup = f(&row["speedup"], "median");
        let ratio = rate / throughput(row, "plain");
        assert!(close(speedup, ratio), "speedup {speedup} vs {ratio}: {row}");
        assert_eq!(row["outputs_match"], true, "{row}");
    }
    let draft_overall = summary
        .iter()
        .find(|r| r["mode"] == "draft:gamma=3" && r["category"] == "overall")
        .unwrap();
    assert!(
        draft_overall["acceptance_rate"].as_f64().unwrap() > 0.9,
        "a self-drafter at the same weights agrees: {draft_overall}"
    );
    assert!(v["machine"]["cpu"].is_string() && v["settings"]["max_tokens"] == 16);
    let engines = v["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 3, "one engine per drafter: {engines:?}");
    for e in engines {
        assert!(e["rounds"].as_u64().unwrap() > 0, "{e}");
        let overlap = e["overlap_ratio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&overlap), "{e}");
    }

    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains(">summarization<") && svg.contains(">overall<"));
    assert_eq!(
        svg.matches("<title>").count(),
        2 * 14,
        "a bar per speculative mode and group"
    );
}

/// The default model's shipped head (`--draft-model head`, `heads/` in the repository) drafts
/// for it: on development questions its training left out, greedy output is plain output and
/// a fair share of its drafts is accepted (a third on this run; a head that lost its training,
/// or whose features or ranking no longer fit the model, accepts next to none).
#[test]
fn the_shipped_head_drafts_for_the_default_model() {
    let (dir, mut bench) = bench_on_dev();
    let out = dir.path().join("r.json");
    let run = bench
        .args(["--left-out", "5", "--limit-per-category", "1"])
        // One draft a round: how often the head's next token is the target's (the governor
        // would decode plainly wherever the head does badly, leaving few drafts to count).
        .args([
            "--max-tokens",
            "48",
            "--warmup",
            "0",
            "--modes",
            "plain,head:gamma=1",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let heads: Vec<&Value> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["mode"] == "head:gamma=1")
        .collect();
    assert!(heads.len() >= 5, "{heads:?}");
    let (mut drafted, mut accepted) = (0, 0);
    for r in &heads {
        assert_eq!(r["outputs_match"], true, "greedy output with the head: {r}");
        drafted += r["draft_tokens"].as_u64().unwrap();
        accepted += r["accepted_tokens"].as_u64().unwrap();
    }
    let rate = accepted as f64 / drafted.max(1) as f64;
    assert!(
        drafted > 0 && rate > 0.2,
        "the shipped head accepted {accepted} of {drafted} drafts"
    );
}

#[test]
fn malformed_prompt_files_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "bad.jsonl",
            "{\"question_id\": 1, \"category\": \"qa\", \"turns\": [\"hi\"]}\n{nope\n",
            "bad.jsonl:2",
        ),
        (
            "missing.jsonl",
            "{\"question_id\": 1, \"turns\": [\"hi\"]}\n",
            "missing.jsonl:1",
        ),
        ("empty.jsonl", "", "no prompts"),
    ];
    for (name, text, needle) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = common::tandem_command()
            .arg("bench")
            .arg("--prompts")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{name}: {stderr}");
    }
    let out = common::tandem_command()
        .arg("bench")
        .arg("--prompts")
        .arg(spec_bench_dev())
        .args(["--modes", "plain,eagle"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode `eagle`"));
}

/// `forward-bench` prints one row per width, the marginal cost of each extra token from the
/// second row on, and the first forward against the memory bound, whose bytes are the weights
/// (the default model: about 96 MB in its types) plus the cache.
#[test]
fn forward_bench_prints_costs_marginal_tokens_and_the_memory_bound() {
    common::default_model();
    let out = common::tandem_command()
        .args([
            "forward-bench",
            "--tokens",
            "1,2,4",
            "--depth",
            "16",
            "--repeats",
            "2",
        ])
        .output()
        .expect("tandem forward-bench runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with("| ") && l.chars().nth(2).is_some_and(|c| c.is_ascii_digit()))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert_eq!(rows[0][4], "–", "{text}");
    for row in &rows[1..] {
        let extra: f64 = row[4].parse().unwrap_or_else(|_| panic!("{text}"));
        assert!(extra.is_finite(), "{text}");
    }
    let bound = text
        .lines()
        .find(|l| l.starts_with("memory bound: a 1-token forward reads"))
        .unwrap_or_else(|| panic!("no memory-bound line: {text}"));
    let weights_mb: f64 = bound
        .split("(weights ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{bound}"));
    assert!((80.0..120.0).contains(&weights_mb), "{bound}");
    assert!(
        bound.contains("GB/s") && bound.ends_with("% of that bound"),
        "{bound}"
    );
}

/// `--sequences N` times forwards of N sequences, each with its own cache at the depth: the
/// bound counts N caches beside the weights read once; 0 sequences is refused naming the
/// flag, and caches past the memory available before any is filled (Gemma-3-270M's 256 f32
/// caches at depth 32760 would take 309 GB).
#[test]
fn forward_bench_times_a_batch_of_sequences() {
    common::default_model();
    let run = |sequences: &str| {
        common::tandem_command()
            .args(["forward-bench", "--tokens", "1,2", "--depth", "200"])
            .args(["--repeats", "2", "--sequences", sequences])
            .output()
            .expect("tandem forward-bench runs")
    };
    let bound = |sequences: &str| -> (String, f64, f64) {
        let out = run(sequences);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let line = text
            .lines()
            .find(|l| l.starts_with("memory bound:"))
            .unwrap_or_else(|| panic!("no memory-bound line: {text}"))
            .to_string();
        let number = |after: &str| -> f64 {
            line.split(after)
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{line}"))
        };
        let (total, weights) = (number(" reads "), number("(weights "));
        (line, total, weights)
    };
    let (one, total_one, weights_one) = bound("1");
    let (four, total_four, weights_four) = bound("4");
    assert!(
        one.starts_with("memory bound: a 1-token forward reads"),
        "{one}"
    );
    // The bandwidth is sampled while the forwards are timed: before each of the two rounds.
    assert!(
        one.contains("the median of 2 samples taken between the timed forwards"),
        "{one}"
    );
    assert!(
        four.starts_with("memory bound: a 1-token forward of 4 sequences reads"),
        "{four}"
    );
    assert_eq!(weights_one, weights_four, "{one}\n{four}");
    // SmolLM2's f16 cache at depth 201: 30 layers of 2 x 192 values, about 4.6 MB a sequence.
    let cache_one = total_one - weights_one;
    let cache_four = total_four - weights_four;
    assert!((4.0..5.5).contains(&cache_one), "{one}");
    assert!((cache_four - 4.0 * cache_one).abs() < 0.3, "{one}\n{four}");
    let out = run("0");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--sequences"), "{err}");
    let gemma = common::gemma_path();
    let out = common::tandem_command()
        .args(["forward-bench", "--model"])
        .arg(&gemma)
        .args([
            "--kv-cache-dtype",
            "f32",
            "--tokens",
            "1",
            "--depth",
            "32760",
        ])
        .args(["--sequences", "256"])
        .output()
        .expect("tandem forward-bench runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--sequences 256: their caches at --depth take 309.")
            && err.contains("available"),
        "{err}"
    );
}

/// `--against-kv-cache-dtype T` times every width on both cache types in one process: each
/// type's table of widths and a ratio a width; a type it cannot run is refused naming the flag,
/// and a bf16 cache where AVX-512 BF16 does not run (turned off here) naming the instruction set.
#[test]
fn forward_bench_compares_two_cache_types_in_one_run() {
    common::default_model();
    let run = |against: &str, avx512: bool| {
        let mut command = common::tandem_command();
        if !avx512 {
            command.env("TANDEM_DISABLE_AVX512", "1");
        }
        let args = [
            "forward-bench",
            "--tokens",
            "1,3",
            "--depth",
            "40",
            "--repeats",
            "2",
        ];
        command
            .args(args)
            .args(["--against-kv-cache-dtype", against])
            .output()
            .expect("tandem forward-bench runs")
    };
    let out = run("q8_0", true);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("KV cache f16:") && text.contains("KV cache q8_0, taking turns"),
        "{text}"
    );
    let ratios: Vec<f64> = text
        .lines()
        .skip_while(|l| !l.starts_with("| new tokens | q8_0 against f16"))
        .filter_map(|l| {
            l.strip_prefix("| ")?
                .split(" | ")
                .nth(1)?
                .strip_suffix("x |")?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(ratios.len(), 2, "{text}");
    assert!(ratios.iter().all(|r| r.is_finite() && *r > 0.0), "{text}");
    assert!(text.contains("memory bound: a 1-token forward"), "{text}");
    let out = run("q4_0", true);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--against-kv-cache-dtype") && err.contains("not offered"),
        "{err}"
    );
    let out = run("bf16", false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kv_cache_dtype bf16") && err.contains("AVX-512 BF16"),
        "{err}"
    );
}

/// `--ops N` breaks the forward down: one row per operation with its time at 1 and N tokens,
/// the matmuls against the kernel's measured multiply-add rate, and sampling with acceptance;
/// the matmuls and attention take real time and the shares add up to the whole.
#[test]
fn forward_bench_breaks_the_forward_down_by_operation() {
    common::default_model();
    let out = common::tandem_command()
        .args([
            "forward-bench",
            "--tokens",
            "1",
            "--depth",
            "16",
            "--repeats",
            "2",
            "--ops",
            "5",
        ])
        .output()
        .expect("tandem forward-bench runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("multiply-adds/s on cache-resident weights"),
        "{text}"
    );
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no row for {name}: {text}"))
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let mut share = 0.0;
    for name in [
        "embedding",
        "rms norms",
        "q/k/v matmul",
        "rope",
        "cache append",
        "attention",
        "output-projection matmul",
        "gate/up matmul",
        "SiLU and residuals",
        "down matmul",
        "lm_head matmul",
    ] {
        let r = row(name);
        let at_one: f64 = r[1].parse().unwrap_or_else(|_| panic!("{name}: {r:?}"));
        let at_five: f64 = r[2].parse().unwrap_or_else(|_| panic!("{name}: {r:?}"));
        assert!(at_one >= 0.0 && at_five >= 0.0, "{name}: {r:?}");
        share += r[4].trim_end_matches('%').parse::<f64>().unwrap();
        if name.ends_with("matmul") {
            assert!(at_one > 0.0, "{name} takes time: {r:?}");
            assert!(
                r[6].ends_with('x'),
                "{name} against the kernel's rate: {r:?}"
            );
        }
    }
    assert!((90.0..=110.0).contains(&share), "shares add up: {share}");
    let s = row("sampling and acceptance (5 rows)");
    assert!(s[2].parse::<f64>().unwrap() > 0.0, "{s:?}");
}

/// `tandem bench` on the first development prompt of the writing category, `max_tokens` long,
/// quietly and without warm-up (modes to be added).
fn bench_one_writing_prompt(max_tokens: &str) -> std::process::Command {
    let mut cmd = common::tandem_command();
    cmd.arg("bench")
        .arg("--prompts")
        .arg(spec_bench_dev())
        .args(["--categories", "writing", "--limit-per-category", "1"])
        .args(["--max-tokens", max_tokens, "--warmup", "0", "--quiet"]);
    cmd
}

/// The README's first bench: the default model drafting for itself (the same Q4_1 weights) costs
/// a target step per draft, so the governor never drafts; the output says so instead of
/// leaving a bare 1.00x.
#[test]
fn a_mode_that_never_drafts_says_why() {
    common::default_model();
    // Fewer tokens than the governor's probe interval: no probe round either.
    let run = bench_one_writing_prompt("8")
        .args(["--modes", "plain,draft", "--draft-weights-dtype", "as-is"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("- draft: the draft model default"))
        .unwrap_or_else(|| panic!("no drafter line: {stdout}"));
    assert!(
        line.contains("never drafted: not forecast to pay"),
        "{line}"
    );
}

/// How a drafter of another vocabulary drafts (`cross_vocabulary=`) asked of one that shares
/// the target's: refused with the setting named, not ignored.
#[test]
fn cross_vocabulary_is_refused_for_a_drafter_of_the_same_vocabulary() {
    common::default_model();
    let run = bench_one_writing_prompt("4")
        .args(["--modes", "plain,draft:cross_vocabulary=tli"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert!(stderr.contains("cross_vocabulary"), "{stderr}");
}

/// The structured workloads: constrained speculation (forced tokens alone, and prompt lookup)
/// gives exactly constrained plain decoding's outputs, forced tokens are drafted, and the
/// constrained plain mode is measured against free plain decoding.
#[test]
fn structured_modes_draft_forced_tokens_and_match_constrained_plain() {
    let (dir, mut bench) = bench_on_dev();
    let out = dir.path().join("r.json");
    let run = bench
        .args(["--categories", "qa,writing", "--limit-per-category", "1"])
        .args(["--max-tokens", "40", "--warmup", "0", "--quiet"])
        .args([
            "--modes",
            "plain,plain:structured=json,forced:structured=json,plain:structured=tools,pld:structured=tools",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("- forced:structured=json: none: only the constraint's forced tokens"),
        "{stdout}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let runs = json["runs"].as_array().unwrap();
    let of = |mode: &'static str| runs.iter().filter(move |r| r["mode"] == mode);
    for mode in ["forced:structured=json", "pld:structured=tools"] {
        assert!(of(mode).count() >= 2, "{mode}: one run a question and turn");
        for r in of(mode) {
            assert_eq!(r["outputs_match"], true, "{mode}: {r}");
        }
        let forced: u64 = of(mode).map(|r| r["forced_tokens"].as_u64().unwrap()).sum();
        assert!(forced > 0, "{mode}: no forced drafts");
    }
    // Every batch starts cold: no first turn found its prompt cached, whichever mode ran
    // before it on the same engine; later turns reuse their own conversation.
    for r in runs.iter().filter(|r| r["turn"] == 0) {
        assert_eq!(r["cached_tokens"], 0, "{r}");
    }
    assert!(runs
        .iter()
        .any(|r| r["turn"] == 1 && r["cached_tokens"].as_u64().unwrap() > 0));
    assert!(!stdout.contains("Cache state differed"), "{stdout}");
    // Forced tokens alone: every draft is forced.
    for r in of("forced:structured=json") {
        assert_eq!(r["forced_tokens"], r["draft_tokens"], "{r}");
    }
    let overall = |mode: &str| {
        json["summary"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["mode"] == mode && s["category"] == "overall")
            .cloned()
            .unwrap_or_else(|| panic!("no overall row for {mode}"))
    };
    // The constraint's own cost is measured against free plain decoding.
    assert!(overall("plain:structured=json")["decode_speedup"].is_number());
    assert!(overall("plain")["decode_speedup"].is_null());
    assert!(
        overall("forced:structured=json")["forced_share"]
            .as_f64()
            .unwrap()
            > 0.99
    );
}
