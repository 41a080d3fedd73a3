//! `tandem bench`: its flags, and turning the library's bench run into tables, JSON and a chart.
//!
//! Why it exists: the bench library runs modes and summarizes figures; this is the part that
//! reads the user's choices (prompts, modes, sampling, the draft model of `draft` modes), loads
//! the models once for every mode, and writes what the user asked for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;

use tandem::bench;
use tandem::config::Config;
use tandem::constraint::ConstraintVocabulary;
use tandem::draft::{DraftSpec, LoadedDrafter};
use tandem::model::{LoadedModel, WeightsDtype};
use tandem::sampling::SamplingParams;

use super::model_args::ModelArgs;
use super::CliError;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Spec-Bench-style JSONL, one {"question_id", "category", "turns": [...]} a line
    /// (required; data/spec_bench_dev.jsonl ships the development half).
    #[arg(long)]
    prompts: PathBuf,
    /// Only every N-th question of the file, the ones `train-head --leave-out N` kept out of a
    /// head's training (0 = every question).
    #[arg(long, default_value_t = 0)]
    left_out: usize,
    /// Only these categories, comma-separated [default: all].
    #[arg(long, value_delimiter = ',')]
    categories: Vec<String>,
    /// At most this many prompts per category [default: all].
    #[arg(long)]
    limit_per_category: Option<usize>,
    /// Tokens to generate per turn.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy (outputs are then checked against plain decoding token for token).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling of sampled runs in (0, 1] [default: 1, off].
    #[arg(long)]
    top_p: Option<f32>,
    /// Top-k sampling of sampled runs [default: 0, off].
    #[arg(long)]
    top_k: Option<usize>,
    /// Base seed for sampled runs (each question, turn and repeat derives its own).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Comma-separated modes: plain, prompt-lookup, suffix, draft, draft+prompt-lookup, head,
    /// head+prompt-lookup, forced (drafter names as `--draft-model` reads them, aliases too),
    /// each optionally with `:gamma=N|adaptive`, `:lenience=L`, `:pipeline=true`,
    /// `:prefix_cache=false` and more (docs/performance.md) (plain is always run; the first
    /// plain mode is the baseline of every speedup).
    #[arg(long, default_value = "plain,prompt-lookup")]
    modes: String,
    /// Requests in flight at once per mode.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Runs of every prompt per mode (spread = min–max over repeats).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Questions run under every mode first and not counted.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Generate exactly --max-tokens tokens per turn.
    #[arg(long)]
    ignore_eos: bool,
    /// A system message before every question: a templated workload, where every prompt opens
    /// with the same text (what a prefix cache serves) [default: none].
    #[arg(long)]
    system_prompt: Option<String>,
    /// The draft model of `draft` modes: `default`, `self:K` or a model path.
    #[arg(long, default_value = "default")]
    draft_model: DraftSpec,
    /// The draft head of `head` modes: a head folder [default: the default model's shipped
    /// head].
    #[arg(long)]
    head: Option<String>,
    /// A draft head's reduced vocabulary: its most frequent tokens (0 = the whole vocabulary).
    #[arg(long, default_value_t = 8192)]
    draft_vocab: usize,
    /// A draft model's (or `self:K`'s) reduced vocabulary, drafting for the default model: the
    /// shipped head's most frequent tokens (0 = the whole vocabulary).
    #[arg(long, default_value_t = 0)]
    draft_model_vocab: usize,
    /// Weight type of the draft model (`as-is` keeps a GGUF's own quantization).
    #[arg(long, default_value = "as-is")]
    draft_weights_dtype: WeightsDtype,
    /// Largest γ any mode may use.
    #[arg(long, default_value_t = 8)]
    max_gamma: usize,
    /// Write every raw figure (and the machine, model and settings) as JSON here, making its
    /// folder if needed [default: no file].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Draw the speedup per category and mode as SVG here [default: no chart].
    #[arg(long)]
    chart: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(mut config: Config, args: BenchArgs) -> Result<(), CliError> {
    // The engine's per-round debug lines (forecast against measured cost) are opt-in here, so a
    // bench's own output stays clean unless TANDEM_LOG asks for them.
    if std::env::var_os("TANDEM_LOG").is_some() {
        tandem::logging::init(&config.logging.level, &config.logging.format)?;
    }
    let drafters = bench::BenchDrafters {
        draft_model: args.draft_model.clone(),
        head: args.head.clone(),
    };
    let modes = bench::parse_modes(&args.modes, args.max_gamma, &drafters)?;
    let prompts = bench::select(
        bench::every_nth(bench::load_prompts(&args.prompts)?, args.left_out, true),
        &args.categories,
        args.limit_per_category,
    )?;
    let sampling = sampling_params(&args)?;
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    set_draft_config(&mut config, &modes, &args);
    let (target, draft, draft_name) = tandem::setup::load_models(&config)?;
    let head = load_head(&modes, &args, &config, &target)?;
    let model_json = model_json(&config, &target, &draft_name);
    let constraints = constraint_vocabulary(&modes, &target)?;
    let models = bench::BenchModels {
        target: Arc::new(target.model),
        tokenizer: Arc::clone(&target.tokenizer),
        draft,
        head,
        constraints,
    };
    let opts = bench_options(&config, &args, &modes, sampling, threads);
    announce(&prompts, &modes, &args, threads);
    let rt = super::async_runtime()?;
    let mut bar = bench::progress::ProgressBar::default();
    let quiet = args.quiet;
    let run = rt.block_on(bench::run_bench(&models, &prompts, opts, &mut |p| {
        if !quiet {
            bar.update(p.done, p.total, p.what);
        }
    }))?;
    let rows = bench::summarize(
        &modes,
        &run.categories,
        &run.runs,
        &run.batches,
        args.repeat,
    );
    print_report(&modes, &rows, &run, &args, &draft_name);
    if let Some(LoadedDrafter::Model {
        translation: Some(t),
        ..
    }) = &models.draft
    {
        println!("{}", bench::render_coverage(t, &modes, &run.runs));
    }
    if let Some(path) = &args.out {
        write_results(path, &args, &model_json, threads, &modes, &rows, &run)?;
    }
    if let Some(path) = &args.chart {
        write_chart(path, &args, &model_json, &rows)?;
    }
    Ok(())
}

