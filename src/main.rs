//! The `tandem` command line: loads config, wires the layers together, reports errors.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use tandem::config::Config;
use tandem::draft::{ModelDrafter, PromptLookup, Proposer};
use tandem::engine::{
    generate_plain, generate_speculative, FixedSpeculation, Gamma, GenerationOutput,
    GenerationRequest, OutputPiece, SpeculationStats,
};
use tandem::model::{ChatMessage, LoadedModel};
use tandem::sampling::SamplingParams;

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "LLM inference built around speculative decoding"
)]
struct Cli {
    /// TOML config file (default: the embedded config/default.toml).
    #[arg(long, global = true, env = "TANDEM_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible HTTP API (and /metrics, /health, the admin API).
    Serve(Box<ServeArgs>),
    /// Generate a completion for one prompt, streaming it to stdout; stats go to stderr.
    Generate(Box<GenerateArgs>),
    /// Benchmark plain vs speculative decoding on Spec-Bench prompts, all modes in one run.
    Bench(Box<BenchArgs>),
    /// Time forwards of k new tokens against a cache of a given depth (the cost a speculative
    /// verification pays), reported against a 1-token forward.
    ForwardBench(ForwardBenchArgs),
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, env = "TANDEM_HOST")]
    host: Option<String>,
    /// 0 picks a free port (printed at start).
    #[arg(long, env = "TANDEM_PORT")]
    port: Option<u16>,
    /// The model id clients send and /v1/models lists.
    #[arg(long, env = "TANDEM_MODEL_NAME")]
    model_name: Option<String>,
    /// `none`, `prompt-lookup`, `default` or a model path.
    #[arg(long, env = "TANDEM_DRAFT_MODEL")]
    draft_model: Option<String>,
    #[arg(long, env = "TANDEM_DRAFT_WEIGHTS_DTYPE")]
    draft_weights_dtype: Option<String>,
    /// Switch speculation on or off (`--speculative-decoding false`).
    #[arg(long, env = "TANDEM_SPECULATIVE_DECODING")]
    speculative_decoding: Option<bool>,
    /// A fixed γ (turns the governor off); `--spec-length` is the seeds' name.
    #[arg(long, alias = "spec-length", env = "TANDEM_GAMMA")]
    gamma: Option<usize>,
    /// Let the governor choose γ (`--adaptive false` for a fixed γ).
    #[arg(long, env = "TANDEM_ADAPTIVE")]
    adaptive: Option<bool>,
    /// Server-wide lenience in (0, 1]; 1 is exact.
    #[arg(long, env = "TANDEM_LENIENCE")]
    lenience: Option<f32>,
    #[arg(long, env = "TANDEM_MAX_SEQS")]
    max_seqs: Option<usize>,
    #[arg(long, env = "TANDEM_MAX_QUEUE")]
    max_queue: Option<usize>,
    #[arg(long, env = "TANDEM_PIPELINE")]
    pipeline: Option<bool>,
    #[arg(long, env = "TANDEM_MAX_BODY_BYTES")]
    max_body_bytes: Option<usize>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Spec-Bench-style JSONL: {"question_id", "category", "turns": [...]} per line.
    #[arg(long)]
    prompts: PathBuf,
    /// Only these categories (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    categories: Vec<String>,
    /// At most this many prompts per category.
    #[arg(long)]
    limit_per_category: Option<usize>,
    /// Tokens to generate per turn.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy (outputs are then checked against plain decoding token for token).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    /// Base seed for sampled runs (each question, turn and repeat derives its own).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Comma-separated modes: plain, prompt-lookup (pld), draft, each optionally with
    /// `:gamma=N|adaptive`, `:lenience=L`, `:pipeline=true` (plain is always run).
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
    /// The draft model of `draft` modes: `default` or a model path.
    #[arg(long, default_value = "default")]
    draft_model: String,
    /// Weight type of the draft model (`as-is` keeps a GGUF's own quantization).
    #[arg(long, default_value = "as-is")]
    draft_weights_dtype: String,
    /// Largest γ any mode may use.
    #[arg(long, default_value_t = 8)]
    max_gamma: usize,
    /// Write every raw figure (and the machine, model and settings) as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Draw the speedup per category and mode as SVG here.
    #[arg(long)]
    chart: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct ForwardBenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// New-token counts to time (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,5,9,16,64")]
    tokens: Vec<usize>,
    /// Tokens already in the cache before each timed forward.
    #[arg(long, default_value_t = 64)]
    depth: usize,
    /// Timed repetitions per count (the median is reported).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
}

