//! `tandem bench` end to end on the default model: a short run over every Spec-Bench dev
//! category (2 prompts each, 16 tokens, both turns of the MT-bench questions) completes, writes
//! valid JSON and an SVG chart, and every greedy speculative mode matches plain decoding token
//! for token. Malformed prompt files stop it with the line named.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn tandem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
    c.env_remove("TANDEM_MODEL").env("TANDEM_THREADS", "2");
    c
}

fn spec_bench_dev() -> std::path::PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/spec_bench_dev.jsonl");
    assert!(
        p.is_file(),
        "Spec-Bench dev prompts missing at {}",
        p.display()
    );
    p
}

#[test]
fn short_bench_run_writes_json_and_svg_and_greedy_outputs_match() {
    common::default_model();
    let dir = tempfile::tempdir().unwrap();
    let (out, chart) = (dir.path().join("r.json"), dir.path().join("s.svg"));
    let run = tandem()
        .arg("bench")
        .arg("--prompts")
        .arg(spec_bench_dev())
        .args([
            "--limit-per-category",
            "2",
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
    assert!(
        stderr.contains("26/26") || stderr.contains("78/78"),
        "progress: {stderr}"
    );

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let categories = v["categories"].as_array().unwrap();
    assert_eq!(categories.len(), 13, "{:?}", v["categories"]);
    let runs = v["runs"].as_array().unwrap();
    // 8 MT-bench categories × 2 questions × 2 turns + 5 categories × 2 questions, per mode.
    assert_eq!(runs.len(), 3 * (8 * 2 * 2 + 5 * 2));
    for r in runs {
        let tokens = r["completion_tokens"].as_u64().unwrap();
        assert!((1..=16).contains(&tokens), "{r}");
        assert!(
            r["accepted_tokens"].as_u64() <= r["draft_tokens"].as_u64(),
            "{r}"
        );
        assert!(
            r["seconds"].as_f64().unwrap() >= r["ttft_s"].as_f64().unwrap(),
            "{r}"
        );
        if r["mode"] != "plain" {
            assert_eq!(
                r["outputs_match"], true,
                "greedy speculative output differs: {r}"
            );
        }
    }
    assert!(
        runs.iter()
            .any(|r| r["turn"] == 1 && r["category"] == "writing"),
        "second turns ran"
    );
    let summary = v["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 3 * 14, "3 modes × (13 categories + overall)");
    for row in summary.iter().filter(|r| r["mode"] != "plain") {
        assert_eq!(row["outputs_match"], true, "{row}");
        assert!(row["speedup"]["median"].as_f64().unwrap() > 0.0, "{row}");
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
        let out = tandem()
            .arg("bench")
            .arg("--prompts")
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{name}: {stderr}");
    }
    let out = tandem()
        .arg("bench")
        .arg("--prompts")
        .arg(spec_bench_dev())
        .args(["--modes", "plain,eagle"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode `eagle`"));
}