/// The sampling every mode decodes with, checked.
fn sampling_params(args: &BenchArgs) -> Result<SamplingParams, CliError> {
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p.unwrap_or(1.0),
        top_k: args.top_k.unwrap_or(0),
        ..Default::default()
    };
    sampling.validate()?;
    Ok(sampling)
}

/// Points the config's drafter at what the modes need, so `load_models` loads only that.
fn set_draft_config(config: &mut Config, modes: &[bench::Mode], args: &BenchArgs) {
    // Prompt-lookup modes carry their own n-gram sizes; only `draft` modes need a model loaded.
    let needs_draft_model = modes.iter().any(bench::Mode::drafts_with_a_model);
    config.speculation.draft_model = if needs_draft_model {
        args.draft_model.clone()
    } else {
        DraftSpec::None
    };
    config.speculation.draft_weights_dtype = args.draft_weights_dtype;
    config.speculation.draft_vocab = args.draft_vocab;
    config.speculation.draft_model_vocab = args.draft_model_vocab;
}

/// The draft head of `head` modes, loaded only when a mode drafts with one.
fn load_head(
    modes: &[bench::Mode],
    args: &BenchArgs,
    config: &Config,
    target: &LoadedModel,
) -> Result<Option<LoadedDrafter>, CliError> {
    if !modes.iter().any(bench::Mode::drafts_with_a_head) {
        return Ok(None);
    }
    let spec = DraftSpec::Head {
        path: args.head.clone(),
        lookup: None,
    };
    let head = tandem::setup::load_drafter(&spec, WeightsDtype::AsIs, config, target)?;
    if let Some(h) = &head {
        eprintln!("bench: draft head {}", h.name());
    }
    Ok(head)
}

/// The models and their settings, as the results file records them.
fn model_json(config: &Config, target: &LoadedModel, draft_name: &str) -> serde_json::Value {
    serde_json::json!({
        "target": target.source.display_name(),
        "target_weights": target.model.linear_dtypes().join("/"),
        "target_device": target.model.placement(),
        "draft": draft_name,
        "draft_device": config.draft_device().to_string(),
        "context_length": target.model.context_len(),
        "kv_cache_dtype": target.model.kv_dtype().to_string(),
        "json_whitespace": config.structured.json_whitespace,
    })
}

/// What structured modes compile their constraints against, built only when a mode needs it.
fn constraint_vocabulary(
    modes: &[bench::Mode],
    target: &LoadedModel,
) -> Result<Option<Arc<ConstraintVocabulary>>, CliError> {
    if !modes.iter().any(|m| m.structured.is_constrained()) {
        return Ok(None);
    }
    let vocab = target.model.hparams().vocab_size;
    let built = ConstraintVocabulary::new(Arc::clone(&target.tokenizer), vocab)
        .map_err(|e| bench::BenchError::Options(format!("structured modes: {e}")))?;
    Ok(Some(Arc::new(built)))
}

fn bench_options(
    config: &Config,
    args: &BenchArgs,
    modes: &[bench::Mode],
    sampling: SamplingParams,
    threads: usize,
) -> bench::BenchOptions {
    bench::BenchOptions {
        modes: modes.to_vec(),
        max_tokens: args.max_tokens,
        sampling,
        seed: args.seed,
        ignore_eos: args.ignore_eos,
        concurrency: args.concurrency,
        repeat: args.repeat,
        warmup: args.warmup,
        threads,
        max_gamma: args.max_gamma,
        prefill_chunk: config.engine.prefill_chunk,
        system_prompt: args.system_prompt.clone(),
        json_whitespace: config.json_whitespace(),
    }
}