/// Model and runtime overrides shared by commands that load a model.
#[derive(Args)]
struct ModelArgs {
    /// `default`, a .gguf file, or a Hugging Face model folder.
    #[arg(long, env = "TANDEM_MODEL")]
    model: Option<String>,
    /// Linear weight type after loading: auto, as-is, f32, f16, bf16, q8_0, q4_0, q4_1, q4k.
    #[arg(long, env = "TANDEM_WEIGHTS_DTYPE")]
    weights_dtype: Option<String>,
    /// Compute threads (0 = all cores).
    #[arg(long, env = "TANDEM_THREADS")]
    threads: Option<usize>,
    /// Context length (prompt + output tokens).
    #[arg(long, env = "TANDEM_CONTEXT_LENGTH")]
    context_length: Option<usize>,
    /// KV cache element type of both models: f16 or f32.
    #[arg(long, env = "TANDEM_KV_CACHE_DTYPE")]
    kv_cache_dtype: Option<String>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (a user message unless --raw).
    #[arg(long, conflicts_with = "prompt_file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Feed the prompt as-is instead of through the model's chat template.
    #[arg(long)]
    raw: bool,
    /// A system message for the chat template.
    #[arg(long)]
    system: Option<String>,
    #[arg(long)]
    max_tokens: Option<usize>,
    /// 0 = greedy.
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    min_p: Option<f32>,
    #[arg(long)]
    repetition_penalty: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when the output contains this text (repeatable); the text stops right before it.
    #[arg(long)]
    stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    ignore_eos: bool,
    /// Print only the stats line (no streamed text).
    #[arg(long)]
    quiet: bool,
    /// Print the result (token ids, text, stats) as one JSON object on stdout instead.
    #[arg(long)]
    json: bool,
    /// Speculative decoding drafter: `none`, `prompt-lookup`, `default` or a model path.
    #[arg(long, env = "TANDEM_DRAFT_MODEL", default_value = "none")]
    draft_model: String,
    /// Linear weight type of a draft model (the same file at another type is a self-drafter).
    #[arg(long, env = "TANDEM_DRAFT_WEIGHTS_DTYPE", default_value = "as-is")]
    draft_weights_dtype: String,
    /// Drafted tokens per round (γ); `--spec-length` is the seeds' name for it.
    #[arg(long, alias = "spec-length", default_value_t = 4)]
    gamma: usize,
    /// Relaxed acceptance in (0, 1]; 1 keeps the target's distribution exactly.
    #[arg(long, default_value_t = 1.0)]
    lenience: f32,
    /// Also run plain decoding of the same prompt in this process and print the speedup and
    /// whether the outputs are identical.
    #[arg(long)]
    compare: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut config = match &cli.config {
        Some(p) => Config::from_file(p)?,
        None => Config::embedded(),
    };
    match cli.command {
        Command::Serve(args) => {
            apply_model_args(&mut config, &args.model)?;
            apply_serve_args(&mut config, &args)?;
            serve(config)
        }
        Command::Generate(args) => {
            apply_model_args(&mut config, &args.model)?;
            generate(&config, *args)
        }
        Command::Bench(args) => {
            apply_model_args(&mut config, &args.model)?;
            bench(config, *args)
        }
        Command::ForwardBench(args) => {
            apply_model_args(&mut config, &args.model)?;
            forward_bench(&config, args)
        }
    }
}

fn apply_model_args(config: &mut Config, args: &ModelArgs) -> Result<()> {
    if let Some(m) = &args.model {
        config.model.path = m.clone();
    }
    if let Some(d) = &args.weights_dtype {
        config.model.weights_dtype = d.clone();
    }
    if let Some(t) = args.threads {
        config.runtime.threads = t;
    }
    if let Some(c) = args.context_length {
        config.model.context_length = c;
    }
    if let Some(d) = &args.kv_cache_dtype {
        config.model.kv_cache_dtype = d.clone();
    }
    config.validate()?;
    Ok(())
}

fn apply_serve_args(config: &mut Config, a: &ServeArgs) -> Result<()> {
    let (srv, spec, eng) = (
        &mut config.server,
        &mut config.speculation,
        &mut config.engine,
    );
    if let Some(v) = &a.host {
        srv.host = v.clone();
    }
    if let Some(v) = a.port {
        srv.port = v;
    }
    if let Some(v) = &a.model_name {
        srv.model_name = v.clone();
    }
    if let Some(v) = a.max_body_bytes {
        srv.max_body_bytes = v;
    }
    if let Some(v) = &a.draft_model {
        spec.draft_model = v.clone();
    }
    if let Some(v) = &a.draft_weights_dtype {
        spec.draft_weights_dtype = v.clone();
    }
    if let Some(v) = a.speculative_decoding {
        spec.enabled = v;
    }
    if let Some(v) = a.gamma {
        spec.gamma = v;
        spec.adaptive = false;
    }
    if let Some(v) = a.adaptive {
        spec.adaptive = v;
    }
    if let Some(v) = a.lenience {
        spec.lenience = v;
    }
    if let Some(v) = a.max_seqs {
        eng.max_seqs = v;
    }
    if let Some(v) = a.max_queue {
        eng.max_queue = v;
    }
    if let Some(v) = a.pipeline {
        eng.pipeline = v;
    }
    config.validate()?;
    Ok(())
}

