//! `tandem bench`: plain and speculative decoding on Spec-Bench prompts in one run, reported as
//! tables, raw JSON and a speedup chart.
//!
//! Why it exists: it is how the team and users judge speed. Every mode runs in the same process
//! on the same prompts, interleaved, so the reported speedups are ratios measured side by side,
//! and greedy runs are checked token for token against plain decoding (speculation that changes
//! the output is not a speedup).

pub mod chart;
mod coverage;
mod error;
pub mod mode;
mod options;
pub mod progress;
pub mod prompts;
mod question;
pub mod report;
pub mod run_modes;
mod structured_workloads;
pub mod tables;

use serde_json::{json, Value};

pub use coverage::render_coverage;
pub use error::BenchError;
pub use mode::{parse_modes, BenchDrafters, Mode, Structured};
pub use options::BenchOptions;
pub use prompts::{every_nth, load_prompts, parse_prompts, select, BenchPrompt};
pub use report::{summarize, BatchRecord, RunRecord, Spread, SummaryRow};
pub use run_modes::{run_bench, BenchModels, BenchRun, EngineReport, Progress};
pub use tables::{render_cache_notes, render_drafters, render_tables};

/// What the machine is, for the record.
pub fn machine_json(threads: usize) -> Value {
    let cpu = crate::model::kernels::cpu_kernels::cpu_name();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "threads": threads,
        "os": std::env::consts::OS,
    })
}

/// The `--out` document: settings, the summary rows and every raw figure.
pub fn results_json(
    settings: Value,
    machine: Value,
    modes: &[Mode],
    rows: &[SummaryRow],
    run: &BenchRun,
) -> Value {
    let modes: Vec<Value> = modes
        .iter()
        .map(|m| {
            json!({
                "label": m.label,
                "drafter": format!("{:?}", m.drafter),
                "gamma": format!("{:?}", m.gamma),
                "lenience": f64::from(m.lenience.unwrap_or_default()),
                "pipeline": m.pipeline,
            })
        })
        .collect();
    json!({
        "tandem_version": env!("CARGO_PKG_VERSION"),
        "created_unix_s": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        "machine": machine,
        "settings": settings,
        "modes": modes,
        "categories": run.categories,
        "engines": run.engines,
        "summary": rows,
        "batches": run.batches,
        "runs": run.runs,
    })
}