/// The run's shape on stderr before it starts, so a long run says what it is doing.
fn announce(
    prompts: &[bench::BenchPrompt],
    modes: &[bench::Mode],
    args: &BenchArgs,
    threads: usize,
) {
    eprintln!(
        "bench: {} prompts in {} categories, modes {}, {} tokens, temperature {}, concurrency {}, {} repeat(s), {} thread(s)",
        prompts.len(),
        {
            let mut c: Vec<&str> = prompts.iter().map(|p| p.category.as_str()).collect();
            c.dedup();
            c.len()
        },
        modes.iter().map(|m| m.label.as_str()).collect::<Vec<_>>().join(", "),
        args.max_tokens,
        args.temperature,
        args.concurrency,
        args.repeat,
        threads
    );
}

/// The tables, cache and drafter notes and pipeline figures on stdout; a greedy mismatch
/// against plain decoding as a warning on stderr.
fn print_report(
    modes: &[bench::Mode],
    rows: &[bench::SummaryRow],
    run: &bench::BenchRun,
    args: &BenchArgs,
    draft_name: &str,
) {
    println!("{}", bench::render_tables(rows, args.repeat));
    let cache_notes = bench::render_cache_notes(modes, &run.runs);
    if !cache_notes.is_empty() {
        println!("{cache_notes}");
    }
    println!(
        "{}",
        bench::render_drafters(modes, &run.runs, &draft_description(draft_name, args))
    );
    for e in run.engines.iter().filter(|e| e.pipeline) {
        println!(
            "pipeline overlap ({}): {:.0}% of busy time over {} rounds; next rounds drafted \
             ahead within a request: {}, used {}",
            e.modes.join(", "),
            e.overlap_ratio * 100.0,
            e.rounds,
            e.drafted_ahead,
            e.ahead_used
        );
    }
    if args.temperature == 0.0 {
        warn_mismatches(rows);
    }
}

/// Greedy speculation must reproduce plain decoding; a mode that did not is named.
fn warn_mismatches(rows: &[bench::SummaryRow]) {
    let mismatched: Vec<&str> = rows
        .iter()
        .filter(|r| r.category == bench::report::OVERALL && r.outputs_match == Some(false))
        .map(|r| r.mode.as_str())
        .collect();
    if !mismatched.is_empty() {
        eprintln!(
            "bench: WARNING: greedy outputs differ from plain decoding for {}",
            mismatched.join(", ")
        );
    }
}

/// The `--out` document: the settings as given, the machine, and every figure.
fn write_results(
    path: &Path,
    args: &BenchArgs,
    model_json: &serde_json::Value,
    threads: usize,
    modes: &[bench::Mode],
    rows: &[bench::SummaryRow],
    run: &bench::BenchRun,
) -> Result<(), CliError> {
    let settings = serde_json::json!({
        "prompts": args.prompts.display().to_string(),
        "categories": args.categories,
        "limit_per_category": args.limit_per_category,
        "max_tokens": args.max_tokens,
        // f32 flags, recorded as the decimal the user typed (0.7, not 0.699999988).
        "temperature": args.temperature.to_string().parse::<f64>().unwrap_or_default(),
        "top_p": args.top_p.map(|p| p.to_string().parse::<f64>().unwrap_or_default()),
        "top_k": args.top_k,
        "seed": args.seed,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "ignore_eos": args.ignore_eos,
        "system_prompt": args.system_prompt,
        "max_gamma": args.max_gamma,
        "model": model_json,
    });
    let doc = bench::results_json(settings, bench::machine_json(threads), modes, rows, run);
    write_file(path, serde_json::to_string_pretty(&doc)?)?;
    eprintln!("bench: results in {}", path.display());
    Ok(())
}

/// The `--chart` SVG, titled with the target and the settings that shape the speedup.
fn write_chart(
    path: &Path,
    args: &BenchArgs,
    model_json: &serde_json::Value,
    rows: &[bench::SummaryRow],
) -> Result<(), CliError> {
    let title = format!(
        "tandem speedup over plain decoding ({}, T={}, concurrency {})",
        model_json["target"].as_str().unwrap_or(""),
        args.temperature,
        args.concurrency
    );
    write_file(path, bench::chart::speedup_svg(rows, &title))?;
    eprintln!("bench: chart in {}", path.display());
    Ok(())
}

/// The draft model of `draft` modes as the user named it, with the file it resolved to and its
/// weight type.
fn draft_description(loaded: &str, args: &BenchArgs) -> String {
    let named = args.draft_model.to_string();
    if loaded.is_empty() || loaded == "none" || loaded == named {
        format!("{named} ({} weights)", args.draft_weights_dtype)
    } else {
        format!("{named}: {loaded} ({} weights)", args.draft_weights_dtype)
    }
}

/// Writes an output file, making its folder first (`target/bench/results.json`).
fn write_file(path: &Path, contents: String) -> Result<(), CliError> {
    let write = || {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, contents)
    };
    write().map_err(|source| CliError::WriteFile {
        path: path.to_path_buf(),
        source,
    })
}