fn serve(config: Config) -> Result<()> {
    tandem::logging::init(&config.logging.level, &config.logging.format)?;
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    // The async runtime only moves bytes and messages; forward passes run on the engine's own
    // compute threads.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(tandem::server::run(config, threads))?;
    Ok(())
}

fn bench(mut config: Config, args: BenchArgs) -> Result<()> {
    use tandem::bench;
    // The engine's per-round debug lines (forecast against measured cost) are opt-in here, so a
    // bench's own output stays clean unless TANDEM_LOG asks for them.
    if std::env::var_os("TANDEM_LOG").is_some() {
        tandem::logging::init(&config.logging.level, &config.logging.format)?;
    }
    let modes = bench::parse_modes(&args.modes, args.max_gamma)?;
    let prompts = bench::select(
        bench::load_prompts(&args.prompts)?,
        &args.categories,
        args.limit_per_category,
    )?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p.unwrap_or(1.0),
        top_k: args.top_k.unwrap_or(0),
        ..Default::default()
    };
    sampling.validate()?;
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    let needs_draft_model = modes.iter().any(|m| m.drafter == bench::DrafterKind::Model);
    config.speculation.draft_model = if needs_draft_model {
        args.draft_model.clone()
    } else {
        "none".into()
    };
    config.speculation.draft_weights_dtype = args.draft_weights_dtype.clone();
    config.validate()?;
    let (target, draft, draft_name) = tandem::setup::load_models(&config)?;
    let model_json = serde_json::json!({
        "target": target.source.display_name(),
        "target_weights": target.model.linear_dtypes().join("/"),
        "draft": draft_name,
        "context_length": target.model.context_len(),
        "kv_cache_dtype": target.model.kv_dtype().to_string(),
    });
    let models = bench::BenchModels {
        target: std::sync::Arc::new(target.model),
        tokenizer: std::sync::Arc::clone(&target.tokenizer),
        draft,
    };
    let opts = bench::BenchOptions {
        modes: modes.clone(),
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
    };
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
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
    println!("{}", bench::render_tables(&rows, args.repeat));
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
    if let Some(path) = &args.out {
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
            "max_gamma": args.max_gamma,
            "model": model_json,
        });
        let doc = bench::results_json(settings, bench::machine_json(threads), &modes, &rows, &run);
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: results in {}", path.display());
    }
    if let Some(path) = &args.chart {
        let title = format!(
            "tandem speedup over plain decoding ({}, T={}, concurrency {})",
            model_json["target"].as_str().unwrap_or(""),
            args.temperature,
            args.concurrency
        );
        std::fs::write(path, bench::chart::speedup_svg(&rows, &title))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: chart in {}", path.display());
    }
    Ok(())
}

fn load_model(config: &Config) -> Result<LoadedModel> {
    let threads = tandem::runtime::init_threads(config.runtime.threads);
    let t = std::time::Instant::now();
    let loaded = tandem::setup::load_target(config)
        .with_context(|| format!("loading model {}", config.model.path))?;
    eprintln!(
        "loaded {} (--weights-dtype {}: linear weights as {}; {} KV cache) in {:.2}s on {threads} thread(s)",
        loaded.source.display_name(),
        config.weights_dtype(),
        loaded.model.linear_dtypes().join("/"),
        loaded.model.kv_dtype(),
        t.elapsed().as_secs_f64()
    );
    Ok(loaded)
}

fn generate(config: &Config, args: GenerateArgs) -> Result<()> {
    let prompt_text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading prompt file {}", f.display()))?,
        (None, None) => bail!("give a prompt with --prompt TEXT or --prompt-file FILE"),
    };
    let g = &config.generation;
    let sampling = SamplingParams {
        temperature: args.temperature.unwrap_or(g.temperature),
        top_k: args.top_k.unwrap_or(g.top_k),
        top_p: args.top_p.unwrap_or(g.top_p),
        min_p: args.min_p.unwrap_or(g.min_p),
        repetition_penalty: args.repetition_penalty.unwrap_or(g.repetition_penalty),
        seed: args.seed,
        ..Default::default()
    };
    sampling.validate()?;
    let loaded = load_model(config)?;
    let tok = &loaded.tokenizer;
    let text = if args.raw {
        prompt_text
    } else {
        let template = tok
            .chat_template()
            .context("the model has no chat template; pass --raw to feed the prompt as-is")?;
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage {
                role: "system".into(),
                content: s.clone(),
            });
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: prompt_text,
        });
        template.render(&messages, true)?
    };
    let prompt = tok.encode(&text, true)?;
    let req = GenerationRequest {
        prompt,
        max_tokens: args.max_tokens.unwrap_or(g.max_tokens),
        sampling,
        eos_ids: if args.ignore_eos {
            Vec::new()
        } else {
            tok.eos_ids().to_vec()
        },
        stop_strings: args.stop.clone(),
        detokenizer: Some(std::sync::Arc::clone(tok)),
    };
    let drafted = build_drafter(config, &args, &loaded)?;
    let stream = !args.quiet && !args.json;
    let spec = FixedSpeculation {
        gamma: Gamma::try_from(args.gamma).map_err(|e| anyhow::anyhow!("--gamma {e}"))?,
        lenience: tandem::sampling::Lenience::try_from(args.lenience)
            .map_err(|e| anyhow::anyhow!("--lenience {e}"))?,
    };
    let plain_run = if args.compare || drafted.is_none() {
        Some(run_generation(
            &loaded,
            None,
            &req,
            spec,
            stream && drafted.is_none(),
        )?)
    } else {
        None
    };
    let spec_run = match drafted {
        Some(mut d) => Some(run_generation(
            &loaded,
            Some(d.as_drafter()),
            &req,
            spec,
            stream,
        )?),
        None => None,
    };
    let (out, spec_stats) = spec_run
        .as_ref()
        .or(plain_run.as_ref())
        .expect("one run happened");
    let s = &out.stats;
    if args.json {
        let text = out.text.clone().unwrap_or_default();
        let mut v = serde_json::json!({
            "text": text,
            "tokens": out.tokens,
            "prompt_token_ids": req.prompt,
            "finish_reason": out.finish.as_openai(),
            "prompt_tokens": s.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "prefill_tokens_per_s": s.prefill_tokens_per_s(),
            "decode_tokens_per_s": s.decode_tokens_per_s(),
        });
        if let Some(st) = spec_stats {
            v["speculative"] = serde_json::json!({
                "draft_tokens": st.draft_tokens,
                "accepted_tokens": st.accepted_tokens,
                "acceptance_rate": st.acceptance_rate(),
                "mean_accepted_length": st.mean_accepted_length(),
                "rounds": st.rounds,
            });
        }
        if let (Some((p, _)), Some(_)) = (&plain_run, &spec_run) {
            v["plain_decode_tokens_per_s"] = p.stats.decode_tokens_per_s().into();
            v["speedup"] = (s.decode_tokens_per_s() / p.stats.decode_tokens_per_s()).into();
            v["outputs_match"] = (p.tokens == out.tokens).into();
        }
        println!("{v}");
    }
    eprintln!(
        "prompt tokens: {} | generated tokens: {} | prefill: {:.1} tok/s | decode: {:.1} tok/s | finish: {:?}",
        s.prompt_tokens,
        s.generated_tokens,
        s.prefill_tokens_per_s(),
        s.decode_tokens_per_s(),
        out.finish
    );
    if let Some(st) = spec_stats {
        eprintln!(
            "speculative: draft tokens: {} | accepted tokens: {} | acceptance rate: {:.1}% | mean tokens per round: {:.2} | rounds: {}",
            st.draft_tokens,
            st.accepted_tokens,
            100.0 * st.acceptance_rate(),
            st.mean_accepted_length(),
            st.rounds
        );
    }
    if let (Some((p, _)), Some((sp, _))) = (&plain_run, &spec_run) {
        eprintln!(
            "compare: plain decode {:.1} tok/s | speculative {:.1} tok/s | speedup {:.2}x | outputs {}",
            p.stats.decode_tokens_per_s(),
            sp.stats.decode_tokens_per_s(),
            sp.stats.decode_tokens_per_s() / p.stats.decode_tokens_per_s(),
            if p.tokens == sp.tokens { "identical" } else { "differ" }
        );
    }
    Ok(())
}

/// A drafter and, for a draft model, the model it borrows.
enum DraftChoice {
    Lookup(PromptLookup),
    Model(Box<LoadedModel>),
}

impl DraftChoice {
    fn as_drafter(&mut self) -> Box<dyn Proposer + '_> {
        match self {
            DraftChoice::Lookup(p) => Box::new(std::mem::take(p)),
            DraftChoice::Model(m) => Box::new(ModelDrafter::new(&m.model, m.source.display_name())),
        }
    }
}

fn build_drafter(
    config: &Config,
    args: &GenerateArgs,
    target: &LoadedModel,
) -> Result<Option<DraftChoice>> {
    if let Some(lookup) = PromptLookup::parse_spec(&args.draft_model) {
        let lookup = lookup.map_err(|e| anyhow::anyhow!("--draft-model: {e}"))?;
        return Ok(Some(DraftChoice::Lookup(lookup)));
    }
    Ok(match args.draft_model.as_str() {
        "none" => None,
        spec => {
            let weights_dtype = args
                .draft_weights_dtype
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--draft-weights-dtype: {e}"))?;
            let (draft, name) =
                tandem::setup::load_draft_model(spec, weights_dtype, config, target)
                    .with_context(|| format!("loading draft model {spec}"))?;
            eprintln!("draft model {name} (--draft-weights-dtype {weights_dtype})");
            Some(DraftChoice::Model(Box::new(draft)))
        }
    })
}

/// One generation, plain (`drafter` = None) or speculative, optionally streaming its text.
fn run_generation(
    loaded: &LoadedModel,
    drafter: Option<Box<dyn Proposer + '_>>,
    req: &GenerationRequest,
    spec: FixedSpeculation,
    stream: bool,
) -> Result<(GenerationOutput, Option<SpeculationStats>)> {
    let mut cache = loaded.model.new_cache(1);
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let mut on_output = |piece: OutputPiece<'_>| {
        if stream && !piece.text.is_empty() {
            if let Err(e) = stdout
                .write_all(piece.text.as_bytes())
                .and_then(|_| stdout.flush())
            {
                write_err = Some(anyhow::anyhow!(e));
                return false;
            }
        }
        true
    };
    let result = match drafter {
        None => (
            generate_plain(&loaded.model, &mut cache, req, &mut on_output)?,
            None,
        ),
        Some(mut d) => {
            let (out, st) = generate_speculative(
                &loaded.model,
                &mut cache,
                d.as_mut(),
                req,
                spec,
                &mut on_output,
            )?;
            (out, Some(st))
        }
    };
    if let Some(e) = write_err {
        return Err(e.context("writing output"));
    }
    if stream {
        writeln!(stdout)?;
    }
    Ok(result)
}

fn forward_bench(config: &Config, args: ForwardBenchArgs) -> Result<()> {
    use tandem::model::{LogitsRows, SeqInput};
    let loaded = load_model(config)?;
    let model = &loaded.model;
    let vocab = model.hparams().vocab_size as u32;
    let mut cache = model.new_cache(1);
    let slot = cache.allocate().context("a cache slot")?;
    // Arbitrary but fixed token ids: the cost does not depend on which tokens they are.
    let ids = |n: usize, salt: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i * 7919 + salt * 104_729) as u32) % vocab)
            .collect()
    };
    let max_k = args.tokens.iter().copied().max().unwrap_or(1);
    if args.depth + max_k > model.context_len() {
        bail!(
            "--depth + the largest --tokens exceeds the context length {}",
            model.context_len()
        );
    }
    model.forward(
        &mut cache,
        &[SeqInput {
            slot,
            start_pos: 0,
            tokens: &ids(args.depth.max(1), 0),
            logits: LogitsRows::None,
        }],
    )?;
    let depth = cache.len(slot)?;
    println!("| new tokens | ms per forward | ms per token | cost vs 1 token |");
    println!("|---|---|---|---|");
    let mut base = None;
    for &k in &args.tokens {
        let mut times = Vec::with_capacity(args.repeats);
        for r in 0..args.repeats + 1 {
            let toks = ids(k, r + 1);
            let t = std::time::Instant::now();
            model.forward(
                &mut cache,
                &[SeqInput {
                    slot,
                    start_pos: depth,
                    tokens: &toks,
                    logits: LogitsRows::All,
                }],
            )?;
            let dt = t.elapsed().as_secs_f64() * 1e3;
            cache.truncate_to(slot, depth)?;
            if r > 0 {
                times.push(dt); // the first run warms caches
            }
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        let one = *base.get_or_insert(ms);
        println!(
            "| {k} | {ms:.2} | {:.2} | {:.2}x |",
            ms / k as f64,
            ms / one
        );
    }
    Ok(())
}
